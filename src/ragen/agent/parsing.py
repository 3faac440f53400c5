"""Turn an assistant reply into the actions to execute, and say what was wrong with it.

The reply is expected as `<think>reasoning</think><answer>Up || Left</answer>` (with
`think=False`, the NoThinking ablation, just `<answer>Up || Left</answer>`). A small model
writes anything, so `parse_reply` never raises on model text, runs in linear time, and is
strict about structure but tolerant of chatter:

1. Tags are the four literal strings `<think>`, `</think>`, `<answer>`, `</answer>`, matched
   case-insensitively (`<Answer>` counts; `< answer>` does not).
2. think=True: the think block runs from the first `<think>` to the first `</think>` after
   it. No `<think>` at all is `missing_think`; no `</think>` is `unclosed_think`, and then
   `think` is everything after `<think>` and no answer is looked for (any `<answer>` in
   there is part of unfinished reasoning).
3. The answer is the first `<answer>` after the think block (after the start of the reply
   when think=False or `<think>` is missing) up to the first `</answer>` after it. No
   `<answer>` is `missing_answer`; no `</answer>` is `unclosed_answer`: a reply cut by the
   token limit is not executed, since its last word may be cut too. `answer` still holds
   the text in that case, for logging.
4. Inside the answer, actions are separated by `||`, `|`, `,`, `;` or line breaks (empty
   pieces are skipped). A piece matches an action word case-insensitively after surrounding
   whitespace and trailing sentence punctuation (`Up.`) are removed; the canonical spelling
   from `valid_actions` is returned. Anything else is an unknown word: dropped, counted.
   Valid actions after the first `max_actions` are dropped and counted.
5. Empty `valid_actions` means a free-text env: the whole stripped answer is the one action.
6. Actions are returned only when no FATAL code was found (`missing_think`,
   `unclosed_think`, `missing_answer`, `unclosed_answer`, `empty_answer`), so
   `format_ok == bool(actions)` always: a reply that runs no action is exactly one that
   gets the format penalty and counts against the format-ok rate.
7. Chatter does not cost the actions but is reported: non-blank text before the first
   block, between the blocks or after `</answer>` (`text_outside_tags`, or `repeated_think` /
   `repeated_answer` when that text opens another block), and tags inside a block
   (`nested_tag`, e.g. the `<think><think>` a model writes when it repeats the prefix).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# Every code `parse_reply` can report, with its meaning. Codes in FATAL mean no action runs.
PROBLEMS: dict[str, str] = {
    "missing_think": "no <think> tag (think=True)",
    "unclosed_think": "<think> without a later </think>",
    "missing_answer": "no <answer> tag after the think block",
    "unclosed_answer": "<answer> without a later </answer> (reply cut short?)",
    "empty_answer": "the answer holds no action pieces",
    "unknown_action": "some answer pieces are not action words (dropped)",
    "extra_actions": "more than max_actions valid actions (the rest dropped)",
    "text_outside_tags": "non-blank text outside the think and answer blocks",
    "repeated_think": "a <think> tag outside the think block (any, with think=False)",
    "repeated_answer": "an <answer> tag outside the answer block",
    "nested_tag": "a tag inside the think or answer block",
}
FATAL = frozenset(
    {"missing_think", "unclosed_think", "missing_answer", "unclosed_answer", "empty_answer"}
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# Lower-cases ASCII only, so the folded text has exactly the length of the original and an
# index found in one is valid in the other (str.lower may lengthen some characters, 'İ').
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# A character class of single characters: re.split over it is linear, and "||" simply
# yields an empty piece in between, which is skipped.
_SEPARATORS = re.compile(r"[|,;\r\n]")
# Sentence punctuation a model puts after a word ("Up.", "Left!"), plus blanks so that
# "Up ." also reduces to "Up".
_TRAILING = ".!?:…。！？： \t"


@dataclass(frozen=True)
class Parsed:
    """What one reply says, and what was wrong with it."""

    think: str
    """Text inside <think>...</think>, stripped; all text after an unclosed <think>; ''
    when there is no <think> or think=False."""
    answer: str
    """Raw text inside <answer>...</answer>, stripped ('' if none)."""
    actions: tuple[str, ...]
    """Actions to execute, canonical spelling, at most max_actions."""
    format_ok: bool
    """The reply has the required tags and yields >= 1 valid action (== bool(actions))."""
    problems: tuple[str, ...]
    """Codes from PROBLEMS, each at most once, in the order they were found."""
    unknown_actions: int
    """Answer pieces dropped because they are not valid actions."""
    extra_actions: int
    """Valid actions dropped beyond max_actions."""


class _Problems:
    """An ordered set of problem codes."""

    def __init__(self) -> None:
        self.codes: list[str] = []

    def add(self, code: str) -> None:
        if code not in self.codes:
            self.codes.append(code)

    def outside(self, folded_segment: str) -> None:
        """Report a stretch of text that lies outside every block."""
        repeated = False
        if THINK_OPEN in folded_segment:
            self.add("repeated_think")
            repeated = True
        if ANSWER_OPEN in folded_segment:
            self.add("repeated_answer")
            repeated = True
        if not repeated and folded_segment.strip():
            self.add("text_outside_tags")

    def fatal(self) -> bool:
        """Whether a code that forbids running any action was found."""
        return any(code in FATAL for code in self.codes)

    def nested(self, folded_block: str) -> None:
        """Report tags inside a block's text."""
        if any(tag in folded_block for tag in _TAGS):
            self.add("nested_tag")


