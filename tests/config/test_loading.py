"""Reading configs: the shipped presets and their ``extends:`` chains, YAML refused in one
line when it cannot make a config, the resolved config written back as YAML, and `ragen
config show` / `list` on top of them."""

import itertools
import json
from pathlib import Path

import pytest

from ragen import config
from ragen.cli import main
from ragen.config import ConfigError
from ragen.config.build import REMOVED_KEYS

GAMES = ["bandit", "sokoban", "frozen-lake", "countdown", "sudoku", "2048", "cube2"]
"""The games that ship a CPU preset, a -gpu one, and a -starpo variant of each."""


@pytest.mark.parametrize("name", config.preset_names())
def test_every_preset_loads(name):
    c = config.load(name)
    assert c.env.name in c.env.eval_names


LEARNED_HERE = {
    "frozen-lake": "speedrun_frozen-lake-ranked-edges-d1.json",
    "sokoban": "speedrun_sokoban-push.json",
}
"""The games whose CPU preset is a speedrun's measured recipe (a warm start on an expert, then
RL), by the result that measured it; the other games' CPU presets play the -gpu one's game."""
RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"


@pytest.mark.parametrize("game", sorted(LEARNED_HERE))
def test_a_cpu_preset_that_learns_here_is_its_speedruns_recipe(game):
    record = json.loads((RESULTS / LEARNED_HERE[game]).read_text())
    c = config.load(game)
    assert config.load(game, record["recipe"]) == c  # the recipe changes nothing in it
    assert (c.sft.warm_start, c.sft.warm_start_minutes) == (True, record["warmup_minutes"])
    assert c.trainer.max_minutes == 0 and c.trainer.steps == 10  # then 10 steps of RL
    # the -starpo variant warms up the same way and differs only in its RL (below)
    assert config.load(f"{game}-starpo").sft == c.sft


@pytest.mark.parametrize("game", GAMES)
def test_a_gpu_preset_plays_the_game_at_the_schemas_scale(game):
    # A -gpu preset states its game (env, the turn shape) again rather than extend the CPU
    # preset: it would otherwise inherit the CPU scale and restate every default to undo it.
    cpu, gpu = config.load(game), config.load(f"{game}-gpu")
    default = config.Config()
    assert (gpu.rollout.groups, gpu.rollout.group_size) == (8, 16)
    assert (gpu.algo.filter_ratio, gpu.monitor) == (default.algo.filter_ratio, default.monitor)
    assert gpu.trainer.steps == default.trainer.steps == 200
    assert gpu.trainer.device == "cuda" and gpu.env.name == cpu.env.name
    assert gpu.algo.whitens() == cpu.algo.whitens()
    if game in LEARNED_HERE:  # the paper's recipe: RL from the model, the map alone
        assert (gpu.env.options, gpu.sft.warm_start) == ({}, False)
        assert (gpu.rollout.max_turns, gpu.rollout.max_actions_per_turn) == (5, 5)
        return
    assert gpu.env == cpu.env
    shape = ("max_turns", "max_actions_per_episode")
    assert [getattr(gpu.rollout, k) for k in shape] == [getattr(cpu.rollout, k) for k in shape]
    assert gpu.sft == cpu.sft


def test_the_cpu_overlay_is_no_preset(tmp_path, capsys):
    # overlays/cpu.yaml holds the CPU scale the game presets extend; it is not a game.
    assert (config.preset_dir() / "overlays" / f"cpu{config.PRESET_SUFFIX}").is_file()
    assert "cpu" not in config.preset_names()
    assert config.load("sokoban").trainer.eval_episodes == 64  # from the overlay
    with pytest.raises(ConfigError, match="unknown preset 'cpu'"):
        config.load("cpu")
    assert main(["train", "cpu", "--out", str(tmp_path / "run")]) == 2
    assert "unknown preset 'cpu'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("env", GAMES)
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


@pytest.mark.parametrize("preset", ["bandit", "bandit-starpo", "bandit-gpu", "bandit-starpo-gpu"])
def test_the_bandit_presets_keep_raw_advantages(preset):
    # make demo collapsed with whitened ones and learned with raw ones (docs/results/bandit.md)
    assert config.load(preset).algo.whitens() is False


def test_yaml_round_trip(tmp_path):
    c = config.load("frozen-lake", ["algo.estimator=grpo", "model.lora_rank=8"])
    path = tmp_path / "run.yaml"
    path.write_text(config.to_yaml(c, doc=True))
    assert config.load(str(path)) == c


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_a_removed_key_is_refused_in_a_new_config_and_dropped_from_a_runs(key, tmp_path):
    section, name = key.split(".")
    value = {"trainer.scoring_pass": "always", "trainer.prefix_sharing": "micro_batch"}
    override = f"{key}={value.get(key, 'false')}"
    refused = f"config: {key} was removed: {REMOVED_KEYS[key]}; drop the key"
    with pytest.raises(ConfigError) as err:
        config.load("bandit", [override])
    assert str(err.value) == refused
    # a run's config.yaml written while the key existed
    saved = config.load("bandit", ["trainer.steps=3"])
    text = config.to_yaml(saved).replace(f"{section}:\n", f"{section}:\n  {name}: false\n", 1)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"{key} was removed"):
        config.load(str(path))  # taken as a new config's preset: refused
    assert config.load_run(path) == saved  # read as the run's own: the key dropped
    assert config.load_run(path, ["trainer.steps=5"]).trainer.steps == 5
    with pytest.raises(ConfigError, match=f"{key} was removed"):
        config.load_run(path, [override])  # a new setting is refused as anywhere


