"""experiments/detector_calibration.py: each run's truth from its success counts, the hits,
misses and false calls of a setting's alerts, and the recorded figures it states; and
experiments/step_record.py, the per-step record a learn or speedrun result keeps."""

import json
import math

import pytest

from experiments import detector_calibration as calib
from experiments import step_record
from ragen import config
from ragen.monitor.collapse import Alert, replay
from ragen.monitor.counts import fall_p_value


def _label(successes: list[int], n: int = 32) -> calib.Label:
    return calib.label([(k, n) for k in successes])


def test_a_fall_that_stays_down_is_a_collapse_at_the_step_it_began():
    # 8 steps, window 2: 16 of 32 a step, then 0 from step 4. The surest split is step 4:
    # 32 of 64 before it against 0 of 128 after, p = C(64,32) / C(192,32), times 6 splits
    truth = _label([16, 16, 16, 16, 0, 0, 0, 0])
    assert (truth.truth, truth.collapse_step, truth.window) == ("collapsed", 4, 2)
    p = math.comb(64, 32) / math.comb(192, 32)
    assert fall_p_value((32, 64), (0, 128)) == pytest.approx(p, rel=1e-9)
    assert f"p {p:.2g} x 6 splits" in truth.reason


def test_a_dip_that_recovers_or_a_fall_that_comes_back_is_no_collapse():
    # one step at 2 of 32 among 16s: the rest of the run is back at the level before
    assert _label([16, 16, 16, 2, 16, 16, 16, 16]).truth == "flat"
    # a fall that held for two steps, then the success came back for the last two: the last
    # window is not below the level before the fall, so it did not stay down
    assert _label([16, 16, 16, 16, 1, 1, 16, 16]).collapse_step is None
    # a low start that hardly moves is flat, however small its numbers
    assert _label([1, 0, 2, 1, 0, 1, 1, 0]).truth == "flat"


def test_a_rise_from_the_first_window_to_the_last_is_learned():
    truth = _label([4, 4, 8, 8, 16, 16, 24, 24])
    assert truth.truth == "learned" and truth.collapse_step is None
    # first 2 steps 8 of 64, last 2 48 of 64: the rise's p is the fall test read backwards
    assert f"(rise p {fall_p_value((48, 64), (8, 64)):.2g})" in truth.reason
    # the window is a quarter of a long run: 40 steps, 10 a side
    assert _label([8] * 20 + [12] * 20).window == 10


def _alert(step: int, kind: str = "collapse") -> Alert:
    return Alert(step, kind, "rollout/success", 0.0, 0.0, "")


COLLAPSED = calib.Label("collapsed", "", window=2, collapse_step=6)
LEARNED = calib.Label("learned", "", window=2)


def test_a_call_from_a_window_before_the_collapse_to_two_steps_after_is_a_hit():
    assert calib.score(COLLAPSED, [_alert(4)]).hit == 4  # the window before: ahead of it
    assert calib.score(COLLAPSED, [_alert(8)]).hit == 8  # two steps after: still a hit
    late = calib.score(COLLAPSED, [_alert(9)])  # three after: a miss, though no false call
    assert late.hit is None and late.false_calls == []
    early = calib.score(COLLAPSED, [_alert(3), _alert(7)])  # before the window: false
    assert (early.hit, early.false_calls) == (7, [3])
    # a warning in the two windows before the hit is a lead of its distance to the hit
    warned = calib.score(COLLAPSED, [_alert(2, "warning"), _alert(5, "warning"), _alert(7)])
    assert (warned.lead, warned.warnings) == (5, [2, 5])
    assert calib.score(COLLAPSED, [_alert(1, "warning"), _alert(7)]).lead is None


