"""The rollout filter: each strategy and metric on hand-made groups (known stds, ties, all-zero
scores), the advantage weights, and the old spelling against the new."""

from __future__ import annotations

import itertools
import math
import typing

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen import config
from ragen.algos import filtering

# Population stds (divide by N = 4):
#   g0 [0, 0, 0, 0]  0      g1 [0, 1, 0, 1]  .5     g2 [1, 1, 1, 1]  0
#   g3 [0, 2, 0, 2]  1      g4 [1, 0, 1, 0]  .5 (g1's returns in another order: an exact tie)
RETURNS = torch.tensor([[0.0, 0, 0, 0], [0, 1, 0, 1], [1, 1, 1, 1], [0, 2, 0, 2], [1, 0, 1, 0]])


def kept(keep: torch.Tensor) -> list[int]:
    return [i for i, k in enumerate(keep.tolist()) if k]


def select(returns, ratio, mode="std", *, top_p=1.0, include_zero=True):
    """``select_groups`` as ragen spelt it before algo.filter_strategy (filter_ratio,
    filter_mode, filter_top_p): std and std_rev are top_k on the reward std, largest and
    smallest first; top_p is top_p (``config.OLD_FILTER_MODES``)."""
    strategy, largest = {"std": ("top_k", True), "std_rev": ("top_k", False)}.get(
        mode, ("top_p", True)
    )
    value = top_p if strategy == "top_p" else ratio
    rule = filtering.FilterRule(strategy, value, "reward_variance", largest, include_zero)
    return filtering.select_groups(returns, rule)


def test_group_std_known_values():
    torch.testing.assert_close(
        filtering.group_std(RETURNS), torch.tensor([0, 0.5, 0, 1, 0.5], dtype=torch.float64)
    )


@pytest.mark.parametrize(
    ("ratio", "mode", "want"),
    [
        # ceil(5 * .2) = 1: the most uncertain group / the most certain (g0 before g2)
        (0.2, "std", [3]),
        (0.2, "std_rev", [0]),
        # ceil(5 * .4) = 2: g3, then the .5 tie goes to the lower index g1
        (0.4, "std", [1, 3]),
        (0.4, "std_rev", [0, 2]),
        # ceil(5 * .6) = 3: g3, g1, g4
        (0.6, "std", [1, 3, 4]),
        (0.6, "std_rev", [0, 1, 2]),
        # ceil(5 * .25) = 2
        (0.25, "std", [1, 3]),
        (1.0, "std", [0, 1, 2, 3, 4]),
        (1.0, "std_rev", [0, 1, 2, 3, 4]),
    ],
)
def test_select_groups_known_stds(ratio, mode, want):
    keep, _ = select(RETURNS, ratio, mode)
    assert keep.dtype == torch.bool and keep.shape == (5,)
    assert kept(keep) == want


def test_select_groups_metrics():
    _, m = select(RETURNS, 0.4)
    assert m["filter/kept_groups"] == 2
    assert m["filter/kept_ratio"] == pytest.approx(0.4)
    assert m["filter/std_mean_kept"] == pytest.approx((1 + 0.5) / 2)
    assert m["filter/std_mean_all"] == pytest.approx((0 + 0.5 + 0 + 1 + 0.5) / 5)
    assert m["filter/std_share_kept"] == pytest.approx(1.5 / 2)
    assert m["filter/zero_std_groups"] == 2
    assert m["filter/empty"] == 0
    assert all(isinstance(v, float) for v in m.values())


def test_include_zero_false_drops_constant_groups_in_every_mode():
    # stds 0, .5, 0, 1, .5: the std modes choose among g1, g3, g4 only
    def pick(ratio, mode):
        return kept(select(RETURNS, ratio, mode, include_zero=False)[0])

    assert pick(0.6, "std") == [1, 3, 4]  # ceil(5 * .6) = 3: the zero groups were last anyway
    assert pick(1.0, "std") == [1, 3, 4]  # all but the constant groups
    assert pick(0.4, "std_rev") == [1, 4]  # the two lowest non-zero stds, not g0 and g2
    keep, _ = select(RETURNS, 1.0, "top_p", include_zero=False)
    assert kept(keep) == [1, 3, 4]  # top_p=1 keeps every group but the constant ones
    keep, m = select(torch.ones(4, 3), 0.5, include_zero=False)
    assert not keep.any() and m["filter/empty"] == 1 and m["filter/kept_groups"] == 0
    assert m["filter/std_mean_kept"] == 0 and m["filter/std_share_kept"] == 0


