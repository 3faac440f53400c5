"""Reports: files that open as images, plotted data equal to metrics.jsonl, summary numbers
for hand-built runs, and one report on a real tiny run."""

import argparse

import matplotlib.image
import pytest
from tests.monitor import streams
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen.monitor.collapse import Alert, MonitorConfig, replay
from ragen.report import command
from ragen.report.curves import PLOTS, ema, plot_data
from ragen.report.figures import draw
from ragen.report.runs import load_run
from ragen.report.summary import (
    RunSummary,
    difference_z,
    story,
    summarize_run,
    summary_markdown,
)
from ragen.report.write import write_report
from ragen.run.jsonl import append_jsonl
from ragen.run.rundir import RunDir


def _run(tmp_path, name, records, alerts=None, torn=False):
    run = RunDir(tmp_path / name)
    append_jsonl(run.metrics, records)
    if torn:  # a run killed mid-write
        with open(run.metrics, "a") as fh:
            fh.write('{"step": 99, "rollout/rew')
    if alerts is not None:
        append_jsonl(run.alerts, [a.to_record() for a in alerts])
    return run


def _hand_records():
    records = [
        {"step": s, "rollout/success": 0.1 * (s % 3), "rollout/reward_mean": s / 10}
        for s in range(15)
    ]
    for step, value in ((4, 0.1), (9, 0.5), (14, 0.3)):
        records[step]["eval/sokoban/success"] = value
    records[7]["rollout/reward_mean"] = float("nan")  # written as null: left out
    return records


HAND_ALERTS = [
    Alert(5, "warning", "rollout/reward_std", 0.1, 0.3, "std fell"),
    Alert(8, "warning", "actor/entropy", 0.4, 1.0, "entropy fell"),
    Alert(12, "collapse", "rollout/reward_mean", 0.2, 0.6, "reward fell"),
]


def test_ema_by_hand():
    assert ema([0, 1], [1.0, 3.0], 0.5) == pytest.approx([1.0, 1.75 / 0.75])
    # two steps apart: the new point weighs 1 - 0.5**2 = 0.75
    assert ema([0, 2], [1.0, 3.0], 0.5) == pytest.approx([1.0, 2.375 / 0.875])
    assert ema([3, 4, 5], [2.0, 5.0, 7.0], 1.0) == [2.0, 5.0, 7.0]


def test_summary_numbers_of_a_hand_built_run(tmp_path):
    run = _run(tmp_path, "hand", _hand_records(), HAND_ALERTS, torn=True)
    data = load_run(run.root)
    assert data.alerts == HAND_ALERTS and data.alerts_source == "alerts.jsonl"
    assert data.skipped_lines == 1 and len(data.records) == 15
    [row] = summarize_run(data)
    # no evaluation before training: the first one (after step 4) is not the base
    assert (row.success_of, row.before, row.peak, row.peak_step, row.final) == (
        "sokoban",
        None,
        0.5,
        9,
        0.3,
    )
    assert (row.collapse_step, row.warning_step, row.lead_time) == (12, 5, 7)
    text = summary_markdown([data])
    assert "| hand | sokoban | — | 0.500 (9) | 0.300 | 12 | 5 | 7 |" in text
    assert "1 torn line(s) skipped" in text


def test_summary_without_evaluation_or_alerts(tmp_path):
    records = [{"step": s, "rollout/success": [0.2, 0.6, 0.4][s]} for s in range(3)]
    run = _run(tmp_path, "plain", records)
    data = load_run(run.root)
    no_config = f"default settings: {run.root} has no config.yaml"
    assert data.alerts == [] and data.alerts_source == f"replayed, {no_config}"
    [row] = summarize_run(data)
    assert (row.success_of, row.before, row.peak, row.final) == ("train rollouts", 0.2, 0.6, 0.4)
    assert row.collapse_step is None and row.lead_time is None
    assert "| plain | train rollouts | 0.200 | 0.600 (1) | 0.400 | — | — | — |" in (
        summary_markdown([data])
    )


def test_the_summary_names_the_steps_and_evaluations_free_memory_cut(tmp_path):
    records = [
        {"step": s, "rollout/success": 0.5, "perf/memory_cuts": [0, 2, 0, 1][s]} for s in range(4)
    ]
    run = _run(tmp_path, "short", records)
    cost = {"prefill_s": 1.0, "memory_cuts": 3}
    append_jsonl(run.evals, [{"step": 3, "env": "sokoban", "success": 0.5, "cost": cost}])
    text = summary_markdown([load_run(run.root)])
    assert "free memory cut the decode batches of 2 step(s) and 1 evaluation(s)" in text
    calm = _run(tmp_path, "calm", [{"step": 0, "rollout/success": 0.5, "perf/memory_cuts": 0}])
    assert "free memory" not in summary_markdown([load_run(calm.root)])


