import dataclasses
from pathlib import Path

import pytest

from ragen import config
from ragen.cli import main
from ragen.config import Config, ConfigError


def test_defaults_are_valid_and_follow_the_paper():
    c = config.validate(Config())
    # StarPO-S: filter to 25% of groups, no KL, clip 0.2 below and 0.28 above, critic (gae).
    assert (c.algo.filter_ratio, c.algo.kl_coef) == (0.25, 0.0)
    assert (c.algo.clip_low, c.algo.clip_high, c.algo.estimator) == (0.2, 0.28, "gae")
    assert (c.rollout.groups, c.rollout.group_size, c.rollout.max_turns) == (8, 16, 5)
    assert (c.trainer.actor_lr, c.trainer.critic_lr, c.trainer.grad_clip) == (1e-6, 1e-5, 1.0)
    assert config.kept_groups(c) == 2 and config.kept_episodes(c) == 32


@pytest.mark.parametrize("name", config.preset_names())
def test_every_preset_loads(name):
    c = config.load(name)
    assert c.env.name in c.env.eval_names


def test_gpu_preset_extends_the_cpu_one():
    cpu, gpu = config.load("sokoban"), config.load("sokoban-gpu")
    assert gpu.env == cpu.env
    assert (gpu.rollout.group_size, gpu.rollout.max_actions_per_turn) == (16, 5)
    assert gpu.rollout.max_turns == cpu.rollout.max_turns == 5
    assert gpu.trainer.device == "cuda"


def test_every_field_has_a_docstring():
    sections = [Config, *(f.type for f in dataclasses.fields(Config))]
    for cls in sections:
        cls = getattr(config, cls) if isinstance(cls, str) else cls
        names = {f.name for f in dataclasses.fields(cls)}
        docs = config.field_docs(cls)
        assert names == set(docs), cls
        assert all(len(doc) > 10 for doc in docs.values())


def test_overrides_are_typed():
    c = config.load(
        "bandit",
        [
            "algo.clip_high=0.3",
            "trainer.actor_lr=1e-6",  # YAML reads this as a string; it is still a number
            "rollout.group_size=8",
            "env.eval_names=[bandit]",
            "algo.dual_clip=3",
            "env.options.high_risk=Phoenix",
            "rollout.think=false",
        ],
    )
    assert c.algo.clip_high == 0.3
    assert c.trainer.actor_lr == 1e-6 and isinstance(c.trainer.actor_lr, float)
    assert c.rollout.group_size == 8
    assert c.env.eval_names == ["bandit"]
    assert c.algo.dual_clip == 3.0
    assert c.env.options == {"high_risk": "Phoenix"}
    assert c.rollout.think is False


def test_yaml_round_trip(tmp_path):
    c = config.load("frozen-lake", ["algo.estimator=grpo", "model.lora_rank=8"])
    path = tmp_path / "run.yaml"
    path.write_text(config.to_yaml(c, doc=True))
    assert config.load(str(path)) == c


BAD = [
    # (overrides, key named in the message, words that say what is allowed)
    (["algo.clip_hgh=0.3"], "algo.clip_hgh", "did you mean algo.clip_high"),
    (["colour.mode=1"], "colour", "allowed here"),
    (["rollout.group_size=two"], "rollout.group_size", "an integer"),
    (["rollout.group_size=true"], "rollout.group_size", "an integer"),
    (["rollout.group_size=2.5"], "rollout.group_size", "an integer"),
    (["rollout.think=1"], "rollout.think", "true or false"),
    (["trainer.actor_lr=fast"], "trainer.actor_lr", "a number"),
    (["trainer.actor_lr=.nan"], "trainer.actor_lr", "a number"),
    (["env.eval_names=bandit"], "env.eval_names", "a list"),
    (["algo.clip_high=-1"], "algo.clip_high", "> 0.0"),
    (["algo.filter_ratio=1.5"], "algo.filter_ratio", "<= 1.0"),
    (["algo.dual_clip=0.5"], "algo.dual_clip", "> 1.0"),
    (["algo.estimator=ppo"], "algo.estimator", "gae, grpo"),
    (["rollout.max_actions_per_turn=5"], "rollout.max_actions_per_turn", "lower"),
    (["rollout.max_reply_tokens=2000"], "rollout.max_reply_tokens", "raise max_context_tokens"),
    (["algo.estimator=grpo", "rollout.group_size=1"], "rollout.group_size", ">= 2"),
    (["trainer.mini_batch_size=64"], "trainer.mini_batch_size", "lower"),
    (["trainer.micro_batch_size=32"], "trainer.micro_batch_size", "lower"),
    (["trainer.device=tpu"], "trainer.device", "cuda:N"),
    (["env.name=chess"], "env.name", "sokoban"),
    (["env.eval_names=[bandit, chess]"], "env.eval_names[1]", "frozen-lake"),
    (["env.options.arm_names=[A, B, C]"], "env.options", "arm_names"),
    (["env.options.num_arms=3"], "env.options", "allowed options: arm_names"),
    (["model.spec=gpt-5"], "model.spec", "smollm2-135m"),
    (["model.spec=Qwen/Qwen2.5-0.5B-Instruct"], "model.spec", "allow_download=true"),
    (["rollout.demos=3"], "rollout.demos", "at most 2"),
    (["env.name=countdown", "env.eval_names=[countdown]"], "rollout.demos", "at most 0"),
    (["trainer"], "trainer", "section.key=value"),
    (["rollout=3"], "rollout", "mapping"),
]


@pytest.mark.parametrize(("overrides", "key", "allowed"), BAD, ids=[b[1] for b in BAD])
def test_bad_config_is_refused_with_the_key_named(overrides, key, allowed):
    with pytest.raises(ConfigError) as err:
        config.load("bandit", overrides)
    message = str(err.value)
    assert key in message and allowed in message
    assert "\n" not in message


@pytest.mark.parametrize(("overrides", "key", "allowed"), BAD[::5], ids=[b[1] for b in BAD[::5]])
def test_cli_exits_2_and_names_the_key(overrides, key, allowed, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["config", "show", "bandit", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragen: config:") and key in err
    assert list(Path(tmp_path).iterdir()) == []  # nothing was written


def test_bad_files_are_refused(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("algo: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(str(broken))
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        config.load(str(listing))
    with pytest.raises(ConfigError, match="no such config file"):
        config.load(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        config.load("nope")


def test_extends_cycle_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text(f"extends: {tmp_path / 'b.yaml'}\n")
    (tmp_path / "b.yaml").write_text(f"extends: {tmp_path / 'a.yaml'}\n")
    with pytest.raises(ConfigError, match="cycle"):
        config.load(str(tmp_path / "a.yaml"))


@pytest.mark.parametrize("env", ["bandit", "sokoban", "frozen-lake", "countdown"])
def test_starpo_presets_differ_from_starpo_s_only_in_the_algorithm(env):
    for suffix in ("", "-gpu"):
        s, plain = config.load(env + suffix), config.load(f"{env}-starpo{suffix}")
        assert (plain.rollout, plain.trainer, plain.env) == (s.rollout, s.trainer, s.env)
        assert (s.algo.kl_coef, s.algo.clip_high) == (0.0, 0.28) and s.algo.filter_ratio < 1
        a = plain.algo
        assert (a.filter_ratio, a.kl_coef, a.kl_type, a.clip_low, a.clip_high) == (
            1.0,
            0.001,
            "k1",
            0.2,
            0.2,
        )