def test_returns_equal_but_for_rounding_count_as_zero_std():
    # returns apart by far less than any reward: the rounding of one sum in another order
    returns = torch.tensor([[1.0, 1.0 + 1e-12], [0.0, 1.0]], dtype=torch.float64)
    assert 0 < float(filtering.group_std(returns)[0]) <= filtering.ZERO_SCORE
    keep, m = select(returns, 1.0, include_zero=False)
    assert kept(keep) == [1] and m["filter/zero_std_groups"] == 1


# top_p. N = 2: a group [0, x] has population std x/2 and Bessel-corrected std x/sqrt(2),
# the scale RAGEN-2 ranks by and subtracts its 0.01 tolerance on. Below, "s" = Bessel std:
#   g0 [0, 1] .5·√2 ≈ .7071   g1 [0, 3] 1.5·√2 ≈ 2.1213   g2 [2, 2] 0
#   g3 [0, 2] 1·√2 ≈ 1.4142   g4 [1, 0] .5·√2 ≈ .7071 (tied with g0)
# total S = 3.5·√2 ≈ 4.9497; kept while the running sum is below top_p·S - .01
TOP_P_RETURNS = torch.tensor([[0.0, 1], [0, 3], [2, 2], [0, 2], [1, 0]])


@pytest.mark.parametrize(
    ("top_p", "want"),
    [
        # target .4·S - .01 = 1.9699: g1 alone (2.1213) reaches it
        (0.4, [1]),
        # target 2.4649: g1 (2.1213) falls short, g1 + g3 (3.5355) reach it: g3 stays in
        (0.5, [1, 3]),
        # target 3.7023: g1 + g3 fall short; the .7071 tie goes to the lower index, g0
        (0.75, [0, 1, 3]),
        # target 4.8902: every non-zero group; g2 (std 0) is never taken below 1
        (0.99, [0, 1, 3, 4]),
        # 1 keeps every group, the constant one too (include_zero)
        (1.0, [0, 1, 2, 3, 4]),
    ],
)
def test_top_p_known_stds(top_p, want):
    keep, m = select(TOP_P_RETURNS, 0.25, "top_p", top_p=top_p)
    assert kept(keep) == want
    assert m["filter/kept_groups"] == len(want)
    stds = [0.5, 1.5, 0.0, 1.0, 0.5]  # population stds: the share is the same on either scale
    assert m["filter/std_share_kept"] == pytest.approx(sum(stds[g] for g in want) / 3.5)


def test_top_p_matches_ragen2_unit_examples():
    # RAGEN-2's own cases for its linear rule, as Bessel stds (scale 1)
    def pick(stds, top_p):
        return filtering.top_p(stds, [g for g, s in enumerate(stds) if s > 0], top_p, 1.0)

    assert pick([4.0, 3.0, 2.0, 1.0], 0.6) == [0, 1]  # target 5.99: 4 + 3
    assert pick([10.0, 1.0, 0.0, 0.0], 0.9) == [0]  # target 9.89
    assert pick([4.0, 2.0, 0.0, 0.0], 0.9) == [0, 1]
    assert pick([3.0, 1.0, 1.0, 0.0], 0.9) == [0, 1, 2]


