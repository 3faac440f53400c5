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
    assert m["filter/zero_std_groups"] == 2
    assert all(isinstance(v, float) for v in m.values())


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


def test_kept_count_agrees_with_config():
    c = config.Config()
    ratios = [0.01, 0.1, 0.125, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.6, 0.7, 0.75, 0.9, 0.99, 1.0]
    for groups, ratio in itertools.product(range(1, 65), ratios):
        c.rollout.groups, c.algo.filter_ratio = groups, ratio
        assert filtering.kept_count(groups, ratio) == config.kept_groups(c), (groups, ratio)


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


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, -0.1]), min_size=3, max_size=3),
        min_size=1,
        max_size=12,
    ),
    ratio=st.floats(0.01, 1.0),
    mode=st.sampled_from(filtering.FILTER_MODES),
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
