"""Phase totals: what ``untimed`` leaves out."""

from ragen import phases


def test_phases_timed_inside_untimed_leave_the_totals_as_they_were():
    phases.drain()
    with phases.timed(phases.SCORE):
        pass
    before = phases.totals()
    with phases.untimed():
        for name in phases.NAMES:
            with phases.timed(name):
                pass
    assert phases.totals() == before
    assert phases.drain() == before and set(phases.totals().values()) == {0.0}
