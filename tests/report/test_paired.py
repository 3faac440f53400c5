"""The level-by-level comparison of two evaluations, by hand."""

import math

import pytest

from ragen.report import paired


def _summary(successes, k=1):
    return {"seeds": len(successes), "k": k, paired.SEED_SUCCESSES: successes}


def test_only_the_levels_that_changed_carry_the_difference():
    before = [0, 0, 1, 1, 0, 0, 0, 0]
    after = [1, 1, 1, 0, 0, 0, 0, 0]  # 2 gained, 1 lost, 5 kept
    change = paired.paired_change(before, after)
    assert (change.levels, change.gained, change.lost) == (8, 2, 1)
    assert change.difference == pytest.approx(1 / 8)
    # per-level changes +1, +1, -1 and five 0s: mean 1/8, sample variance (3 - 8/64) / 7
    se = math.sqrt((3 - 8 * (1 / 8) ** 2) / 7 / 8)
    assert change.se == pytest.approx(se)
    assert change.z == pytest.approx((1 / 8) / se)
    # two independent rates 2/8 and 3/8 would read sqrt(p(1-p)/8 + q(1-q)/8) = 0.228
    assert change.se < math.sqrt((2 / 8 * 6 / 8 + 3 / 8 * 5 / 8) / 8)


def test_no_level_changed_reads_zero_and_all_alike_reads_infinite():
    kept = paired.paired_change([1, 0, 1], [1, 0, 1])
    assert (kept.difference, kept.se, kept.z) == (0.0, 0.0, 0.0)
    alike = paired.paired_change([0, 0], [1, 1])
    assert alike.se == 0.0 and alike.z == math.inf
    with pytest.raises(ValueError, match="same levels"):
        paired.paired_change([1, 0], [1])


def test_seed_successes_are_read_only_where_they_fit_the_summary():
    assert paired.seed_successes(_summary([2, 0, 1], k=2)) == ([2, 0, 1], 2)
    assert paired.seed_successes({"seeds": 3, "k": 1}) is None  # written before the key
    assert paired.seed_successes(_summary([1, 3], k=2)) is None  # 3 of 2 tries
    assert paired.seed_successes({**_summary([1, 0]), "seeds": 3}) is None
    assert paired.seed_successes(_summary([True, False])) is None
    assert paired.seed_successes(_summary("10")) is None
    assert paired.seed_successes({**_summary([1]), "k": 0}) is None


def test_several_evaluations_a_side_are_averaged_level_by_level():
    # two seeds of a run: level rates (1/2 + 1) / 2, (0 + 1/2) / 2, (0 + 0) / 2
    rates = paired.level_rates([_summary([1, 0, 0], k=2), _summary([2, 1, 0], k=2)])
    assert rates == [0.75, 0.25, 0.0]
    start = [_summary([0, 0, 0]), _summary([1, 0, 0])]  # rates 0.5, 0, 0
    change = paired.paired_summaries(start, [_summary([1, 0, 0], k=2), _summary([2, 1, 0], k=2)])
    assert change is not None and change.difference == pytest.approx((0.25 + 0.25 + 0) / 3)
    assert paired.paired_summaries(start, [_summary([1, 0])]) is None  # other levels
    assert paired.paired_summaries(start, [{"seeds": 3, "k": 1}]) is None
    assert paired.level_rates([]) is None
    # the same number of levels of another split, or another env: not the same levels
    dev, test = ({**_summary([1, 0, 0]), "env": "frozen-lake", "split": s} for s in ("dev", "test"))
    assert paired.paired_summaries([dev], [test]) is None
    assert paired.agreement(dev, {**dev, "env": "sokoban"}) is None
    assert paired.level_rates([dev, test]) is None
    assert paired.paired_summaries([dev], [_summary([1, 1, 0])]) is not None  # one names none


def test_agreement_counts_the_levels_with_the_same_outcome():
    assert paired.agreement(_summary([1, 0, 1, 0]), _summary([1, 1, 0, 0])) == (2, 4)
    assert paired.agreement(_summary([2, 0, 1], k=2), _summary([2, 1, 1], k=2)) == (2, 3)
    assert paired.agreement(_summary([1, 0]), _summary([1, 0, 0])) is None  # other levels
    assert paired.agreement(_summary([1, 0]), _summary([1, 0], k=2)) is None  # other tries
    assert paired.agreement({"seeds": 2, "k": 1}, _summary([1, 0])) is None
