"""Two-armed bandit with symbolic arm names (single turn, stochastic).

One arm is high-risk: it pays `high_payoff` with probability `high_prob`, else 0. The other
is low-risk: it always pays `low_payoff`. With the paper's defaults (0.25 × 1 against a sure
0.15) the risky arm has the higher mean, so success means pulling it. The arms are told
apart only by their names, which is the point: the agent has to bring what "Dragon" and
"Phoenix" suggest to the choice. `bandit-rev` keeps the names and swaps the payoffs, against
their meaning; `bandit-test` uses a name pair never seen in training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ragen.agent.parsing import action_word_problem
from ragen.envs.base import (
    Demonstration,
    EpisodeBudget,
    StepResult,
    action_lookup,
    check_int,
    check_probability,
    info,
    match_action,
)

# Salt that separates the reward stream from the arm-order stream of the same seed.
_REWARD_STREAM = 1

# Worked turns for few-shot prompting: name pairs no registered bandit uses, listed in the
# order shown, and the arm picked. One picks the first arm shown and one the second, so the
# examples lean toward no position; with no reward shown they say nothing about risk.
_DEMOS = (
    (("Owl", "Rabbit"), ("Rabbit", "Owl"), "Owl"),
    (("Lion", "Cat"), ("Lion", "Cat"), "Cat"),
)


def arm_order(seed: int, arm_names: Sequence[str]) -> tuple[str, ...]:
    """The order in which the arms are listed to the agent for this seed."""
    check_int("seed", seed, 0)
    permutation = np.random.default_rng(seed).permutation(len(arm_names))
    return tuple(arm_names[i] for i in permutation)


class BanditEnv:
    """A single-pull, two-armed bandit; the action is an arm's name.

    The first valid pull ends the episode. The budget (`max_actions`, default 3) only
    matters for words that name no arm: they are no-ops, and the budget stops an agent
    that keeps writing them.
    """

    def __init__(
        self,
        arm_names: Sequence[str] = ("Dragon", "Phoenix"),
        high_risk: str = "Dragon",
        low_payoff: float = 0.15,
        high_prob: float = 0.25,
        high_payoff: float = 1.0,
        max_actions: int = 3,
    ) -> None:
        names = tuple(arm_names)
        if (
            len(names) != 2
            or not all(isinstance(n, str) and n.strip() == n and n for n in names)
            or names[0].casefold() == names[1].casefold()
        ):
            raise ValueError(
                f"arm_names must be two different non-empty words without surrounding "
                f"spaces, got {arm_names!r}"
            )
        for name in names:
            problem = action_word_problem(name)
            if problem:
                raise ValueError(f"arm name {name!r} could never be chosen: {problem}")
        if high_risk not in names:
            raise ValueError(
                f"high_risk must be one of {names[0]!r}, {names[1]!r}; got {high_risk!r}"
            )
        for option, value in (("low_payoff", low_payoff), ("high_payoff", high_payoff)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ValueError(f"{option} must be a finite number, got {value!r}")
        self.actions: tuple[str, ...] = names
        self.high_risk = high_risk
        self.low_payoff = float(low_payoff)
        self.high_prob = check_probability("high_prob", high_prob)
        self.high_payoff = float(high_payoff)
        self._lookup = action_lookup(names)
        self._budget = EpisodeBudget(max_actions)
        self._order: tuple[str, ...] = names
        self._rng = np.random.default_rng(0)
        self._text = ""

    def instructions(self) -> str:
        a, b = self.actions
        return (
            f"You are in front of two slot machine arms, {a} and {b}. "
            "Each arm gives a reward when pulled: one arm pays a small amount every time, the "
            "other pays a larger amount only some of the time. You may pull one arm, once. "
            "Try to get the highest expected reward.\n"
            f"Answer with the name of one arm: {a} or {b}."
        )

    def reset(self, seed: int) -> str:
        self._order = arm_order(seed, self.actions)
        self._rng = np.random.default_rng([seed, _REWARD_STREAM])
        self._budget.start()
        self._text = _state_text(self._order)
        return self._text

    demo_count = len(_DEMOS)

    def demonstrations(self) -> tuple[Demonstration, ...]:
        """Two worked pulls of bandits with other arm names (see `Demonstration`)."""
        worked = []
        for names, shown, pick in _DEMOS:
            other = BanditEnv(arm_names=names, high_risk=names[0])
            thought = f"The arms are {shown[0]} and {shown[1]}. I pull {pick}."
            worked.append(Demonstration(other.instructions(), _state_text(shown), thought, (pick,)))
        return tuple(worked)

    def _payoff(self, arm: str) -> float:
        if arm != self.high_risk:
            return self.low_payoff
        return self.high_payoff if self._rng.random() < self.high_prob else 0.0

    def step(self, action: str) -> StepResult:
        self._budget.spend()
        arm = match_action(self._lookup, action)
        if arm is None:
            truncated = self._budget.close(terminated=False)
            return StepResult(self._text, 0.0, False, truncated, info(False, False, False))
        reward = self._payoff(arm)
        self._budget.close(terminated=True)
        self._text = f"You pulled {arm} and received {reward:.2f}."
        return StepResult(self._text, reward, True, False, info(arm == self.high_risk, True, True))

    def render(self) -> str:
        return self._text


def _state_text(order: Sequence[str]) -> str:
    return f"Arms: {', '.join(order)}. Which arm do you pull?"
