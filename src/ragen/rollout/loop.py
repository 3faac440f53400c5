"""Multi-turn episodes: P groups × N copies, one turn at a time, only for live episodes.

Each turn: every live episode's context goes to the generator in one batch; each reply is
parsed into actions; at most ``max_actions_per_turn`` of them (and no more than the episode
has left) are executed; the observation and rewards go back as the next user message, after
the whole dialogue (``context_window=full``) or in a context built afresh for the next turn
(the other windows, window.py).
An episode ends on a terminal env state, on its action or turn budget, when its context
could not hold another reply, or when a reply runs out of tokens without closing. Every
episode records why it ended (one of ``trajectory.END_REASONS``).

What does not depend on token ids (making the episodes, opening the dialogue, playing one
reply: `make_episodes`, `open_dialogue`, `play_reply`) is shared with the episodes played
over an API (`ragen.rollout.api_loop`), so both play by the same rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragen import envs, phases
from ragen.agent.parsing import parse_reply
from ragen.agent.prompts import (
    SYSTEM_PROMPT,
    first_user_message,
    reply_prefix,
    turn_user_message,
    worked_reply,
)
from ragen.config import CONTEXT_WINDOWS, FORMAT_PENALTY_MODES, FORMAT_RULES, RolloutConfig
from ragen.rollout.dialogue import ChatFormat
from ragen.rollout.engines import FINISH_LENGTH, Generator, Request
from ragen.rollout.rewards import resolve, shaping
from ragen.rollout.trajectory import Trajectory, Turn
from ragen.rollout.window import FULL, EpisodeSoFar, window_context

# Evaluation seeds start here so they never coincide with training seeds (which are drawn
# below this). Two fixed, disjoint ranges (splits) follow: dev, the seeds every evaluation
# has played and tuning may read, and test, seeds kept for a result's final figure. Each
# range holds more seeds than one evaluation may play (config.MAX_EVAL_EPISODES), and test
# stays below 2**32 (numpy's seed streams take any non-negative int, gymnasium's 32 bits).
EVAL_SEED_BASE = 1_000_000_000
SPLIT_SEED_BASES = {"dev": EVAL_SEED_BASE, "test": 3_000_000_000}
_CALLS = itertools.count()
_DEFAULT = RolloutConfig()


@dataclass(frozen=True)
class RolloutSpec:
    """The rollout settings the loop needs, as plain values; each default is
    config.RolloutConfig's (documented there)."""

    max_turns: int = _DEFAULT.max_turns
    max_actions_per_turn: int = _DEFAULT.max_actions_per_turn
    max_actions_per_episode: int = _DEFAULT.max_actions_per_episode
    max_reply_tokens: int = _DEFAULT.max_reply_tokens
    max_context_tokens: int = _DEFAULT.max_context_tokens
    temperature: float = _DEFAULT.temperature
    top_p: float = _DEFAULT.top_p
    think: bool = _DEFAULT.think
    format_rule: str = _DEFAULT.format_rule
    format_penalty: float = _DEFAULT.format_penalty
    format_penalty_mode: str = _DEFAULT.format_penalty_mode
    cut_reply_penalty: float | None = _DEFAULT.cut_reply_penalty
    demos: int = _DEFAULT.demos
    reward_terms: tuple[tuple[str, float], ...] = tuple(_DEFAULT.reward_terms.items())
    context_window: str = _DEFAULT.context_window
    context_turns: int = _DEFAULT.context_turns

    def __post_init__(self) -> None:
        if self.format_penalty_mode not in FORMAT_PENALTY_MODES:
            raise ValueError(
                f"format_penalty_mode={self.format_penalty_mode!r}: choose one of "
                f"{', '.join(FORMAT_PENALTY_MODES)}"
            )
        if self.context_window not in CONTEXT_WINDOWS:
            raise ValueError(
                f"context_window={self.context_window!r}: choose one of "
                f"{', '.join(CONTEXT_WINDOWS)}"
            )
        if self.format_rule not in FORMAT_RULES:
            raise ValueError(
                f"format_rule={self.format_rule!r}: choose one of {', '.join(FORMAT_RULES)}"
            )
        if self.context_turns < 0:
            raise ValueError(f"context_turns must be >= 0 (0: all), got {self.context_turns}")

    @property
    def rule_every_turn(self) -> bool:
        """Whether the format rule closes every user message, not only the first."""
        return self.format_rule == "every_turn"

    @classmethod
    def from_config(cls, rollout, **changes) -> RolloutSpec:
        """Build from a ``config.RolloutConfig``; ``changes`` override fields (e.g. temperature)."""
        values = {f: getattr(rollout, f) for f in cls.__dataclass_fields__}
        values["reward_terms"] = tuple(values["reward_terms"].items())
        return cls(**{**values, **changes})


