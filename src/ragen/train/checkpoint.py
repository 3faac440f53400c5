"""Checkpoints: written to a temporary folder and renamed into place, so a run killed at any
moment leaves only complete checkpoints.

``checkpoints/step_N/`` holds the policy in the Hugging Face layout (safetensors; LoRA
merged in), so ``transformers`` and ``ragen eval --model …/step_N`` load it directly, plus
what an exact resume needs: the trainable weights that the layout does not hold (LoRA
adapters, the critic), the optimiser states, and ``trainer_state.json``.

Models sharded with FSDP2 (fsdp.py) are gathered whole onto rank 0's CPU, which writes the
same files, and a resume sends each rank its shards back: every rank calls ``save_checkpoint``
and ``load_checkpoint`` together.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ragen.monitor.logging import RunDir
from ragen.train import distributed, fsdp

STATE_FILE = "trainer_state.json"


def _trainable(model) -> dict[str, torch.Tensor]:
    # named_parameters() lists a tied tensor once, so nothing is saved twice
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def _is_lora(model) -> bool:
    return hasattr(model, "peft_config")


def _owners(policy, critic) -> dict:
    """The model each optimiser trains, by the optimiser keys of ``trainer.build_models``."""
    return {"actor": policy, "critic": critic}


def _trainable_names(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


@dataclass
class _Whole:
    """What a checkpoint writes, as whole tensors: the policy's state dict (None: the policy
    saves its own), the critic's trainable weights, the optimiser states by name."""

    policy: dict[str, torch.Tensor] | None
    critic: dict[str, torch.Tensor] | None
    optimizers: dict[str, dict]


def _whole(policy, critic, optimizers: dict[str, torch.optim.Optimizer]) -> _Whole:
    """The checkpoint's contents; sharded models are gathered onto rank 0 (a collective: every
    rank calls this), whose contents alone are complete."""
    if not fsdp.is_sharded(policy):
        return _Whole(
            None,
            None if critic is None else _trainable(critic),
            {k: o.state_dict() for k, o in optimizers.items()},
        )
    critic_state = None
    if critic is not None:
        names = _trainable_names(critic)
        gathered = fsdp.gather_model_state(critic)
        critic_state = {n: t.contiguous() for n, t in gathered.items() if n in names}
    owners = _owners(policy, critic)
    return _Whole(
        fsdp.gather_model_state(policy),
        critic_state,
        {k: fsdp.gather_optimizer_state(owners[k], o) for k, o in optimizers.items()},
    )


def save_checkpoint(
    run: RunDir,
    step: int,
    *,
    policy,
    tokenizer,
    critic,
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict,
    keep: int,
) -> Path:
    """Write ``checkpoints/step_<step>`` atomically; keep the newest ``keep`` checkpoints and
    the one with the best ``eval_success`` in its state (the rollback target). Every rank
    calls it (sharded models are gathered first); rank 0 writes."""
    final = run.checkpoint(step)
    whole = _whole(policy, critic, optimizers)
    if not distributed.is_main():
        return final
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if _is_lora(policy):
        copy.deepcopy(policy).merge_and_unload().save_pretrained(tmp)
        save_file(_trainable(policy), tmp / "policy_trainable.safetensors")
    else:
        policy.save_pretrained(tmp, state_dict=whole.policy)
    tokenizer.save_pretrained(tmp)
    if whole.critic is not None:
        save_file(whole.critic, tmp / "critic_trainable.safetensors")
    torch.save(whole.optimizers, tmp / "optimizer.pt")
    (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=2) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(run, keep)
    return final


def _prune(run: RunDir, keep: int) -> None:
    best = best_checkpoint(run)
    for old in complete_checkpoints(run)[:-keep]:
        if old != best:
            shutil.rmtree(old)


def best_checkpoint(run: RunDir) -> Path | None:
    """The complete checkpoint with the highest ``eval_success`` (the newest among equals);
    None when no checkpoint recorded one."""
    scored = []
    for path in complete_checkpoints(run):
        success = json.loads((path / STATE_FILE).read_text()).get("eval_success")
        if isinstance(success, int | float):
            scored.append((success, int(path.name.removeprefix("step_")), path))
    return max(scored)[2] if scored else None


def complete_checkpoints(run: RunDir) -> list[Path]:
    """Finished checkpoints, oldest first (a temporary folder is never one)."""
    if not run.checkpoints.is_dir():
        return []
    done = [p for p in run.checkpoints.glob("step_*") if (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name.removeprefix("step_")))


def _weights_of(model, tensors: dict[str, torch.Tensor], what: str) -> dict[str, torch.Tensor]:
    """The tensors of ``model``'s parameters; raises if a trainable one is missing."""
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in tensors]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} {what} tensors, e.g. {missing[0]}")
    return {n: t for n, t in tensors.items() if n in params}


def _load_weights(model, file: Path, what: str) -> None:
    if not fsdp.is_sharded(model):
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, tensor in _weights_of(model, load_file(file), what).items():
                params[name].copy_(tensor)
        return
    tensors: dict[str, torch.Tensor] = {}  # read on rank 0, sent from there
    # a missing tensor stops every rank with rank 0's message, not only rank 0
    distributed.on_main(lambda: tensors.update(_weights_of(model, load_file(file), what)))
    fsdp.scatter_model_state(model, tensors)


def _load_optimizers(path: Path, policy, critic, optimizers: dict[str, torch.optim.Optimizer]):
    if not fsdp.is_sharded(policy):
        saved = torch.load(path / "optimizer.pt", weights_only=True)
        for key, opt in optimizers.items():
            opt.load_state_dict(saved[key])
        return
    saved = torch.load(path / "optimizer.pt", weights_only=True) if distributed.is_main() else {}
    owners = _owners(policy, critic)
    for key, opt in optimizers.items():
        fsdp.scatter_optimizer_state(owners[key], opt, saved.get(key, {}))


def load_checkpoint(
    path: Path, *, policy, critic, optimizers: dict[str, torch.optim.Optimizer]
) -> dict:
    """Restore weights and optimiser states from ``path``; returns the trainer state. Every
    rank calls it (sharded models get their shards from rank 0)."""
    if _is_lora(policy):
        _load_weights(policy, path / "policy_trainable.safetensors", "policy")
    else:
        _load_weights(policy, path / "model.safetensors", "policy")
    if critic is not None:
        _load_weights(critic, path / "critic_trainable.safetensors", "critic")
    _load_optimizers(path, policy, critic, optimizers)
    return json.loads((path / STATE_FILE).read_text())
