"""Countdown (single turn): combine the given numbers into an expression equal to the target.

Each number must be used exactly once; + - * / and parentheses are allowed (the typeset
× ÷ − read as * / -). Reward 1 for a correct expression, 0.1 for one that uses exactly the
given numbers but misses the target (a format-level reward, as in TinyZero and RAGEN), 0
otherwise.

Answers are read by a small recursive-descent parser over exact fractions, never `eval`:
agent text must not run as code, and exact arithmetic means 8 / 3 * 3 equals 8. Bounds on
length, digits, nesting and magnitude turn hostile input into a plain 0 reward.

Instances are generated backwards: draw the numbers, combine them at random into an
expression, and take its value as the target, so every instance has a known solution.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ragen.envs.base import EpisodeBudget, GenerationError, StepResult, check_int, info

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1  # right numbers, wrong value

MAX_ANSWER_CHARS = 200
MAX_DIGITS = 6  # no given number has more; longer literals are junk
MAX_DEPTH = 32  # parenthesis nesting; bounds the parser's recursion
MAX_MAGNITUDE = 10**12  # numerators/denominators beyond this: an overflow, reward 0
MAX_TRIES = 10_000  # draws per instance: about 3 s of trying at worst, then a clear error

# Typeset operators, as models (and people) write them, read as their ASCII forms.
_OPERATOR = {"\N{MULTIPLICATION SIGN}": "*", "\N{DIVISION SIGN}": "/", "\N{MINUS SIGN}": "-"}
_TOKEN = re.compile(r"\s*(?:([0-9]+)|([-+*/()" + "".join(_OPERATOR) + "]))")


class ExpressionError(ValueError):
    """The text is not an arithmetic expression this game accepts."""


def tokenize(text: str) -> list[str]:
    """Numbers and operators of `text`; anything else is an ExpressionError."""
    if len(text) > MAX_ANSWER_CHARS:
        raise ExpressionError(f"longer than {MAX_ANSWER_CHARS} characters")
    tokens, position, end = [], 0, len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None:
            raise ExpressionError(f"unexpected character {text[position]!r}")
        number, operator = match.groups()
        if number is not None and len(number) > MAX_DIGITS:
            raise ExpressionError(f"number with more than {MAX_DIGITS} digits")
        tokens.append(number if number is not None else _OPERATOR.get(operator, operator))
        position = match.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ;
    factor := NUMBER | '(' expr ')' | '-' factor."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = 0
        self.numbers: list[int] = []
        self.failure: str | None = None  # first arithmetic failure, reported after parsing

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError("the expression ends too early")
        self.position += 1
        return token

    def expression(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            right = self.term(depth) if self.take() == "+" else -self.term(depth)
            value = self.checked(value + right)
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            operator = self.take()
            right = self.factor(depth)
            if operator == "*":
                value = self.checked(value * right)
            elif right == 0:
                self.failure = self.failure or "division by zero"
                value = Fraction(0)
            else:
                value = self.checked(value / right)
        return value

    def factor(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise ExpressionError(f"nested deeper than {MAX_DEPTH} levels")
        token = self.take()
        if token == "(":
            value = self.expression(depth + 1)
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            return value
        if token == "-":
            return -self.factor(depth + 1)
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise ExpressionError(f"unexpected {token!r}")

    def checked(self, value: Fraction) -> Fraction:
        if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
            self.failure = self.failure or "number too large"
            return Fraction(0)
        return value


@dataclass(frozen=True)
class Evaluation:
    """A parsed answer: the numbers it uses (in order) and its value (None if undefined)."""

    numbers: tuple[int, ...]
    value: Fraction | None
    failure: str | None = None


def evaluate(text: str) -> Evaluation:
    """Parse and evaluate an answer; raises ExpressionError if it is not an expression.

    A trailing "= 24" is ignored, since agents often restate the target. Division by zero
    and overflow are not syntax errors: they give `value=None` and a `failure` reason.
    """
    tokens = tokenize(text.split("=", 1)[0])
    if not tokens:
        raise ExpressionError("empty answer")
    parser = _Parser(tokens)
    value = parser.expression(0)
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after the expression")
    if parser.failure is not None:
        return Evaluation(tuple(parser.numbers), None, parser.failure)
    return Evaluation(tuple(parser.numbers), value)


def score(evaluation: Evaluation, numbers: tuple[int, ...], target: int) -> float:
    """1 if correct, 0.1 if it uses exactly `numbers` but misses, else 0."""
    if evaluation.value is None or sorted(evaluation.numbers) != sorted(numbers):
        return 0.0
    return CORRECT_REWARD if evaluation.value == target else FORMAT_REWARD


# --------------------------------------------------------------------------- generator


_APPLY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


@dataclass(frozen=True)
class Instance:
    """Numbers to use, the target, and one expression that reaches it."""

    numbers: tuple[int, ...]
    target: int
    solution: str


def _combine(rng: np.random.Generator, numbers: list[int]) -> tuple[Fraction, str]:
    """Fold the numbers into one random expression: (value, text)."""
    items = [(Fraction(n), str(n)) for n in numbers]
    while len(items) > 1:
        i, j = rng.permutation(len(items))[:2].tolist()
        (a, text_a), (b, text_b) = items[i], items[j]
        operator = "+-*/"[int(rng.integers(4))]
        if operator == "-" and a < b:
            (a, text_a), (b, text_b) = (b, text_b), (a, text_a)  # keep values non-negative
        if operator == "/" and (b == 0 or a % b != 0):
            operator = "+"  # keep every intermediate value a whole number
        value = _APPLY[operator](a, b)
        merged = (value, f"({text_a} {operator} {text_b})")
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [merged]
    value, text = items[0]
    return value, text[1:-1] if len(numbers) > 1 else text


def generate_instance(
    seed: int,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 99,
    max_target: int = 100,
    max_tries: int = 1000,
) -> Instance:
    """An instance whose target is a whole number in [1, max_target] with a known solution."""
    check_int("seed", seed, 0)
    check_countdown_options(min_numbers, max_numbers, max_number, max_target)
    check_int("max_tries", max_tries, 1, MAX_TRIES)
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        count = int(rng.integers(min_numbers, max_numbers + 1))
        numbers = rng.integers(1, max_number + 1, size=count).tolist()
        value, solution = _combine(rng, numbers)
        if value.denominator == 1 and 1 <= value <= max_target:
            return Instance(tuple(numbers), int(value), solution)
    raise GenerationError(
        f"no countdown instance with a target in [1, {max_target}] after max_tries={max_tries} "
        "attempts; raise max_target"
    )


def check_countdown_options(
    min_numbers: int, max_numbers: int, max_number: int, max_target: int
) -> None:
    check_int("min_numbers", min_numbers, 2, 6)
    check_int(f"max_numbers (with min_numbers={min_numbers})", max_numbers, min_numbers, 6)
    check_int("max_number", max_number, 1, 10**MAX_DIGITS - 1)
    check_int("max_target", max_target, 1, MAX_MAGNITUDE)


# --------------------------------------------------------------------------- environment


class CountdownEnv:
    """Answer with one arithmetic expression; the action is free text, so `actions` is empty.

    Text that does not parse is an invalid action (a no-op, reward 0); the default budget of
    three actions lets a malformed answer be followed by another, then truncates.
    """

    actions: tuple[str, ...] = ()

    def __init__(
        self,
        min_numbers: int = 3,
        max_numbers: int = 4,
        max_number: int = 99,
        max_target: int = 100,
        max_actions: int = 3,
        max_tries: int = 1000,
    ) -> None:
        check_countdown_options(min_numbers, max_numbers, max_number, max_target)
        self._options = {
            "min_numbers": min_numbers,
            "max_numbers": max_numbers,
            "max_number": max_number,
            "max_target": max_target,
            "max_tries": check_int("max_tries", max_tries, 1, MAX_TRIES),
        }
        self._budget = EpisodeBudget(max_actions)
        self.instance: Instance | None = None
        self._text = ""

    def instructions(self) -> str:
        return (
            "You are playing Countdown. Using each of the given numbers exactly once, and "
            "the operations +, -, *, / with parentheses, write an expression whose value is "
            "the target.\n"
            "Reward: 1 for a correct expression, 0.1 if you used exactly the given numbers "
            "but missed the target, 0 otherwise.\n"
            "Answer with the expression only, for example: (7 - 2) * 3."
        )

    def reset(self, seed: int) -> str:
        self.instance = generate_instance(seed, **self._options)
        numbers = ", ".join(map(str, self.instance.numbers))
        self._text = f"Numbers: [{numbers}]\nTarget: {self.instance.target}"
        self._budget.start()
        return self._text

    def step(self, action: str) -> StepResult:
        self._budget.spend()
        try:
            evaluation = evaluate(action)
        except ExpressionError as error:
            truncated = self._budget.close(terminated=False)
            extra = {"error": str(error)}
            return StepResult(self._text, 0.0, False, truncated, info(False, False, False, **extra))
        instance = self.instance
        assert instance is not None  # spend() above raised unless reset() dealt one
        reward = score(evaluation, instance.numbers, instance.target)
        self._budget.close(terminated=True)
        extra = {"failure": evaluation.failure} if evaluation.failure else {}
        result = info(reward == CORRECT_REWARD, True, True, **extra)
        return StepResult(self._text, reward, True, False, result)

    def render(self) -> str:
        return self._text
