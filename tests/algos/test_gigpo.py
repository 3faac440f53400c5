"""GiGPO against hand-computed advantages: REFERENCE's worked example through the whole path
(turns -> collate -> anchor ids -> estimate), its mean_std_norm variant, and the edges."""

from __future__ import annotations

import math

import pytest
import torch

from ragen import config
from ragen import metric_names as names
from ragen.algos import advantages as adv
from ragen.algos.gigpo import ANCHOR_NONE, anchor_ids, discounted_turn_returns, gigpo
from ragen.config import AlgoConfig, ConfigError
from ragen.monitor.metrics import credit_metrics
from ragen.rollout.trajectory import Trajectory, Turn, collate


def _turn(observation: str, reward: float, start: int, stop: int) -> Turn:
    return Turn(
        observation=observation,
        reply="<answer>Right</answer>",
        think="",
        answer="Right",
        actions=["Right"],
        rewards=[reward],
        reward=reward,
        format_ok=True,
        problems=[],
        unknown_actions=0,
        think_tokens=0,
        reply_start=start,
        reply_end=stop,
    )


def _episode(group: int, copy: int, visits: list[tuple[str, float]]) -> Trajectory:
    """An episode of 2 context tokens then, per turn, a 3-token reply and 2 context tokens
    (the last turn's reply ends the row), visiting ``visits`` (state, reward) in order."""
    t = Trajectory(env="frozen-lake", group=group, copy=copy, seed=group)
    t.append([1, 2], sampled=False)
    for n, (state, reward) in enumerate(visits):
        start = len(t.token_ids)
        t.append([10 + n, 11 + n, 12 + n], sampled=True, logprobs=[-0.5] * 3)
        t.turns.append(_turn(state, reward, start, start + 3))
        if n + 1 < len(visits):
            t.append([3, 4], sampled=False)
    return t


def _estimate(trajectories: list[Trajectory], **algo) -> torch.Tensor:
    batch = collate(trajectories, pad_id=0, placement="per_turn")
    anchors = anchor_ids(
        [[turn.anchor_key for turn in t.turns] for t in trajectories],
        [t.group for t in trajectories],
        algo.pop("gigpo_similarity", None),
    )
    advantages, returns = adv.estimate(
        "gigpo",
        rewards=batch.rewards,
        mask=batch.loss_mask,
        scores=batch.scores,
        group_ids=batch.group_ids,
        turn_ids=batch.turn_ids,
        anchor_ids=anchors,
        coefs=adv.Coefficients.of(AlgoConfig(**algo)),
    )
    torch.testing.assert_close(returns, advantages)
    return advantages


def _per_turn(advantages: torch.Tensor, trajectories: list[Trajectory]) -> list[float]:
    """Each turn's advantage, episode by episode, read off its reply tokens (asserting they
    all carry it) and every other token's (asserting it is 0)."""
    out = []
    for row, t in zip(advantages, trajectories, strict=True):
        seen = torch.zeros_like(row, dtype=torch.bool)
        turns = []
        for turn in t.turns:
            values = row[turn.reply_start : turn.reply_end]
            assert torch.all(values == values[0])
            seen[turn.reply_start : turn.reply_end] = True
            turns.append(float(values[0]))
        assert not row[~seen].any()
        out += turns
    return out


# A visits s0, s1 with rewards [0, 1]; B visits s0, s2, s1 with [0, 0, 0] (REFERENCE.md)
WORKED = [
    _episode(0, 0, [("s0", 0.0), ("s1", 1.0)]),
    _episode(0, 1, [("s0", 0.0), ("s2", 0.0), ("s1", 0.0)]),
]


def test_the_worked_example_mean_norm():
    got = _per_turn(_estimate(WORKED, gigpo_gamma=0.95), WORKED)
    assert got == pytest.approx([1.075, 1.1, -0.875, -0.4, -0.9], abs=1e-6)