def test_the_summary_names_the_steps_whose_update_free_memory_cut(tmp_path):
    records = [
        {"step": s, "rollout/success": 0.5, "perf/update_memory_cuts": [2, 0, 1][s]}
        for s in range(3)
    ]
    text = summary_markdown([load_run(_run(tmp_path, "short", records).root)])
    assert "; free memory cut the update's micro-batches of 2 step(s)" in text
    assert "decode batches" not in text


def test_a_warning_after_the_collapse_has_no_lead_time():
    row = RunSummary("r", "x", None, None, None, None, collapse_step=5, warning_step=9)
    assert row.lead_time is None


def test_plotted_lines_are_the_metrics(tmp_path):
    records = _hand_records()
    data = load_run(_run(tmp_path, "hand", records, HAND_ALERTS).root)
    panels = plot_data([data])["reward"]
    [curve] = panels["reward mean"]
    assert curve.steps == [s for s in range(15) if s != 7]
    assert curve.raw == [records[s]["rollout/reward_mean"] for s in curve.steps]
    assert curve.smooth == pytest.approx(ema(curve.steps, curve.raw, 0.1))
    assert "in-group reward std" not in panels  # not logged: no empty panel
    plot = next(p for p in PLOTS if p.name == "reward")
    fig = draw(plot, panels, [data])
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()}
    raw = lines["hand|rollout/reward_mean|raw"].get_xydata()
    assert raw[:, 0].tolist() == curve.steps and raw[:, 1].tolist() == curve.raw
    smooth = lines["hand|rollout/reward_mean|smooth"]
    assert smooth.get_ydata().tolist() == curve.smooth and smooth.get_label() == "hand"
    # the alerts: a vertical line at each alert step, one legend entry per kind
    verticals = sorted(
        line.get_xdata()[0]
        for line in fig.axes[0].get_lines()
        if line.get_gid() is None
        if len(line.get_xdata()) == 2
    )
    assert verticals == [5, 8, 12]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["hand", "warning", "collapse"]


def test_eval_points_are_drawn_unsmoothed(tmp_path):
    data = load_run(_run(tmp_path, "hand", _hand_records(), []).root)
    [curve] = plot_data([data])["success"]["evaluation (fixed seeds)"]
    assert curve.key == "eval/sokoban/success"
    assert curve.steps == [4, 9, 14] and curve.smooth == curve.raw == [0.1, 0.5, 0.3]


def test_report_overlays_runs_and_writes_images(tmp_path):
    healthy = _run(tmp_path, "starpo-s", streams.healthy(0, steps=60))
    collapsing = _run(tmp_path, "starpo", streams.collapsing(1))
    out = tmp_path / "out"
    written = write_report([healthy.root, collapsing.root], out)
    names = sorted(p.name for p in written.files)
    assert names == sorted(
        ["success.png", "reward.png", "entropy.png", "grad_norm.png", "diversity.png", "summary.md"]
    )  # no reply or think lengths were logged: no length.png
    for path in written.files:
        if path.suffix == ".png":
            image = matplotlib.image.imread(path)
            assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    summary = (out / "summary.md").read_text()
    assert "| starpo-s | train rollouts |" in summary and "| starpo | train rollouts |" in summary
    collapse_row = next(line for line in summary.splitlines() if line.startswith("| starpo |"))
    assert "| — |" not in collapse_row.split("|", 6)[-1]  # collapse, warning and lead time
    data = plot_data([load_run(healthy.root), load_run(collapsing.root)])
    plot = next(p for p in PLOTS if p.name == "entropy")
    fig = draw(plot, data["entropy"], [load_run(healthy.root), load_run(collapsing.root)])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:2] == ["starpo-s", "starpo"]


def test_same_named_runs_are_told_apart(tmp_path):
    a = _run(tmp_path / "a", "seed0", streams.healthy(0, steps=20))
    b = _run(tmp_path / "b", "seed0", streams.healthy(1, steps=20))
    write_report([a.root, b.root], tmp_path / "out")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| a/seed0 |" in summary and "| b/seed0 |" in summary


