"""Context windows: what the model is shown at each turn (``rollout.context_window``).

- ``full``: the whole dialogue. The loop grows it by appending each reply's ids and the
  template's continuation, and an episode is one training sample.
- ``limited_multi_turn``: the system line, the worked examples and the env's instructions,
  then the last k turns as a chat: the first shown turn's state follows the instructions in
  their message, under its own turn number, and the later turns follow as in the full
  dialogue, the earlier replies as the ids they were sampled as.
- ``single_turn``: the same opening, then one user message: the k - 1 turns before the
  current one summarised (state, actions, rewards), then the current state.

A windowed turn's context is built afresh (:func:`window_context`) and appended to the
trajectory after the previous reply, so a trajectory holds, turn after turn, each context
followed by the reply sampled in it; ``Turn.context_start`` marks where that context begins.
Each turn is then its own training sample (``rollout.samples``): exactly the ids the model
read and wrote. k is ``rollout.context_turns``, the current turn included; 0 shows every turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragen.agent.prompts import first_user_message, past_turn, turn_user_message
from ragen.rollout.dialogue import ChatFormat
from ragen.rollout.trajectory import Turn

FULL = "full"


def first_shown(turn: int, k: int) -> int:
    """The first turn (1-based) a context of turn ``turn`` shows: ``turn - k + 1``, at least
    1; k = 0 shows every turn."""
    return 1 if k == 0 else max(1, turn - k + 1)


@dataclass(frozen=True)
class EpisodeSoFar:
    """What a window is built from: the episode's fixed text and its turns so far.

    ``turns`` index ``token_ids`` (their replies' ids); ``observation`` is the state of the
    turn to come, number ``len(turns) + 1``; ``budget`` the episode's action budget."""

    instructions: str
    actions: Sequence[str]
    demos: Sequence[dict]
    turns: Sequence[Turn]
    token_ids: Sequence[int]
    observation: str
    budget: int


def window_context(
    fmt: ChatFormat,
    mode: str,
    k: int,
    ep: EpisodeSoFar,
    max_actions_per_turn: int,
    think: bool,
    *,
    rule_every_turn: bool = True,
) -> tuple[list[int], int]:
    """The ids of the next turn's context in the windowed ``mode`` (limited_multi_turn or
    single_turn) showing ``k`` turns, and the number of the first turn it shows.
    ``rule_every_turn``: the later turns' messages close with the format rule
    (rollout.format_rule); the opening message always does.
    ``max_actions_per_turn``: the most actions a reply may run (1 for a free-text env);
    ``think``: the reply format (rollout.think)."""
    current = len(ep.turns) + 1
    start = first_shown(current, k)
    states = [t.observation for t in ep.turns] + [ep.observation]  # of turns 1..current
    left = [ep.budget]  # actions left at the start of turns 1..current
    for t in ep.turns:
        left.append(left[-1] - len(t.actions))

    def first_message(turn: int, past: Sequence[str] = ()) -> str:
        return first_user_message(
            ep.instructions,
            ep.actions,
            max_actions_per_turn,
            states[turn - 1],
            left[turn - 1],
            think=think,
            turn=turn,
            past=past,
        )

    if mode == "single_turn":
        past = [
            past_turn(i, states[i - 1], ep.turns[i - 1].actions, ep.turns[i - 1].rewards)
            for i in range(start, current)
        ]
        return fmt.opening(first_message(current, past), ep.demos), start
    user = first_message(start)
    ids = fmt.opening(user, ep.demos)
    history = [*ep.demos, {"role": "user", "content": user}]
    for i in range(start, current):  # each shown reply, then the message that followed it
        turn = ep.turns[i - 1]
        reply = list(ep.token_ids[turn.reply_start : turn.reply_end])
        user = turn_user_message(
            i + 1,
            states[i],
            left[i],
            turn.rewards,
            max_actions_per_turn=max_actions_per_turn,
            think=think,
            rule=rule_every_turn,
        )
        stopped = bool(reply) and reply[-1] in fmt.stop_ids
        ids += reply + fmt.continuation(history, user, reply_stopped=stopped)
        history += [{"role": "assistant", "content": turn.reply}, {"role": "user", "content": user}]
    return ids, start
