"""`ragen monitor`: one line per alert, the detector settings it used, and one line and exit 2
for every input it cannot use."""

from __future__ import annotations

import argparse
import json

from ragen.cli import main
from ragen.monitor import command
from ragen.run.jsonl import append_jsonl
from ragen.run.rundir import RunDir

from . import streams

STRICT = "monitor: {std_drop: 0.99, entropy_drop: 0.99, diversity_drop: 0.99}\n"


def _run(root, config: str | None = None, records=None, torn: bool = False) -> RunDir:
    run = RunDir(root)
    append_jsonl(run.metrics, streams.collapsing(0) if records is None else records)
    if torn:  # a run killed mid-write
        with open(run.metrics, "a") as fh:
            fh.write('{"step": 99, "rollout/rew')
    if config is not None:
        run.config.write_text(config, encoding="utf-8")
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


def test_monitor_command_prints_one_line_per_alert(tmp_path, capsys):
    run = _run(tmp_path / "r", torn=True)
    assert command.run(_args([str(run.root)])) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines and all(line.startswith("[step ") for line in lines)
    assert any("COLLAPSE rollout/success" in line for line in lines)
    assert f"{len(lines)} alert(s) in 160 steps, 1 unreadable line(s) skipped" in err
    assert command.run(_args([str(run.root), "--json"])) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["step"] for r in records] == [int(line[6:].split("]")[0]) for line in lines]
    # a stricter threshold on the command line finds the std fall later or not at all
    argv = [str(run.root), "monitor.std_drop=0.99", "entropy_drop=0.99", "diversity_drop=0.99"]
    assert command.run(_args(argv)) == 0
    assert "WARNING" not in capsys.readouterr().out


def test_monitor_command_refuses_bad_input(tmp_path, capsys):
    assert command.run(_args([str(tmp_path)])) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    run = _run(tmp_path / "r", records=streams.healthy(0, steps=5))
    assert command.run(_args([str(run.root), "std_dorp=0.3"])) == 2
    assert "did you mean monitor.std_drop" in capsys.readouterr().err
    # another section's key: a replay changes only the detector
    assert command.run(_args([str(run.root), "trainer.steps=3"])) == 2
    assert "'trainer.steps=3' sets the trainer section" in capsys.readouterr().err


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


def test_unusable_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    latin1 = _run(tmp_path / "latin1")
    latin1.config.write_bytes("# réglages\nmonitor: {}\n".encode("latin-1"))
    err = _one_line_error(capsys, ["monitor", str(latin1.root)])
    assert f"{latin1.config} is not UTF-8 text (byte 3)" in err

    folder = RunDir(tmp_path / "folder")
    folder.metrics.mkdir(parents=True)
    err = _one_line_error(capsys, ["monitor", str(folder.root)])
    assert f"cannot read {folder.metrics} (Is a directory)" in err


def test_lines_no_reader_can_use_are_skipped_and_counted(tmp_path, capsys):
    run = _run(tmp_path / "r")
    with open(run.metrics, "a", encoding="utf-8") as fh:
        fh.write('{"step": 500, "rollout/success": ' + "9" * 5000 + "}\n")
        fh.write('{"step": 501, "rollout/success": 1e999}\n')
        fh.write('{"step": 502, "note": "\\ud800"}\n')
    assert main(["monitor", str(run.root)]) == 0
    assert "alert(s) in 160 steps, 3 unreadable line(s) skipped" in capsys.readouterr().err