def test_report_on_a_real_tiny_run(tmp_path):
    from ragen import config
    from ragen.run.rundir import create_run_dir
    from ragen.train.loop import RunLoop
    from ragen.train.trainer import Trainer

    cfg = config.load(
        "bandit",  # single-turn and critic-free: the cheapest real run
        [
            *TINY_RL,
            NO_TENSORBOARD,
            "algo.estimator=grpo",
            "trainer.steps=3",
            "trainer.eval_every=2",
            "trainer.eval_episodes=2",
            "trainer.eval_before=true",
            "trainer.gradient_analysis_every=2",
        ],
    )
    run = create_run_dir(tmp_path / "tiny-run", cfg)
    RunLoop(Trainer(cfg), run).train()
    written = write_report([run.root], tmp_path / "out")
    names = {p.name for p in written.files}
    assert {"success.png", "reward.png", "entropy.png", "grad_norm.png", "length.png"} <= names
    assert "grad_buckets.png" in names
    [curve, *_] = plot_data([load_run(run.root)])["grad_buckets"]["entropy term"]
    assert curve.key == "grad_norm/all/entropy" and curve.steps == [0, 2]
    data = load_run(run.root)
    # eval.jsonl: each env before training (step -1), after step 1 and after the last, 2
    evaluated = [(e["step"], e["env"]) for e in data.evals]
    assert evaluated == [(s, env) for s in (-1, 1, 2) for env in cfg.env.eval_names]
    rows = summarize_run(data)
    assert [r.success_of for r in rows] == cfg.env.eval_names
    for row in rows:
        mine = [e["success"] for e in data.evals if e["env"] == row.success_of]
        [curve] = [
            c
            for c in plot_data([data])["success"]["evaluation (fixed seeds)"]
            if c.key == f"eval/{row.success_of}/success"
        ]
        assert curve.steps == [-1, 1, 2] and curve.raw == mine
        assert (row.before, row.final) == (mine[0], mine[-1])
    assert data.steps == 3
    [curve] = plot_data([data])["entropy"]["entropy (nats)"]
    assert curve.steps == [0, 1, 2]
    assert curve.raw == [r["actor/entropy"] for r in data.records if r["step"] >= 0]
    assert written.story[0].startswith(f"{cfg.env.eval_names[0]}: ")
    assert "before training" in written.story[0] and written.story[0].endswith(
        "The collapse monitor raised no alert."
    )


def _args(add, argv):
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(argv)


def test_report_can_replay_alerts_with_other_detector_settings(tmp_path):
    records = streams.collapsing(0)
    run = _run(tmp_path, "r", records, alerts=HAND_ALERTS)
    assert load_run(run.root).alerts == HAND_ALERTS  # the run's own alerts.jsonl
    replayed = load_run(run.root, replay_with=["std_drop=0.99"])
    assert replayed.alerts == replay(records, MonitorConfig(std_drop=0.99))
    no_config = f"default settings: {run.root} has no config.yaml"
    assert replayed.alerts_source == f"replayed, {no_config} + std_drop=0.99"
    out = tmp_path / "out"
    args = _args(
        command.add_arguments, [str(run.root), "--out", str(out), "--replay", "std_drop=0.99"]
    )
    assert command.run(args) == 0
    assert f"(replayed, {no_config} + std_drop=0.99)" in (out / "summary.md").read_text()


def _evals(run, records):
    append_jsonl(run.evals, records)


def test_the_story_sets_the_trained_policy_beside_the_base(tmp_path):
    records = [{"step": s, "rollout/success": 0.5} for s in range(20)]
    records[19].update({"eval/bandit/success": 1.0, "eval/bandit-test/success": 0.3125})
    run = _run(tmp_path, "demo", records, alerts=[])
    _evals(
        run,
        [
            {"step": -1, "env": "bandit", "success": 0.5, "episodes": 128},
            {"step": 19, "env": "bandit", "success": 1.0, "episodes": 128},
            {"step": -1, "env": "bandit-test", "success": 0.25, "episodes": 64},
            {"step": 19, "env": "bandit-test", "success": 0.3125, "episodes": 64},
        ],
    )
    data = load_run(run.root)
    assert data.records[0] == {
        "step": -1,
        "eval/bandit/success": 0.5,
        "eval/bandit-test/success": 0.25,
    }
    assert data.steps == 20
    # SE of the difference: sqrt(0.5 * 0.5 / 128 + 0) = 0.0442, so +50 points is 11.3 SE;
    # sqrt(0.25 * 0.75 / 64 + 0.3125 * 0.6875 / 64) = 0.0798: +6.25 points is 0.8 SE
    assert story([data]) == [
        "bandit: 50.0% before training, 100.0% after step 19 (+50.0 points, +11.3 SE on 128 "
        "episodes): a gain beyond the noise. bandit-test: 25.0% before training, 31.2% after "
        "step 19 (+6.2 points, +0.8 SE on 64 episodes): within the noise (under 2 standard "
        "errors). The collapse monitor raised no alert."
    ]
    [bandit, test] = summarize_run(data)
    assert (bandit.before, bandit.final, test.before, test.final) == (0.5, 1.0, 0.25, 0.3125)
    assert summary_markdown([data]).startswith("# Run summary\n\n" + story([data])[0])


