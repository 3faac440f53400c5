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

import json
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ragen.models.lora import is_lora, merged_copy
from ragen.models.progress import without_transformers_bars
from ragen.run.rundir import RunDir
from ragen.train import distributed, fsdp

STATE_FILE = "trainer_state.json"
FILES_KEY = "files"
"""Key of the trainer state that lists the checkpoint's files with their sizes in bytes."""
LOAD_ERRORS = (
    OSError,
    RuntimeError,
    ValueError,
    KeyError,
    EOFError,
    pickle.UnpicklingError,
    SafetensorError,
)
"""What loading a damaged checkpoint raises: a file cut short or overwritten (safetensors,
torch.load's zip and pickle readers, JSON), or one whose tensors do not fit the model."""


def _trainable(model) -> dict[str, torch.Tensor]:
    # named_parameters() lists a tied tensor once, so nothing is saved twice
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def _owners(policy, critic) -> dict:
    """The model each optimiser trains, by the optimiser keys of ``setup.build_models``."""
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
    calls it (sharded models are gathered first); rank 0 writes. A write that fails (a full
    disk, a size limit) raises RunDirError and leaves no temporary folder."""
    final = run.checkpoint(step)
    whole = _whole(policy, critic, optimizers)
    if not distributed.is_main():
        return final
    sweep(run)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        with run.writing(final):
            tmp.mkdir(parents=True)
            _write(tmp, policy, tokenizer, whole)
            files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}
            state = {"step": step, **state, FILES_KEY: files}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
            if final.exists():
                _discard(final)
            os.replace(tmp, final)
            _prune(run, keep)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write(folder: Path, policy, tokenizer, whole: _Whole) -> None:
    """Every file of a checkpoint but its state."""
    with without_transformers_bars():
        if is_lora(policy):
            merged_copy(policy).save_pretrained(folder)
            save_file(_trainable(policy), folder / "policy_trainable.safetensors")
        else:
            policy.save_pretrained(folder, state_dict=whole.policy)
    tokenizer.save_pretrained(folder)
    if whole.critic is not None:
        save_file(whole.critic, folder / "critic_trainable.safetensors")
    torch.save(whole.optimizers, folder / "optimizer.pt")


def _prune(run: RunDir, keep: int) -> None:
    """Remove every checkpoint but the newest ``keep`` intact ones and the best one; damaged
    ones go too."""
    done = complete_checkpoints(run)
    kept = {*done[-keep:], best_checkpoint(run)}
    for folder in checkpoint_folders(run):
        if folder not in kept:
            _discard(folder)


def _discard(folder: Path) -> None:
    """Remove a checkpoint folder so that no moment shows it half deleted: renamed to a
    hidden name first (which no reader takes for a checkpoint), then deleted. A removal cut
    short leaves the hidden folder, which ``sweep`` deletes."""
    hidden = folder.with_name(f".{folder.name}.discarded")
    shutil.rmtree(hidden, ignore_errors=True)
    os.replace(folder, hidden)
    shutil.rmtree(hidden)


def sweep(run: RunDir) -> None:
    """Delete what interrupted writes and removals left: the hidden folders beside the
    checkpoints. Only the run's one writer (see ragen.run.lock) calls it."""
    if run.checkpoints.is_dir():
        for leftover in run.checkpoints.glob(".step_*"):
            shutil.rmtree(leftover, ignore_errors=True)


def best_checkpoint(run: RunDir) -> Path | None:
    """The complete checkpoint with the highest ``eval_success`` (the newest among equals);
    None when no checkpoint recorded one."""
    scored = []
    for path in complete_checkpoints(run):
        success = json.loads((path / STATE_FILE).read_text()).get("eval_success")
        if isinstance(success, int | float):
            scored.append((success, steps_done(path), path))
    return max(scored)[2] if scored else None


def written_by(path: Path) -> str | None:
    """The loop that wrote the checkpoint at ``path`` (``train`` or ``sft``); None for a
    checkpoint from before the state recorded it."""
    loop = json.loads((path / STATE_FILE).read_text()).get("loop")
    return loop if isinstance(loop, str) else None


def steps_done(path: Path) -> int:
    """The steps the checkpoint at ``path`` (a ``step_N`` folder) holds: N."""
    return int(path.name.removeprefix("step_"))


def checkpoint_folders(run: RunDir) -> list[Path]:
    """Every ``step_N`` folder, oldest first, intact or not (temporary and discarded folders
    have hidden names, never matched here)."""
    if not run.checkpoints.is_dir():
        return []
    found = [p for p in run.checkpoints.glob("step_*") if p.is_dir()]
    return sorted(found, key=steps_done)


def complete_checkpoints(run: RunDir) -> list[Path]:
    """Intact checkpoints (every file present at its written size), oldest first."""
    return [p for p in checkpoint_folders(run) if damage(p) is None]


def damage(path: Path) -> str | None:
    """What makes the checkpoint at ``path`` unusable, in a few words; None when every file
    its state lists is there at the size it was written with."""
    try:
        state = json.loads((path / STATE_FILE).read_text())
        files = state[FILES_KEY] if FILES_KEY in state else _legacy_files(path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{STATE_FILE} is missing or unreadable ({type(err).__name__})"
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if size is not None and file.stat().st_size != size:
            return f"{name} has {file.stat().st_size:,} of its {size:,} bytes"
    return None


def _legacy_files(path: Path) -> dict[str, int | None]:
    """The files a checkpoint written before file lists were recorded must hold (sizes
    unknown): the optimiser states and the policy's weights."""
    weights = "model.safetensors"
    if (path / "policy_trainable.safetensors").exists():
        weights = "policy_trainable.safetensors"
    return {"optimizer.pt": None, weights: None}


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


def _read_optimizers(path: Path) -> dict:
    # Onto the CPU: a GPU run's states name cuda:0, which a CPU machine cannot open and every
    # rank of a multi-GPU run would otherwise fill; load_state_dict moves them to the
    # parameters' device.
    return torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)


def _load_optimizers(path: Path, policy, critic, optimizers: dict[str, torch.optim.Optimizer]):
    if not fsdp.is_sharded(policy):
        saved = _read_optimizers(path)
        for key, opt in optimizers.items():
            opt.load_state_dict(saved[key])
        return
    saved = _read_optimizers(path) if distributed.is_main() else {}
    owners = _owners(policy, critic)
    for key, opt in optimizers.items():
        fsdp.scatter_optimizer_state(owners[key], opt, saved.get(key, {}))


def load_checkpoint(
    path: Path, *, policy, critic, optimizers: dict[str, torch.optim.Optimizer]
) -> dict:
    """Restore weights and optimiser states from ``path``; returns the trainer state. Every
    rank calls it (sharded models get their shards from rank 0)."""
    if is_lora(policy):
        _load_weights(policy, path / "policy_trainable.safetensors", "policy")
    else:
        _load_weights(policy, path / "model.safetensors", "policy")
    if critic is not None:
        _load_weights(critic, path / "critic_trainable.safetensors", "critic")
    _load_optimizers(path, policy, critic, optimizers)
    return json.loads((path / STATE_FILE).read_text())
