"""A reward term written outside ragen: the worked example of
docs/guides/adding-a-reward-term.md.

    ragen train sokoban "rollout.reward_terms={my_reward_terms:names_its_action: 0.05}"

A term is a plain function of one finished ``ragen.rollout.trajectory.Turn`` returning a
finite number; the config gives it a weight, and ``weight * term(turn)`` joins the turn's
reward.
"""

from __future__ import annotations

import re

from ragen.rollout.trajectory import Turn


def names_its_action(turn: Turn) -> float:
    """The share of the actions the reply ran that its reasoning names, as whole words in
    any letter case; 0 when it ran none.

    A small positive weight pays reasoning that agrees with the answer: a model that thinks
    "the box is left of me, so I push Left" and answers Left gets it, one whose answer does
    not follow from its think does not. For games with action words (Sokoban, FrozenLake,
    Bandit); a Countdown action is an equation, which a think rarely spells out verbatim.
    """
    if not turn.actions:
        return 0.0
    named = [
        re.search(rf"\b{re.escape(action)}\b", turn.think, re.IGNORECASE) is not None
        for action in turn.actions
    ]
    return sum(named) / len(named)