def test_top_p_keeps_nothing_when_groups_hardly_vary():
    keep, m = select(torch.ones(3, 4), 1.0, "top_p", top_p=0.9)
    assert not keep.any() and m["filter/empty"] == 1 and m["filter/std_share_kept"] == 0
    # a Bessel std of .017/√2 = .0120: .9 × .0120 = .0108 is above the tolerance, one group kept
    # (on the population scale, .9 × .0085 = .0077 would have kept none)
    small = torch.tensor([[0.0, 0.017], [1.0, 1.0]])
    assert kept(select(small, 1.0, "top_p", top_p=0.9)[0]) == [0]
    # .01/√2 = .0071: .9 × .0071 is within the tolerance, nothing is kept
    tiny = torch.tensor([[0.0, 0.01], [1.0, 1.0]])
    keep, m = select(tiny, 1.0, "top_p", top_p=0.9)
    assert not keep.any() and m["filter/empty"] == 1
    # top_p = 1 keeps every group however little they vary
    assert select(torch.ones(3, 4), 1.0, "top_p", top_p=1.0)[0].all()


def test_std_modes_ignore_top_p():
    for mode in ("std", "std_rev"):
        a = select(RETURNS, 0.4, mode)
        b = select(RETURNS, 0.4, mode, top_p=0.3)
        assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_all_groups_tied_keeps_the_first_ones():
    keep, m = select(torch.ones(8, 3), 0.25)
    assert kept(keep) == [0, 1]
    assert m["filter/zero_std_groups"] == 8 and m["filter/std_mean_all"] == 0


def test_constant_group_std_is_exactly_zero():
    # 0.1 repeated: a naive float std can come out as ~1e-17, which would break ties
    returns = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]], dtype=torch.float64)
    assert torch.equal(filtering.group_std(returns), torch.zeros(2, dtype=torch.float64))


def test_one_rollout_per_group():
    keep, m = select(torch.tensor([[1.0], [2.0], [3.0]]), 0.5)
    assert kept(keep) == [0, 1] and m["filter/zero_std_groups"] == 3


def test_kept_count_examples():
    assert filtering.kept_count(8, 0.25) == 2
    assert filtering.kept_count(8, 0.3) == 3  # ceil(2.4)
    assert filtering.kept_count(3, 0.1) == 1  # at least one
    assert filtering.kept_count(10, 0.7) == 7  # 10 * .7 = 7.000000000000001 in floats


def test_strategies_and_metrics_match_config():
    hints = typing.get_type_hints(config.AlgoConfig)
    strategies = set(typing.get_args(hints["filter_strategy"]))
    assert {name.removesuffix("_softmax") for name in filtering.RULES} == strategies
    assert set(config.FILTER_VALUE_KEYS) == strategies
    assert set(filtering.METRICS) == set(typing.get_args(hints["filter_metric"]))
    assert set(filtering.LOSS_SCALINGS) == set(typing.get_args(hints["filter_loss_scaling"]))
    old = set(typing.get_args(hints["filter_mode"]))
    assert set(config.OLD_FILTER_MODES) == old - {"std"}
    assert {mode[0] for mode in config.OLD_FILTER_MODES.values()} <= strategies


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((RETURNS, 0.0), "keep_ratio"),
        ((RETURNS, 1.5), "keep_ratio"),
        ((torch.zeros(4), 0.5), r"\(G, N\)"),
        ((torch.tensor([[0.0, math.nan]]), 0.5), "NaN"),
    ],
)
def test_select_groups_errors(args, match):
    with pytest.raises(ValueError, match=match):
        select(*args)


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_top_p_out_of_range_is_an_error(top_p):
    with pytest.raises(ValueError, match="top_p must lie in"):
        select(RETURNS, 0.5, "top_p", top_p=top_p)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, -0.1]), min_size=3, max_size=3),
        min_size=1,
        max_size=12,
    ),
    ratio=st.floats(0.01, 1.0),
    mode=st.sampled_from(["std", "std_rev"]),
)
def test_select_groups_properties(data, ratio, mode):
    returns = torch.tensor(data)
    keep, m = select(returns, ratio, mode)
    std = filtering.group_std(returns)
    assert int(keep.sum()) == filtering.kept_count(len(data), ratio) == m["filter/kept_groups"]
    if keep.all():
        return
    worst_kept = std[keep].min() if mode == "std" else std[keep].max()
    best_dropped = std[~keep].max() if mode == "std" else std[~keep].min()
    assert worst_kept >= best_dropped if mode == "std" else worst_kept <= best_dropped
    # among equal stds the kept ones come first
    for i, j in itertools.combinations(range(len(data)), 2):
        if std[i] == std[j] and keep[j]:
            assert keep[i]
    # the choice depends on each group's returns as a set, not their order
    noise = torch.rand(returns.shape, generator=torch.Generator().manual_seed(len(data)))
    shuffled = returns.gather(1, noise.argsort(dim=1))  # each row in its own order
    assert torch.equal(select(shuffled, ratio, mode)[0], keep)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, -0.1, 10.0]), min_size=3, max_size=3),
        min_size=1,
        max_size=12,
    ),
    top_p=st.floats(0.01, 0.999),
    include_zero=st.booleans(),
)
def test_top_p_properties(data, top_p, include_zero):
    returns = torch.tensor(data)
    keep, m = select(returns, 1.0, "top_p", top_p=top_p, include_zero=include_zero)
    std = filtering.group_std(returns)
    assert int(keep.sum()) == m["filter/kept_groups"]
    assert not (keep & (std == 0)).any()  # below 1, a zero-std group is never taken
    bessel = std * math.sqrt(3 / 2)
    target = top_p * float(bessel.sum()) - filtering.TOP_P_TOLERANCE
    if not keep.any():
        assert target <= 0  # only a step with (almost) no std keeps nothing
        return
    # the highest stds are kept; they reach the target and would not without the last one
    if not keep.all():
        assert float(std[keep].min()) >= float(std[~keep].max())
    kept_sum = float(bessel[keep].sum())
    assert kept_sum >= target - 1e-9
    assert kept_sum - float(bessel[keep].min()) < target + 1e-9
    noise = torch.rand(returns.shape, generator=torch.Generator().manual_seed(len(data)))
    shuffled = returns.gather(1, noise.argsort(dim=1))
    again, _ = select(shuffled, 1.0, "top_p", top_p=top_p, include_zero=include_zero)
    assert torch.equal(again, keep)