def test_the_worked_example_mean_std_norm():
    got = _per_turn(_estimate(WORKED, gigpo_gamma=0.95, gigpo_mode="mean_std_norm"), WORKED)
    # episode: step scores [1, 1, 0, 0, 0], mean 0.4, unbiased std sqrt(0.3);
    # anchors s0 {0.95, 0} and s1 {1, 0}: each +-1/sqrt(2) of its std; s2 alone: 0
    eps = 1e-6
    a_e = 0.6 / (math.sqrt(0.3) + eps)
    b_e = -0.4 / (math.sqrt(0.3) + eps)
    s0 = 0.475 / (0.475 * math.sqrt(2) + eps)
    s1 = 0.5 / (0.5 * math.sqrt(2) + eps)
    want = [a_e + s0, a_e + s1, b_e - s0, b_e, b_e - s1]
    assert got == pytest.approx(want, abs=1e-6)


def test_the_step_weight_scales_only_the_step_term():
    got = _per_turn(_estimate(WORKED, gigpo_gamma=0.95, gigpo_step_weight=0.0), WORKED)
    assert got == pytest.approx([0.6, 0.6, -0.4, -0.4, -0.4], abs=1e-6)  # grpo-like
    got = _per_turn(_estimate(WORKED, gigpo_gamma=0.95, gigpo_step_weight=2.0), WORKED)
    assert got == pytest.approx([1.55, 1.6, -1.35, -0.4, -1.4], abs=1e-6)


def test_credit_metrics_of_the_worked_example():
    # anchors s0 {A, B} and s1 {A, B} pair 4 of the 5 turns; s2 holds B's alone: 3 groups.
    # |A_E|: 0.6 on A's 2 turns, 0.4 on B's 3; |A_S|: 0.475 twice (s0), 0.5 twice (s1), 0
    got = credit_metrics(WORKED, gamma=0.95, step_weight=2.0, norm_by_std=False)
    assert got == pytest.approx(
        {
            names.GIGPO_ANCHORED_SHARE: 4 / 5,
            names.GIGPO_TURNS_PER_ANCHOR: 5 / 3,
            names.GIGPO_EPISODE_ADV: (2 * 0.6 + 3 * 0.4) / 5,
            names.GIGPO_STEP_ADV: 2.0 * (2 * 0.475 + 2 * 0.5) / 5,
        }
    )
    lone = [_episode(0, 0, [("x", 1.0), ("y", 0.0)]), _episode(1, 0, [("x", 0.0)])]
    got = credit_metrics(lone, gamma=0.95, step_weight=1.0, norm_by_std=False)
    assert got[names.GIGPO_ANCHORED_SHARE] == 0.0 and got[names.GIGPO_STEP_ADV] == 0.0
    assert got[names.GIGPO_TURNS_PER_ANCHOR] == 1.0
    assert credit_metrics([], gamma=0.95, step_weight=1.0, norm_by_std=False) == {}


def test_groups_and_anchor_groups_of_one_sample_give_zero():
    lone = [_episode(3, 0, [("x", 1.0)])]  # one episode of one turn: nothing to compare
    assert _per_turn(_estimate(lone), lone) == [0.0]
    # two groups that visit the same state text never share an anchor group
    split = [_episode(0, 0, [("s", 1.0)]), _episode(1, 0, [("s", 0.0)])]
    assert _per_turn(_estimate(split), split) == [0.0, 0.0]


def test_step_returns_are_discounted_within_each_episode():
    rewards = torch.tensor([[1.0, 2.0, 4.0], [3.0, 5.0, 7.0]])
    valid = torch.tensor([[True, True, True], [True, False, False]])
    got = discounted_turn_returns(rewards, valid, 0.5)
    torch.testing.assert_close(got, torch.tensor([[3.0, 4.0, 4.0], [3.0, 0.0, 0.0]]))
    no_turns = discounted_turn_returns(torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.bool), 0.9)
    assert no_turns.shape == (3, 0)


