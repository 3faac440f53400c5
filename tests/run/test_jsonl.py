"""JSONL files: torn and junk lines skipped and counted, appends whole or not at all, strict
JSON written, and lines no reader can use skipped."""

import json
import math
import subprocess
import sys
import textwrap

import pytest

from ragen.run.jsonl import JsonlRead, RunDirError, append_jsonl, read_jsonl


def test_torn_and_junk_lines_are_skipped_and_counted(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n[1, 2]\n\n{"step": 1}\n{"step": 2, "rollo')
    read = read_jsonl(path)
    assert [r["step"] for r in read.records] == [0, 1]
    assert read.skipped == [2, 3, 6]
    append_jsonl(path, [{"step": 3}])  # the torn line must not swallow the new record
    assert [r["step"] for r in read_jsonl(path).records] == [0, 1, 3]


def test_a_failed_append_leaves_the_file_as_it_was(tmp_path):
    # Under a file size limit the record does not fit, as on a full disk: the old file (a
    # torn last line included, which the append would first end) keeps every byte, and a
    # file the append created is gone.
    old = tmp_path / "metrics.jsonl"
    old.write_text('{"step": 0}\n{"step": 1, "rollo')
    script = textwrap.dedent(
        f"""
        import resource, signal
        from pathlib import Path
        from ragen.run.jsonl import append_jsonl
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
        for name in ("metrics.jsonl", "new.jsonl"):
            try:
                append_jsonl(Path({str(tmp_path)!r}) / name, [{{"step": 1, "pad": "x" * 80}}])
            except OSError as err:
                print(err.strerror)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.stdout.splitlines() == ["File too large", "File too large"]
    assert old.read_text() == '{"step": 0}\n{"step": 1, "rollo'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_lines_are_strict_json(tmp_path):
    path = tmp_path / "x.jsonl"
    append_jsonl(path, [{"a": math.inf, "b": [1.0, -math.inf], "c": "√ ×"}])
    line = path.read_text(encoding="utf-8").strip()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(c)) == {
        "a": None,
        "b": [1.0, None],
        "c": "√ ×",
    }


def test_lines_json_accepts_but_no_reader_can_use_are_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        '{"step": 0, "reply": "\\ud83d\\ude00", "big": 1E+300, "tiny": 1e-999}',  # all fine
        '{"step": 1, "reply": "\\ud800"}',  # a lone surrogate: no UTF-8 form
        '{"step": 2, "reply": "ok", "k\\uDFFF": 1}',  # in a key, upper-case escape
        '{"step": 3, "x": 1e999}',  # inf
        '{"step": 4, "x": -1' + "0" * 250 + "e99}",  # -inf from a long mantissa
        '{"step": 5, "x": ' + "9" * 400 + "}",  # an int float() cannot hold
        '{"step": 6, "x": ' + "9" * 5000 + "}",  # past Python's int-string limit
        '{"step": 7, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",  # past the recursion limit
        '{"step": 8, "x": ' + "9" * 300 + "}",  # big but a float holds it
        '{"step": 9, "note": "caf\\u00e9 \\\\ud800 is written as text"}',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    read = read_jsonl(path)
    assert [r["step"] for r in read.records] == [0, 8, 9]
    assert read.records[0] == {"step": 0, "reply": "😀", "big": 1e300, "tiny": 0.0}
    assert read.records[2]["note"] == "café \\ud800 is written as text"
    assert read.skipped == [2, 3, 4, 5, 6, 7, 8]


def test_a_log_that_is_not_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(RunDirError, match=r"metrics.jsonl \(Is a directory\): it must be"):
        read_jsonl(tmp_path / "metrics.jsonl")
    assert read_jsonl(tmp_path / "missing.jsonl") == JsonlRead([], [])
