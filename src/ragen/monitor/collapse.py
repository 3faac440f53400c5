"""Online collapse detection over the metric stream: early warnings, then confirmed collapse.

RAGEN (finding 3) reads collapse from four curves: the in-group reward std and the token
entropy drop *before* the reward does; the reward then falls from its peak, and gradient-norm
spikes mark the point of no return. RAGEN-2 adds template collapse: the reasoning stops
depending on the input (``collapse/mi_estimate`` falls). The detector follows each curve with
a running baseline and raises

- a **warning** when a signal falls well below its running peak: the in-group reward std or
  the entropy while the reward still holds; reply diversity or the MI estimate at any time;
- a **collapse** when the success rate has given back a set share of its rise since warm-up
  (the reward, where a run logs no success), or the gradient norm jumps far above its
  running median; with ``success_test: counts`` the success's fall is instead tested as
  counts of episodes (`ragen.monitor.counts`): the steps since a recent split against the
  steps before it;
- RAGEN-2's two early stops, when switched on: a **collapse** when the in-group reward std
  stays under a share of its early baseline for several steps in a row, or the evaluation
  success stays under a floor for several evaluations in a row; called again each time the
  spell lasts as long once more, so a rollback that did not lift it is followed by another
  (and, past ``max_rollbacks``, by a stop).

Success rather than reward: the reward also carries the env's payoff noise (Bandit's risky
arm pays 1 one time in 4, so a policy that always picks it sees its reward swing by ±0.2
between steps) and any shaping terms, while success is what the task asks and what the
evaluation measures.

Baselines are debiased exponential moving averages (EMA) of the raw values, so one noisy step
moves nothing. A fall must also exceed ``noise_margin`` standard deviations of the raw
per-step values, so a flat, noisy curve never alerts. Each signal alerts once when it crosses
its threshold and again only after it has recovered halfway (hysteresis), so a curve hovering
at the threshold does not flood the log.

Everything the detector has seen lives in plain numbers that ``state_dict`` returns as JSON
data; ``load_state_dict`` on a fresh detector continues exactly where it stopped.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal, TypeGuard

from ragen import metric_names as names
from ragen.config import MonitorConfig
from ragen.monitor.counts import surest_fall

# A signal needs a few observations before its noise estimate means anything.
_MIN_OBSERVATIONS = 3
_MIN_GRAD_HISTORY = 5
_TOLERANCE = 1e-6

EVAL_SUCCESS = "eval/success"
"""The signal of the evaluation-floor stop: the mean evaluation success over the eval envs."""
EARLY_STOP_SIGNALS = frozenset({names.REWARD_STD, EVAL_SUCCESS})
"""The signals of RAGEN-2's early stops, the detector's only collapses on these signals
(``act_on: early_stop`` acts on these alone)."""


@dataclass
class Alert:
    """One detector finding. ``value`` is the signal now (its EMA, or the raw gradient norm);
    ``baseline`` what it is compared with (the running peak, or the running median)."""

    step: int
    kind: Literal["warning", "collapse"]
    signal: str
    value: float
    baseline: float
    message: str

    def to_record(self) -> dict:
        """The alerts.jsonl object."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> Alert:
        return cls(**{k: record[k] for k in cls.__dataclass_fields__})

    def line(self) -> str:
        """One console line."""
        label = "WARNING" if self.kind == "warning" else "COLLAPSE"
        return f"[step {self.step}] {label} {self.signal}: {self.message}"


@dataclass
class _Track:
    """A debiased EMA of one metric, the spread of its raw values around it, and its peak.

    ``weight`` is the EMA's total weight so far (Adam's bias correction): ``mean / weight``
    is the EMA, which on the first steps is close to the plain mean instead of being pulled
    towards zero.
    """

    count: int = 0
    last_step: int = -1
    mean: float = 0.0
    weight: float = 0.0
    sq: float = 0.0
    sq_weight: float = 0.0
    peak: float | None = None
    base: float | None = None
    active: bool = False

    @property
    def ema(self) -> float:
        return self.mean / self.weight if self.weight else math.nan

    @property
    def noise(self) -> float:
        """Standard deviation of raw values around the EMA (0 before two observations)."""
        return math.sqrt(self.sq / self.sq_weight) if self.sq_weight else 0.0

    def observe(self, step: int, value: float, alpha: float) -> None:
        # A metric logged every k steps moves its EMA as much as k steps would.
        gap = max(1, step - self.last_step) if self.count else 1
        a = 1.0 - (1.0 - alpha) ** gap
        if self.count:
            residual = value - self.ema
            self.sq = (1 - a) * self.sq + a * residual * residual
            self.sq_weight = (1 - a) * self.sq_weight + a
        self.mean = (1 - a) * self.mean + a * value
        self.weight = (1 - a) * self.weight + a
        self.count += 1
        self.last_step = step

    def mark(self) -> None:
        """After warm-up: remember the starting level once, and the highest level since."""
        if self.base is None:
            self.base = self.ema
        self.peak = self.ema if self.peak is None else max(self.peak, self.ema)


