"""Every registered name passes the conformance checker, and the checker catches violations."""

import pytest

from ragen import envs
from ragen.envs.base import StepResult, info
from ragen.envs.conformance import check, check_all


@pytest.mark.parametrize("name", envs.names())
def test_registered_env_conforms(name):
    assert check(name) == []


def test_check_all_covers_every_name():
    assert list(check_all(seeds=(0, 1))) == envs.names()


class Sloppy:
    """Breaks the contract in several ways at once."""

    actions = ("Go",)
    demo_count = 3  # promises worked turns it does not offer

    def __init__(self):
        self.text = ""

    def instructions(self):
        return "Press the button."  # does not list the action word

    def reset(self, seed):
        self.text = "level"  # every seed gives the same level
        return self.text

    def step(self, action):
        # Never ends, is case-sensitive, rewards junk, and forgets action_effective.
        valid = action == "Go"
        return StepResult(self.text, 1.0, False, False, {"success": False, "action_valid": valid})

    def render(self):
        return self.text


def test_checker_reports_each_violation():
    problems = "\n".join(check(Sloppy, seeds=(0, 1, 2)))
    assert "instructions() must list every action word" in problems
    assert "step before reset must raise" in problems
    assert "all gave the same level" in problems
    assert "info lacks bool action_effective" in problems
    assert "demo_count is 3 but demonstrations() gave 0" in problems


class Endless(Sloppy):
    """Well-formed steps, but no budget: an episode never ends."""

    def instructions(self):
        return "Go."

    def step(self, action):
        return StepResult(self.text, 0.0, False, False, info(False, False, False))


def test_checker_reports_a_missing_budget():
    problems = "\n".join(check(Endless, seeds=(0,)))
    assert "no end after 10000 steps" in problems