def test_the_story_tells_a_collapse_and_a_missing_base(tmp_path):
    run = _run(tmp_path, "hand", _hand_records(), HAND_ALERTS)
    _evals(run, [{"step": 14, "env": "sokoban", "success": 0.3, "episodes": 16}])
    assert story([load_run(run.root)]) == [
        "sokoban: 30.0% after step 14; no evaluation before training to set it beside "
        "(trainer.eval_before=true makes one). The collapse monitor warned first at step 5 "
        "(rollout/reward_std: std fell) and saw a collapse at step 12 (rollout/reward_mean: "
        "reward fell)."
    ]


def test_the_story_reads_the_levels_pair_by_pair_where_the_evaluations_hold_them(tmp_path):
    records = [{"step": s, "rollout/success": 0.5} for s in range(4)]
    run = _run(tmp_path, "paired", records, alerts=[])
    before = [1, 1, 0, 0, 0, 0, 0, 0]  # 2 of 8
    after = [1, 1, 1, 1, 1, 0, 0, 0]  # 5 of 8: 3 levels gained, none lost
    _evals(
        run,
        [
            {
                "step": -1,
                "env": "bandit",
                "success": 0.25,
                "episodes": 8,
                "seeds": 8,
                "k": 1,
                "seed_successes": before,
            },
            {
                "step": 3,
                "env": "bandit",
                "success": 0.625,
                "episodes": 8,
                "seeds": 8,
                "k": 1,
                "seed_successes": after,
            },
        ],
    )
    # per-level changes: three 1s and five 0s; mean 3/8, sample variance (3 - 8 * 9/64) / 7
    # = 15/56, SE sqrt(15/56/8) = 0.183: 2.0 SE, where two independent rates read 1.6
    assert story([load_run(run.root)]) == [
        "bandit: 25.0% before training, 62.5% after step 3 (+37.5 points, +2.0 SE level by "
        "level on 8 levels: 3 gained, 0 lost): a gain beyond the noise. The collapse monitor "
        "raised no alert."
    ]


def test_difference_z_by_hand():
    half, all_ = {"success": 0.5, "episodes": 100}, {"success": 1.0, "episodes": 100}
    assert difference_z(half, all_) == pytest.approx(0.5 / 0.05)
    assert difference_z(all_, half) == pytest.approx(-10.0)
    none = {"success": 0.0, "episodes": 10}
    assert difference_z(none, none) == 0.0
    assert difference_z(none, {"success": 1.0, "episodes": 10}) == float("inf")


def test_endings_plot_the_share_and_the_return_of_each_way_episodes_ended(tmp_path):
    # steps 0-1: some replies cut (paying -0.1 against -1.0 for playing the budget out)
    records = [
        {"step": 0, "rollout/end_truncated_reply_length": 0.25, "rollout/end_terminated": 0.0,
         "rollout/return_end_truncated_reply_length": -0.1, "rollout/end_truncated_actions": 0.75,
         "rollout/return_end_truncated_actions": -1.0},
        {"step": 1, "rollout/end_truncated_reply_length": 0.5, "rollout/end_terminated": 0.0,
         "rollout/return_end_truncated_reply_length": -0.2, "rollout/end_truncated_actions": 0.5,
         "rollout/return_end_truncated_actions": -0.9},
    ]  # fmt: skip
    data = load_run(_run(tmp_path, "cut", records).root)
    panels = plot_data([data])["endings"]
    shares = {c.key: c.raw for c in panels["share of episodes"]}
    assert shares == {
        "rollout/end_truncated_reply_length": [0.25, 0.5],
        "rollout/end_terminated": [0.0, 0.0],
        "rollout/end_truncated_actions": [0.75, 0.5],
    }
    returns = {c.key: c.raw for c in panels["mean return of those episodes"]}
    assert returns["rollout/return_end_truncated_reply_length"] == [-0.1, -0.2]
    plot = next(p for p in PLOTS if p.name == "endings")
    fig = draw(plot, panels, [data])
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert legend == ["cut · truncated_reply_length", "cut · truncated_actions"]


