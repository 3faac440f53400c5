"""The suite's own model keeping (tests/conftest.py)."""

import json

from tests.conftest import _keep


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