class Episode:
    """One live episode: its env, its trajectory, the dialogue as messages (full window); the
    context of its next turn is ``traj.token_ids[context_start:]``."""

    def __init__(
        self, env_name: str, env, group: int, copy: int, seed: int, key, stream: int, budget: int
    ) -> None:
        self.env, self.key, self.stream, self.budget = env, key, stream, budget
        self.traj = Trajectory(env=env_name, group=group, copy=copy, seed=seed)
        self.messages: list[dict] = []
        self.demos: list[dict] = []
        self.instructions = ""
        self.observation = ""
        self.actions_used = 0
        self.context_start = 0
        self.first_shown = 1

    def context(self) -> list[int]:
        """The ids the model continues at its next turn."""
        return self.traj.token_ids[self.context_start :]

    @property
    def done(self) -> bool:
        return bool(self.traj.end)

    def finish(self, reason: str) -> None:
        self.traj.end = reason


def _demo_messages(env, spec: RolloutSpec) -> list[dict]:
    """The first ``spec.demos`` worked turns of the env as user/assistant messages."""
    worked = envs.demonstrations(env)
    if spec.demos > len(worked):
        raise ValueError(f"rollout.demos={spec.demos}, but the env offers {len(worked)}")
    messages = []
    # A demonstration may hold more actions than one turn runs; its worked reply keeps to
    # the turn's limit, as a reply of the agent must.
    per_turn = _per_turn(env, spec)
    for demo in worked[: spec.demos]:
        user = first_user_message(
            demo.instructions,
            env.actions,
            spec.max_actions_per_turn,
            demo.observation,
            spec.max_actions_per_episode,
            think=spec.think,
        )
        reply = worked_reply(demo.thought, demo.answer[:per_turn], think=spec.think)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return messages


def open_dialogue(ep: Episode, spec: RolloutSpec) -> tuple[str, list[dict]]:
    """Reset the episode's env and open its dialogue (the demonstrations, then the first user
    message, in ``ep.messages``); returns that user message and the demonstrations."""
    ep.observation = ep.env.reset(ep.traj.seed)
    ep.instructions = ep.env.instructions()
    ep.traj.context_window = spec.context_window
    user = first_user_message(
        ep.instructions,
        ep.env.actions,
        spec.max_actions_per_turn,
        ep.observation,
        spec.max_actions_per_episode,
        think=spec.think,
    )
    ep.demos = _demo_messages(ep.env, spec)
    # The demonstrations stay in the dialogue: the template renders every later turn after them.
    ep.messages += [*ep.demos, {"role": "user", "content": user}]
    return user, ep.demos


def _start(ep: Episode, fmt: ChatFormat, spec: RolloutSpec) -> None:
    user, demos = open_dialogue(ep, spec)
    ep.traj.append(fmt.opening(user, demos), sampled=False)


def _act(ep: Episode, actions: Sequence[str]) -> list[float]:
    """Execute actions in order until the episode ends; returns their rewards."""
    rewards: list[float] = []
    for action in actions:
        result = ep.env.step(action)
        ep.actions_used += 1
        rewards.append(result.reward)
        ep.observation = result.observation
        ep.traj.success = bool(result.info.get("success", False))
        if result.terminated:
            ep.finish("terminated")
        elif result.truncated or ep.actions_used >= ep.budget:
            ep.finish("truncated:actions")
        if ep.done:
            break
    return rewards


