"""Uncertainty filtering: known stds, ties, zero-std groups, agreement with the config."""

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
    keep, _ = filtering.select_groups(RETURNS, ratio, mode)
    assert keep.dtype == torch.bool and keep.shape == (5,)
    assert kept(keep) == want


def test_select_groups_metrics():
    _, m = filtering.select_groups(RETURNS, 0.4)
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
        return kept(filtering.select_groups(RETURNS, ratio, mode, include_zero=False)[0])

    assert pick(0.6, "std") == [1, 3, 4]  # ceil(5 * .6) = 3: the zero groups were last anyway
    assert pick(1.0, "std") == [1, 3, 4]  # all but the constant groups
    assert pick(0.4, "std_rev") == [1, 4]  # the two lowest non-zero stds, not g0 and g2
    keep, _ = filtering.select_groups(RETURNS, 1.0, "top_p", include_zero=False)
    assert kept(keep) == [1, 3, 4]  # top_p=1 keeps every group but the constant ones
    keep, m = filtering.select_groups(torch.ones(4, 3), 0.5, include_zero=False)
    assert not keep.any() and m["filter/empty"] == 1 and m["filter/kept_groups"] == 0
    assert m["filter/std_mean_kept"] == 0 and m["filter/std_share_kept"] == 0


def test_returns_equal_but_for_rounding_count_as_zero_std():
    # returns apart by far less than any reward: the rounding of one sum in another order
    returns = torch.tensor([[1.0, 1.0 + 1e-12], [0.0, 1.0]], dtype=torch.float64)
    assert 0 < float(filtering.group_std(returns)[0]) <= filtering.ZERO_STD
    keep, m = filtering.select_groups(returns, 1.0, include_zero=False)
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
    keep, m = filtering.select_groups(TOP_P_RETURNS, 0.25, "top_p", top_p=top_p)
    assert kept(keep) == want
    assert m["filter/kept_groups"] == len(want)
    stds = [0.5, 1.5, 0.0, 1.0, 0.5]  # population stds: the share is the same on either scale
    assert m["filter/std_share_kept"] == pytest.approx(sum(stds[g] for g in want) / 3.5)


def test_top_p_matches_ragen2_unit_examples():
    # RAGEN-2's own cases for its linear rule, as Bessel stds (N huge: the factor is 1)
    def pick(stds, top_p):
        return filtering._top_p(stds, [g for g, s in enumerate(stds) if s > 0], top_p, 10**9)

    assert pick([4.0, 3.0, 2.0, 1.0], 0.6) == [0, 1]  # target 5.99: 4 + 3
    assert pick([10.0, 1.0, 0.0, 0.0], 0.9) == [0]  # target 9.89
    assert pick([4.0, 2.0, 0.0, 0.0], 0.9) == [0, 1]
    assert pick([3.0, 1.0, 1.0, 0.0], 0.9) == [0, 1, 2]


def test_top_p_keeps_nothing_when_groups_hardly_vary():
    keep, m = filtering.select_groups(torch.ones(3, 4), 1.0, "top_p", top_p=0.9)
    assert not keep.any() and m["filter/empty"] == 1 and m["filter/std_share_kept"] == 0
    # a Bessel std of .017/√2 = .0120: .9 × .0120 = .0108 is above the tolerance, one group kept
    # (on the population scale, .9 × .0085 = .0077 would have kept none)
    small = torch.tensor([[0.0, 0.017], [1.0, 1.0]])
    assert kept(filtering.select_groups(small, 1.0, "top_p", top_p=0.9)[0]) == [0]
    # .01/√2 = .0071: .9 × .0071 is within the tolerance, nothing is kept
    tiny = torch.tensor([[0.0, 0.01], [1.0, 1.0]])
    keep, m = filtering.select_groups(tiny, 1.0, "top_p", top_p=0.9)
    assert not keep.any() and m["filter/empty"] == 1
    # top_p = 1 keeps every group however little they vary
    assert filtering.select_groups(torch.ones(3, 4), 1.0, "top_p", top_p=1.0)[0].all()


def test_std_modes_ignore_top_p():
    for mode in ("std", "std_rev"):
        a = filtering.select_groups(RETURNS, 0.4, mode)
        b = filtering.select_groups(RETURNS, 0.4, mode, top_p=0.3)
        assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_all_groups_tied_keeps_the_first_ones():
    keep, m = filtering.select_groups(torch.ones(8, 3), 0.25)
    assert kept(keep) == [0, 1]
    assert m["filter/zero_std_groups"] == 8 and m["filter/std_mean_all"] == 0


def test_constant_group_std_is_exactly_zero():
    # 0.1 repeated: a naive float std can come out as ~1e-17, which would break ties
    returns = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]], dtype=torch.float64)
    assert torch.equal(filtering.group_std(returns), torch.zeros(2, dtype=torch.float64))


def test_one_rollout_per_group():
    keep, m = filtering.select_groups(torch.tensor([[1.0], [2.0], [3.0]]), 0.5)
    assert kept(keep) == [0, 1] and m["filter/zero_std_groups"] == 3


def test_kept_count_examples():
    assert filtering.kept_count(8, 0.25) == 2
    assert filtering.kept_count(8, 0.3) == 3  # ceil(2.4)
    assert filtering.kept_count(3, 0.1) == 1  # at least one
    assert filtering.kept_count(10, 0.7) == 7  # 10 * .7 = 7.000000000000001 in floats


def test_modes_match_config():
    hint = typing.get_type_hints(config.AlgoConfig)["filter_mode"]
    assert set(filtering.FILTER_MODES) == set(typing.get_args(hint))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((RETURNS, 0.0), "keep_ratio"),
        ((RETURNS, 1.5), "keep_ratio"),
        ((RETURNS, 0.5, "max"), "choose one of"),
        ((torch.zeros(4), 0.5), r"\(G, N\)"),
        ((torch.tensor([[0.0, math.nan]]), 0.5), "NaN"),
    ],
)
def test_select_groups_errors(args, match):
    with pytest.raises(ValueError, match=match):
        filtering.select_groups(*args)


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_top_p_out_of_range_is_an_error(top_p):
    with pytest.raises(ValueError, match="top_p must lie in"):
        filtering.select_groups(RETURNS, 0.5, "top_p", top_p=top_p)


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
    keep, m = filtering.select_groups(returns, ratio, mode)
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
    assert torch.equal(filtering.select_groups(shuffled, ratio, mode)[0], keep)


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
    keep, m = filtering.select_groups(returns, 1.0, "top_p", top_p=top_p, include_zero=include_zero)
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
    again, _ = filtering.select_groups(
        shuffled, 1.0, "top_p", top_p=top_p, include_zero=include_zero
    )
    assert torch.equal(again, keep)