# ------------------------------------------------------------------- the strategies by hand
# Scores given directly: one rollout a group, scored by its mean return (metric reward), so a
# group's score is its single return and the scale is 1.
SCORES = [3.0, 1.0, 2.0, 1.0, 0.0]  # g1 and g3 tie; g4 scores 0


def pick(scores, strategy, value, *, largest=True, include_zero=True, metric="reward"):
    returns = torch.tensor(scores)[:, None]  # (G, 1)
    rule = filtering.FilterRule(strategy, value, metric, largest, include_zero)
    keep, m = filtering.select_groups(returns, rule)
    assert m["filter/kept_groups"] == int(keep.sum())
    return kept(keep)


@pytest.mark.parametrize(
    ("strategy", "value", "largest", "want"),
    [
        ("top_k", 0.4, True, [0, 2]),  # ceil(5 × .4) = 2
        ("top_k", 0.5, True, [0, 1, 2]),  # ceil(2.5) = 3: the 1-1 tie goes to g1
        ("top_k", 0.8, True, [0, 1, 2, 3]),
        ("top_k", 0.4, False, [1, 4]),  # the two smallest: 0, then the tie's lower index
        ("top_k_abs", 1, True, [0]),
        ("top_k_abs", 3, True, [0, 1, 2]),
        ("top_k_abs", 9, True, [0, 1, 2, 3, 4]),  # more than there are: all
        ("top_k_abs", 2, False, [1, 4]),
        # linear top_p, total 7: the target is p × 7 - .01
        ("top_p", 0.5, True, [0, 2]),  # 3.49: 3 falls short, 3 + 2 reaches it
        ("top_p", 0.75, True, [0, 1, 2]),  # 5.24: 3 + 2 + 1 (g1 before g3)
        ("top_p", 0.99, True, [0, 1, 2, 3]),  # 6.92: every group but the one scoring 0
        ("top_p", 1.0, True, [0, 1, 2, 3, 4]),
        # min_p against the best score, 3
        ("min_p", 0.5, True, [0, 2]),  # at least 1.5
        ("min_p", 0.3, True, [0, 1, 2, 3]),  # at least .9: both of the tie
        ("min_p", 1.0, True, [0]),
    ],
)
def test_each_strategy_on_hand_made_scores(strategy, value, largest, want):
    assert pick(SCORES, strategy, value, largest=largest) == want