def test_bucket_norms_plot_one_line_per_bucket_and_term(tmp_path):
    # the gradient reporter every 5 steps: two buckets and all, a loss without KL or critic
    records = [
        {"step": s, **{f"grad_norm/{b}/{t}": (k + 1) * (s + 1) * scale
                       for k, b in enumerate(("all", "bucket_1", "bucket_2"))
                       for t, scale in (("task", 1.0), ("entropy", 1e-3))}}
        for s in (0, 5, 10)
    ]  # fmt: skip
    records += [{"step": s, "rollout/success": 0.0} for s in (1, 2, 3)]
    data = load_run(_run(tmp_path, "probe", records).root)
    panels = plot_data([data])["grad_buckets"]
    assert list(panels) == ["task (policy loss)", "entropy term"]  # no KL, no value loss
    curves = panels["entropy term"]
    assert [c.key for c in curves] == [f"grad_norm/{b}/entropy" for b in ("all", "bucket_1",
                                                                           "bucket_2")]  # fmt: skip
    assert curves[2].steps == [0, 5, 10]
    assert curves[2].raw == curves[2].smooth == pytest.approx([3e-3, 18e-3, 33e-3])
    plot = next(p for p in PLOTS if p.name == "grad_buckets")
    fig = draw(plot, panels, [data])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["probe · all", "probe · bucket_1", "probe · bucket_2"]
    colours = {line.get_gid(): line.get_color() for line in fig.axes[0].get_lines()}
    assert len({colours[f"probe|grad_norm/{b}/task|smooth"] for b in ("all", "bucket_1")}) == 2
    assert fig.axes[0].get_yscale() == "log"


def test_evaluation_folders_are_read_and_their_levels_set_side_by_side(tmp_path, capsys):
    # Two `ragen eval` folders of the same four levels: a local model and one over an API.
    def folder(name, successes, **more):
        run = RunDir(tmp_path / name)
        summary = {"env": "sokoban", "success": sum(successes) / 4, "episodes": 4, "seeds": 4}
        append_jsonl(run.evals, [{**summary, "k": 1, "seed_successes": successes, **more}])
        return run.root

    local = folder("local", [1, 0, 1, 0], model="smollm2-135m")
    api = {"base_url": "http://127.0.0.1:8080/v1", "prefill": False}
    remote = folder("remote", [1, 1, 0, 0], model="smollm2", api=api)
    runs = [load_run(local), load_run(remote)]
    assert [r.evaluation for r in runs] == [True, True]
    # levels 1 and 4 agree; the API run gained level 2 and lost level 3: per-level changes
    # 0, +1, -1, 0 have mean 0, so 0.0 SE
    assert story(runs) == [
        "local: sokoban: success 50.0% of 4 episodes by smollm2-135m.",
        "remote: sokoban: success 50.0% of 4 episodes by smollm2 over the API at "
        "http://127.0.0.1:8080/v1 (no reply prefix).",
        "remote against local on sokoban: they agree on the success of 2 of 4 levels; "
        "1 gained, 1 lost (+0.0 SE level by level).",
    ]
    [row] = summarize_run(runs[1])
    assert (row.success_of, row.before, row.final) == ("sokoban", None, 0.5)
    args = argparse.Namespace(
        run_dirs=[str(local), str(remote)], out=str(tmp_path / "r"), smoothing=0.1, replay=None
    )
    assert command.run(args) == 0
    markdown = (tmp_path / "r" / "summary.md").read_text()
    assert "| remote | sokoban | — | — | 0.500 |" in markdown
    assert "- local: an evaluation folder (no training, no alerts)" in markdown
    assert "agree on the success of 2 of 4 levels" in capsys.readouterr().out


def test_a_gigpo_run_plots_its_anchor_groups_and_both_terms(tmp_path):
    records = [
        {"step": s, "rollout/success": 0.1 * s, "gigpo/anchored_share": 0.5 + 0.1 * s,
         "gigpo/episode_adv_abs": 0.4, "gigpo/step_adv_abs": 0.1 * (s + 1)}
        for s in (0, 1, 2)
    ]  # fmt: skip
    data = load_run(_run(tmp_path, "gigpo", records).root)
    panels = plot_data([data])["credit"]
    assert list(panels) == [
        "turns sharing their state with another",
        "mean |advantage| of each term",
    ]
    terms = panels["mean |advantage| of each term"]
    assert [c.key for c in terms] == ["gigpo/episode_adv_abs", "gigpo/step_adv_abs"]
    assert terms[1].raw == pytest.approx([0.1, 0.2, 0.3])
    fig = draw(next(p for p in PLOTS if p.name == "credit"), panels, [data])
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert legend == ["gigpo · episode term", "gigpo · step term × w"]
    plain = load_run(_run(tmp_path, "ppo", [{"step": 0, "rollout/success": 0.0}]).root)
    assert "credit" not in plot_data([plain])  # no gigpo metrics: no credit.png
