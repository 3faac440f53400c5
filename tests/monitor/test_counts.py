"""ragen.monitor.counts: the exact one-sided test of a fall in success, and the split of the
last steps it is surest at, on counts whose p-values are worked out by hand."""

import math

import pytest

from ragen.monitor.counts import fall_p_value, surest_fall


def test_the_p_value_is_the_hypergeometric_upper_tail():
    # 4 of 8 episodes succeeded, 3 of them among the first 4: the chance that 4 episodes
    # drawn from the 8 hold 3 or 4 of the successes is (C(4,3)C(4,1) + C(4,4)C(4,0)) / C(8,4)
    assert fall_p_value((3, 4), (1, 4)) == pytest.approx(17 / 70, rel=1e-12)
    # all 6 successes in the 32 episodes before, none in the 64 after: C(32,6) / C(96,6)
    assert fall_p_value((6, 32), (0, 64)) == pytest.approx(
        math.comb(32, 6) / math.comb(96, 6), rel=1e-12
    )
    # no fall at all: the upper tail from the smallest count is everything
    assert fall_p_value((0, 32), (5, 32)) == pytest.approx(1.0)
    # a larger sample of the same rates is surer
    assert fall_p_value((16, 32), (4, 32)) > fall_p_value((32, 64), (8, 64))


def test_the_surest_split_leaves_a_window_to_twice_a_window_of_steps_after_it():
    counts = [(16, 32)] * 6 + [(4, 32), (3, 32)]
    fall = surest_fall(counts, window=2, start_rate=0.5, drop=0.3)
    # splits at steps 4, 5 and 6; the fall is surest at 6: 7 of 64 against 32 of 64
    assert fall is not None and fall.after_steps == 2
    assert (fall.before, fall.after) == ((32, 64), (7, 64))
    assert fall.p == pytest.approx(fall_p_value((32, 64), (7, 64)))
    assert fall.p < fall_p_value((32, 64), (23, 96)) < fall_p_value((32, 64), (20, 64))
    # a window after the split and a step before it are the least there is to test
    short = surest_fall([(16, 32), (4, 32), (3, 32)], window=2, start_rate=0.5, drop=0.3)
    assert short is not None and (short.before, short.after) == ((16, 32), (7, 64))
    assert surest_fall([(16, 32), (4, 32)], window=2, start_rate=0.5, drop=0.3) is None


def test_a_run_start_splits_after_its_first_step_and_a_rise_is_no_fall():
    # broke in its first update: step 0 alone is the level before the split
    fall = surest_fall([(6, 32), (0, 32), (0, 32), (0, 32)], 2, 6 / 32, 0.3)
    assert fall is not None and (fall.before, fall.after) == ((6, 32), (0, 96))
    assert surest_fall([(2, 32), (8, 32), (16, 32)], 1, 2 / 32, 0.3) is None


def test_a_small_fall_from_far_above_the_start_is_no_collapse():
    # 90% -> 80% of 512 episodes is significant, but gives back an eighth of the rise from
    # 10%, under drop=0.3 of it: no collapse; a fall of 40 points gives back half
    counts = [(461, 512), (461, 512), (410, 512), (410, 512)]
    assert surest_fall(counts, 2, 0.1, 0.3) is None
    assert fall_p_value((922, 1024), (820, 1024)) < 1e-9
    assert surest_fall([(461, 512)] * 2 + [(256, 512)] * 2, 2, 0.1, 0.3) is not None