def test_softmax_top_p_on_hand_made_scores():
    # softmax of [2, 1, 0]: .6652, .2447, .0900; running mass .6652, .9100, 1
    assert pick([2.0, 1.0, 0.0], "top_p_softmax", 0.5) == [0]
    assert pick([2.0, 1.0, 0.0], "top_p_softmax", 0.9) == [0, 1]
    assert pick([2.0, 1.0, 0.0], "top_p_softmax", 0.95) == [0, 1, 2]
    assert pick([0.0, 1.0, 2.0], "top_p_softmax", 0.9) == [1, 2]  # by score, not by index
    # ties: equal mass .25 each, taken by index; the group that reaches the share stays in
    assert pick([0.0, 0.0, 0.0, 0.0], "top_p_softmax", 0.5) == [0, 1]
    assert pick([0.0, 0.0, 0.0, 0.0], "top_p_softmax", 0.6) == [0, 1, 2]
    assert pick([0.0, 0.0, 0.0, 0.0], "top_p_softmax", 0.6, include_zero=False) == []


def test_softmax_top_p_takes_spreads_on_ragen2s_scale():
    # TOP_P_RETURNS' Bessel stds, best first g1 2.1213, g3 1.4142, g0 .7071, g4 .7071, g2 0:
    # softmax mass .4764, .2349, .1158, .1158, .0571, running .4764, .7113, .8271, .9429, 1.
    # On the population stds (1.5, 1, .5, .5, 0) the running mass would be .3898, .6262,
    # .7696, .9130, 1, and .8 would take g4 too.
    def pick_std(p):
        rule = filtering.FilterRule("top_p_softmax", p, "reward_variance", True, True)
        return kept(filtering.select_groups(TOP_P_RETURNS, rule)[0])

    assert pick_std(0.45) == [1]
    assert pick_std(0.8) == [0, 1, 3]
    assert pick_std(0.9) == [0, 1, 3, 4]


@pytest.mark.parametrize(
    ("strategy", "value", "want"),
    [
        ("top_k", 0.5, [0, 1]),  # ceil(4 × .5) = 2: the first by index
        ("top_k_abs", 3, [0, 1, 2]),
        ("top_p", 0.9, []),  # the target, -.01, is reached with nothing taken: none kept
        ("top_p_softmax", 0.5, [0, 1]),
        ("min_p", 0.5, [0, 1, 2, 3]),  # at least 0: every group
    ],
)
def test_all_zero_scores(strategy, value, want):
    assert pick([0.0] * 4, strategy, value) == want
    # include_zero=false drops every group first: nothing is left to choose from
    assert pick([0.0] * 4, strategy, value, include_zero=False) == []


def test_include_zero_false_drops_zero_scores_of_any_metric():
    # the mean return of g4 is 0: dropped; g1 (mean 1, std 0) stays under metric reward
    assert pick(SCORES, "top_k", 1.0, include_zero=False) == [0, 1, 2, 3]
    assert pick(SCORES, "top_k", 0.4, largest=False, include_zero=False) == [1, 3]


def test_metric_reward_sum_and_negative_scores():
    returns = torch.tensor(
        [[1.0, 1.0], [0.0, 3.0], [-1.0, -1.0]]
    )  # sums 2, 3, -2; means 1, 1.5, -1
    rule = filtering.FilterRule("top_k_abs", 1, "reward_sum", True, True)
    keep, m = filtering.select_groups(returns, rule)
    assert kept(keep) == [1] and m["filter/score_mean_kept"] == 3.0
    assert m["filter/score_mean_all"] == pytest.approx(1.0)
    # a negative score lowers linear top_p's target: .8 × (1 + 1.5 - 1) - .01 = 1.19, which
    # g1's mean 1.5 reaches alone
    rule = filtering.FilterRule("top_p", 0.8, "reward", True, True)
    assert kept(filtering.select_groups(returns, rule)[0]) == [1]