def test_anchor_ids_exact_and_by_similarity():
    texts = [["abcdefghij", "abcdefghiX"], ["abcdefghiX", "zzzz"], ["abcdefghij"]]
    groups = [0, 0, 1]
    exact = anchor_ids(texts, groups)
    assert exact.tolist() == [[0, 1], [1, 2], [0, ANCHOR_NONE]]
    # ratio("abcdefghiX", "abcdefghij") = 0.9: one cluster at 0.85, two at 0.95
    assert anchor_ids(texts, groups, 0.85).tolist() == [[0, 0], [0, 1], [0, ANCHOR_NONE]]
    assert anchor_ids(texts, groups, 0.95).tolist() == exact.tolist()


def test_gigpo_direct_call_matches_the_estimator():
    got = gigpo(
        scores=torch.tensor([1.0, 0.0]),
        turn_rewards=torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]),
        turn_valid=torch.tensor([[True, True, False], [True, True, True]]),
        anchor_ids=torch.tensor([[0, 1, -1], [0, 2, 1]]),
        group_ids=torch.tensor([7, 7]),
        gamma=0.95,
        step_weight=1.0,
        norm_by_std=False,
    )
    want = torch.tensor([[1.075, 1.1, 0.0], [-0.875, -0.4, -0.9]], dtype=torch.float64)
    torch.testing.assert_close(got, want)


def test_turns_counted_from_the_mask_match_the_collated_turn_ids():
    batch = collate(WORKED, pad_id=0, placement="per_turn")
    torch.testing.assert_close(adv.turn_numbers(batch.loss_mask), batch.turn_ids)
    assert batch.turn_ids[1].tolist() == [-1, -1, 0, 0, 0, -1, -1, 1, 1, 1, -1, -1, 2, 2, 2]


def test_gigpo_without_anchor_ids_names_what_it_needs():
    batch = collate(WORKED, pad_id=0, placement="per_turn")
    with pytest.raises(ValueError, match="needs anchor_ids"):
        adv.estimate(
            "gigpo",
            rewards=batch.rewards,
            mask=batch.loss_mask,
            scores=batch.scores,
            group_ids=batch.group_ids,
            coefs=adv.Coefficients.of(AlgoConfig()),
        )


def test_an_estimator_written_before_anchor_ids_still_runs():
    def old(*, rewards, mask, values, scores, group_ids, turn_ids, coefs):
        return rewards * mask, rewards * mask

    batch = collate(WORKED, pad_id=0, placement="per_turn")
    adv.ESTIMATORS["old_style"] = old
    try:
        a, _ = adv.estimate(
            "old_style",
            rewards=batch.rewards,
            mask=batch.loss_mask,
            anchor_ids=torch.zeros(2, 3, dtype=torch.long),
            coefs=adv.Coefficients.of(AlgoConfig()),
        )
    finally:
        del adv.ESTIMATORS["old_style"]
    assert float(a.sum()) == 1.0


def test_the_config_asks_for_per_turn_rewards_and_groups():
    with pytest.raises(ConfigError, match=r"set rollout\.reward_placement=per_turn"):
        config.load("frozen-lake-rl", ["algo.estimator=gigpo"])
    with pytest.raises(ConfigError, match="group_size >= 2"):
        config.load(
            "frozen-lake-rl",
            ["algo.estimator=gigpo", "rollout.reward_placement=per_turn", "rollout.group_size=1"],
        )
    c = config.load(
        "frozen-lake-rl",
        ["algo.estimator=gigpo", "rollout.reward_placement=per_turn", "algo.gigpo_similarity=0.9"],
    )
    assert not c.algo.trains_critic() and not c.algo.whitens()
    with pytest.raises(ConfigError, match="gigpo_similarity"):
        config.load("frozen-lake-rl", ["algo.gigpo_similarity=1.0"])
