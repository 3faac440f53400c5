"""`ragen report`: where it writes, the detector settings of replayed alerts, and one line and
exit 2 for every input it cannot use."""

from __future__ import annotations

import argparse

from tests.monitor import streams

from ragen.cli import main
from ragen.report import command
from ragen.run.jsonl import append_jsonl
from ragen.run.rundir import RunDir


def _run(root, records=None) -> RunDir:
    run = RunDir(root)
    append_jsonl(run.metrics, streams.collapsing(0) if records is None else records)
    return run


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ragen: ") and err.count("\n") == 1, err
    return err


def _args(argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_report_command_defaults_to_the_run_folder(tmp_path, capsys):
    run = _run(tmp_path / "r", streams.healthy(0, steps=20))
    assert command.run(_args([str(run.root)])) == 0
    printed = capsys.readouterr().out.split()
    assert (run.root / "report" / "summary.md").is_file()
    assert str(run.root / "report" / "summary.md") in printed
    assert command.run(_args([str(tmp_path / "nothing")])) == 2


def test_report_names_the_settings_of_replayed_alerts(tmp_path, capsys):
    bare = _run(tmp_path / "bare")
    assert main(["report", str(bare.root)]) == 0
    summary = (bare.root / "report" / "summary.md").read_text(encoding="utf-8")
    assert f"(replayed, default settings: {bare.root} has no config.yaml)" in summary


def test_unusable_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    latin1 = _run(tmp_path / "latin1")
    latin1.config.write_bytes("# réglages\nmonitor: {}\n".encode("latin-1"))
    err = _one_line_error(capsys, ["report", str(latin1.root)])
    assert f"{latin1.config} is not UTF-8 text (byte 3)" in err

    folder = RunDir(tmp_path / "folder")
    folder.metrics.mkdir(parents=True)
    err = _one_line_error(capsys, ["report", str(folder.root)])
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
    assert main(["report", str(run.root)]) == 0
    summary = (run.root / "report" / "summary.md").read_text(encoding="utf-8")
    assert "160 steps" in summary and "3 torn line(s) skipped" in summary
