"""`ragen monitor` and `ragen report` through the CLI: what they say about the settings they
used, and one line and exit 2 for every input they cannot use."""

from __future__ import annotations

import pytest

from ragen.cli import main
from ragen.monitor.jsonl import append_jsonl
from ragen.monitor.rundir import RunDir

from . import streams

STRICT = "monitor: {std_drop: 0.99, entropy_drop: 0.99, diversity_drop: 0.99}\n"


def _run(root, config: str | None = None) -> RunDir:
    run = RunDir(root)
    append_jsonl(run.metrics, streams.collapsing(0))
    if config is not None:
        run.config.write_text(config, encoding="utf-8")
    return run


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ragen: ") and err.count("\n") == 1, err
    return err


def test_monitor_says_which_detector_settings_it_used(tmp_path, capsys):
    bare = _run(tmp_path / "bare")
    assert main(["monitor", str(bare.root)]) == 0
    out, err = capsys.readouterr()
    assert f"detector: default settings: {bare.root} has no config.yaml\n" in err
    default_alerts = out.splitlines()

    strict = _run(tmp_path / "strict", STRICT)
    assert main(["monitor", str(strict.root), "warmup_steps=5"]) == 0
    out, err = capsys.readouterr()
    assert f"detector: settings from {strict.config} + warmup_steps=5\n" in err
    assert len(out.splitlines()) < len(default_alerts)  # the run's own settings count


def test_report_names_the_settings_of_replayed_alerts(tmp_path, capsys):
    bare = _run(tmp_path / "bare")
    assert main(["report", str(bare.root)]) == 0
    summary = (bare.root / "report" / "summary.md").read_text(encoding="utf-8")
    assert f"(replayed, default settings: {bare.root} has no config.yaml)" in summary


@pytest.mark.parametrize("command", ["monitor", "report"])
def test_unusable_inputs_are_one_line_and_exit_2(tmp_path, capsys, command):
    latin1 = _run(tmp_path / "latin1")
    latin1.config.write_bytes("# réglages\nmonitor: {}\n".encode("latin-1"))
    err = _one_line_error(capsys, [command, str(latin1.root)])
    assert f"{latin1.config} is not UTF-8 text (byte 3)" in err

    folder = RunDir(tmp_path / "folder")
    folder.metrics.mkdir(parents=True)
    err = _one_line_error(capsys, [command, str(folder.root)])
    assert f"cannot read {folder.metrics} (Is a directory)" in err


def test_report_out_naming_a_file_is_refused(tmp_path, capsys):
    run = _run(tmp_path / "r")
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n", encoding="utf-8")
    err = _one_line_error(capsys, ["report", str(run.root), "--out", str(taken)])
    assert f"--out {taken} is a file: name a folder" in err
    assert taken.read_text(encoding="utf-8") == "mine\n"


def test_lines_no_reader_can_use_are_skipped_and_counted(tmp_path, capsys):
    run = _run(tmp_path / "r")
    with open(run.metrics, "a", encoding="utf-8") as fh:
        fh.write('{"step": 500, "rollout/success": ' + "9" * 5000 + "}\n")
        fh.write('{"step": 501, "rollout/success": 1e999}\n')
        fh.write('{"step": 502, "note": "\\ud800"}\n')
    assert main(["monitor", str(run.root)]) == 0
    assert "alert(s) in 160 steps, 3 unreadable line(s) skipped" in capsys.readouterr().err
    assert main(["report", str(run.root)]) == 0
    summary = (run.root / "report" / "summary.md").read_text(encoding="utf-8")
    assert "160 steps" in summary and "3 torn line(s) skipped" in summary