def parse_reply(
    text: str, valid_actions: Sequence[str], max_actions: int, *, think: bool = True
) -> Parsed:
    """Parse a whole assistant reply (prefix included) by the rules in the module docstring.

    text: the reply as decoded, starting with the prefix the rollout inserted (`<think>`,
        or `<answer>` when think=False).
    valid_actions: the env's action words; empty for a free-text env.
    max_actions: how many actions one reply may run (>= 1).
    think: whether a think block is required before the answer.
    """
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    folded = text.translate(_ASCII_LOWER)
    problems = _Problems()
    think_text, cursor = "", 0
    if think:
        think_text, cursor = _think_block(text, folded, problems)
        if cursor < 0:  # unclosed think: there is no answer to look for
            return _result(think_text, "", (), problems)
    answer, closed = _answer_block(text, folded, cursor, problems)
    if not closed or problems.fatal():
        return _result(think_text, answer, (), problems)
    actions, unknown, extra = _split_actions(answer, valid_actions, max_actions, problems)
    return _result(think_text, answer, actions, problems, unknown, extra)


def _think_block(text: str, folded: str, problems: _Problems) -> tuple[str, int]:
    """The think text and where the answer search starts (-1 if the block is unclosed)."""
    start = folded.find(THINK_OPEN)
    if start < 0:
        problems.add("missing_think")
        return "", 0
    problems.outside(folded[:start])
    body = start + len(THINK_OPEN)
    end = folded.find(THINK_CLOSE, body)
    if end < 0:
        problems.add("unclosed_think")
        return text[body:].strip(), -1
    problems.nested(folded[body:end])
    return text[body:end].strip(), end + len(THINK_CLOSE)


def _answer_block(text: str, folded: str, cursor: int, problems: _Problems) -> tuple[str, bool]:
    """The stripped answer text from `cursor` on, and whether its block was closed."""
    start = folded.find(ANSWER_OPEN, cursor)
    if start < 0:
        problems.add("missing_answer")
        problems.outside(folded[cursor:])
        return "", False
    problems.outside(folded[cursor:start])
    body = start + len(ANSWER_OPEN)
    end = folded.find(ANSWER_CLOSE, body)
    if end < 0:
        problems.add("unclosed_answer")
        return text[body:].strip(), False
    problems.nested(folded[body:end])
    problems.outside(folded[end + len(ANSWER_CLOSE) :])
    return text[body:end].strip(), True


def _split_actions(
    answer: str, valid_actions: Sequence[str], max_actions: int, problems: _Problems
) -> tuple[tuple[str, ...], int, int]:
    """The actions in a closed answer, and how many unknown and extra pieces were dropped."""
    if not valid_actions:  # free text: the whole answer is the action
        if not answer:
            problems.add("empty_answer")
        return (answer,) if answer else (), 0, 0
    pieces = [p.strip() for p in _SEPARATORS.split(answer)]
    pieces = [p for p in pieces if p]
    if not pieces:
        problems.add("empty_answer")
        return (), 0, 0
    lookup = {word.strip().casefold(): word for word in valid_actions}
    matched = []
    for piece in pieces:
        key = piece.casefold()
        # The exact piece first, so an action word that itself ends in "!" still matches.
        word = lookup.get(key)
        if word is None:
            word = lookup.get(key.rstrip(_TRAILING))
        if word is not None:
            matched.append(word)
    unknown = len(pieces) - len(matched)
    extra = max(0, len(matched) - max_actions)
    if unknown:
        problems.add("unknown_action")
    if extra:
        problems.add("extra_actions")
    return tuple(matched[:max_actions]), unknown, extra


def action_word_problem(word: str) -> str | None:
    """Why `parse_reply` could never return ``word`` as one action, or None if it can.

    An env checks its action words with this, so that every action it offers is one some
    reply can choose: a separator splits the word into pieces, and a tag ends a block early.
    """
    if not word.strip():
        return "it is blank"
    if _SEPARATORS.search(word):
        return "it holds an action separator (|, a comma, ; or a line break)"
    if any(tag in word.translate(_ASCII_LOWER) for tag in _TAGS):
        return "it holds a <think> or <answer> tag"
    return None


def _result(
    think: str,
    answer: str,
    actions: tuple[str, ...],
    problems: _Problems,
    unknown: int = 0,
    extra: int = 0,
) -> Parsed:
    """Assemble the answer; format_ok is bool(actions) because actions only exist when ok."""
    return Parsed(think, answer, actions, bool(actions), tuple(problems.codes), unknown, extra)
