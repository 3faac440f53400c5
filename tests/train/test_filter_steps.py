"""The rollout filter in training steps on the tiny model: what it reads of the episodes, the
advantage weights it hands the update, and the empty steps that stop a run."""

import json

import pytest
import torch
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen import config
from ragen.algos import sampled_entropy
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import create_run_dir
from ragen.train import checkpoint
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

SMALL = [*TINY_RL, NO_TENSORBOARD]


class ConstantReturns(Trainer):
    """Every episode returns -0.1: no group's returns vary, so a filter by reward_variance
    with filter_include_zero=false keeps none."""

    def collect(self, step):
        episodes = super().collect(step)
        for episode in episodes:
            for turn in episode.turns:
                turn.reward = 0.0
            episode.turns[-1].reward = -0.1
        return episodes


def _trainer(*overrides, cls=Trainer):
    return cls(config.load("sokoban-rl", [*SMALL, *overrides]))


def _group_means(episodes, value):
    groups: dict[int, list[float]] = {}
    for episode in episodes:
        groups.setdefault(episode.group, []).append(value(episode))
    return {g: sum(v) / len(v) for g, v in groups.items()}


@pytest.mark.parametrize(
    ("metric", "value"),
    [
        ("length", lambda t: float(sum(t.loss_mask))),
        (
            "entropy",
            lambda t: float(sampled_entropy(torch.tensor(t.logprobs), torch.tensor(t.loss_mask))),
        ),
    ],
)
def test_the_filter_scores_groups_by_what_their_episodes_hold(metric, value):
    trainer = _trainer(
        f"algo.filter_metric={metric}", "algo.filter_strategy=top_k_abs"
    )  # filter_k: 2 of the 4 groups
    episodes = trainer.collect(0)
    means = _group_means(episodes, value)
    best = sorted(means, key=lambda g: (-means[g], g))[:2]
    kept, metrics = trainer.filter(episodes)
    assert sorted({t.group for t in kept}) == sorted(best)
    assert metrics["filter/score_mean_all"] == pytest.approx(sum(means.values()) / 4)


def test_loss_scaling_and_soft_reweight_weigh_the_kept_advantages():
    trainer = _trainer(
        "algo.estimator=grpo",
        "algo.filter_ratio=0.5",
        "algo.filter_loss_scaling=linear",
        "algo.soft_advantage_reweight=true",
    )
    episodes = trainer.collect(0)
    for episode in episodes:  # group g returns [0, g + 1]: Bessel std (g + 1) / √2
        for turn in episode.turns:
            turn.reward = 0.0
        episode.turns[-1].reward = float(episode.copy * (episode.group + 1))
    kept, _ = trainer.filter(episodes)
    assert sorted({t.group for t in kept}) == [2, 3]  # the two that vary most
    data = trainer.prepare(kept)
    weighted, metrics = trainer.weigh(data, kept)
    # linear: × 2 of 4 groups; soft: g3 2.8284 / (2.8284 + 1e-6) = .99999965,
    # g2 2.1213 / (2.8284 + 1e-6) = .74999974
    by_group = {3: 0.5 * 0.99999965, 2: 0.5 * 0.74999974}
    rows = torch.tensor([by_group[t.group] for t in kept])[:, None]
    assert data.advantages is not None and data.advantages.abs().sum() > 0
    torch.testing.assert_close(weighted.advantages, data.advantages * rows)
    assert metrics["filter/weight_min"] == pytest.approx(0.37499987)
    assert weighted.returns is data.returns  # only the advantages are weighed


def test_empty_steps_in_a_row_stop_the_run_and_resume_counting(tmp_path, capsys):
    overrides = [
        "trainer.steps=6",
        "trainer.save_every=10",
        "algo.filter_strategy=top_p",
        "algo.filter_include_zero=false",
        "algo.filter_empty_stop_steps=2",
    ]
    trainer = _trainer(*overrides, cls=ConstantReturns)
    run = create_run_dir(tmp_path / "run", trainer.config)
    loop = RunLoop(trainer, run)
    loop.train()
    records = read_jsonl(run.metrics).records
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["filter/empty"] == 1 and r["actor/optimizer_steps"] == 0 for r in records)
    assert loop.state.stopped_at == 1
    assert "the filter kept no group 2 steps in a row" in capsys.readouterr().out
    assert checkpoint.complete_checkpoints(run) == [run.checkpoint(2)]
    state = json.loads((run.checkpoint(2) / checkpoint.STATE_FILE).read_text())
    assert state["empty_steps"] == 2
    # resumed, the run still counts the two: its next empty step is the third in a row
    resumed = RunLoop(ConstantReturns(trainer.config), run)
    resumed.resume()
    assert resumed.state.empty_steps == 2
    resumed.train()
    assert [r["step"] for r in read_jsonl(run.metrics).records] == [0, 1, 2]
    assert resumed.state.stopped_at == 2
