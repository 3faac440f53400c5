"""The gradient reporter's reward-variance buckets on hand-made group stds: the cut by rank, the
remainder in the last bucket, ties by group id, fewer groups than buckets, and rows whose
groups are not adjacent."""

from __future__ import annotations

import pytest
import torch

from ragen.algos.buckets import bucket_name, row_buckets, variance_buckets


def test_groups_are_cut_by_rank_lowest_variance_first_remainder_last():
    # 8 groups, 3 buckets: 8 // 3 = 2 groups to a bucket, the last takes the other 4.
    # ranked: g5 0, g1 .1, g7 .2, g0 .3, g3 .4, g6 .5, g2 .6, g4 .7
    stds = torch.tensor([0.3, 0.1, 0.6, 0.4, 0.7, 0.0, 0.5, 0.2])
    got = variance_buckets(stds, 3).tolist()
    assert got == [1, 0, 2, 2, 2, 0, 2, 1]


def test_ties_rank_by_group_id_and_may_straddle_a_cut():
    # four groups of std 0 (a group whose rollouts all scored the same) and two of .5:
    # g0 g2 g3 g5 are 0, so g0 g2 fill bucket 0 and g3 g5 bucket 1, then g1 g4 bucket 2
    stds = torch.tensor([0.0, 0.5, 0.0, 0.0, 0.5, 0.0])
    assert variance_buckets(stds, 3).tolist() == [0, 2, 0, 1, 2, 1]
    assert variance_buckets(torch.zeros(4), 2).tolist() == [0, 0, 1, 1]


def test_fewer_groups_than_buckets_give_a_bucket_each_and_empty_ones_after():
    stds = torch.tensor([0.9, 0.2, 0.4])
    assert variance_buckets(stds, 6).tolist() == [2, 0, 1]
    assert variance_buckets(stds, 1).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="at least 1"):
        variance_buckets(stds, 0)


def test_rows_take_their_groups_bucket_and_std():
    # groups 7 and 3 of two rows each, interleaved, and group 5 of three rows
    returns = torch.tensor([1.0, 0.0, 3.0, 2.0, 0.5, 0.5, 0.5])
    groups = torch.tensor([7, 3, 7, 3, 5, 5, 5])
    # population stds: g3 [0, 2] -> 1, g5 -> 0, g7 [1, 3] -> 1; ranked g5, g3, g7 (the tie by id)
    bucket, std = row_buckets(returns, groups, 3)
    assert bucket.tolist() == [2, 1, 2, 1, 0, 0, 0]
    assert std.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert [bucket_name(k) for k in range(3)] == ["bucket_1", "bucket_2", "bucket_3"]


def test_turn_samples_take_their_episodes_group_spread_one_entry_per_episode():
    # group 0: returns 0 (1 turn) and 1 (3 turns), std .5; group 1: 0 and .9 (2 turns
    # each), std .45. Taken over the rows, group 0's would be .433 and rank below group 1's.
    returns = torch.tensor([0.0, 1.0, 0.0, 0.9])
    groups = torch.tensor([0, 0, 1, 1])
    episodes = torch.tensor([0, 1, 1, 1, 2, 2, 3, 3])
    bucket, std = row_buckets(returns, groups, 2, episodes)
    assert bucket.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert std.tolist() == pytest.approx([0.5] * 4 + [0.45] * 4)
    by_row, _ = row_buckets(returns[episodes], groups[episodes], 2)
    assert by_row.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
