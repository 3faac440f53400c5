import dataclasses
import itertools
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
    # A falsy section once reset the whole section to its defaults without a word.
    (["rollout=[]"], "rollout must be a mapping", "got []"),
    (["model=null"], "model must be a mapping", "got null"),
    # Sizes that passed and then hung or crashed the run after its folder was made.
    (["rollout.groups=1000000000"], "rollout.groups=1000000000", "<= 65536"),
    (["rollout.group_size=" + "1" + "0" * 21], "rollout.group_size", "<= 65536"),
    (["rollout.groups=512", "rollout.group_size=256"], "rollout.groups", "lower one of them"),
    (["trainer.seed=9223372036854775808"], "trainer.seed", "<= 4294967295"),
    (["trainer.eval_episodes=1000000000"], "trainer.eval_episodes", "<= 1000000"),
    (["rollout.max_context_tokens=2000000"], "rollout.max_context_tokens", "<= 1048576"),
    (["trainer.steps=10000000000"], "trainer.steps", "<= 1000000"),
    (["monitor.template_pairs=100000"], "monitor.template_pairs", "<= 256"),
    (["trainer.device=cuda:abc"], "trainer.device='cuda:abc'", "cuda:N with N from 0 to 127"),
    (["trainer.device=cuda:128"], "trainer.device", "from 0 to 127"),  # torch: cuda:-128
    (["trainer.device=cuda:01"], "trainer.device", "cuda:N"),
    (["env.name=sokoban", "env.options.carve_steps=99999999999"], "carve_steps", "20000"),
    (
        ["env.name=sokoban", "env.options={width: 5, height: 5, num_boxes: 4}"],
        "env.options",
        "no 5×5 room",
    ),
    (["rollout.reward_terms={no spaces:f: 1.0}"], "rollout.reward_terms", "module:function"),
    # top_p keeps up to every group: a mini-batch may reach all episodes, not beyond
    (
        ["algo.filter_mode=top_p", "trainer.mini_batch_size=64"],
        "trainer.mini_batch_size",
        "64 > 32 = groups × group_size",
    ),
    (["algo.filter_mode=top_p", "rollout.group_size=1"], "algo.filter_top_p", "filter_top_p=1"),
    (
        ["algo.filter_include_zero=false", "algo.filter_ratio=1", "rollout.group_size=1"],
        "algo.filter_include_zero",
        "group_size >= 2",
    ),
    (
        ["algo.filter_mode=top_p", "monitor.rollback_filter_ratio=0.25"],
        "monitor.rollback_filter_ratio",
        "filter_strategy=top_k",
    ),
    (
        ["algo.filter_strategy=min_p", "monitor.rollback_filter_ratio=0.25"],
        "monitor.rollback_filter_ratio",
        "min_p filtering does not read filter_ratio",
    ),
    (
        ["algo.filter_strategy=top_k_abs", "rollout.group_size=1", "trainer.mini_batch_size=2"],
        "algo.filter_strategy and rollout.group_size",
        "filter_metric=reward",
    ),
    (["algo.filter_strategy=top_p", "algo.filter_type=smallest"], "algo.filter_type", "largest"),
    (["algo.soft_advantage_reweight=true"], "algo.soft_advantage_reweight", "estimator=grpo"),
    (["algo.filter_loss_scaling=sqrt"], "algo.filter_loss_scaling", "scoring_pass=always"),
    (["algo.filter_strategy=top_n"], "algo.filter_strategy", "top_k, top_k_abs, top_p, min_p"),
    (["algo.filter_metric=std"], "algo.filter_metric", "reward_variance, reward, reward_sum"),
    (["algo.filter_empty_stop_steps=-1"], "algo.filter_empty_stop_steps", ">= 0"),
    (["algo.filter_top_p=0"], "algo.filter_top_p", "> 0.0"),
    (["algo.filter_mode=top_k"], "algo.filter_mode", "std, std_rev, top_p"),
    (["algo.whiten_advantages=2"], "algo.whiten_advantages", "true or false"),
    (["rollout.format_penalty_mode=always"], "rollout.format_penalty_mode", "any_invalid"),
    (["sft.thought=grid"], "sft.thought", "relative, located"),
    (["sft.lake_expert=greedy"], "sft.lake_expert", "optimal, toward, careful"),
    (["sft.lr=1e308"], "sft.lr", "<= 1.0"),
    (["trainer.actor_lr=1e308"], "trainer.actor_lr", "<= 1.0"),
    (["trainer.critic_lr=2"], "trainer.critic_lr", "<= 1.0"),
    (["trainer.eval_split=train"], "trainer.eval_split", "dev, test"),
    (["model.attention=flash"], "model.attention", "ragen, sdpa"),
    (["env.eval_options.bandit.arm_names=[A, B]"], "env.eval_options", "set its options in"),
    (["env.eval_options.sokoban.spaced=true"], "env.eval_options", "does not evaluate"),
    (
        ["env.eval_names=[sokoban-large]", "env.eval_options.sokoban-large.spaced=maybe"],
        "env.eval_options.sokoban-large",
        "spaced must be True or False",
    ),
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


