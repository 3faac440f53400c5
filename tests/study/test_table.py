"""A study's table by hand: end values over seeds, their standard errors, the verdicts of the
expected comparisons, and the collapse-aligned plot's data."""

import math
import statistics

import pytest

from ragen.monitor.collapse import Alert
from ragen.report.runs import load_run
from ragen.run.jsonl import append_jsonl
from ragen.run.rundir import RunDir
from ragen.study import aligned, table
from ragen.study.spec import Expectation, Study, StudyRun, StudyScale


def _study(metric="rollout/success", tail=2, columns=()):
    return Study(
        title="t",
        finding="f",
        paper="p",
        runs=[StudyRun("a", "bandit"), StudyRun("b", "bandit")],
        scales={"cpu": StudyScale()},
        metric=metric,
        tail=tail,
        columns=list(columns),
    )


def _run(tmp_path, name, success, evals=(), alerts=()):
    """A run directory as the trainer writes one: each evaluation after a step is also in
    that step's metrics (the one before training only in eval.jsonl)."""
    run = RunDir(tmp_path / name)
    records = [
        {"step": s, "rollout/success": v, "actor/entropy": 1.0 - s / 10}
        for s, v in enumerate(success)
    ]
    for e in evals:
        if e["step"] >= 0:
            records[e["step"]][f"eval/{e['env']}/success"] = e["success"]
    append_jsonl(run.metrics, records)
    append_jsonl(run.evals, [dict(e) for e in evals])
    append_jsonl(run.alerts, [a.to_record() for a in alerts])
    return load_run(run.root)


def test_end_start_and_peak_of_a_train_metric(tmp_path):
    run = _run(tmp_path, "r", [0.25, 0.5, 0.75, 0.5])
    res = table.seed_result(run, 0, _study(tail=2, columns=["actor/entropy"]), minutes=1.5)
    assert res.start == table.Measured(0.25)  # step 0 was sampled before any update
    assert res.end == table.Measured((0.75 + 0.5) / 2)
    assert (res.peak, res.peak_step, res.steps, res.minutes) == (0.75, 2, 4, 1.5)
    assert res.columns == {"actor/entropy": table.Measured((0.8 + 0.7) / 2)}


def test_an_evaluation_metric_keeps_its_episodes(tmp_path):
    evals = [
        {"step": -1, "env": "bandit", "success": 0.5, "episodes": 64},
        {"step": 3, "env": "bandit", "success": 0.75, "episodes": 128},
    ]
    run = _run(tmp_path, "r", [0.1, 0.2, 0.3, 0.4], evals)
    res = table.seed_result(run, 0, _study(metric="eval/bandit/success", tail=1), None)
    assert res.start == table.Measured(0.5, 64) and res.end == table.Measured(0.75, 128)
    # one seed: the binomial error of its evaluation
    one = table.over_seeds([res.end])
    assert one == table.Estimate(0.75, math.sqrt(0.75 * 0.25 / 128))


def test_over_seeds_by_hand():
    two = table.over_seeds([table.Measured(0.5), table.Measured(0.7), table.Measured(None)])
    assert two.mean == pytest.approx(0.6)
    assert two.se == pytest.approx(statistics.stdev([0.5, 0.7]) / math.sqrt(2))  # 0.1
    assert table.over_seeds([table.Measured(0.4)]) == table.Estimate(0.4, None)
    assert table.over_seeds([table.Measured(None)]) == table.Estimate(None, None)