def _per_turn(env, spec: RolloutSpec) -> int:
    # A free-text env (no action words, e.g. Countdown) takes one answer per turn.
    return spec.max_actions_per_turn if env.actions else 1


def play_reply(
    ep: Episode,
    reply: str,
    *,
    cut: bool,
    span: tuple[int, int],
    think_tokens: Callable[[str], int],
    spec: RolloutSpec,
    terms: dict,
    turn: int,
) -> str | None:
    """Parse one reply, run its actions and append its `Turn` to the trajectory; returns the
    user message that opens the next turn, or None when the episode has ended.

    ``cut``: the reply ran out of tokens before it ended (its answer is not run); ``span``:
    (reply_start, reply_end), where the reply's tokens lie in the dialogue; ``think_tokens``:
    the length in tokens of a think text. ``ep.messages`` is left as it was, ending with the
    user message the reply answered.
    """
    left = ep.budget - ep.actions_used
    parsed = parse_reply(
        reply, ep.env.actions, min(_per_turn(ep.env, spec), left), think=spec.think
    )
    observation = ep.observation
    anchor = envs.anchor(ep.env, observation)  # the state before this turn's actions
    if cut:
        # The reply never closed: its half-written answer is not executed.
        rewards, actions = [], []
        ep.finish("truncated:reply_length")
    else:
        actions = list(parsed.actions)
        rewards = _act(ep, actions)
    # any_invalid is RAGEN's rule: a reply is penalised for any answer piece that is not an
    # action, even when the rest ran; no_action only when nothing ran.
    invalid = spec.format_penalty_mode == "any_invalid" and parsed.unknown_actions > 0
    penalty = spec.format_penalty if not actions or invalid else 0.0
    if cut and spec.cut_reply_penalty is not None:
        penalty = spec.cut_reply_penalty
    done = Turn(
        observation=observation,
        reply=reply,
        think=parsed.think,
        answer=parsed.answer,
        actions=actions[: len(rewards)],
        rewards=rewards,
        reward=0.0,
        format_ok=parsed.format_ok and not cut,
        problems=list(parsed.problems),
        unknown_actions=parsed.unknown_actions,
        think_tokens=think_tokens(parsed.think),
        reply_start=span[0],
        reply_end=span[1],
        anchor=anchor,
        context_start=ep.context_start,
        first_shown=ep.first_shown,
    )
    done.terms = {"env": sum(rewards), "format": penalty, **shaping(done, terms)}
    done.reward = sum(done.terms.values())
    ep.traj.turns.append(done)
    if not ep.done and turn + 1 >= spec.max_turns:
        ep.finish("truncated:turns")
    if ep.done:
        return None
    return turn_user_message(
        turn + 2,
        ep.observation,
        ep.budget - ep.actions_used,
        rewards,
        max_actions_per_turn=_per_turn(ep.env, spec),
        think=spec.think,
        rule=spec.rule_every_turn,
    )


def _take_turn(
    ep: Episode, sample, fmt: ChatFormat, spec: RolloutSpec, terms: dict, turn: int
) -> None:
    start = len(ep.traj.token_ids)
    ep.traj.append(sample.token_ids, sampled=True, logprobs=sample.logprobs)
    reply = fmt.reply_text(sample.token_ids)

    def think_tokens(text: str) -> int:
        return len(fmt.tokenizer(text, add_special_tokens=False)["input_ids"])

    user = play_reply(
        ep,
        reply,
        cut=sample.finish == FINISH_LENGTH,
        span=(start, start + len(sample.token_ids)),
        think_tokens=think_tokens,
        spec=spec,
        terms=terms,
        turn=turn,
    )
    if user is None:
        return
    if spec.context_window != FULL:
        _open_window(ep, fmt, spec)
        return
    stopped = bool(sample.token_ids) and sample.token_ids[-1] in fmt.stop_ids
    # ep.messages still ends with the user message this reply answered
    ep.traj.append(fmt.continuation(ep.messages, user, reply_stopped=stopped), sampled=False)
    ep.messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": user}]


