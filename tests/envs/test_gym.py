"""The gymnasium adapter, checked by gymnasium's own env checker on every registered name."""

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from ragen import envs
from ragen.envs.gym import as_gymnasium, gymnasium_id, register_gymnasium


@pytest.mark.parametrize("name", envs.names())
def test_gymnasium_env_checker_passes_without_warnings(name):
    register_gymnasium()
    env = gymnasium.make(gymnasium_id(name), render_mode="ansi")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium reports soft failures as warnings
        check_env(env.unwrapped)


def test_adapter_steps_the_wrapped_game():
    env = as_gymnasium(envs.make("sokoban"), render_mode="ansi")
    observation, info = env.reset(seed=0)
    assert observation == envs.make("sokoban").reset(0)
    assert info["level_seed"] == 0 and "Sokoban" in info["instructions"]
    assert observation in env.observation_space
    observation, reward, terminated, truncated, info = env.step("Down")
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert env.render() == observation
    assert set(info) >= {"success", "action_valid", "action_effective"}


def test_unseeded_resets_follow_the_last_seed():
    env = as_gymnasium(envs.make("frozen-lake"))
    env.reset(seed=5)
    first = [env.reset()[1]["level_seed"] for _ in range(3)]
    env.reset(seed=5)
    assert [env.reset()[1]["level_seed"] for _ in range(3)] == first


def test_render_mode_is_checked():
    with pytest.raises(ValueError, match="render_mode must be None or 'ansi'"):
        as_gymnasium(envs.make("bandit"), render_mode="human")


def test_registration_is_idempotent():
    assert register_gymnasium() == register_gymnasium()
    assert "ragen/frozen-lake-8x8-v0" in register_gymnasium()
