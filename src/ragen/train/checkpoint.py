"""Checkpoints: written to a temporary folder and renamed into place, so a run killed at any
moment leaves only complete checkpoints.

``checkpoints/step_N/`` holds the policy in the Hugging Face layout (safetensors; LoRA
merged in), so ``transformers`` and ``ragen eval --model …/step_N`` load it directly, plus
what an exact resume needs: the trainable weights that the layout does not hold (LoRA
adapters, the critic), the optimiser states, and ``trainer_state.json``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ragen.monitor.logging import RunDir

STATE_FILE = "trainer_state.json"


def _trainable(model) -> dict[str, torch.Tensor]:
    # named_parameters() lists a tied tensor once, so nothing is saved twice
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def _is_lora(model) -> bool:
    return hasattr(model, "peft_config")


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
    the one with the best ``eval_success`` in its state (the rollback target)."""
    final = run.checkpoint(step)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if _is_lora(policy):
        copy.deepcopy(policy).merge_and_unload().save_pretrained(tmp)
        save_file(_trainable(policy), tmp / "policy_trainable.safetensors")
    else:
        policy.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if critic is not None:
        save_file(_trainable(critic), tmp / "critic_trainable.safetensors")
    torch.save({k: o.state_dict() for k, o in optimizers.items()}, tmp / "optimizer.pt")
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


def _copy_into(model, tensors: dict[str, torch.Tensor], what: str) -> None:
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in tensors]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} {what} tensors, e.g. {missing[0]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name in params:
                params[name].copy_(tensor)


def load_checkpoint(
    path: Path, *, policy, critic, optimizers: dict[str, torch.optim.Optimizer]
) -> dict:
    """Restore weights and optimiser states from ``path``; returns the trainer state."""
    if _is_lora(policy):
        _copy_into(policy, load_file(path / "policy_trainable.safetensors"), "policy")
    else:
        _copy_into(policy, load_file(path / "model.safetensors"), "policy")
    if critic is not None:
        _copy_into(critic, load_file(path / "critic_trainable.safetensors"), "critic")
    saved = torch.load(path / "optimizer.pt", weights_only=True)
    for key, opt in optimizers.items():
        opt.load_state_dict(saved[key])
    return json.loads((path / STATE_FILE).read_text())