def test_two_evaluations_close_by_chance_keep_their_binomial_error():
    close = table.over_seeds([table.Measured(0.20, 256), table.Measured(0.21, 256)])
    # the spread says 0.005; 512 episodes at 20.5% say 0.0178
    assert close.mean == pytest.approx(0.205)
    assert close.se == pytest.approx(math.sqrt(0.205 * 0.795 * (2 / 256)) / 2)
    assert close.se == pytest.approx(0.01784, abs=1e-5)
    apart = table.over_seeds([table.Measured(0.10, 256), table.Measured(0.30, 256)])
    assert apart.se == pytest.approx(0.1)  # the spread, wider than the binomial 0.0177
    # episodes of unequal evaluations: each adds its own variance
    mixed = table.over_seeds([table.Measured(0.5, 64), table.Measured(0.5, 256)])
    assert mixed.se == pytest.approx(math.sqrt(0.25 * (1 / 64 + 1 / 256)) / 2)
    # a seed without episodes leaves only the spread
    unknown = table.over_seeds([table.Measured(0.20, 256), table.Measured(0.21)])
    assert unknown.se == pytest.approx(0.005)


UNMEASURED = table.Estimate(None, None)


def _row(name, end, start=UNMEASURED):
    return table.RowResult(name, "bandit", [], end, start, None, {})


@pytest.mark.parametrize(
    ("high", "low", "z", "outcome"),
    [
        (table.Estimate(0.8, 0.03), table.Estimate(0.5, 0.04), 6.0, "reproduced"),
        (table.Estimate(0.56, 0.03), table.Estimate(0.5, 0.04), 1.2, "the paper's direction"),
        (table.Estimate(0.4, 0.03), table.Estimate(0.5, 0.04), -2.0, "not reproduced"),
    ],
)
def test_a_verdict_is_the_difference_in_standard_errors(high, low, z, outcome):
    rows = {"a": _row("a", high), "b": _row("b", low)}
    verdict = table.judge(Expectation("a", "b"), rows)
    assert verdict.se == pytest.approx(0.05)  # hypot(0.03, 0.04)
    assert verdict.z == pytest.approx(z) and verdict.outcome.startswith(outcome)


def test_a_verdict_without_an_error_is_untested_and_start_is_a_runs_start():
    rows = {"a": _row("a", table.Estimate(0.9, None), start=table.Estimate(0.2, 0.1))}
    untested = table.judge(Expectation("a", "a@start"), rows)
    assert untested.difference == pytest.approx(0.7) and untested.z is None
    assert untested.outcome.startswith("untested")
    rows = {"a": _row("a", table.Estimate(0.9, 0.0), start=table.Estimate(0.2, 0.0))}
    assert table.judge(Expectation("a", "a@start"), rows).z == math.inf


def test_the_markdown_table_holds_the_rows_and_verdicts(tmp_path):
    alerts = [
        Alert(1, "warning", "actor/entropy", 0.1, 0.3, "fell"),
        Alert(3, "collapse", "rollout/success", 0.1, 0.5, "fell"),
    ]
    study = _study(tail=1)
    seeds = [
        table.seed_result(_run(tmp_path, "s0", [0.2, 0.6, 0.8, 0.1], alerts=alerts), 0, study, 2.0),
        table.seed_result(_run(tmp_path, "s1", [0.2, 0.4, 0.6, 0.3]), 1, study, 3.0),
    ]
    row = table.row_result("a", "bandit", seeds, "21.48%", [])
    other = _row("b", table.Estimate(0.1, 0.05))
    verdicts = [table.judge(Expectation("a", "b"), {"a": row, "b": other})]
    text = table.table_markdown(study, "cpu", [row, other], verdicts)
    # end 0.2 ± stdev(0.1, 0.3)/sqrt(2) = 0.1; peak mean (0.8 + 0.6)/2
    cells = "| a | `bandit` | 2 | 4, 4 | 0.200 ± 0.000 | 0.200 ± 0.100 | 0.700 | 1/2 (steps 3) "
    assert cells + "| 1/2 (steps 1) | 5.0 min | 21.48% |" in text
    assert "- Expected a above b: +0.100 ± 0.112 (z +0.89): the paper's direction" in text


