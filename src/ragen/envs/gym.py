"""A gymnasium view of any ragen TextEnv, so other RL tools can use ragen's games.

Observations and actions are gymnasium `Text` spaces. gymnasium seeds with `reset(seed=...)`
and may reset without a seed; a ragen env always needs one, so an unseeded reset draws the
level seed from the adapter's own `np_random` (itself seeded by the last seeded reset, which
is what gymnasium's determinism checks expect).

    env = as_gymnasium(make("sokoban"))
    observation, info = env.reset(seed=0)
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces

from ragen.envs.base import TextEnv, make, names

# Every glyph any ragen observation uses: printable ASCII (newline as the only control
# character) plus the non-ASCII symbols of the games.
CHARSET = frozenset(string.ascii_letters + string.digits + string.punctuation + " \n√×÷")
MAX_OBSERVATION_CHARS = 4096
MAX_ACTION_CHARS = 200
_MAX_LEVEL_SEED = 2**31 - 1
NAMESPACE = "ragen"


class TextGymEnv(gymnasium.Env[str, str]):
    """gymnasium.Env over a TextEnv; `render_mode="ansi"` makes `render()` return the grid."""

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}  # noqa: RUF012

    def __init__(self, env: TextEnv, render_mode: str | None = None) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.text_env = env
        self.render_mode = render_mode
        self.observation_space = spaces.Text(MAX_OBSERVATION_CHARS, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(MAX_ACTION_CHARS, min_length=0, charset=CHARSET)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        level_seed = seed if seed is not None else int(self.np_random.integers(_MAX_LEVEL_SEED))
        observation = self.text_env.reset(level_seed)
        return observation, {"level_seed": level_seed, "instructions": self.text_env.instructions()}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        result = self.text_env.step(action)
        # A fresh dict each time: callers keep infos, and gymnasium checks they are not shared.
        return (
            result.observation,
            result.reward,
            result.terminated,
            result.truncated,
            dict(result.info),
        )

    def render(self) -> str | None:
        return self.text_env.render() if self.render_mode == "ansi" else None


def as_gymnasium(env: TextEnv, render_mode: str | None = None) -> TextGymEnv:
    """Wrap a TextEnv as a gymnasium.Env with Text observation and action spaces."""
    return TextGymEnv(env, render_mode=render_mode)


def make_gymnasium(name: str, render_mode: str | None = None, **options: Any) -> TextGymEnv:
    """`make(name, **options)` wrapped for gymnasium (the entry point of the ids below)."""
    return TextGymEnv(make(name, **options), render_mode=render_mode)


def gymnasium_id(name: str) -> str:
    return f"{NAMESPACE}/{name}-v0"


def register_gymnasium() -> list[str]:
    """Register every ragen name with gymnasium as `ragen/<name>-v0`; returns the ids.

    Explicit rather than done on import, so importing ragen leaves gymnasium's registry
    untouched. Calling it twice is harmless.
    """
    ids = []
    for name in names():
        env_id = gymnasium_id(name)
        if env_id not in gymnasium.registry:
            gymnasium.register(
                env_id, entry_point=f"{__name__}:make_gymnasium", kwargs={"name": name}
            )
        ids.append(env_id)
    return ids
