"""`--export`: one self-contained HTML file of a step."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import textwrap

import pytest

from ragen.run.jsonl import RunDirError, read_jsonl
from ragen.run.rundir import RunDir
from ragen.viewer.export import export_step, json_for_html

STEPS = 3  # as the viewer_run fixture trains


def _inline(html: str, tag: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def test_export_holds_every_episode_and_nothing_external(planted_run, tmp_path, planted):
    out = tmp_path / "step.html"
    # the latest step; broken lines left out
    assert export_step(planted_run, None, out) == (STEPS - 1, 9, 9)
    html = out.read_text()
    external = re.findall(r"(?:src|href)=\"[^\"#]|https?://(?!www\.w3\.org/2000/svg)", html)
    assert external == []  # no file, script, style or icon from elsewhere
    data = re.search(r'<script type="application/json" id="ragen-data">(.*?)</script>', html, re.S)
    loaded = json.loads(data[1])
    assert loaded["step"] == STEPS - 1 and len(loaded["records"]) == 9
    assert loaded["records"][-1]["turns"][0]["reply"] == planted.reply
    assert any("last line is incomplete" in n for n in loaded["notices"])
    # the payload never appears as markup: only the page's own two script elements exist
    assert html.count("<script") == 2 and "<img" not in html
    assert planted.reply not in html


def test_export_csp_admits_exactly_the_inline_blocks(viewer_run, tmp_path):
    out = tmp_path / "step.html"
    export_step(viewer_run, 1, out)
    html = out.read_text()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)[1]
    (script,) = _inline(html, "script")
    (style,) = _inline(html, "style")
    assert f"script-src '{_hash(script)}'" in csp and f"style-src '{_hash(style)}'" in csp
    assert "unsafe" not in csp and "default-src 'none'" in csp
    records = read_jsonl(RunDir(viewer_run).trajectory_file(1)).records
    assert json_for_html(records[0]["turns"][0]["reply"]) in html


def test_json_for_html_cannot_close_its_element():
    text = json_for_html({"a": "</script><!-- & -->"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"a": "</script><!-- & -->"}


def test_export_errors_say_what_to_do(viewer_run, tmp_path):
    with pytest.raises(RunDirError, match="steps with episodes run from 0 to 2"):
        export_step(viewer_run, 9, tmp_path / "x.html")
    with pytest.raises(RunDirError, match="is a folder"):
        export_step(viewer_run, 0, tmp_path)
    with pytest.raises(RunDirError, match="does not exist"):
        export_step(viewer_run, 0, tmp_path / "missing" / "x.html")
    empty = tmp_path / "empty-run"
    (empty / "trajectories").mkdir(parents=True)
    with pytest.raises(RunDirError, match="no trajectories to export"):
        export_step(empty, None, tmp_path / "x.html")


def test_a_failed_export_leaves_the_old_file_as_it_was(viewer_run, tmp_path):
    # The export runs under a file-size limit it cannot fit in: its write fails half-way,
    # as on a full disk.
    old = tmp_path / "shared.html"
    old.write_text("<p>the page sent last week</p>\n", encoding="utf-8")
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from ragen.cli import main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        sys.exit(main(["view", {str(viewer_run)!r}, "--export", {str(old)!r}]))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"ragen: cannot write --export {old} (File too large)")
    assert proc.stderr.count("\n") == 1
    assert old.read_text(encoding="utf-8") == "<p>the page sent last week</p>\n"
    assert [p.name for p in tmp_path.iterdir()] == ["shared.html"]  # no temporary left
