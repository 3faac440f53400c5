"""The words the agent is shown: a system line, the first user message, one message per turn.

The dialogue, rendered by the tokenizer's chat template:

    system:    SYSTEM_PROMPT
    user:      <env instructions>
               Turn 1:
               State:
               <observation>
               You have 10 actions left.
               Always reply as <think>...</think><answer>...</answer>, with up to 3 actions
               separated by ||. Example: <think>I look at the state, then plan.</think>
               <answer>Up || Down</answer>
    assistant: <think>... (the rollout inserts the prefix, the model writes the rest)
    user:      Rewards: -0.1, 1
               Turn 2:
               ...

The budget sentence ("up to K actions ..., separated by ||") is part of the format rule, so
it closes every user message instead of appearing twice in the first one. The default model
is a 135M instruct model with a small context, so every line here earns its tokens.

Everything here is a pure function of strings and numbers: no tokenizer, no env.
"""

from __future__ import annotations

from collections.abc import Sequence

SYSTEM_PROMPT = "You are an agent playing a text game. Follow the rules and the reply format."

# A neutral thought for the example: one that stated facts about a state ("the box is left
# of me") would be false for most states, and a small model copies examples.
_EXAMPLE_THOUGHT = "I look at the state, then plan."


def reply_prefix(think: bool) -> str:
    """What the rollout writes at the start of every assistant reply."""
    return "<think>" if think else "<answer>"


def format_rule(think: bool, max_actions_per_turn: int) -> str:
    """The reply format, repeated at the end of every user message.

    With one action per turn the separator is not mentioned; a free-text env (no action
    words) should pass 1 here, since its whole answer is a single action.
    """
    _check_at_least("max_actions_per_turn", max_actions_per_turn, 1)
    tags = "<think>...</think><answer>...</answer>" if think else "<answer>...</answer>"
    if max_actions_per_turn == 1:
        return f"Always reply as {tags}."
    return f"Always reply as {tags}, with up to {max_actions_per_turn} actions separated by ||."


def example_reply(actions: Sequence[str], max_actions_per_turn: int, *, think: bool = True) -> str:
    """A valid reply built from the env's first action words ('' when none is shown).

    It is shown only when a reply may hold several actions, where it teaches the `||`
    separator. With one action per turn it would only push the model toward the env's first
    action word, which on Bandit is one of the two arms the agent has to choose between.
    """
    if not actions or max_actions_per_turn == 1:
        return ""
    answer = f"<answer>{' || '.join(actions[:2])}</answer>"
    return f"<think>{_EXAMPLE_THOUGHT}</think>{answer}" if think else answer


def worked_reply(thought: str, answer: Sequence[str], *, think: bool = True) -> str:
    """The reply of a worked example (a demonstration): its thought and its action words."""
    tagged = f"<answer>{' || '.join(answer)}</answer>"
    return f"<think>{thought}</think>{tagged}" if think else tagged


def first_user_message(
    instructions: str,
    actions: Sequence[str],
    max_actions_per_turn: int,
    observation: str,
    actions_left: int,
    *,
    think: bool = True,
    turn: int = 1,
    past: Sequence[str] = (),
) -> str:
    """The opening user message: the env's instructions, then turn 1 and the format rule.

    instructions: the env's text (rules, symbol legend, action list).
    actions: the env's action words; empty for a free-text env, whose answer is one action.
    turn, past: a context window that dropped the turns before ``turn`` opens with it instead
    (its number kept), after ``past``, the earlier turns summarised (:func:`past_turn`).
    """
    _check_at_least("turn", turn, 1)
    per_turn = max_actions_per_turn if actions else 1
    rule = format_rule(think, per_turn)
    example = example_reply(actions, per_turn, think=think)
    if example:
        rule = f"{rule} Example: {example}"
    history = "".join(f"{block}\n" for block in past)
    return f"{instructions.strip()}\n{history}{_turn(turn, observation, actions_left)}\n{rule}"


def past_turn(turn: int, observation: str, actions: Sequence[str], rewards: Sequence[float]) -> str:
    """An earlier turn in one block, as the single_turn context window summarises it: its
    state, the actions it ran and their rewards."""
    state = observation.strip("\r\n")
    ran = f"Actions: {' || '.join(actions)}\n{_rewards(rewards)}" if actions else _rewards(())
    return f"Turn {turn}:\nState:\n{state}\n{ran}"


def turn_user_message(
    turn: int,
    observation: str,
    actions_left: int,
    rewards: Sequence[float],
    *,
    max_actions_per_turn: int,
    think: bool = True,
    rule: bool = True,
) -> str:
    """A later user message: the previous turn's rewards, then this turn and the format rule
    (``rule``; false leaves the rule to the first message: rollout.format_rule=first_turn).

    turn: the number of the turn this message opens (2 after the first reply).
    rewards: one per action the previous reply ran; empty when it ran none.
    """
    _check_at_least("turn", turn, 2, "turn 1 is opened by first_user_message")
    message = f"{_rewards(rewards)}\n{_turn(turn, observation, actions_left)}"
    return f"{message}\n{format_rule(think, max_actions_per_turn)}" if rule else message


def _turn(turn: int, observation: str, actions_left: int) -> str:
    _check_at_least("actions_left", actions_left, 0)
    unit = "action" if actions_left == 1 else "actions"
    # Only blank lines are trimmed: a grid may begin with meaningful spaces.
    state = observation.strip("\r\n")
    return f"Turn {turn}:\nState:\n{state}\nYou have {actions_left} {unit} left."


def _rewards(rewards: Sequence[float]) -> str:
    # :g keeps rewards short and hides float noise: -0.30000000000000004 -> -0.3, 10.0 -> 10.
    if not rewards:
        return "No action was taken."
    label = "Reward" if len(rewards) == 1 else "Rewards"
    return f"{label}: {', '.join(f'{r:g}' for r in rewards)}"


def _check_at_least(name: str, value: int, low: int, why: str = "") -> None:
    if value < low:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be >= {low}, got {value}{reason}")
