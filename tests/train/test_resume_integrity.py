"""Resuming a run that was cut short, damaged or given new settings: each step is logged
once, a refused resume changes nothing, a damaged checkpoint is passed over by name, and each
start records where it ran."""

import shutil
import subprocess
import sys

import pytest
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen import config
from ragen.cli import main
from ragen.models import bf16_supported, resolve_dtype
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

SMALL = [*TINY_RL, NO_TENSORBOARD, "monitor.template_every=0"]
EPISODES = 8  # rollout.groups × rollout.group_size

# The run in a child whose files may not grow past 1 MB: the logs fit, a checkpoint does not
# (its weights alone take 12 MB). SIGXFSZ ignored, a write past the limit fails with EFBIG.
SIZE_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))
from ragen.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _steps(run):
    return [r["step"] for r in read_jsonl(run.metrics).records]


def test_a_failed_checkpoint_write_stops_cleanly_and_the_resume_logs_each_step_once(
    tmp_path, tiny, capsys
):
    run = RunDir(tmp_path / "run")
    args = ["train", "bandit", *SMALL, "trainer.steps=2", "trainer.save_every=0"]
    child = subprocess.run(
        [sys.executable, "-c", SIZE_LIMITED, *args, "--out", str(run.root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 2, child.stderr[-2000:]
    assert "Traceback" not in child.stderr
    line = child.stderr.strip().splitlines()[-1]
    assert line.startswith(f"ragen: cannot write {run.checkpoint(2)}: ")
    assert "File too large" in line
    assert line.endswith(f"; free space or fix permissions, then ragen train --resume {run.root}")
    assert list(run.checkpoints.iterdir()) == []  # the temporary folder is gone
    assert _steps(run) == [0, 1]  # logged, but no checkpoint holds them
    assert main(["train", "--resume", str(run.root)]) == 0
    assert "no checkpoint yet: starting again from step 0" in capsys.readouterr().out
    assert _steps(run) == [0, 1]
    assert [r["step"] for r in read_jsonl(run.machine).records] == [0, 0]  # two starts
    for step in (0, 1):
        assert len(read_jsonl(run.trajectory_file(step)).records) == EPISODES


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny):
    """A finished 2-step run with a checkpoint after each step."""
    cfg = config.load("bandit", [*SMALL, "trainer.steps=2", "trainer.save_every=1"])
    run = create_run_dir(tmp_path_factory.mktemp("two") / "run", cfg)
    RunLoop(Trainer(cfg), run).train()
    return run


def _copy(run, tmp_path):
    return RunDir(shutil.copytree(run.root, tmp_path / "run"))


def _garble(file):
    """Overwrite the safetensors header's length: the file keeps its size, but cannot load."""
    with open(file, "r+b") as fh:
        fh.write(b"\xff" * 8)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("env.name=sokoban", "env.name"),  # its steps so far played Bandit
        ("model.lora_rank=4", "model.lora_rank"),
        ("model.critic_layers=1", "model.critic_layers"),
        ("trainer.steps=1", "trainer.steps"),
        ("algo.estimator=grpo", "algo.estimator"),
    ],
)
def test_a_resume_refuses_overrides_its_checkpoints_cannot_take(
    two_steps, tmp_path, capsys, override, key
):
    run = _copy(two_steps, tmp_path)
    before = run.config.read_bytes()
    assert main(["train", "--resume", str(run.root), override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ragen: config: {key}=")
    assert run.config.read_bytes() == before
    assert not run.lock.exists()  # refused before anything was written


def test_a_resume_passes_over_a_damaged_checkpoint_and_records_its_config_once_loaded(
    two_steps, tmp_path, capsys
):
    run = _copy(two_steps, tmp_path)
    _garble(run.checkpoint(2) / "model.safetensors")
    assert main(["train", "--resume", str(run.root), "trainer.steps=3"]) == 0
    out = capsys.readouterr().out
    assert "resuming from step_000001; skipped step_000002: does not load (SafetensorError" in out
    assert _steps(run) == [0, 1, 2]
    assert config.load(str(run.config)).trainer.steps == 3
    assert [p.name for p in sorted(run.checkpoints.iterdir())] == ["step_000002", "step_000003"]
    (start,) = read_jsonl(run.machine).records  # the fixture trained without the CLI
    assert start["step"] == 1  # this resume's start, after the step of step_000001
    resolved = resolve_dtype(config.load(str(run.config)).model.dtype, "cpu")
    assert start["model_dtype"] == str(resolved).removeprefix("torch.")
    assert start["cpu_bf16"] == bf16_supported("cpu") and start["device"] == "cpu"


def test_a_resume_with_no_intact_checkpoint_is_refused_and_changes_nothing(
    two_steps, tmp_path, capsys
):
    run = _copy(two_steps, tmp_path)
    weights = run.checkpoint(2) / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:1000])
    _garble(run.checkpoint(1) / "model.safetensors")
    before = run.config.read_bytes(), run.metrics.read_bytes()
    assert main(["train", "--resume", str(run.root), "trainer.steps=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        f"ragen: no checkpoint of {run.root} is intact (step_000002: model.safetensors has "
        f"1,000 of its {size:,} bytes; step_000001: does not load (SafetensorError"
    )
    assert (run.config.read_bytes(), run.metrics.read_bytes()) == before
