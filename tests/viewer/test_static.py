"""The page's own files: nothing that parses text as HTML, nothing from the network."""

from __future__ import annotations

import re

import pytest

from ragen.viewer.app import STATIC, static_text

# Sinks that turn a string into markup or code. Model text must only ever reach the page
# through textContent; the page uses none of these, so none may appear.
SINKS = ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("]


@pytest.mark.parametrize("sink", SINKS)
def test_script_uses_no_html_sink(sink):
    assert sink not in static_text("viewer.js")


def test_page_loads_nothing_from_elsewhere():
    for name in ["index.html", *STATIC]:
        text = static_text(name)
        urls = re.findall(r"(?:https?:)?//[\w.-]+\.\w+", text)
        assert [u for u in urls if "www.w3.org" not in u] == [], name
    assert "@import" not in static_text("viewer.css")


def test_page_has_no_inline_script_or_style():
    page = static_text("index.html")
    assert re.findall(r"<script>|<style|\sstyle=|\son\w+=", page) == []