def test_every_int_size_has_an_upper_bound():
    # model.lora_* are bounded against the model itself, by the model checks.
    sections = [f.type for f in dataclasses.fields(Config) if f.name != "model"]
    for cls in [getattr(config, name) for name in sections]:
        for f in dataclasses.fields(cls):
            if f.type == "int":
                assert "le" in f.metadata, f"{cls.__name__}.{f.name}"


def test_bounds_leave_room_for_paper_scale_gpu_runs():
    c = config.load(
        "bandit-gpu",
        [
            "rollout.groups=1024",
            "rollout.group_size=64",
            "rollout.max_context_tokens=1000000",
            "rollout.max_reply_tokens=32768",
            "trainer.mini_batch_size=4096",
            f"trainer.eval_episodes={config.MAX_EVAL_EPISODES}",
            "trainer.seed=4294967295",
            "trainer.device=cuda:7",
        ],
    )
    assert config.kept_episodes(c) == 256 * 64
    with pytest.raises(ConfigError, match="<= 1000000"):
        config.load("bandit", [f"trainer.eval_episodes={config.MAX_EVAL_EPISODES + 1}"])


def _write_marker_module(folder: Path) -> Path:
    """A module whose import leaves a file behind: proof that code ran."""
    marker = folder / "imported"
    (folder / "ragen_marker_term.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef term(turn):\n    return 1.0\n"
    )
    return marker