def test_sampled_entropy():
    logprobs = torch.tensor(
        [[-1.0, -2.0, -0.5, -9.0], [-0.3, -5.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]
    )
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    # (1 + 2) / 2; .3 / 1; no sampled token: 0
    torch.testing.assert_close(
        filtering.sampled_entropy(logprobs, mask), torch.tensor([1.5, 0.3, 0.0])
    )
    assert float(filtering.sampled_entropy(logprobs[0], mask[0])) == 1.5  # one episode, (T,)


def test_entropy_and_length_metrics_read_their_own_values():
    returns = torch.zeros(3, 2)  # no reward signal at all
    entropy = torch.tensor([[1.5, 0.5], [0.2, 0.2], [3.0, 1.0]])  # means 1, .2, 2; stds .5, 0, 1
    length = torch.tensor([[10.0, 30.0], [5.0, 5.0], [40.0, 0.0]])  # means 20, 5, 20

    def pick_by(metric, values, strategy, value, largest=True):
        rule = filtering.FilterRule(strategy, value, metric, largest, True)
        return kept(filtering.select_groups(returns, rule, values)[0])

    assert pick_by("entropy", entropy, "top_k_abs", 1) == [2]
    assert pick_by("entropy", entropy, "top_k_abs", 1, largest=False) == [1]
    assert pick_by("entropy_variance", entropy, "top_k_abs", 2) == [0, 2]
    assert pick_by("entropy_variance", entropy, "top_k_abs", 1, largest=False) == [1]
    assert pick_by("length", length, "top_k_abs", 1) == [0]  # 20 and 20 tie: the lower index
    assert pick_by("length", length, "min_p", 0.5) == [0, 2]  # at least 10
    # entropy_variance is a spread on RAGEN-2's scale (Bessel): .5·√2 + 0 + 1·√2 = 2.1213,
    # target .5 × 2.1213 - .01 = 1.0507: g2 (1.4142) alone reaches it
    assert pick_by("entropy_variance", entropy, "top_p", 0.5) == [2]


def test_filter_rule_errors():
    def run(rule, values=None):
        filtering.select_groups(RETURNS, rule, values)

    with pytest.raises(ValueError, match="choose one of"):
        run(filtering.FilterRule("max", 0.5, "reward_variance", True, True))
    with pytest.raises(ValueError, match="choose one of"):
        run(filtering.FilterRule("top_k", 0.5, "variance", True, True))
    with pytest.raises(ValueError, match="rank the smallest"):
        run(filtering.FilterRule("min_p", 0.5, "reward_variance", False, True))
    with pytest.raises(ValueError, match=">= 1"):
        run(filtering.FilterRule("top_k_abs", 0.5, "reward_variance", True, True))
    with pytest.raises(ValueError, match="min_p must lie in"):
        run(filtering.FilterRule("min_p", 0.0, "reward_variance", True, True))
    with pytest.raises(ValueError, match=r"values must be a non-empty \(G, N\)"):
        run(filtering.FilterRule("top_k", 0.5, "length", True, True), torch.ones(5, 3))


# --------------------------------------------------------------- advantage weights by hand
# Kept: groups 0 and 2 of 4 (share .5), returns [0, 1] and [0, 3]: Bessel stds .7071, 2.1213.
KEPT_RETURNS = torch.tensor([0.0, 1.0, 0.0, 3.0])
KEPT_GROUPS = torch.tensor([0, 0, 2, 2])
ADVANTAGES = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-2.0, 0.0], [2.0, 0.0]])  # (B, T)


@pytest.mark.parametrize(
    ("scaling", "soft", "want"),
    [
        ("none", False, [1.0, 1.0, 1.0, 1.0]),
        ("linear", False, [0.5, 0.5, 0.5, 0.5]),
        ("sqrt", False, [0.70710678] * 4),
        # .7071 / (2.1213 + 1e-6) = .33333318; 2.1213 / (2.1213 + 1e-6) = .99999953
        ("none", True, [0.33333318, 0.33333318, 0.99999953, 0.99999953]),
        ("linear", True, [0.16666659, 0.16666659, 0.49999976, 0.49999976]),
    ],
)
def test_advantage_weights(scaling, soft, want):
    weights = filtering.advantage_weights(
        KEPT_RETURNS, KEPT_GROUPS, kept_share=0.5, loss_scaling=scaling, soft=soft
    )
    assert weights.dtype == torch.float64 and weights.shape == (4,)
    torch.testing.assert_close(weights, torch.tensor(want, dtype=torch.float64))


