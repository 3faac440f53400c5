"""Damaged model folders are refused in one line naming the file, by loading and commands."""

import io
import json
from pathlib import Path

import pytest
import torch

from ragen import models
from ragen.cli import main


def _cut_in_half(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _set_config(folder: Path, **values) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(values)
    (folder / "config.json").write_text(json.dumps(config))


def _shard(folder: Path, index: dict) -> None:
    """``folder``'s weights as the one shard of a safetensors index, ``index`` less its
    weight map, which maps every weight to ``shard.safetensors``."""
    from safetensors import safe_open

    (folder / "model.safetensors").rename(folder / "shard.safetensors")
    with safe_open(str(folder / "shard.safetensors"), framework="pt") as weights:
        weight_map = dict.fromkeys(weights.keys(), "shard.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map, **index})
    )


def _index_outside(folder: Path) -> None:
    """An index whose weight map points at intact weights outside the folder."""
    _shard(folder, {"metadata": {}})
    (folder / "shard.safetensors").rename(folder.parent / "elsewhere.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = dict.fromkeys(index["weight_map"], "../elsewhere.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _pickle_weights(folder: Path) -> None:
    """The same weights, saved by torch.save as pytorch_model.bin (a pickle)."""
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: _cut_in_half(f / "model.safetensors"), r"model\.safetensors is corrupt"),
        (lambda f: (f / "config.json").write_text("{oops"), r"config\.json is not readable JSON"),
        (lambda f: (f / "config.json").write_text("[1]"), r"config\.json is not a JSON object"),
        (lambda f: (f / "model.safetensors").unlink(), "is incomplete: it lacks model.safetensors"),
        (lambda f: _set_config(f, num_hidden_layers=0), r"config\.json gives num_hidden_layers=0"),
        (
            lambda f: _set_config(f, hidden_size=128),
            r"config\.json does not match the weights: model\.embed_tokens\.weight is "
            r"\[49152, 64\] in model\.safetensors but config\.json makes it \[49152, 128\]",
        ),
        (
            lambda f: _set_config(f, vocab_size=1000),
            r"model\.embed_tokens\.weight is \[49152, 64\] in model\.safetensors but "
            r"config\.json makes it \[1000, 64\]",
        ),
        (_index_outside, r"names the shard '\.\./elsewhere\.safetensors', which is not a file"),
        (lambda f: _shard(f, {}), r"index\.json is not a weight index: it needs a \"metadata\""),
        (_pickle_weights, r"pytorch_model\.bin holds pickled .* ragen loads safetensors only"),
    ],
    ids=[
        "truncated-weights",
        "bad-json",
        "not-an-object",
        "no-weights",
        "zero-layers",
        "hidden-size-not-the-weights",
        "vocab-size-not-the-weights",
        "index-outside-the-folder",
        "index-without-metadata",
        "pickled-weights",
    ],
)
def test_a_damaged_folder_is_refused_naming_the_file(tiny_folder, damage, message, refused):
    damage(tiny_folder)
    with pytest.raises(models.ModelError, match=message):
        models.load_policy(str(tiny_folder))
    with pytest.raises(models.ModelError, match=message):
        models.build_skeleton(str(tiny_folder))
    refused(tiny_folder, message)


def test_an_unknown_architecture_is_refused_in_one_line(tiny_folder):
    (tiny_folder / "config.json").write_text('{"model_type": "no-such-arch"}')
    with pytest.raises(models.ModelError, match=r"its config\.json is not a model config") as err:
        models.build_skeleton(str(tiny_folder))
    assert "\n" not in str(err.value)


def _with_own_code(folder: Path) -> Path:
    """``folder``'s config pointed at a configuration class in its own evilcode.py, which
    leaves a file behind when it is imported; the marker file's path is returned."""
    marker = folder / "code-ran"
    (folder / "evilcode.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'evil-llama'\n"
        "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n"
    )
    # a model type transformers does not know: only the folder's own code can read it
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "evil-llama"
    config["auto_map"] = {
        "AutoConfig": "evilcode.EvilConfig",
        "AutoModelForCausalLM": "evilcode.EvilModel",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return marker


def test_a_folder_that_ships_code_is_refused_unless_trusted(tiny_folder, capsys, monkeypatch):
    marker = _with_own_code(tiny_folder)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10))  # a yes on stdin changes nothing
    with pytest.raises(models.ModelError, match=r"model\.trust_remote_code=true") as err:
        models.build_skeleton(str(tiny_folder))
    assert "\n" not in str(err.value)
    argv = ["eval", "--env", "bandit", "--model", str(tiny_folder), "--out", str(tiny_folder / "e")]
    assert main(argv) == 2
    out = capsys.readouterr().err
    assert out.count("\n") == 1 and "trust_remote_code" in out
    assert main(["model", "info", str(tiny_folder)]) == 2
    assert not marker.exists()
    # trusted, the folder's code runs as transformers runs it
    models.build_skeleton(str(tiny_folder), trust_remote_code=True)
    assert marker.read_text() == "ran"
