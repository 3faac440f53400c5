"""preflight.check_runnable: a run that cannot start is refused before its folder exists,
with one line, and without reading the model's weights."""

import pytest
import torch

from ragen import config, models
from ragen.cli import main
from ragen.config import ConfigError
from ragen.train.preflight import check_device, check_runnable


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
