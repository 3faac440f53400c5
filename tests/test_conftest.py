"""The suite's own scheduling and model keeping (tests/conftest.py)."""

import json

from tests.conftest import _keep, longest_first


def test_modules_go_longest_first_and_each_stays_together_in_its_order():
    nodeids = [
        "tests/a.py::one",
        "tests/a.py::two",
        "tests/b.py::one",
        "tests/c.py::one",
        "tests/c.py::two",
        "tests/c.py::three",
        "tests/d.py::one",
    ]
    # b recorded 9 s, a 2 s; c and d have no record: 3 tests and 1 test at 0.2 s each.
    seconds = {"tests/a.py": 2.0, "tests/b.py": 9.0, "tests/gone.py": 50.0}
    assert longest_first(nodeids, seconds) == [
        "tests/b.py::one",
        "tests/a.py::one",
        "tests/a.py::two",
        "tests/c.py::one",
        "tests/c.py::two",
        "tests/c.py::three",
        "tests/d.py::one",
    ]
    # No record at all: by test count, ties in collection order; a damaged entry counts as none.
    assert longest_first(nodeids, {"tests/d.py": "fast"}) == [
        "tests/c.py::one",
        "tests/c.py::two",
        "tests/c.py::three",
        "tests/a.py::one",
        "tests/a.py::two",
        "tests/b.py::one",
        "tests/d.py::one",
    ]


def _conversion(folder, marker="done"):
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "ragen-converted.json").write_text(json.dumps({"by": marker}))
    return folder


def test_a_session_keeps_its_conversion_once_and_only_the_current_one(tmp_path):
    kept_root = tmp_path / "cache"
    stale = _conversion(kept_root / "olddigest", "old")
    (kept_root / "newdigest.tmp-1").mkdir()  # a killed session's move
    converted = _conversion(tmp_path / "home" / "models" / "smollm2-135m", "this session")
    _keep(converted, kept_root / "newdigest")
    assert not converted.exists()  # moved, not copied
    assert [p.name for p in kept_root.iterdir()] == ["newdigest"]
    assert json.loads((kept_root / "newdigest" / "ragen-converted.json").read_text())["by"] == (
        "this session"
    )
    assert not stale.exists()
    # A later session finds it kept and keeps nothing of its own.
    later = _conversion(tmp_path / "later" / "models" / "smollm2-135m", "later session")
    _keep(later, kept_root / "newdigest")
    assert later.exists()
    assert json.loads((kept_root / "newdigest" / "ragen-converted.json").read_text())["by"] == (
        "this session"
    )
