"""Loading a spec's tokenizer and causal LM (``load_tokenizer``, ``load_policy``), a weightless
skeleton of it for checks made before a run (``build_skeleton``), and the dtype to load in."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from safetensors import SafetensorError

from ragen.config import DEFAULT_SPEC, DTYPES
from ragen.models.chat import PROBE_DIALOGUE, render_chat
from ragen.models.embedded import prepare
from ragen.models.folder import check_folder, check_shapes, read_config, remote_code_line
from ragen.models.progress import without_transformers_bars
from ragen.models.source import ModelError, ModelSource, first_line, resolve
from ragen.models.tiny import build_tiny, tiny_config

# transformers' model and tokenizer classes are imported inside the functions that use them:
# importing them takes seconds, which commands that never load a model should not pay.


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
    without it such a folder is a ModelError, never a question on standard input.

    Read once per process for a location as its files are (names, sizes, times) and these
    options: later calls return the same tokenizer, which callers must not change (nothing
    in ragen does): a run asks for it up to three times (the preflight check, the skeleton
    of the tiny model, the policy)."""
    source = resolve(spec)
    if source.kind == "tiny":
        source = resolve(DEFAULT_SPEC)
    location = _load_location(source, allow_download)
    return _read_tokenizer(location, allow_download, trust_remote_code, _files_stamp(location))


def _files_stamp(location: str) -> tuple[tuple[str, int, int], ...]:
    """(name, size, modification time) of each file of a folder, () for a Hub id: a folder
    rewritten in place is read again."""
    folder = Path(location)
    if not folder.is_dir():
        return ()
    stats = [(p.name, p.stat()) for p in folder.iterdir() if p.is_file()]
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))


@lru_cache(maxsize=4)
def _read_tokenizer(location: str, allow_download: bool, trust_remote_code: bool, stamp: tuple):
    """The tokenizer at ``location`` (see `load_tokenizer`); ``stamp`` keys the cache only."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            location, local_files_only=not allow_download, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise ModelError(
            f"could not load a tokenizer from {location}: {remote_code_line(err)}"
        ) from None
    # Decoder-only batched generation appends to the right, so prompts must be left-padded.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template:  # refused now, not mid-evaluation
        render_chat(tokenizer, PROBE_DIALOGUE, generation_prompt=True)
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
            return LlamaForCausalLM(tiny_config(len(tokenizer), tokenizer.eos_token_id))
    location = _load_location(source, allow_download)
    config = read_config(location, allow_download, trust_remote_code)
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, TypeError, KeyError) as err:
        raise ModelError(
            f"{location}: no causal LM can be built from its config: {first_line(err)}"
        ) from None
    if source.kind != "hub":
        check_shapes(Path(location), skeleton)
    return skeleton


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
            with without_transformers_bars():
                model = AutoModelForCausalLM.from_pretrained(
                    location,
                    dtype=torch_dtype,
                    local_files_only=not allow_download,
                    trust_remote_code=trust_remote_code,
                    use_safetensors=True,  # a Hub model, too, is never unpickled
                )
        except (OSError, ValueError, SafetensorError) as err:
            raise ModelError(
                f"could not load a causal LM from {location}: {remote_code_line(err)}"
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