def _open_window(ep: Episode, fmt: ChatFormat, spec: RolloutSpec) -> None:
    """Append the next turn's context in a windowed mode (rollout/window.py): it starts
    afresh after the last reply."""
    window = EpisodeSoFar(
        instructions=ep.instructions,
        actions=ep.env.actions,
        demos=ep.demos,
        turns=ep.traj.turns,
        token_ids=ep.traj.token_ids,
        observation=ep.observation,
        budget=ep.budget,
    )
    ids, ep.first_shown = window_context(
        fmt,
        spec.context_window,
        spec.context_turns,
        window,
        _per_turn(ep.env, spec),
        spec.think,
        rule_every_turn=spec.rule_every_turn,
    )
    ep.context_start = len(ep.traj.token_ids)
    ep.traj.append(ids, sampled=False)


def make_episodes(
    env_name: str,
    seeds: Sequence[int],
    group_size: int,
    spec: RolloutSpec,
    env_options: dict | None,
    first_group: int,
) -> list[Episode]:
    """``group_size`` episodes of each seed, group by group, numbered from ``first_group``
    (see `rollout`); their envs are made, not yet reset."""
    call = next(_CALLS)
    episodes = []
    for group, seed in enumerate(seeds, start=first_group):
        for copy in range(group_size):
            env = envs.make(env_name, **(env_options or {}))
            key, stream = (call, group, copy), group * group_size + copy
            budget = spec.max_actions_per_episode
            episodes.append(Episode(env_name, env, group, copy, int(seed), key, stream, budget))
    return episodes


def reward_terms(spec: RolloutSpec) -> dict:
    """The shaping terms of ``spec`` by name: (function, weight), as `play_reply` takes them."""
    return {name: (resolve(name), weight) for name, weight in spec.reward_terms}


def rollout(
    generator: Generator,
    tokenizer,
    env_name: str,
    seeds: Sequence[int],
    group_size: int,
    spec: RolloutSpec,
    *,
    env_options: dict | None = None,
    sample_seed: int = 0,
    first_group: int = 0,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[Trajectory]:
    """Play ``len(seeds)`` groups of ``group_size`` copies (a group's copies share its seed).

    Groups are numbered from ``first_group``: a process playing a share of a larger rollout
    passes the number of its first group, and each episode then samples exactly what it
    would in the whole rollout (its sampling noise is numbered by its group and copy).
    Returns the trajectories ordered group by group. ``on_turn(turn, live)`` is called before
    each turn's generation (for progress display).
    """
    fmt = ChatFormat(tokenizer, SYSTEM_PROMPT, reply_prefix(spec.think))
    terms = reward_terms(spec)
    with phases.timed(phases.ROLLOUT_ENV):
        episodes = make_episodes(env_name, seeds, group_size, spec, env_options, first_group)
        for ep in episodes:
            _start(ep, fmt, spec)
    try:
        for turn in range(spec.max_turns):
            live = [ep for ep in episodes if not ep.done]
            for ep in live:
                context = len(ep.traj.token_ids) - ep.context_start
                if context + spec.max_reply_tokens > spec.max_context_tokens:
                    ep.finish("truncated:context")
            live = [ep for ep in live if not ep.done]
            if not live:
                break
            if on_turn is not None:
                on_turn(turn, len(live))
            samples = generator.generate(
                [Request(ep.key, ep.context(), ep.stream, ep.env) for ep in live],
                max_new_tokens=spec.max_reply_tokens,
                temperature=spec.temperature,
                top_p=spec.top_p,
                seed=sample_seed * 7919 + turn,
            )
            with phases.timed(phases.ROLLOUT_ENV):
                for ep, sample in zip(live, samples, strict=True):
                    _take_turn(ep, sample, fmt, spec, terms, turn)
            generator.release([ep.key for ep in live if ep.done])
    finally:
        generator.release([ep.key for ep in episodes])
    return [ep.traj for ep in episodes]
