"""preflight: names a config points to outside itself are judged without running user code,
which is imported only when a run starts; a run that cannot start is refused before its folder
exists, with one line, and without reading the model's weights."""

from pathlib import Path

import pytest
import torch

from ragen import config, models
from ragen.cli import main
from ragen.config import ConfigError
from ragen.train.preflight import (
    check_device,
    check_references,
    check_runnable,
    import_reward_terms,
)

BAD_REFERENCES = [
    # (overrides, key named in the message, words that say what is allowed)
    (["algo.estimator=ppo"], "algo.estimator", "gae, grpo"),
    (["env.name=chess"], "env.name", "sokoban"),
    (["env.eval_names=[bandit, chess]"], "env.eval_names[1]", "frozen-lake"),
    (["env.options.arm_names=[A, B, C]"], "env.options", "arm_names"),
    (["env.options.num_arms=3"], "env.options", "allowed options: arm_names"),
    (["model.spec=gpt-5"], "model.spec", "smollm2-135m"),
    (["model.spec=Qwen/Qwen2.5-0.5B-Instruct"], "model.spec", "allow_download=true"),
    (["rollout.demos=3"], "rollout.demos", "at most 2"),
    (["env.name=countdown", "env.eval_names=[countdown]"], "rollout.demos", "at most 0"),
    (["env.name=sokoban", "env.options.carve_steps=99999999999"], "carve_steps", "20000"),
    (
        ["env.name=sokoban", "env.options={width: 5, height: 5, num_boxes: 4}"],
        "env.options",
        "no 5×5 room",
    ),
    (["rollout.reward_terms={no spaces:f: 1.0}"], "rollout.reward_terms", "module:function"),
    (
        ["env.eval_names=[sokoban-large]", "env.eval_options.sokoban-large.spaced=maybe"],
        "env.eval_options.sokoban-large",
        "spaced must be True or False",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"), BAD_REFERENCES, ids=[b[1] for b in BAD_REFERENCES]
)
def test_bad_references_are_refused_with_the_key_named(overrides, key, allowed):
    c = config.load("bandit", overrides)  # the schema alone cannot judge these
    with pytest.raises(ConfigError) as err:
        check_references(c)
    message = str(err.value)
    assert key in message and allowed in message
    assert "\n" not in message


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
        check_references(config.load("bandit", [override]))
    assert len(str(err.value)) < 500 and "\n" not in str(err.value)


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
    c = check_references(config.load(str(run_config)))
    assert not marker.exists()
    import_reward_terms(c)  # when the run starts
    assert marker.exists()


def test_a_reward_term_that_cannot_be_imported_is_refused_when_the_run_starts():
    c = config.load("bandit", ["rollout.reward_terms={ragen_no_such_module:f: 1.0}"])
    with pytest.raises(ConfigError, match="'ragen_no_such_module:f' cannot be imported"):
        import_reward_terms(c)


def _tiny(*overrides):
    return config.load("bandit", ["model.spec=tiny", *overrides])


def test_a_runnable_config_passes():
    check_runnable(_tiny("trainer.device=cpu", "model.lora_rank=8", "model.lora_targets=[q_proj]"))
    check_runnable(_tiny("model.lora_rank=32"))  # 32: the tiny model's narrowest layer


def test_the_model_is_checked_on_the_meta_device():
    skeleton = models.build_skeleton("tiny")
    assert {p.device.type for p in skeleton.parameters()} == {"meta"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(ConfigError, match="sees no CUDA GPU on this machine"):
        check_device("cuda")


def test_a_gpu_index_beyond_the_machine_and_a_non_device_are_refused():
    beyond = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, on any machine
    with pytest.raises(ConfigError, match=f"trainer.device='{beyond}'"):
        check_device(beyond)
    with pytest.raises(ConfigError, match="'cuda:abc' is not a device"):
        check_device("cuda:abc")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.lora_rank=4", "model.lora_targets=[]"], "model.lora_targets is empty"),
        (["model.lora_rank=4", "model.lora_targets=[q_proj, qproj]"], "'qproj', which is no"),
        (["model.lora_rank=4", "model.lora_targets=[mlp]"], "'mlp', which is no linear"),
        (["model.lora_rank=100000000"], "model.lora_rank=100000000 is above 32"),
        (["model.lora_rank=65", "model.lora_targets=[q_proj]"], "above 64"),
    ],
)
def test_lora_that_does_not_fit_the_model_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_runnable(_tiny(*overrides))
    assert "\n" not in str(err.value)


def test_train_refuses_before_making_the_run_dir(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "bandit", "model.spec=tiny", "model.lora_rank=100000000", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragen: config: model.lora_rank=100000000") and err.count("\n") == 1
    assert not out.exists()


def test_eval_checks_the_device_before_loading(tmp_path, capsys):
    out = tmp_path / "ev"
    beyond = f"trainer.device=cuda:{torch.cuda.device_count()}"
    assert main(["eval", "--env", "bandit", "--model", "tiny", "--out", str(out), beyond]) == 2
    assert capsys.readouterr().err.startswith("ragen: config: trainer.device='cuda:")
    assert not out.exists()
