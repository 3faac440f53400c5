"""Checkpoint files: a checkpoint counts only when every file it wrote is whole, and removing
one never leaves a folder that looks like a checkpoint."""

import json

import torch

from ragen.run.rundir import RunDir
from ragen.train import checkpoint


def _save(run, step, tiny, keep=2):
    policy, tokenizer = tiny
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    return checkpoint.save_checkpoint(
        run,
        step,
        policy=policy,
        tokenizer=tokenizer,
        critic=None,
        optimizers={"actor": optimizer},
        state={"rollbacks": 0, "eval_success": None},
        keep=keep,
    )


def _names(run):
    return [p.name for p in checkpoint.complete_checkpoints(run)]


def test_a_checkpoint_missing_or_short_of_a_file_is_not_complete(tmp_path, tiny):
    run = RunDir(tmp_path)
    for step in (1, 2):
        _save(run, step, tiny)
    state = json.loads((run.checkpoint(2) / checkpoint.STATE_FILE).read_text())
    assert {"model.safetensors", "optimizer.pt", "tokenizer.json"} <= set(state["files"])
    assert _names(run) == ["step_000001", "step_000002"]
    # what a prune cut short used to leave: the state file, the weights gone
    (run.checkpoint(1) / "model.safetensors").unlink()
    assert checkpoint.damage(run.checkpoint(1)) == "model.safetensors is missing"
    optimizer = run.checkpoint(2) / "optimizer.pt"
    size = optimizer.stat().st_size
    optimizer.write_bytes(optimizer.read_bytes()[:1000])
    assert checkpoint.damage(run.checkpoint(2)) == f"optimizer.pt has 1,000 of its {size:,} bytes"
    assert _names(run) == []
    # a checkpoint written before file lists were kept still needs its weights
    legacy = run.checkpoint(1) / checkpoint.STATE_FILE
    legacy.write_text(json.dumps({"step": 1}))
    assert checkpoint.damage(run.checkpoint(1)) == "model.safetensors is missing"


def test_pruning_leaves_no_half_removed_checkpoint(tmp_path, tiny):
    run = RunDir(tmp_path)
    _save(run, 1, tiny)
    _save(run, 2, tiny)
    (run.checkpoint(1) / "model.safetensors").unlink()  # damaged: pruned with the old ones
    leftover = run.checkpoints / ".step_000000.discarded"  # a removal that was cut short
    leftover.mkdir()
    (leftover / "optimizer.pt").write_bytes(b"x" * 100)
    _save(run, 3, tiny)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step_000002", "step_000003"]
    _save(run, 4, tiny, keep=1)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step_000004"]
