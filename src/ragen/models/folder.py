"""Hugging Face model folders, checked before transformers reads them.

A damaged folder (an unreadable config.json, a size of 0, pickled weights, a bad index,
missing or cut-short weights) is refused in one line naming the file (:func:`check_folder`),
and so are weights whose shapes config.json contradicts (:func:`check_shapes`), where
transformers would print a report and a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from ragen.models.source import ModelError, first_line

# transformers' model and tokenizer classes are imported inside the functions that use them:
# importing them takes seconds, which commands that never load a model should not pay.

_SAFETENSORS = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights stored with pickle: unpickling a file can run any code, so ragen never reads them.
_PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# Sizes config.json must give as positive whole numbers where it gives them: 0 layers or heads
# builds a model that fails far from the file (a division by zero in the generator).
_POSITIVE_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


def _read_json(file: Path):
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(
            f"{file} is not readable JSON ({first_line(err)}): restore the file, or point "
            "model.spec at an intact model folder"
        ) from None


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files transformers reads from ``folder``, looked for in its order:
    model.safetensors, else the shards its index names (maybe not all present), else none.
    Pickled weights are refused: ragen loads safetensors only."""
    if (folder / _SAFETENSORS).is_file():
        return [folder / _SAFETENSORS]
    index = folder / _SAFETENSORS_INDEX
    if index.is_file():
        return [folder / name for name in _shard_names(index)]
    for name in _PICKLED:
        if (folder / name).is_file():
            raise ModelError(
                f"{folder / name} holds pickled PyTorch weights, which ragen never loads "
                "(unpickling can run code): ragen loads safetensors only; use a folder with "
                "model.safetensors, or convert the weights with a tool you trust"
            )
    return []


def _shard_names(index: Path) -> list[str]:
    """The shard files a safetensors index names. Each must be a plain file name (transformers
    joins it to the folder, so ``../x`` would read outside it), and the index must hold the
    ``metadata`` and ``weight_map`` objects transformers reads."""
    data = _read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not (
        isinstance(weight_map, dict)
        and weight_map
        and all(isinstance(name, str) for name in weight_map.values())
        and isinstance(data.get("metadata"), dict)
    ):
        raise ModelError(
            f'{index} is not a weight index: it needs a "metadata" object and a "weight_map" '
            "from weight names to shard files; restore the file from the model's source"
        )
    names = sorted(set(weight_map.values()))
    for name in names:
        if name in ("", ".", "..") or Path(name).name != name:
            raise ModelError(
                f"{index} names the shard {name!r}, which is not a file inside {index.parent}: "
                "shard names are plain file names in the model folder; restore the index"
            )
    return names


def _check_sizes(config_file: Path, config: dict) -> None:
    """The sizes ``config`` gives (top level, and ``text_config`` for a multimodal model) are
    positive whole numbers."""
    for section in (config, config.get("text_config")):
        if not isinstance(section, dict):
            continue
        for key in _POSITIVE_SIZES:
            value = section.get(key)
            if key in section and (type(value) is not int or value < 1):
                raise ModelError(
                    f"{config_file} gives {key}={json.dumps(value)}: a causal LM needs a "
                    "positive whole number there; restore the model's config.json"
                )


def check_folder(folder: Path) -> None:
    """Refuse a model folder that cannot load, naming the file: a config.json that is not a
    JSON object or gives a size that is not a positive whole number (0 layers), pickled
    weights, an index that names shards outside the folder or lacks its metadata, missing
    weights (an interrupted save or prune), a cut-short safetensors file. Reads only
    config.json, the index and the safetensors headers."""
    config_file = folder / "config.json"
    config = _read_json(config_file)
    if not isinstance(config, dict):
        raise ModelError(f"{config_file} is not a JSON object: restore the model's config.json")
    _check_sizes(config_file, config)
    weights = _weight_files(folder)
    missing = [f.name for f in weights if not f.is_file()] if weights else [_SAFETENSORS]
    if missing:
        raise ModelError(
            f"model folder {folder} is incomplete: it lacks {', '.join(missing)} (an interrupted "
            "save or checkpoint prune leaves such a folder); use a complete checkpoint or model "
            "folder"
        )
    for file in weights:
        try:
            with safe_open(str(file), framework="pt"):
                pass  # opening checks the header against the file's size
        except (SafetensorError, OSError) as err:
            raise ModelError(
                f"{file} is corrupt ({first_line(err)}): it was cut short or overwritten; use "
                "another checkpoint or restore the model folder"
            ) from None


def read_config(location: str, allow_download: bool, trust_remote_code: bool = False):
    """The transformers config at ``location`` (config.json only)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            location, local_files_only=not allow_download, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise ModelError(
            f"{location}: its config.json is not a model config: {remote_code_line(err)}"
        ) from None


def remote_code_line(err: BaseException) -> str:
    """``err`` in one line; for a folder that ships its own code, the setting that runs it."""
    if "trust_remote_code" not in str(err):
        return first_line(err)
    return (
        "it ships its own Python code (config.json's auto_map), which ragen runs only when "
        "you trust it: set model.trust_remote_code=true (ragen model: --trust-remote-code)"
    )


def check_shapes(folder: Path, skeleton) -> None:
    """Refuse weights whose shapes config.json contradicts (a hidden or vocabulary size edited,
    or copied from another model), where transformers would print a report and raise a
    RuntimeError: each weight stored under a name of the model built from config.json must
    have that model's shape. Reads the safetensors headers only."""
    wanted = {name: list(tensor.shape) for name, tensor in skeleton.state_dict().items()}
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as weights:
            for name in sorted(set(weights.keys()) & set(wanted)):
                stored = weights.get_slice(name).get_shape()
                if stored != wanted[name]:
                    raise ModelError(
                        f"{folder}: config.json does not match the weights: {name} is "
                        f"{stored} in {file.name} but config.json makes it {wanted[name]}; "
                        "restore the model's config.json, or use the weights it was saved with"
                    )
