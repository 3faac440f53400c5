"""Model specs resolved without loading anything."""

from pathlib import Path

import pytest

from ragen import models


def test_resolve_embedded_points_into_ragen_home(ragen_home):
    source = models.resolve("SmolLM2-135M")
    assert source.kind == "embedded"
    assert source.spec == "smollm2-135m"
    assert source.path == Path(ragen_home) / "models" / "smollm2-135m"


def test_resolve_tiny_local_and_hub(tmp_path):
    assert models.resolve("tiny").kind == "tiny"
    (tmp_path / "config.json").write_text("{}")
    local = models.resolve(str(tmp_path))
    assert (local.kind, local.path) == ("local", tmp_path)
    assert models.resolve("Qwen/Qwen2.5-0.5B-Instruct").kind == "hub"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("gpt-5", "unknown model spec"), ("./no/such/dir", "unknown model spec")],
)
def test_resolve_refuses_unknown_specs(spec, needle):
    with pytest.raises(models.ModelError, match=needle) as err:
        models.resolve(spec)
    assert "smollm2-135m" in str(err.value)  # the message lists what is accepted


def test_folder_without_config_json_is_refused(tmp_path):
    with pytest.raises(models.ModelError, match=r"config\.json"):
        models.resolve(str(tmp_path))


def test_a_run_directory_given_as_a_model_names_its_newest_checkpoint(tmp_path):
    for step in ("step_000002", "step_000010"):
        (tmp_path / "checkpoints" / step).mkdir(parents=True)
    with pytest.raises(models.ModelError) as err:
        models.resolve(str(tmp_path))
    newest = tmp_path / "checkpoints" / "step_000010"
    assert str(err.value).endswith(
        f"it is a run directory: name one of its checkpoints, such as {newest}"
    )