def test_showing_or_loading_a_config_imports_no_reward_term(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = _write_marker_module(tmp_path)
    term = "rollout.reward_terms={ragen_marker_term:term: 1.0}"
    assert main(["config", "show", "bandit", term]) == 0
    assert "ragen_marker_term:term" in capsys.readouterr().out
    # A run's config.yaml (what --resume loads) is checked without importing either.
    run_config = tmp_path / "config.yaml"
    run_config.write_text(config.to_yaml(config.load("bandit", [term])))
    c = config.load(str(run_config))
    assert not marker.exists()
    config.import_reward_terms(c)  # when the run starts
    assert marker.exists()


def test_a_reward_term_that_cannot_be_imported_is_refused_when_the_run_starts():
    c = config.load("bandit", ["rollout.reward_terms={ragen_no_such_module:f: 1.0}"])
    with pytest.raises(ConfigError, match="'ragen_no_such_module:f' cannot be imported"):
        config.import_reward_terms(c)


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
    assert config._load_yaml("a: &x {k: 1}\nb: {<<: *x, k: 2}\n") == {"a": {"k": 1}, "b": {"k": 2}}


@pytest.mark.parametrize(
    "override",
    [
        "env.options={a: &a [1,1,1,1,1,1,1,1,1,1], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a],"
        " c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c],"
        " e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], f: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]}",
        "rollout.groups=[" + ", ".join(["8"] * 10_000) + "]",
        "model.spec=" + "x" * 100_000,
        "rollout.group_size=" + "9" * 5000,
    ],
)
def test_values_echoed_in_errors_are_cut_short(override):
    with pytest.raises(ConfigError) as err:
        config.load("bandit", [override])
    assert len(str(err.value)) < 500 and "\n" not in str(err.value)


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


@pytest.mark.parametrize(
    ("overrides", "whitens"),
    [
        ([], True),  # gae: RAGEN whitens GAE advantages
        (["algo.estimator=bi_level_gae"], True),
        (["algo.estimator=grpo"], False),
        (["algo.estimator=rloo"], False),
        (["algo.estimator=reinforce_pp"], False),  # whitens its own
        (["algo.estimator=grpo", "algo.whiten_advantages=true"], True),
        (["algo.whiten_advantages=false"], False),
    ],
)
def test_advantage_whitening_follows_the_estimator_unless_set(overrides, whitens):
    c = config.load("sokoban", overrides)
    assert c.algo.whitens() is whitens
    if not any("whiten" in o for o in overrides):  # the default is shown as null
        assert "whiten_advantages: null" in config.to_yaml(c)


@pytest.mark.parametrize("preset", ["bandit", "bandit-starpo", "bandit-gpu", "bandit-starpo-gpu"])
def test_the_bandit_presets_keep_raw_advantages(preset):
    # make demo collapsed with whitened ones and learned with raw ones (docs/results.md)
    assert config.load(preset).algo.whitens() is False


def test_top_p_bounds_the_mini_batch_by_every_episode():
    c = config.load("bandit", ["algo.filter_mode=top_p", "trainer.mini_batch_size=32"])
    assert config.kept_groups(c) == 8 and config.kept_episodes(c) == 32
    # with one rollout per group top_p=1 keeps everything: filter_ratio is not read
    config.load(
        "bandit",
        [
            "algo.filter_mode=top_p",
            "algo.filter_top_p=1",
            "rollout.group_size=1",
            "trainer.mini_batch_size=8",
            "trainer.micro_batch_size=8",
        ],
    )


def test_each_filter_strategy_bounds_the_mini_batch_by_what_it_keeps():
    def kept(*overrides):
        return config.kept_groups(config.load("bandit", list(overrides)))

    assert kept("algo.filter_strategy=top_k_abs", "algo.filter_k=5") == 5
    assert kept("algo.filter_strategy=top_k_abs", "algo.filter_k=50") == 8  # all 8 groups
    assert kept("algo.filter_strategy=min_p") == 8  # at most every group
    with pytest.raises(config.ConfigError, match=r"16 > 12 = min\(groups, filter_k\)"):
        config.load("bandit", ["algo.filter_strategy=top_k_abs", "algo.filter_k=3"])


def test_filter_weights_run_where_the_trainer_holds_the_advantages():
    config.load("bandit", ["algo.estimator=grpo", "algo.soft_advantage_reweight=true"])
    config.load("bandit", ["algo.filter_loss_scaling=linear", "trainer.scoring_pass=always"])
    config.load("bandit", ["algo.estimator=grpo", "algo.filter_loss_scaling=sqrt"])


def test_eval_envs_take_their_own_options_and_the_training_env_takes_env_options():
    c = config.load(
        "sokoban",
        [
            "env.options.spaced=true",
            "env.eval_names=[sokoban, sokoban-large, frozen-lake]",
            "env.eval_options.sokoban-large={spaced: true, num_boxes: 1}",
        ],
    )
    assert config.env_options(c, "sokoban") == {"spaced": True}
    assert config.env_options(c, "sokoban-large") == {"spaced": True, "num_boxes": 1}
    assert config.env_options(c, "frozen-lake") == {}
