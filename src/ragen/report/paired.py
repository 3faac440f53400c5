"""Two evaluations of the same levels, compared level by level.

An evaluation plays fixed seeds (the same levels for every model and run), so the difference
of two success rates can be read level by level: a lake that no policy solves, or one that
every policy solves, adds nothing to it, and only the levels whose outcome changed carry it.
Its standard error is that of the mean of the per-level differences, which is smaller than
that of two independent rates whenever levels keep their outcome (a paired design). An
evaluation summary holds its levels' outcomes under :data:`SEED_SUCCESSES`: for each seed in
order, how many of its ``k`` tries succeeded. Two summaries hold the same levels when they
name the same env and split (where they name them: older summaries may not) and as many.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

from ragen.run.rundir import SEED_SUCCESSES


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def seed_successes(summary: dict) -> tuple[list[int], int] | None:
    """(successes of each level among its tries, tries per level) of an evaluation summary,
    or None where it holds none or they do not fit its ``seeds`` and ``k`` (a summary from
    before the key existed, or a hand-edited line)."""
    values, k, seeds = summary.get(SEED_SUCCESSES), summary.get("k"), summary.get("seeds")
    if not (isinstance(values, list) and _count(k) and _count(seeds)) or k == 0:
        return None
    if len(values) != seeds or not values or not all(_count(v) and v <= k for v in values):
        return None
    return values, k


@dataclass(frozen=True)
class PairedChange:
    """The mean per-level change of success from one side to the other, with its standard
    error; ``gained``/``lost``: levels whose success rose or fell."""

    levels: int
    gained: int
    lost: int
    difference: float
    se: float

    @property
    def z(self) -> float:
        """The difference in standard errors; infinite when every level changed alike."""
        if self.se == 0:
            return 0.0 if self.difference == 0 else math.copysign(math.inf, self.difference)
        return self.difference / self.se


def paired_change(before: Sequence[float], after: Sequence[float]) -> PairedChange:
    """The change from ``before`` to ``after``, each a success rate per level (the same
    levels in the same order): the mean of the per-level differences and the standard error
    of that mean (sample variance over the levels)."""
    if len(before) != len(after) or not before:
        raise ValueError(
            f"paired levels: {len(before)} before and {len(after)} after; both need the same "
            "levels, at least one"
        )
    changes = [a - b for b, a in zip(before, after, strict=True)]
    variance = statistics.variance(changes) if len(changes) > 1 else 0.0
    return PairedChange(
        levels=len(changes),
        gained=sum(c > 0 for c in changes),
        lost=sum(c < 0 for c in changes),
        difference=statistics.fmean(changes),
        se=math.sqrt(variance / len(changes)),
    )


LEVEL_KEYS = ("env", "split")
"""What names an evaluation's levels besides their number: its seeds are the split's."""


def same_levels(summaries: Sequence[dict]) -> bool:
    """Whether ``summaries`` name no two envs or splits (an absent name matches any)."""
    for key in LEVEL_KEYS:
        named = {s[key] for s in summaries if isinstance(s.get(key), str)}
        if len(named) > 1:
            return False
    return True


def level_rates(summaries: Sequence[dict]) -> list[float] | None:
    """Each level's success rate over the evaluations ``summaries`` (the seeds of one run,
    say), or None unless every one holds its levels' successes for the same levels."""
    if not same_levels(summaries):
        return None
    read = []
    for summary in summaries:
        successes = seed_successes(summary)
        if successes is None:
            return None
        read.append(successes)
    if not read or len({len(values) for values, _ in read}) != 1:
        return None
    rates = [[v / k for v in values] for values, k in read]
    return [statistics.fmean(level) for level in zip(*rates, strict=True)]


def paired_summaries(before: Sequence[dict], after: Sequence[dict]) -> PairedChange | None:
    """The level-by-level change between two sets of evaluations of the same levels, or None
    where either side lacks its levels' successes or the levels differ (in number, env or
    split)."""
    if not same_levels([*before, *after]):
        return None
    first, second = level_rates(before), level_rates(after)
    if first is None or second is None or len(first) != len(second):
        return None
    return paired_change(first, second)


def agreement(first: dict, second: dict) -> tuple[int, int] | None:
    """(levels on which two evaluations of the same levels agree, levels): a level agrees
    when as many of its tries succeeded in both (with one try: both solved it, or neither
    did). None where either lacks its levels' successes or they differ in levels or tries."""
    if not same_levels([first, second]):
        return None
    a, b = seed_successes(first), seed_successes(second)
    if a is None or b is None or len(a[0]) != len(b[0]) or a[1] != b[1]:
        return None
    return sum(x == y for x, y in zip(a[0], b[0], strict=True)), len(a[0])
