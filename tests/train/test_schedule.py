"""The learning-rate schedule: linear warm-up and the cut per rollback, by hand."""

import pytest

from ragen.train.schedule import lr_scale


def test_warmup_rises_linearly_then_holds():
    assert [lr_scale(s, 3) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])


def test_no_warmup_is_the_full_rate_from_the_first_step():
    assert [lr_scale(s, 0) for s in range(3)] == [1.0, 1.0, 1.0]


def test_each_rollback_multiplies_the_warmed_rate():
    assert lr_scale(0, 1, rollbacks=2, rollback_scale=0.5) == pytest.approx(0.5 * 0.25)
    assert lr_scale(7, 1, rollbacks=1, rollback_scale=0.5) == pytest.approx(0.5)


def test_negative_inputs_are_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        lr_scale(-1, 3)
