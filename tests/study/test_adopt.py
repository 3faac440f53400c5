"""`ragen study --adopt DIR`: a study continued from a copy of its runs' logs takes the runs
they show finished as done (its table as before), runs the rest, refuses logs of other
settings or another study, and makes a warm start again while a run left needs its
checkpoint."""

import json
import shutil

import pytest
from tests.study.test_run import STUDY, TWO_RUNS, in_process

from ragen.cli import main
from ragen.run.jsonl import read_jsonl
from ragen.study import outputs, runner, spec
from ragen.study.adopt import adopt
from ragen.train.eval_cache import REUSED_FROM

LOGS = ("config.yaml", "metrics.jsonl", "eval.jsonl")


def _study(tmp_path, text, name):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return spec.load_study(str(path))


def _run(study, name, out, seeds=1, **kw):
    planned = spec.plan(study, "cpu", seeds, out)
    calls: list = []
    state = runner.run_all(planned, out, study=name, scale="cpu", launch=in_process(calls), **kw)
    return planned, state, calls


def _logs_only(run_root, to):
    """What a user keeps of a run: its logs, no checkpoints."""
    to.mkdir(parents=True)
    for name in LOGS:
        if (run_root / name).is_file():
            shutil.copy2(run_root / name, to / name)


def test_a_whole_kept_study_is_adopted_and_nothing_runs_again(tmp_path):
    study = _study(tmp_path, STUDY, "tiny")
    first = tmp_path / "first"
    planned, state, calls = _run(study, "tiny", first)
    assert calls == [("keep-all", False), ("keep-half", False)]
    table = outputs.write_outputs(study, "cpu", planned, state, first).table

    kept = tmp_path / "kept"
    shutil.copytree(first, kept)  # study.json with it: its minutes and statuses are read
    (kept / "keep-all" / "seed-0" / ".lock").write_text("stale")
    second = tmp_path / "second"
    planned2, state2, calls2 = _run(study, "tiny", second, adopt_from=kept)
    assert calls2 == []
    assert state2.data["runs"]["keep-half/seed-0"]["adopted_from"] == str(
        kept / "keep-half" / "seed-0"
    )
    assert [state2.minutes(p) for p in planned2] == [state.minutes(p) for p in planned]
    assert not (second / "keep-all" / "seed-0" / ".lock").exists()  # hidden files stay behind
    assert outputs.write_outputs(study, "cpu", planned2, state2, second).table == table

    # Run again with the same --adopt: the runs are done now, nothing is copied or run.
    said: list[str] = []
    assert adopt(planned2, state2, kept, said.append) == []


def test_logs_without_study_json_adopt_the_finished_runs_only(tmp_path):
    study = _study(tmp_path, STUDY, "tiny")
    first = tmp_path / "first"
    _run(study, "tiny", first)
    kept = tmp_path / "kept"
    for name in ("keep-all", "keep-half"):
        _logs_only(first / name / "seed-0", kept / name / "seed-0")
    half = kept / "keep-half" / "seed-0" / "metrics.jsonl"
    # killed after step 0, and a line damaged into a step that is not a number
    half.write_text(half.read_text().splitlines(keepends=True)[0] + '{"step": [1]}\n')

    second = tmp_path / "second"
    planned = spec.plan(study, "cpu", 1, second)
    said: list[str] = []
    state = runner.StudyState(second, "tiny", "cpu")
    second.mkdir()
    adopted = adopt(planned, state, kept, said.append)
    assert [p.name for p in adopted] == ["keep-all"]
    assert said == [
        f"not adopted: {kept / 'keep-half' / 'seed-0'} (its metrics end at step 0 of 2, and "
        "no study.json says it was done); the study runs it",
        f"adopted keep-all seed 0 from {kept / 'keep-all' / 'seed-0'}",
    ]
    times = [r["time"] for r in read_jsonl(kept / "keep-all" / "seed-0" / "metrics.jsonl").records]
    assert state.minutes(planned[0]) == round((times[1] - times[0]) / 60, 2)
    copied = sorted(p.name for p in (second / "keep-all" / "seed-0").iterdir())
    assert copied == sorted(p.name for p in (kept / "keep-all" / "seed-0").iterdir())

    calls: list = []
    runner.run_all(planned, second, study="tiny", scale="cpu", launch=in_process(calls))
    assert calls == [("keep-half", False)]


