"""The evaluation before training, kept and reused (``trainer.eval_before_cache``).

Runs that start from the same weights and evaluate them with the same settings play the same
episodes before their first update: the runs of a study that share a warm start, or that all
start from the embedded model. The first such run keeps its summary in a folder; the next
finds it by a key of everything the figures depend on and reads it instead of playing the
episodes again.

The key holds the starting policy itself: a digest of every tensor's bytes (so a warm start
redone, or a LoRA adapter, is a new key) and one of the tokenizer. Where the weights were
read from (``model.spec``) is not in it, so a study folder moved or adopted elsewhere still
finds its kept evaluations. Beside them: the rest of the model section and the env section,
the rollout settings the evaluation plays by (`evaluator.eval_spec` and the engine; not those
only training reads: P, N, the training temperature, where rewards are placed, reuse_k), the
training seed (it seeds the evaluation's sampling), the request (env, seeds, tries,
temperature, split), torch's version, and the machine the episodes are sampled on (the dtype
the sampling weights hold, which ``model.dtype=auto`` resolves per machine, and the kernels:
the CPU's instruction set, or the GPU), since those round differently and so sample other
episodes from the same weights. A kept summary whose key differs in
anything is not used. ragen's own code is not in the key: a study continued after an
upgrade that changes how episodes play belongs in a new folder. A file that cannot be read
is ignored (the run evaluates and writes it again), and one that cannot be written is
reported and skipped: the cache only saves time, it never stops a run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import torch

from ragen.config import Config, to_dict
from ragen.run.jsonl import write_atomic
from ragen.train.evaluator import HEADLINE, EvalRequest, eval_spec

REUSED_FROM = "reused_from"
"""The field of a reused summary naming the run that played its episodes."""


def weights_digest(model: torch.nn.Module) -> str:
    """BLAKE2b of ``model``'s state: each tensor's name, dtype, shape and bytes, in
    ``state_dict`` order."""
    digest = hashlib.blake2b(digest_size=32)
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """BLAKE2b of how ``tokenizer`` turns text into tokens and back: the whole definition of a
    fast (Rust) tokenizer (vocabulary, merges, normalizer, added tokens), else its vocabulary;
    with its class, special tokens and chat template either way."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = (
        backend.to_str()
        if backend is not None
        else json.dumps(sorted(tokenizer.get_vocab().items()))
    )
    rest = [type(tokenizer).__name__, tokenizer.special_tokens_map, tokenizer.chat_template]
    text = body + json.dumps(rest, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=32).hexdigest()


def policy_digests(model: torch.nn.Module, tokenizer) -> dict[str, str]:
    """The starting policy as the key holds it: ``weights`` (`weights_digest`) and
    ``tokenizer`` (`tokenizer_digest`)."""
    return {"weights": weights_digest(model), "tokenizer": tokenizer_digest(tokenizer)}


def sampling_machine(sampler: torch.nn.Module) -> dict:
    """What the episodes sampled with ``sampler`` (the weights the rollout samples with)
    depend on beyond its values: their dtype and the kernels that run them."""
    param = next(sampler.parameters())
    if param.device.type == "cuda":
        kernels = torch.cuda.get_device_name(param.device)
    else:
        kernels = f"{param.device.type} {torch.backends.cpu.get_cpu_capability()}"
    return {"dtype": str(param.dtype).removeprefix("torch."), "kernels": kernels}


def eval_key(config: Config, request: EvalRequest, policy: dict[str, str], machine: dict) -> dict:
    """Everything the figures of ``request`` depend on, for the ``policy`` of
    `policy_digests` sampled on ``machine`` (`sampling_machine`): of the model section, all
    but where the weights were read from; of the rollout section, what the evaluation plays
    by."""
    c = to_dict(config)
    return {
        "torch": torch.__version__,
        "machine": machine,
        **policy,
        "seed": config.trainer.seed,
        "request": asdict(request),
        "model": {k: v for k, v in c["model"].items() if k != "spec"},
        "env": c["env"],
        "rollout": {**asdict(eval_spec(config, request)), "backend": config.rollout.backend},
    }


class EvalCache:
    """A folder of kept summaries, one JSON file a key: ``{"key": …, "summary": …}``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, key: dict) -> Path:
        text = json.dumps(key, sort_keys=True, default=str)
        return self.folder / f"{hashlib.blake2b(text.encode(), digest_size=12).hexdigest()}.json"

    def get(self, key: dict) -> dict | None:
        """The summary kept for ``key``, or None: none kept, one kept for another key (the
        file name is a short hash), or a file that is not a kept summary."""
        try:
            kept = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(kept, dict) or _canonical(kept.get("key")) != _canonical(key):
            return None
        summary = kept.get("summary")
        if not isinstance(summary, dict) or not all(
            isinstance(summary.get(k), int | float) for k in HEADLINE
        ):
            return None
        return summary

    def put(self, key: dict, summary: dict, source: Path) -> str | None:
        """Keep ``summary`` for ``key``, naming ``source`` (the run that played it); returns
        why it could not be written, or None."""
        kept = {"key": key, "summary": {**summary, REUSED_FROM: str(source)}}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path(key), json.dumps(kept, indent=1, default=str) + "\n")
        except OSError as err:
            return f"{type(err).__name__}: {err}"
        return None


def _canonical(key: object) -> str:
    """``key`` as it reads back from JSON, so a key compares equal to its own file's."""
    return json.dumps(json.loads(json.dumps(key, default=str)), sort_keys=True)