SHOWN_BAD = [
    # One of every five refusals the config tests make, from each layer that refuses them:
    # the types and ranges, the combinations, and the names outside the config.
    (["algo.clip_hgh=0.3"], "algo.clip_hgh", "did you mean algo.clip_high"),
    (["rollout.think=1"], "rollout.think", "true or false"),
    (["algo.filter_ratio=1.5"], "algo.filter_ratio", "<= 1.0"),
    (["algo.estimator=grpo", "rollout.group_size=1"], "rollout.group_size", ">= 2"),
    (["env.eval_names=[bandit, chess]"], "env.eval_names[1]", "frozen-lake"),
    (["rollout.demos=3"], "rollout.demos", "at most 2"),
    (["model=null"], "model must be a mapping", "got null"),
    (["trainer.eval_episodes=1000000000"], "trainer.eval_episodes", "<= 1000000"),
    (["trainer.device=cuda:128"], "trainer.device", "from 0 to 127"),
    (
        ["algo.filter_mode=top_p", "trainer.mini_batch_size=64"],
        "trainer.mini_batch_size",
        "64 > 32 = groups × group_size",
    ),
    (
        ["algo.filter_strategy=top_k_abs", "rollout.group_size=1", "trainer.mini_batch_size=2"],
        "algo.filter_strategy and rollout.group_size",
        "filter_metric=reward",
    ),
    (["algo.filter_metric=std"], "algo.filter_metric", "reward_variance, reward, reward_sum"),
    (["rollout.format_penalty_mode=always"], "rollout.format_penalty_mode", "any_invalid"),
    (["trainer.critic_lr=2"], "trainer.critic_lr", "<= 1.0"),
    (
        ["env.eval_names=[sokoban-large]", "env.eval_options.sokoban-large.spaced=maybe"],
        "env.eval_options.sokoban-large",
        "spaced must be True or False",
    ),
]


@pytest.mark.parametrize(("overrides", "key", "allowed"), SHOWN_BAD, ids=[b[1] for b in SHOWN_BAD])
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


BILLION_LAUGHS = "".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n']
    + [f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in itertools.pairwise("abcdefghi")]
)


def test_a_billion_laughs_preset_is_refused_in_one_short_line(tmp_path, capsys):
    # Its 9**9 "lol"s once took 54 s and 2.7 GB to put into an error message.
    path = tmp_path / "lol.yaml"
    path.write_text(BILLION_LAUGHS)
    assert main(["config", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 200
    assert err.startswith(f"ragen: config: {path} is refused: it holds more than 100000 values")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("env: &a {options: [*a]}\n", "refers to a node that contains it"),
        ("env: {options: {x: " + "[" * 100 + "]" * 100 + "}}\n", "deeper than 64 levels"),
        ("trainer: {seed: " + "9" * 5000 + "}\n", "not valid YAML: Exceeds the limit"),
        ("env:\n  options:\n    x: " + "[" * 5000 + "]" * 5000 + "\n", "not valid YAML"),
        ("trainer: {seed: 1}\ntrainer: {steps: 2}\n", "key 'trainer' appears twice in one "),
        ("trainer:\n  seed: 1\n  seed: 2\n", r"key 'seed' appears twice in one mapping \(line 3\)"),
    ],
)
def test_yaml_that_cannot_make_a_config_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        config.load(str(path))
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_a_merged_mapping_may_repeat_its_keys():
    # YAML's merge key: the mapping's own value wins over the merged one, and is no duplicate
    text = b"a: &x {k: 1}\nb: {<<: *x, k: 2}\n"
    assert config.yaml_mapping(text, Path("merged.yaml")) == {"a": {"k": 1}, "b": {"k": 2}}


def test_an_empty_section_in_a_file_is_refused(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("extends: bandit\nmodel:\ntrainer: {steps: 3}\n")
    with pytest.raises(ConfigError, match="config: model must be a mapping of keys, got null"):
        config.load(str(path))


def test_a_relative_extends_is_read_from_the_folder_of_the_file_saying_it(tmp_path, monkeypatch):
    (tmp_path / "presets" / "base").mkdir(parents=True)
    (tmp_path / "presets" / "base" / "root.yaml").write_text(
        "extends: bandit\ntrainer: {steps: 7}\n"
    )
    (tmp_path / "presets" / "mine.yaml").write_text("extends: base/root.yaml\nalgo: {gamma: 0.5}\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    c = config.load("../presets/mine.yaml")
    assert (c.trainer.steps, c.algo.gamma, c.env.name) == (7, 0.5, "bandit")