def test_every_call_on_a_run_without_a_collapse_is_false_and_warnings_count_apart():
    score = calib.score(LEARNED, [_alert(3), _alert(5, "warning"), _alert(9)])
    assert (score.false_calls, score.warnings, score.hit) == ([3, 9], [5], None)
    t = calib.tally(
        [COLLAPSED, COLLAPSED, LEARNED, LEARNED],
        [
            calib.score(COLLAPSED, [_alert(5, "warning"), _alert(7)]),
            calib.score(COLLAPSED, [_alert(1)]),
            score,
            calib.score(LEARNED, []),
        ],
    )
    assert t == {
        "collapsed": 2,
        "hits": 1,
        "misses": 1,
        "false_calls": 3,  # the second collapsed run's early call and the learned run's two
        "runs_with_false_calls": 2,
        "not_collapsed": 2,
        "warnings_without_collapse": 1,
        "runs_warned_without_collapse": 1,
        "collapses_warned_ahead": 1,
    }


def test_the_replay_over_the_recorded_runs_gives_the_figures_the_result_states():
    stated = json.loads((calib.RESULTS / "detector_calibration.json").read_text())
    runs = calib.recorded_runs()
    labels = [calib.label(calib._counts(run.records)) for run in runs]
    assert [r["name"] for r in stated["runs"]] == [run.name for run in runs]
    assert [(r["truth"], r["collapse_step"]) for r in stated["runs"]] == [
        (lab.truth, lab.collapse_step) for lab in labels
    ]
    for row in stated["named"]:
        monitor = calib.named_settings()[row["name"]]
        tally, scores = calib.evaluate(runs, labels, monitor)
        assert tally == row["tally"]
        assert {r.name: s.calls for r, s in zip(runs, scores, strict=True)} == {
            name: s["calls"] for name, s in row["per_run"].items()
        }
    # the run issue 50 names: three collapse calls from the ema rule, none from counts
    critic4 = next(r for r in runs if r.name == "learn-frozen-lake-warm4-from-sft-critic4")
    calls = [a.step for a in replay(critic4.records, calib.BEFORE) if a.kind == "collapse"]
    assert calls == [6, 31, 37]
    cpu = config.load("frozen-lake").monitor
    assert [a for a in replay(critic4.records, cpu) if a.kind == "collapse"] == []


def test_a_run_folder_is_read_with_its_episode_count_from_its_config(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "rollout/success": v}) + "\n" for s, v in enumerate([0.5, 0.25])
        )
    )
    (tmp_path / "config.yaml").write_text("rollout:\n  groups: 3\n  group_size: 2\n")
    run = calib.folder_run(tmp_path)
    assert [r["rollout/episodes"] for r in run.records] == [6.0, 6.0]
    assert calib._counts(run.records) == [(3, 6), (2, 6)]  # 0.25 of 6 rounds to 2


def test_the_per_step_record_keeps_what_the_detector_reads_and_replays_as_logged(tmp_path):
    rows = [
        {"step": 0, "rollout/success": 0.123456, "rollout/episodes": 32.0, "actor/entropy": 1.5},
        {"step": 1, "rollout/success": 0.25, "rollout/episodes": 32.0, "eval/bandit/success": 0.5},
        {"step": 2, "rollout/success": 0.0, "rollout/episodes": 32.0, "time/rollout_s": 3.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    alert = {"step": 2, "kind": "collapse", "signal": "rollout/success", "value": 0.0}
    (tmp_path / "alerts.jsonl").write_text(json.dumps(alert) + "\n")
    (tmp_path / "config.yaml").write_text("monitor:\n  success_test: counts\n")
    record = step_record.record(tmp_path)
    assert record["columns"] == {
        "step": [0, 1, 2],
        "rollout/success": [0.1235, 0.25, 0.0],  # 4 significant digits
        "rollout/episodes": [32.0, 32.0, 32.0],
        "actor/entropy": [1.5, None, None],
        "eval/bandit/success": [None, 0.5, None],
    }
    assert record["alerts"] == [[2, "collapse", "rollout/success"]]
    assert record["monitor"] == {"success_test": "counts"}
    assert step_record.records_of(record)[1] == {
        "step": 1,
        "rollout/success": 0.25,
        "rollout/episodes": 32.0,
        "eval/bandit/success": 0.5,
    }
    assert step_record.record(tmp_path / "nothing") is None
