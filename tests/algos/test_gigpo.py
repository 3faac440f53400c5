"""GiGPO against hand-computed advantages: REFERENCE's worked example through the whole path
(turns -> collate -> anchor ids -> estimate), its mean_std_norm variant, and the edges."""

from __future__ import annotations

import math

import pytest
import torch

from ragen import config
from ragen import metric_names as names
from ragen.algos import advantages as adv
from ragen.algos.gigpo import ANCHOR_NONE, anchor_ids, discounted_turn_returns, gigpo, per_turn
from ragen.config import AlgoConfig, ConfigError
from ragen.monitor.metrics import credit_metrics
from ragen.rollout.trajectory import Trajectory, Turn, collate


def _turn(observation: str, reward: float, start: int, stop: int, penalty: float = 0.0) -> Turn:
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
        terms={"env": reward - penalty, "format": penalty},
    )


def _episode(
    group: int,
    copy: int,
    visits: list[tuple[str, float]],
    penalties: dict[int, float] | None = None,
) -> Trajectory:
    """An episode of 2 context tokens then, per turn, a 3-token reply and 2 context tokens
    (the last turn's reply ends the row), visiting ``visits`` (state, reward) in order; turn
    ``n`` of ``penalties`` also carries that format penalty inside its reward."""
    t = Trajectory(env="frozen-lake", group=group, copy=copy, seed=group)
    t.append([1, 2], sampled=False)
    for n, (state, reward) in enumerate(visits):
        start = len(t.token_ids)
        t.append([10 + n, 11 + n, 12 + n], sampled=True, logprobs=[-0.5] * 3)
        penalty = (penalties or {}).get(n, 0.0)
        t.turns.append(_turn(state, reward + penalty, start, start + 3, penalty))
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
        turn_penalties=per_turn([[turn.penalty for turn in t.turns] for t in trajectories]),
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


# A visits s0, s1, s1 with env rewards [0, 0, 1], its turn 1 ran no action (format penalty
# -0.1 inside that turn's reward); B visits s0, s1 with [0, 0]
PENALISED = [
    _episode(0, 0, [("s0", 0.0), ("s1", 0.0), ("s1", 1.0)], penalties={1: -0.1}),
    _episode(0, 1, [("s0", 0.0), ("s1", 0.0)]),
]


def test_an_invalid_action_deducts_from_its_own_turn_alone():
    # verl-agent's rule. Step scores: A's 1, 1 - 0.1, 1, B's 0, 0 (mean 0.58): A_E 0.42,
    # 0.32, 0.42 and -0.58 twice. Returns from the env rewards: A 0.9025, 0.95, 1 and B 0,
    # 0; A's turn 1 then loses 0.1: 0.85. Anchor s0 {0.9025, 0}: +-0.45125; s1 {0.85, 1, 0}
    # (mean 0.61667): 0.23333, 0.38333, -0.61667.
    got = _per_turn(_estimate(PENALISED, gigpo_gamma=0.95), PENALISED)
    want = [0.87125, 0.32 + 0.85 - 1.85 / 3, 0.42 + 1 - 1.85 / 3, -1.03125, -0.58 - 1.85 / 3]
    assert got == pytest.approx(want, abs=1e-6)
    assert want == pytest.approx([0.87125, 0.55333, 0.80333, -1.03125, -1.19667], abs=1e-5)


def test_credit_metrics_read_the_penalty_as_the_estimator_does():
    # |A_E| over the 5 turns: (0.42 + 0.32 + 0.42 + 2 * 0.58) / 5; |A_S| as above
    got = credit_metrics(PENALISED, gamma=0.95, step_weight=1.0, norm_by_std=False)
    step = 2 * 0.45125 + abs(0.85 - 1.85 / 3) + abs(1 - 1.85 / 3) + 1.85 / 3
    assert got[names.GIGPO_EPISODE_ADV] == pytest.approx(2.32 / 5)
    assert got[names.GIGPO_STEP_ADV] == pytest.approx(step / 5)


def test_without_turn_penalties_the_penalty_counts_as_reward():
    # a direct call that sets no deduction apart: A's scores 0.9 on each turn (mean 0.54),
    # returns from [0, -0.1, 1]: 0.8075, 0.85, 1
    got = gigpo(
        scores=torch.tensor([0.9, 0.0]),
        turn_rewards=torch.tensor([[0.0, -0.1, 1.0], [0.0, 0.0, 0.0]]),
        turn_valid=torch.tensor([[True, True, True], [True, True, False]]),
        anchor_ids=torch.tensor([[0, 1, 1], [0, 1, -1]]),
        group_ids=torch.tensor([0, 0]),
        gamma=0.95,
        step_weight=1.0,
        norm_by_std=False,
    )
    s1 = (0.85 + 1.0) / 3
    want = [[0.36 + 0.40375, 0.36 + 0.85 - s1, 0.36 + 1 - s1], [-0.54 - 0.40375, -0.54 - s1, 0]]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


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


@pytest.mark.parametrize(
    ("per_turn_inputs", "message"),
    [
        ({}, "needs anchor_ids"),  # the anchors are required, the penalties are not
        (
            {
                "anchor_ids": torch.zeros(2, 3, dtype=torch.long),
                "turn_penalties": torch.zeros(2, 2),
            },
            r"turn_penalties \(2, 2\) must hold one value per turn",
        ),
    ],
)
def test_gigpo_refuses_missing_or_short_per_turn_inputs(per_turn_inputs, message):
    batch = collate(PENALISED, pad_id=0, placement="per_turn")  # 3 turns at most
    with pytest.raises(ValueError, match=message):
        adv.estimate(
            "gigpo",
            rewards=batch.rewards,
            mask=batch.loss_mask,
            scores=batch.scores,
            group_ids=batch.group_ids,
            coefs=adv.Coefficients.of(AlgoConfig()),
            **per_turn_inputs,
        )


def test_an_estimator_written_before_anchor_ids_and_turn_penalties_still_runs():
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
            turn_penalties=torch.zeros(2, 3),
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