def test_the_aligned_runs_count_steps_from_their_collapse(tmp_path):
    collapse = [Alert(3, "collapse", "rollout/success", 0.1, 0.5, "fell")]
    run = _run(tmp_path, "r", [0.2, 0.6, 0.8, 0.1, 0.0], alerts=collapse)
    shifted = aligned.aligned(run)
    assert [r["step"] for r in shifted.records] == [-3, -2, -1, 0, 1]
    assert [a.step for a in shifted.alerts] == [0]
    assert aligned.aligned(_run(tmp_path, "calm", [0.2, 0.3])) is None
    path = aligned.write_aligned([run], tmp_path, alpha=1.0)
    assert path == tmp_path / "aligned.png" and path.stat().st_size > 0


def _levels_run(tmp_path, name, before, after, templates=((), ())):
    """A run evaluated before training and after its last step on the same 8 lakes;
    ``templates``: each evaluation's most frequent failed action sequence, played by every
    failed episode."""
    evals = [
        {
            "step": step,
            "env": "frozen-lake",
            "success": sum(o) / 8,
            "episodes": 8,
            "seeds": 8,
            "k": 1,
            "seed_successes": o,
            "action_template": list(moves),
            "action_template_share": (8 - sum(o)) / 8 if moves else 0.0,
        }
        for step, o, moves in ((-1, before, templates[0]), (3, after, templates[1]))
    ]
    return _run(tmp_path, name, [0.1, 0.2, 0.3, 0.4], evals)


def test_a_run_against_its_start_is_read_level_by_level(tmp_path):
    study = _study(metric="eval/frozen-lake/success", tail=1)
    seeds = [
        table.seed_result(
            _levels_run(tmp_path, "s0", [1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]),
            0,
            study,
            1.0,
        ),
        table.seed_result(
            _levels_run(tmp_path, "s1", [1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]),
            1,
            study,
            1.0,
        ),
    ]
    assert seeds[0].end.levels == {"seeds": 8, "k": 1, "seed_successes": [1, 1, 1, 1, 0, 0, 0, 0]}
    row = table.row_result("a", "frozen-lake", seeds, None, [])
    verdict = table.judge(Expectation("a", "a@start"), {"a": row})
    # level rates over the two seeds: before 1, .5, 0 x 6; after 1, 1, 1, .5, 0 x 4
    # changes 0, .5, 1, .5, 0 x 4: mean 2/8, sample variance (1.5 - 8/16) / 7 = 1/7
    assert verdict.difference == pytest.approx(0.25) and verdict.paired_levels == 8
    paired_se = math.sqrt(1 / 7 / 8)  # 0.134, wider than the seeds' spread, 0.088
    assert verdict.se == pytest.approx(paired_se)
    assert verdict.z == pytest.approx(0.25 / paired_se)
    text = table.table_markdown(study, "cpu", [row], [verdict])
    assert "+0.250 ± 0.134 (z +1.87, level by level on 8 levels)" in text
    # one seed without its levels' outcomes: the two sides are compared as means
    seeds[1].start.levels = None
    assert table.judge(Expectation("a", "a@start"), {"a": row}).paired_levels is None


def test_each_seed_is_read_level_by_level_with_its_template(tmp_path):
    study = _study(metric="eval/frozen-lake/success", tail=1)
    zigzag = ["Right", "Down", "Down", "Down", "Left"]
    run = _levels_run(
        tmp_path, "s0", [1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0], ((), zigzag)
    )
    seed = table.seed_result(run, 0, study, 1.0)
    # per-lake changes 0, 0, 1, 1, 0 x 4: mean 2/8; sample variance (2 - 8/16) / 7
    assert (seed.change.levels, seed.change.gained, seed.change.lost) == (8, 2, 0)
    assert seed.change.difference == pytest.approx(0.25)
    assert seed.change.se == pytest.approx(math.sqrt(1.5 / 7 / 8))
    assert (seed.start.template_share, seed.end.template_share) == (0.0, 0.5)
    assert seed.end.template == zigzag
    text = table.table_markdown(
        study, "cpu", [table.row_result("a", "frozen-lake", [seed], None, [])], []
    )
    assert (
        "- a seed 0: 0.250 → 0.500, +0.250 ± 0.164 level by level (z +1.53; 2 of 8 levels "
        "gained, 0 lost); one action sequence in 0% of the episodes before, "
        "50% (Right, Down × 3, Left) after."
    ) in text