@dataclass(frozen=True)
class _Fall:
    """A signal whose fall from its running peak is an early warning."""

    metric: str
    share: float
    while_reward_holds: bool


class CollapseDetector:
    """Feed it each step's metrics; it returns the alerts that step raised.

    Metrics it reads (absent ones are simply not watched): rollout/reward_mean,
    rollout/success, rollout/episodes, rollout/reward_std, actor/entropy, actor/grad_norm,
    diversity/distinct_reply, diversity/distinct_2gram_think, collapse/mi_estimate.
    """

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        c = self.config
        self.falls = (
            _Fall(names.REWARD_STD, c.std_drop, True),
            _Fall(names.ENTROPY, c.entropy_drop, True),
            _Fall(names.DISTINCT_REPLY, c.diversity_drop, False),
            _Fall(names.DISTINCT_THINK, c.diversity_drop, False),
            _Fall(names.MI, c.mi_drop, False),
        )
        self.watched = frozenset(
            {
                names.REWARD_MEAN,
                names.SUCCESS,
                names.EPISODES,
                names.GRAD_NORM,
                *(f.metric for f in self.falls),
            }
        )
        unknown = self.watched - names.PRODUCED
        if unknown:  # a renamed metric would silently switch its alarm off
            raise ValueError(f"the detector watches {sorted(unknown)}, which no run writes")
        self.steps_seen = 0
        self.tracks: dict[str, _Track] = {}
        self.grad_history: list[float] = []
        self.grad_active = False
        self.std_baseline: list[float] = []  # reward std of the first steps that kept a group
        self.std_low = 0  # steps in a row under the variance_collapse_ratio of that baseline
        self.eval_low = 0  # evaluations in a row under eval_floor
        # success_test=counts: (successes, episodes) of the last steps, of the first ones
        # (the start level), and whether the last test called a collapse not yet recovered
        self.counts: list[tuple[int, int]] = []
        self.start: list[tuple[int, int]] = []
        self.counts_active = False

    # ------------------------------------------------------------------------ stream

    def update(self, step: int, metrics: dict) -> list[Alert]:
        """Take one step's metrics (non-numeric and non-finite values are ignored)."""
        self.steps_seen += 1
        values = {k: float(v) for k, v in metrics.items() if is_finite_number(v)}
        warm = self.steps_seen > self.config.warmup_steps
        for name in {
            names.REWARD_MEAN,
            names.SUCCESS,
            *(f.metric for f in self.falls),
        } & values.keys():
            track = self.tracks.setdefault(name, _Track())
            track.observe(step, values[name], self.config.ema_alpha)
            if warm:
                track.mark()
        counted = self._count(values)
        alerts = []
        if warm:
            outcome = self._counts_collapse(step) if counted else None
            alerts += self._reward_collapse(step, values) if outcome is None else outcome
            alerts += self._falls(step, values)
        alerts += self._grad_spike(step, values.get(names.GRAD_NORM), warm)
        alerts += self._variance_collapse(step, values)
        alerts += self._eval_floor(step, values)
        return alerts

    def _outcome(self) -> str:
        """The metric whose fall is a collapse: success when the run logs it, else reward."""
        return names.SUCCESS if names.SUCCESS in self.tracks else names.REWARD_MEAN

    def _reward_collapse(self, step: int, values: dict) -> list[Alert]:
        name = self._outcome()
        track = self.tracks.get(name)
        if track is None or name not in values or track.count < _MIN_OBSERVATIONS:
            return []
        peak, base = track.peak, track.base
        assert peak is not None and base is not None  # update() marked it: warm and in values
        rise = max(0.0, peak - base)
        need = max(self.config.reward_drop * rise, self.config.noise_margin * track.noise)
        fall = peak - track.ema
        if not _crossed(track, fall, need):
            return []
        message = (
            f"{name.split('/')[-1]} {track.ema:.4g} fell {fall:.4g} from its peak "
            f"{peak:.4g} (start {base:.4g}; threshold {need:.4g})"
        )
        return [Alert(step, "collapse", name, track.ema, peak, message)]

    def _count(self, values: dict) -> bool:
        """success_test=counts: record this step's (successes, episodes); False where the
        step logs no success or no episode count (the ema rule judges it then)."""
        episodes = values.get(names.EPISODES, 0.0)
        if self.config.success_test != "counts" or names.SUCCESS not in values or episodes < 1:
            return False
        count = (round(values[names.SUCCESS] * episodes), round(episodes))
        window = self.config.success_window
        if len(self.start) < window:
            self.start.append(count)
        self.counts.append(count)
        del self.counts[: -3 * window]  # the longest split: window before, 2 * window after
        return True

    def _counts_collapse(self, step: int) -> list[Alert]:
        """A collapse when `surest_fall`'s p-value is under that of ``success_z`` standard
        deviations; re-armed once it is back over that of half of them."""
        c = self.config
        start_rate = sum(k for k, _ in self.start) / sum(n for _, n in self.start)
        fall = surest_fall(self.counts, c.success_window, start_rate, c.reward_drop)
        p = 1.0 if fall is None else fall.p
        if self.counts_active:
            self.counts_active = p < _tail(c.success_z / 2)
            return []
        self.counts_active = fall is not None and p < _tail(c.success_z)
        if fall is None or not self.counts_active:
            return []
        (kb, nb), (ka, na) = fall.before, fall.after
        message = (
            f"success {fall.after_rate:.3g} ({ka}/{na} episodes) over the last "
            f"{fall.after_steps} steps against {fall.before_rate:.3g} ({kb}/{nb}) just before "
            f"(one-sided exact test p {p:.2g}, under {_tail(c.success_z):.2g})"
        )
        return [Alert(step, "collapse", names.SUCCESS, fall.after_rate, fall.before_rate, message)]

    def _falls(self, step: int, values: dict) -> list[Alert]:
        alerts = []
        for f in self.falls:
            track = self.tracks.get(f.metric)
            if track is None or f.metric not in values or track.count < _MIN_OBSERVATIONS:
                continue
            peak = track.peak
            assert peak is not None  # update() marked it: warm and in values
            if peak <= 0:  # no fall from a level of zero (e.g. an MI never above 0)
                continue
            if f.while_reward_holds and not self._holds():
                continue  # not judged now, so it stays armed for when the reward holds again
            fall = peak - track.ema
            need = max(f.share * peak, self.config.noise_margin * track.noise)
            if not _crossed(track, fall, need):
                continue
            reason = " while the reward holds" if f.while_reward_holds else ""
            message = (
                f"{track.ema:.4g} is {fall / peak:.0%} below its running peak {peak:.4g}{reason}"
            )
            alerts.append(Alert(step, "warning", f.metric, track.ema, peak, message))
        return alerts

    def _holds(self) -> bool:
        """The outcome has not collapsed and the task is not solved (std and entropy then
        fall for a good reason)."""
        outcome, success = self.tracks.get(self._outcome()), self.tracks.get(names.SUCCESS)
        collapsed = self.counts_active or (outcome is not None and outcome.active)
        solved = success is not None and success.ema >= self.config.solved_success
        return not collapsed and not solved

    def _grad_spike(self, step: int, value: float | None, warm: bool) -> list[Alert]:
        if value is None:
            return []
        c = self.config
        history = self.grad_history
        median = statistics.median(history) if history else 0.0
        history.append(value)
        del history[: -c.grad_window]
        if not warm or len(history) <= _MIN_GRAD_HISTORY or median <= 0:
            return []
        if self.grad_active:  # one alert per spell of spikes: re-arm below half the bar
            self.grad_active = value > c.grad_spike * median / 2
            return []
        self.grad_active = value > c.grad_spike * median
        if not self.grad_active:
            return []
        message = (
            f"gradient norm {value:.4g} is {value / median:.1f}x its running median {median:.4g}"
        )
        return [Alert(step, "collapse", names.GRAD_NORM, value, median, message)]

    def _variance_collapse(self, step: int, values: dict) -> list[Alert]:
        """RAGEN-2's reward-variance stop: the baseline is the mean reward std of the first
        ``variance_baseline_steps`` steps that kept a group; the collapse is called on the
        ``variance_collapse_steps``-th step in a row under ``variance_collapse_ratio`` of it
        (a step whose filter kept nothing counts, as its std is what emptied it), and again at
        each further multiple of it while the spell lasts. A baseline of 0 (no group's returns
        differed in those steps) is never called: there was no variance to lose, and a run
        that never learns is the evaluation floor's to stop."""
        c = self.config
        std = values.get(names.REWARD_STD)
        if not c.variance_collapse_steps or std is None:
            return []
        if len(self.std_baseline) < c.variance_baseline_steps:
            if values.get(names.KEPT_GROUPS, 1.0) > 0:
                self.std_baseline.append(std)
            return []
        baseline = sum(self.std_baseline) / len(self.std_baseline)
        self.std_low = self.std_low + 1 if std < c.variance_collapse_ratio * baseline else 0
        if self.std_low == 0 or self.std_low % c.variance_collapse_steps:
            return []
        message = (
            f"in-group reward std {std:.4g} has stayed under {c.variance_collapse_ratio:g} x "
            f"its baseline {baseline:.4g} for {self.std_low} steps"
        )
        return [Alert(step, "collapse", names.REWARD_STD, std, baseline, message)]

    def _eval_floor(self, step: int, values: dict) -> list[Alert]:
        """RAGEN-2's validation stop: called at the ``eval_floor_evals``-th evaluation in a
        row whose success (the mean over the evaluated envs) is under ``eval_floor``, and again
        at each further multiple of it while the spell lasts."""
        c = self.config
        found = [v for k, v in values.items() if k.startswith("eval/") and k.endswith("/success")]
        if not c.eval_floor_evals or not found:
            return []
        success = sum(found) / len(found)
        self.eval_low = self.eval_low + 1 if success < c.eval_floor else 0
        if self.eval_low == 0 or self.eval_low % c.eval_floor_evals:
            return []
        message = (
            f"evaluation success {success:.1%} has been under {c.eval_floor:.1%} at "
            f"{self.eval_low} evaluations in a row"
        )
        return [Alert(step, "collapse", EVAL_SUCCESS, success, c.eval_floor, message)]

    def actionable(self, alerts: Sequence[Alert]) -> list[Alert]:
        """The alerts that call for ``config.action``: collapses; plus warnings when
        ``act_on`` is warning; RAGEN-2's early stops alone when it is early_stop. (With
        action=warn the caller only logs them.)"""
        act_on = self.config.act_on
        if act_on == "early_stop":
            return [a for a in alerts if a.kind == "collapse" and a.signal in EARLY_STOP_SIGNALS]
        kinds = {"collapse", "warning"} if act_on == "warning" else {"collapse"}
        return [a for a in alerts if a.kind in kinds]

    # ------------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Everything seen so far, as JSON data (it goes into the checkpoint)."""
        return {
            "steps_seen": self.steps_seen,
            "tracks": {k: asdict(t) for k, t in self.tracks.items()},
            "grad_history": list(self.grad_history),
            "grad_active": self.grad_active,
            "std_baseline": list(self.std_baseline),
            "std_low": self.std_low,
            "eval_low": self.eval_low,
            "counts": [list(c) for c in self.counts],
            "start": [list(c) for c in self.start],
            "counts_active": self.counts_active,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s data: later updates match an unbroken stream."""
        self.steps_seen = int(state["steps_seen"])
        self.tracks = {k: _Track(**v) for k, v in state["tracks"].items()}
        self.grad_history = [float(v) for v in state["grad_history"]]
        self.grad_active = bool(state["grad_active"])
        # checkpoints written before the early stops existed hold none of their state
        self.std_baseline = [float(v) for v in state.get("std_baseline", [])]
        self.std_low = int(state.get("std_low", 0))
        self.eval_low = int(state.get("eval_low", 0))
        self.counts = [(int(k), int(n)) for k, n in state.get("counts", [])]
        self.start = [(int(k), int(n)) for k, n in state.get("start", [])]
        self.counts_active = bool(state.get("counts_active", False))


def _crossed(track: _Track, fall: float, need: float) -> bool:
    """Whether a signal alerts now: it falls past ``need`` while not already alerting.
    It re-arms once it is back within half of ``need`` of its peak."""
    assert track.peak is not None  # only marked tracks are judged
    # A constant metric has no noise and no rise: keep rounding error from being a "fall".
    need = max(need, _TOLERANCE * max(1.0, abs(track.peak)))
    if track.active:
        track.active = fall > need / 2
        return False
    track.active = fall >= need and fall > 0
    return track.active


def _tail(z: float) -> float:
    """The one-sided p-value of a fall of ``z`` standard deviations."""
    return 1.0 - statistics.NormalDist().cdf(z)


def is_finite_number(value: object) -> TypeGuard[int | float]:
    """A metric value worth reading: an int or float (not a bool), finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def replay(records, config: MonitorConfig | None = None) -> list[Alert]:
    """Run a whole metrics stream (metrics.jsonl records, in order) through a fresh detector."""
    detector = CollapseDetector(config)
    alerts = []
    for record in sorted(records, key=lambda r: r.get("step", 0)):
        if "step" in record:
            alerts += detector.update(int(record["step"]), record)
    return alerts
