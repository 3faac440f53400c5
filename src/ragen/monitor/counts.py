"""Whether a run's success has fallen, read as counts of episodes rather than as a curve.

A step's rollout success is k successes out of its n episodes, so the sampling noise of a
32-episode step is known: sqrt(p(1-p)/32), 0.08 at p = 0.3. A curve's spread measured from
the run itself mixes that noise with real movement (a policy that learns in jumps looks
noisy) and, taken over a few steps, comes out near zero after a calm stretch; both made the
EMA rule call dips of noise collapses. Here a fall is the success of the steps since some
recent step against that of the steps just before it, tested as two samples of episodes:
the one-sided exact (Fisher) test, exact at the 0 and 1 a collapse or a solved task reach.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fall_p_value(before: tuple[int, int], after: tuple[int, int]) -> float:
    """One-sided p-value of the exact test that the success rate of ``before`` (successes,
    episodes) is above that of ``after``: the chance, were both one rate, that ``before``
    drew at least its successes of all the successes the two drew together (hypergeometric
    upper tail)."""
    (kb, nb), (ka, na) = before, after
    total, drawn = nb + na, kb + ka
    logs = [
        _log_comb(drawn, x) + _log_comb(total - drawn, nb - x) - _log_comb(total, nb)
        for x in range(kb, min(drawn, nb) + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


@dataclass(frozen=True)
class Fall:
    """The surest fall the last steps show: the success over the ``after`` steps (from the
    split to now) against the ``before`` steps just before the split."""

    p: float
    before: tuple[int, int]  # (successes, episodes)
    after: tuple[int, int]
    after_steps: int

    @property
    def before_rate(self) -> float:
        return self.before[0] / self.before[1]

    @property
    def after_rate(self) -> float:
        return self.after[0] / self.after[1]


def surest_fall(
    counts: Sequence[tuple[int, int]], window: int, start_rate: float, drop: float
) -> Fall | None:
    """The split of the recent steps with the smallest `fall_p_value`, or None when none
    qualifies. ``counts``: (successes, episodes) per step, oldest first, the latest last.

    A split leaves ``window`` to ``2 * window`` steps after it (a fall must hold that long,
    and an older one has been judged already) and takes the ``window`` steps before it (fewer
    at the start of a run: at least one). Its fall must also give back ``drop`` of the rise
    from ``start_rate`` to the level before the split, so a large batch's small, significant
    dip from a high level is no collapse.
    """
    best: Fall | None = None
    last = len(counts)
    for split in range(max(1, last - 2 * window), last - window + 1):
        before_steps = counts[max(0, split - window) : split]
        after_steps = counts[split:]
        before = (sum(k for k, _ in before_steps), sum(n for _, n in before_steps))
        after = (sum(k for k, _ in after_steps), sum(n for _, n in after_steps))
        if before[1] == 0 or after[1] == 0:
            continue
        fall = before[0] / before[1] - after[0] / after[1]
        if fall <= 0 or fall < drop * max(0.0, before[0] / before[1] - start_rate):
            continue
        p = fall_p_value(before, after)
        if best is None or p < best.p:
            best = Fall(p, before, after, len(after_steps))
    return best
