import re
from pathlib import Path

import pytest

from ragen import metric_names as names
from ragen.monitor import collapse

VIEWER_JS = Path(names.__file__).parent / "viewer" / "static" / "viewer.js"


def test_the_detector_watches_only_names_runs_write():
    watched = collapse.CollapseDetector().watched
    assert {names.SUCCESS, names.ENTROPY, names.GRAD_NORM, names.MI} <= watched <= names.PRODUCED


def test_the_detector_refuses_a_renamed_metric(monkeypatch):
    monkeypatch.setattr(names, "ENTROPY", "actor/entropy_nats")
    with pytest.raises(ValueError, match="actor/entropy_nats"):
        collapse.CollapseDetector()


def test_the_viewer_page_reads_only_names_runs_write():
    quoted = set(
        re.findall(
            r'"((?:rollout|actor|critic|filter|diversity|think|collapse)/\w+)"',
            VIEWER_JS.read_text(),
        )
    )
    assert quoted and quoted <= names.PRODUCED, sorted(quoted - names.PRODUCED)