def test_the_share_of_groups_whose_returns_differed_is_read_by_hand(tmp_path):
    steps = [
        {"step": -1, "eval/frozen-lake/success": 0.25},  # the evaluation before: no groups
        {"step": 0, "filter/kept_groups": 4, "filter/kept_ratio": 0.5, "filter/zero_std_groups": 7},
        {"step": 1, "filter/kept_groups": 4, "filter/kept_ratio": 0.5, "filter/zero_std_groups": 4},
        {"step": 2, "filter/kept_groups": 0, "filter/kept_ratio": 0.0, "filter/zero_std_groups": 8},
        {"step": 3, "filter/kept_groups": 3, "filter/kept_ratio": 0.5, "filter/zero_std_groups": 0},
    ]
    # of 8, 8, (none kept: left out) and 6 groups, 1, 4 and 6 differed: 1/8, 1/2, 1
    assert table.group_spread(steps) == pytest.approx((0.125 + 0.5 + 1.0) / 3)
    assert table.group_spread(steps[:1]) is None  # no step logged the filter's metrics
    assert table.group_spread([{"step": 0, "filter/kept_groups": "4"}]) is None  # hand-edited
    study = _study(metric="eval/frozen-lake/success", tail=1)
    seed = table.seed_result(_levels_run(tmp_path, "s0", [1, 1, 0, 0], [1, 1, 1, 0]), 0, study, 1.0)
    seed.spread = table.group_spread(steps[1:3])
    text = table.table_markdown(
        study, "cpu", [table.row_result("a", "frozen-lake", [seed], None, [])], []
    )
    assert "after; groups whose returns differed: 31% a step." in text


@pytest.mark.parametrize(
    ("moves", "shown"),
    [
        (["Down"] * 10, "Down × 10"),
        (["Right", "Down"] * 5, "(Right, Down) × 5"),
        (["Right", "Down", "Down", "Down", "Left"], "Right, Down × 3, Left"),
        (["Up"], "Up"),
        (["Up", "Left", "Up"], "Up, Left, Up"),
    ],
)
def test_a_template_is_shown_short(moves, shown):
    assert table._moves(moves) == shown


def test_a_template_of_no_move_says_so(tmp_path):
    run = _levels_run(tmp_path, "s0", [1] + [0] * 7, [1] * 2 + [0] * 6)
    run.evals[-1]["action_template_share"] = 0.25  # episodes whose replies held no action
    seed = table.seed_result(run, 0, _study(metric="eval/frozen-lake/success", tail=1), None)
    assert table._template(seed.end) == "25% (no move)"
    assert table._template(seed.start) == "0%"


def test_a_hand_edited_template_is_left_out(tmp_path):
    run = _levels_run(tmp_path, "s0", [1] + [0] * 7, [1] * 2 + [0] * 6)
    run.evals[-1]["action_template_share"] = 1.5
    run.evals[-1]["action_template"] = "Down"
    run.evals[0]["seed_successes"] = [1]  # does not fit its 8 seeds: no levels, no change
    seed = table.seed_result(run, 0, _study(metric="eval/frozen-lake/success", tail=1), None)
    assert (seed.end.template_share, seed.end.template, seed.change) == (None, None, None)
    assert seed.start.template_share == 0.0 and seed.end.value == 0.25


def _seed(seed, end):
    m = table.Measured(end)
    return table.SeedResult(seed, 8, m, m, None, None, {}, None, None, None)