def test_logs_of_other_settings_or_another_study_are_refused(tmp_path):
    study = _study(tmp_path, STUDY, "tiny")
    first = tmp_path / "first"
    _run(study, "tiny", first)
    kept = tmp_path / "kept"
    _logs_only(first / "keep-half" / "seed-0", kept / "keep-all" / "seed-0")  # filter 0.5
    second = tmp_path / "second"
    planned = spec.plan(study, "cpu", 1, second)
    with pytest.raises(runner.StudyError, match=r"algo\.filter_ratio 0\.5 → 1\.0"):
        runner.run_all(planned, second, study="tiny", scale="cpu", adopt_from=kept)
    assert not (second / "keep-all").exists()

    shutil.rmtree(kept)
    shutil.copytree(first, kept)
    record = json.loads((kept / runner.STATE_FILE).read_text())
    (kept / runner.STATE_FILE).write_text(json.dumps({**record, "study": "other"}))
    with pytest.raises(runner.StudyError, match="holds the study 'other' at scale 'cpu'"):
        runner.run_all(planned, second, study="tiny", scale="cpu", adopt_from=kept)
    with pytest.raises(runner.StudyError, match="no such folder"):
        runner.run_all(planned, second, study="tiny", scale="cpu", adopt_from=tmp_path / "none")


def test_a_warm_start_is_made_again_while_a_run_left_starts_from_it(tmp_path):
    text = TWO_RUNS
    study = _study(tmp_path, text, "warm")
    first = tmp_path / "first"
    _run(study, "warm", first)
    kept = tmp_path / "kept"
    for name in ("warm-start", "a"):  # b was lost
        _logs_only(first / name / "seed-0", kept / name / "seed-0")

    second = tmp_path / "second"
    _, state, calls = _run(study, "warm", second, adopt_from=kept)
    assert calls == [("warm-start", False), ("b", False)]  # a adopted
    assert "adopted_from" in state.data["runs"]["a/seed-0"]
    assert "adopted_from" not in state.data["runs"]["warm-start/seed-0"]
    # Made again with the same settings and seed: the same weights, so b starts where a did.
    again = read_jsonl(second / "warm-start" / "seed-0" / "metrics.jsonl").records
    before = read_jsonl(first / "warm-start" / "seed-0" / "metrics.jsonl").records
    assert [r["sft/loss"] for r in again] == [r["sft/loss"] for r in before]

    # With every run of its seed kept, the warm start is adopted as well: nothing runs.
    _logs_only(first / "b" / "seed-0", kept / "b" / "seed-0")
    _, _, calls3 = _run(study, "warm", tmp_path / "third", adopt_from=kept)
    assert calls3 == []


def test_adopt_runs_a_study_so_it_goes_with_neither_plan_nor_status(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(STUDY)
    with pytest.raises(SystemExit) as stopped:
        main(["study", str(path), "--plan", "--adopt", str(tmp_path)])
    assert stopped.value.code == 2
    assert "not allowed with argument --plan" in capsys.readouterr().err


def test_the_kept_evaluations_before_training_are_read_by_the_runs_made_again(tmp_path):
    # The study folder lost (as runs/ with a machine) and the study run again in the same
    # place: the warm start made again on this machine has the same weights, so the run left
    # reads the evaluation before training its lost peer played, from the kept eval-before.
    evaluate = "trainer.steps=1, trainer.eval_before=true, trainer.eval_episodes=2"
    text = TWO_RUNS.replace("trainer.steps=1", evaluate)
    study = _study(tmp_path, text, "warm")
    out = tmp_path / "out"
    _run(study, "warm", out)
    kept = tmp_path / "kept"
    for name in ("warm-start", "a"):
        _logs_only(out / name / "seed-0", kept / name / "seed-0")
    shutil.copytree(out / spec.EVAL_BEFORE, kept / spec.EVAL_BEFORE)
    shutil.rmtree(out)

    _, _, calls = _run(study, "warm", out, adopt_from=kept)
    assert calls == [("warm-start", False), ("b", False)]
    before = read_jsonl(out / "b" / "seed-0" / "eval.jsonl").records[0]
    assert before["step"] == -1
    assert before[REUSED_FROM] == str(out / "a" / "seed-0")  # played by the lost run's peer