def test_weighted_advantages_by_hand():
    # sqrt scaling (√.5) times the soft weights: row 0 -1 × .70711 × .33333 = -.23570
    weights = filtering.advantage_weights(
        KEPT_RETURNS, KEPT_GROUPS, kept_share=0.5, loss_scaling="sqrt", soft=True
    )
    weighted = ADVANTAGES * weights.float()[:, None]
    want = torch.tensor(
        [[-0.2357021, -0.2357021], [0.2357021, 0.2357021], [-1.4142129, 0.0], [1.4142129, 0.0]]
    )
    torch.testing.assert_close(weighted, want)


def test_soft_weights_of_constant_groups_are_zero():
    # g0 [1, 1] has no spread: weight 0; g1 [0, 2] holds the max: 1.4142 / 1.4142 ≈ 1
    weights = filtering.advantage_weights(
        torch.tensor([1.0, 1.0, 0.0, 2.0]),
        torch.tensor([0, 0, 1, 1]),
        kept_share=1.0,
        loss_scaling="none",
        soft=True,
    )
    torch.testing.assert_close(
        weights, torch.tensor([0.0, 0.0, 0.9999993, 0.9999993], dtype=torch.float64)
    )
    # every kept group constant: every weight 0 (0 / 1e-6), no division by zero
    none_vary = filtering.advantage_weights(
        torch.ones(4), KEPT_GROUPS, kept_share=0.5, loss_scaling="linear", soft=True
    )
    assert torch.equal(none_vary, torch.zeros(4, dtype=torch.float64))


# ------------------------------------------------------------- the old spelling, the new one
def rule_of(*overrides):
    c = config.load("bandit", list(overrides))
    return filtering.FilterRule.of(c.algo, c.algo.filter_ratio)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ([], ["algo.filter_strategy=top_k", "algo.filter_type=largest"]),
        (["algo.filter_mode=std", "algo.filter_ratio=0.75"], ["algo.filter_ratio=0.75"]),
        (
            ["algo.filter_mode=std_rev", "algo.filter_ratio=0.75"],
            ["algo.filter_strategy=top_k", "algo.filter_type=smallest", "algo.filter_ratio=0.75"],
        ),
        (
            ["algo.filter_mode=top_p", "algo.filter_top_p=0.8"],
            ["algo.filter_strategy=top_p", "algo.filter_top_p=0.8"],
        ),
        (  # both spellings, saying the same
            ["algo.filter_mode=std_rev", "algo.filter_type=smallest"],
            ["algo.filter_strategy=top_k", "algo.filter_type=smallest"],
        ),
        (  # what a run's config.yaml wrote before: every old key, std among them
            ["algo.filter_mode=std", "algo.filter_top_p=0.9", "algo.filter_include_zero=false"],
            ["algo.filter_strategy=top_k", "algo.filter_include_zero=false"],
        ),
    ],
)
def test_old_spellings_equal_new_ones(old, new):
    assert rule_of(*old) == rule_of(*new)


def test_presets_filter_as_before():
    # bandit keeps half its 8 groups by reward std, as `algo.filter_ratio: 0.5` always did
    want = filtering.FilterRule("top_k", 0.5, "reward_variance", True, True)
    assert rule_of() == want
    assert config.kept_groups(config.load("bandit")) == 4
    c = config.load("bandit", ["algo.filter_mode=top_p", "algo.filter_top_p_mode=softmax"])
    assert filtering.FilterRule.of(c.algo, 0.5).strategy == "top_p_softmax"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algo.filter_mode=top_p", "algo.filter_strategy=min_p"], "top_p means"),
        (["algo.filter_mode=std_rev", "algo.filter_strategy=top_k_abs"], "drop algo.filter_mode"),
    ],
)
def test_old_and_new_spellings_that_disagree_are_refused(overrides, match):
    with pytest.raises(config.ConfigError, match=match):
        config.load("bandit", overrides)