def test_a_study_in_progress_judges_each_expectation_on_the_seeds_both_runs_did():
    from ragen.study.status import on_common_seeds

    a = table.row_result("a", "bandit", [_seed(0, 0.6), _seed(1, 0.9)], None, [])
    b = table.row_result("b", "bandit", [_seed(0, 0.5)], None, [])
    assert a.end.mean == pytest.approx(0.75)  # the row shows both of a's seeds
    cut = on_common_seeds(Expectation("a", "b"), {"a": a, "b": b}, [])
    assert [s.seed for s in cut["a"].seeds] == [0] and cut["a"].end.mean == pytest.approx(0.6)
    assert cut["b"] is not b and cut["b"].end.mean == pytest.approx(0.5)
    verdict = table.judge(Expectation("a", "b"), cut)
    assert verdict.difference == pytest.approx(0.1)  # not 0.25: seed 1 is a's alone
    # no seed in common, or a run with none done: not measured
    c = table.row_result("c", "bandit", [_seed(2, 0.1)], None, [])
    none = on_common_seeds(Expectation("c", "b"), {"b": b, "c": c}, [])
    assert table.judge(Expectation("c", "b"), none).outcome == "not measured"
    assert table.judge(Expectation("a", "d"), {"a": a}).outcome == "not measured"


def _started(seed, start, end):
    """A seed evaluated before training (its levels' outcomes recorded) and at its end."""
    levels = {"seeds": 1, "k": 1, "seed_successes": [0]}
    return table.SeedResult(
        seed, 8, table.Measured(start, None, levels), table.Measured(end), None, None, {},
        None, None, None,
    )  # fmt: skip


def test_the_spread_of_a_difference_reads_the_seeds_pairs():
    # seed 0 rose from a low start, seed 1 fell from a high one (regression to the mean):
    # per-seed changes +0.25 and -0.15 spread wider than the starts' and ends' own spreads
    seeds = [_started(0, 0.3, 0.55), _started(1, 0.6, 0.45)]
    a = table.row_result("a", "bandit", seeds, None, [])
    verdict = table.judge(Expectation("a", "a@start"), {"a": a})
    own = math.hypot(statistics.stdev([0.55, 0.45]), statistics.stdev([0.3, 0.6])) / math.sqrt(2)
    pairs = statistics.stdev([0.25, -0.15]) / math.sqrt(2)
    assert verdict.difference == pytest.approx(0.05)
    assert pairs > own and verdict.se == pytest.approx(pairs)  # 0.2 against 0.158
    # two runs that move together on each seed: their own spreads, the wider reading, stand
    b = table.row_result("b", "bandit", [_seed(0, 0.2), _seed(1, 0.6)], None, [])
    c = table.row_result("c", "bandit", [_seed(0, 0.1), _seed(1, 0.5)], None, [])
    together = table.judge(Expectation("b", "c"), {"b": b, "c": c})
    assert together.se == pytest.approx(math.hypot(0.2, 0.2))  # the differences spread 0


def test_a_seed_without_a_value_leaves_its_comparison_unmeasured():
    # seed 1 of a stopped before its final evaluation: the mean of seed 0 alone would say
    # "reproduced" on one seed while the table counts two
    a = table.row_result("a", "bandit", [_seed(0, 0.6), _seed(1, None)], None, [])
    b = table.row_result("b", "bandit", [_seed(0, 0.45), _seed(1, 0.46)], None, [])
    verdict = table.judge(Expectation("a", "b"), {"a": a, "b": b})
    assert verdict.outcome == "not measured: a seed 1 logged no value"
    assert verdict.z is None


def test_runs_of_a_seed_that_started_apart_are_named(tmp_path):
    study = _study(metric="eval/frozen-lake/success", tail=1)
    rows = [
        table.row_result(
            name, "frozen-lake", [_started(0, 0.44, 0.5), _started(1, s1, 0.5)], None, []
        )
        for name, s1 in (("ppo", 0.492), ("grpo", 0.496), ("gigpo", 0.496))
    ]
    text = table.table_markdown(study, "cpu", rows, [])
    assert (
        "- Seed 1: the runs' evaluations before training differ (ppo 0.492; grpo, gigpo "
        "0.496): they did not start from the same policy under the same settings."
    ) in text
    assert "Seed 0:" not in text
