"""Data parallel on CPU (gloo) with the tiny model, launched by torchrun as a user would:
2 processes, run as two "machines" on 127.0.0.1, train what 1 process trains and resume
from their own checkpoint, and a rollout they cannot split evenly is refused; the same for
2 processes that shard the models with FSDP2 (trainer.parallel=fsdp), and the settings FSDP2
refuses.

The 1-process reference runs in this process; every torchrun launch is a subprocess with
OMP_NUM_THREADS=1, as torchrun itself sets for several processes per machine."""

from __future__ import annotations

import gc
import os
import runpy
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.train.openings import each_micro_batch_runs_its_opening

from ragen import config
from ragen.cli import main
from ragen.config import ConfigError
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train import fsdp
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

RUN = [
    "model.spec=tiny",
    # float32 throughout, whatever auto picks on this CPU: the tolerances below are float32
    # rounding's; in bf16 every sum is rounded to 8 bits, and how sums split across ranks
    # (the opening's backward takes a rank's share of the gradient) moves metrics by ~0.2%
    "model.dtype=float32",
    "trainer.update_dtype=float32",
    "rollout.groups=4",  # 2 groups per rank
    "rollout.group_size=2",
    "rollout.max_reply_tokens=6",  # the random model never closes a reply: 6 tokens each
    "rollout.reward_terms.think_tokens=0.01",  # returns differ inside groups: a real filter
    "algo.kl_coef=0.01",  # reference log-probs are scored in shares too
    "trainer.mini_batch_size=4",  # the 4 kept episodes: each rank back-propagates 2 of them
    "trainer.micro_batch_size=1",
    "trainer.ppo_epochs=2",
    "trainer.actor_lr=1e-3",
    "trainer.critic_lr=1e-3",
    "trainer.eval_every=2",
    "trainer.eval_episodes=3",  # shared unevenly: 1 seed and 2 seeds
    "env.eval_names=[sokoban]",
    "monitor.template_every=2",  # rank 0 measures template collapse on every group
    "trainer.gradient_analysis_every=2",  # the gradient reporter sums the ranks' shares too
    "trainer.save_every=2",
    "logging.progress=false",
    "logging.tensorboard=false",
]
# Weights of the 2-process run equal the 1-process ones up to the order in which float32
# gradients are summed (rank shares added, then reduced, instead of one running sum), and
# training amplifies that rounding by an amount that depends on the machine's kernels. On a
# 2-core AVX2 EPYC: after 2 steps (4 AdamW steps at lr 1e-3) at most 3.1e-6 apart (FSDP2:
# 4.4e-5); after 4 steps, resumed from the 2-process checkpoint, 0.03% (FSDP2: 0.15%) of the
# weights lay more than 1e-5 apart, the farthest by 6.5e-4 (an embedding row with a near-zero
# gradient, where AdamW's step is about lr * sign(grad)), but the mean difference stayed at
# 3.7e-7 (FSDP2: 9.4e-7); the resumed run was bit-identical to 4 uninterrupted 2-process
# steps. A real mistake (a rank that trains on its own gradient, a lost micro-batch, optimiser
# state not restored on resume) moves the weights by a good share of what training moves them
# (two steps: 4.3e-4 on average, 51% of the weights by more than 1e-5). The mean difference
# is held to MEAN_WEIGHT_ATOL, ten times the largest rounding seen and 40 times below that.
MEAN_WEIGHT_ATOL = 1e-5
# Optimiser states and a single update from the same weights follow to float rounding.
WEIGHT_ATOL = 1e-5
# Optimiser states after two steps, relative to each tensor's largest value: rounding moved
# the actor's first moment by 0.26% of its largest value (4.5e-5 of 0.0175, FSDP2 against one
# process, whitened advantages); a state saved in another layout or not gathered differs by
# its whole size.
OPTIMIZER_RTOL = 1e-2
# One update from the same weights reproduces its metrics to float rounding.
METRIC_ATOL = 1e-5
# Metrics of whole runs follow their weights: rollout metrics come from identical episodes,
# update metrics from weights apart as above. On the EPYC, after 4 steps, actor/ratio_max moved
# by 1.7e-4, the gradient norms by 3e-4 of themselves, actor/kl by 7.9e-5 and
# collapse/mi_estimate (a difference of log-likelihoods of about 60 nats) by 3.2e-4. A wrong
# gradient sum, or a rank's share missing from a metric, moves them by tens of percent.
RUN_METRIC_TOL = 1e-3
# Clip fractions count tokens past a threshold (a ratio beyond its clip range, a value more
# than the clip from its old one); a token within float rounding of it may land on either
# side. One token of the 2 epochs x 4 episodes x 6 reply tokens counted:
ONE_TOKEN = 1 / 48


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


RAGEN_TRAIN = ("-m", "ragen", "train")  # what torchrun starts in each process, by default


def _torchrun_cmd(
    launch: list[str], args: list[str], program: tuple[str, ...] = RAGEN_TRAIN
) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launch, *program, *args]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _torchrun(
    launch: list[str], args: list[str], program: tuple[str, ...] = RAGEN_TRAIN
) -> subprocess.CompletedProcess:
    return subprocess.run(
        _torchrun_cmd(launch, args, program),
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )


TWO_PROCESSES = ["--standalone", "--nproc_per_node", "2"]


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def _weights(run: RunDir, step: int) -> dict[str, torch.Tensor]:
    folder = run.checkpoint(step)
    policy = load_file(folder / "model.safetensors")
    critic = load_file(folder / "critic_trainable.safetensors")
    return {
        **{f"policy.{k}": v for k, v in policy.items()},
        **{f"critic.{k}": v for k, v in critic.items()},
    }


def _mean_difference(a: RunDir, b: RunDir, step: int) -> float:
    """Mean absolute difference of the weights of step ``step``'s checkpoints."""
    wa, wb = _weights(a, step), _weights(b, step)
    assert wa.keys() == wb.keys()
    total = sum(float((wa[k] - wb[k]).abs().sum()) for k in wa)
    return total / sum(w.numel() for w in wa.values())


def _optimizer_difference(a: RunDir, b: RunDir, step: int) -> float:
    """Largest difference of the optimiser states, which must have the same layout, as a
    share of the largest value of the state tensor it is in."""
    sa, sb = (torch.load(r.checkpoint(step) / "optimizer.pt", weights_only=True) for r in (a, b))
    assert sa.keys() == sb.keys()
    worst = 0.0
    for key in sa:
        assert sa[key]["param_groups"] == sb[key]["param_groups"]
        assert sa[key]["state"].keys() == sb[key]["state"].keys()
        for number, values in sa[key]["state"].items():
            for name, value in values.items():
                want = sb[key]["state"][number][name]
                scale = max(float(want.abs().max()), 1e-12)
                worst = max(worst, float((value - want).abs().max()) / scale)
    return worst


def _assert_same_metrics(got: RunDir, want: RunDir, steps: int) -> None:
    """``got`` logged each of ``steps`` steps once, with every metric but the wall-clock ones
    equal to those of ``want``'s first steps within RUN_METRIC_TOL."""
    records = [read_jsonl(got.metrics).records, read_jsonl(want.metrics).records[:steps]]
    assert [r["step"] for r in records[0]] == [r["step"] for r in records[1]] == list(range(steps))
    for g, w in zip(*records, strict=True):
        g, w = ({k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in (g, w))
        assert g.keys() == w.keys()
        for key, value in w.items():
            if "clipfrac" in key:
                assert abs(g[key] - value) <= ONE_TOKEN + 1e-9, key
            elif key == "collapse/retrieval_acc":
                # An argmax over prompts whose log-likelihoods differ by about 1e-4 nats for
                # the random model: one pair's pick may flip with the weights' rounding (seen
                # with FSDP2 after 4 steps on the EPYC).
                assert abs(g[key] - value) <= 1 / w["collapse/pairs"] + 1e-9, key
            else:
                assert g[key] == pytest.approx(value, rel=RUN_METRIC_TOL, abs=RUN_METRIC_TOL), key


@contextmanager
def _one_thread() -> Iterator[None]:
    """One thread like the torchrun processes: with two, the matmuls split their sums
    differently, and Adam's first steps (about lr * sign(grad)) turn a sign flip of a
    near-zero gradient into a weight difference of 1e-5 (seen with CI's default threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _one_process(folder: Path, steps: int) -> RunDir:
    """The reference: ``steps`` steps in one process, a checkpoint after every second."""
    cfg = config.load("sokoban-rl", [*RUN, f"trainer.steps={steps}"])
    run = create_run_dir(folder / "run", cfg)
    with _one_thread():
        RunLoop(Trainer(cfg), run).train()
    return run


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> RunDir:
    """The reference of the 2-process runs: 3 steps in one process, each micro-batch running
    the opening its rows share itself. Sharded models run it so (each of their forwards is a
    collective): the same sums, in the same order, per row. DDP's ranks run it once for their
    share of a mini-batch, which sums its gradient in another order: float rounding again (on
    the EPYC, DDP's weights after 2 steps lay 1.05e-9 apart on average from this reference,
    0.96e-9 from one running the opening once per mini-batch)."""
    with each_micro_batch_runs_its_opening():
        return _one_process(tmp_path_factory.mktemp("one-micro"), 3)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> RunDir:
    """2 steps of the same run in 2 processes, launched as two "machines" on 127.0.0.1: one
    torchrun per node, each starting 1 process, meeting at a c10d rendezvous (the same
    command on every machine, as a multi-node run is launched). The resume below launches
    both processes from one torchrun, as one machine would."""
    run = RunDir(tmp_path_factory.mktemp("two") / "run")
    endpoint = f"127.0.0.1:{_free_port()}"
    args = ["sokoban-rl", *RUN, "trainer.steps=2", "--out", str(run.root)]
    nodes = [
        subprocess.Popen(
            _torchrun_cmd(
                [
                    "--nnodes",
                    "2",
                    "--nproc_per_node",
                    "1",
                    "--node-rank",
                    str(node),
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    endpoint,
                ],
                args,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    return run


def test_two_processes_train_what_one_process_trains(reference, two_processes):
    assert _mean_difference(two_processes, reference, 2) <= MEAN_WEIGHT_ATOL
    _assert_same_metrics(two_processes, reference, steps=2)
    for step in (0, 1):  # rank 0 wrote every episode of both ranks, in group order
        got = read_jsonl(two_processes.trajectory_file(step)).records
        assert got == read_jsonl(reference.trajectory_file(step)).records
        assert [e["group"] for e in got] == [0, 0, 1, 1, 2, 2, 3, 3]
    evals = [read_jsonl(r.evals).records for r in (two_processes, reference)]
    # Wall time and cost are each process's own (rank 0 played half the seeds), not results.
    untimed = [[{**e, "seconds": 0, "cost": None} for e in records] for records in evals]
    assert untimed[0] == untimed[1][:1]
    assert evals[0][0]["cost"]["generated_tokens"] < evals[1][0]["cost"]["generated_tokens"]


# Each part is proven in the default suite: a one-process resume replays the uninterrupted
# run exactly (test_trainer), two processes train what one does (above), and two processes
# resume from their checkpoint (the FSDP2 test below; DDP loads it as one process does).
@pytest.mark.slow
def test_two_processes_resume_from_their_checkpoint(two_processes, tmp_path):
    run = RunDir(tmp_path / "resumed")
    shutil.copytree(two_processes.root, run.root)
    _ok(_torchrun(TWO_PROCESSES, ["--resume", str(run.root), "trainer.steps=4"]))
    four_steps = _one_process(tmp_path / "one", 4)
    assert _mean_difference(run, four_steps, 4) <= MEAN_WEIGHT_ATOL
    _assert_same_metrics(run, four_steps, steps=4)


FSDP = ["trainer.parallel=fsdp"]


UPDATE_SCRIPT = Path(__file__).with_name("fsdp_update_script.py")


@pytest.fixture(scope="module")
def two_fsdp_processes(tmp_path_factory) -> RunDir:
    """2 steps of the same run in 2 processes that shard the models with FSDP2, run by
    UPDATE_SCRIPT inside the group it joined; the same processes then take its sharded
    update (result.pt, beside the run)."""
    run = RunDir(tmp_path_factory.mktemp("fsdp") / "run")
    args = ["sokoban-rl", *RUN, *FSDP, "trainer.steps=2", "--out", str(run.root)]
    _ok(_torchrun(TWO_PROCESSES, [str(run.root.parent), *args], program=(str(UPDATE_SCRIPT),)))
    return run


def test_two_fsdp_processes_train_what_one_process_trains(reference, two_fsdp_processes):
    # Sharded, the gradients are summed per micro-batch and per shard (reduce-scatter) rather
    # than per rank: float32 rounding again (see MEAN_WEIGHT_ATOL).
    assert _mean_difference(two_fsdp_processes, reference, 2) <= MEAN_WEIGHT_ATOL
    _assert_same_metrics(two_fsdp_processes, reference, steps=2)
    for step in (0, 1):  # generated with the gathered weights: the same episodes
        got = read_jsonl(two_fsdp_processes.trajectory_file(step)).records
        assert got == read_jsonl(reference.trajectory_file(step)).records
    # the checkpoint has the layout of an unsharded run, optimiser states included
    assert _optimizer_difference(two_fsdp_processes, reference, 2) <= OPTIMIZER_RTOL


def test_two_fsdp_processes_resume_from_their_checkpoint(reference, two_fsdp_processes, tmp_path):
    # One step past the checkpoint: optimiser states not restored, or restored to the wrong
    # shards, move that step's update; it is the third step, analysed and evaluated
    # (gradient_analysis_every=2, the last step).
    run = RunDir(tmp_path / "resumed")
    shutil.copytree(two_fsdp_processes.root, run.root)
    _ok(_torchrun(TWO_PROCESSES, ["--resume", str(run.root), "trainer.steps=3"]))
    assert config.load(str(run.root / "config.yaml")).trainer.parallel == "fsdp"
    assert _mean_difference(run, reference, 3) <= MEAN_WEIGHT_ATOL
    _assert_same_metrics(run, reference, steps=3)


def test_a_sharded_update_pads_uneven_shares_and_skips_a_non_finite_step(two_fsdp_processes):
    got = torch.load(two_fsdp_processes.root.parent / "result.pt", weights_only=True)
    with _one_thread():
        weights, metrics = runpy.run_path(str(UPDATE_SCRIPT))["update"](sharded=False)
    # 2 epochs of 2 mini-batches; the one holding the non-finite row is skipped in each
    assert metrics["actor/optimizer_steps"] == 2 and metrics["actor/skipped_steps"] == 2
    assert got["metrics"] == pytest.approx(metrics, rel=1e-5, abs=METRIC_ATOL)
    assert got["weights"].keys() == weights.keys()
    worst = max(float((got["weights"][k] - weights[k]).abs().max()) for k in weights)
    assert worst <= WEIGHT_ATOL


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.parallel=zero"],
            "config: trainer.parallel='zero' is not allowed: must be one of ddp, fsdp",
        ),
        (
            ["trainer.parallel=fsdp", "model.lora_rank=8"],
            "config: trainer.parallel and model.lora_rank contradict (fsdp with lora_rank=8): "
            "a checkpoint merges the adapters into a copy of the model, which FSDP2 cannot make",
        ),
        (
            ["trainer.parallel=fsdp", "rollout.backend=naive"],
            "config: trainer.parallel and rollout.backend contradict (fsdp with naive): ",
        ),
    ],
)
def test_parallel_settings_that_cannot_run_are_refused(overrides, message):
    with pytest.raises(ConfigError) as err:
        config.load("sokoban-rl", ["model.spec=tiny", *overrides])
    assert message in str(err.value)


def test_the_run_is_freed_before_its_process_group_ends(monkeypatch, tmp_path):
    # What a run holds at the group's teardown is freed at interpreter exit instead, where a
    # gloo thread that drops a tensor aborts the process: nothing of the run may outlive it.
    from ragen.train import distributed

    kinds = (RunLoop, Trainer)  # type(), not isinstance: some torch objects warn when asked
    before = {id(o) for o in gc.get_objects() if type(o) in kinds}
    left: list[str] = []
    session = distributed.session

    @contextmanager
    def watched(device: torch.device) -> Iterator[None]:
        with session(device):
            yield
            gc.collect()
            left.extend(
                type(o).__name__
                for o in gc.get_objects()
                if type(o) in kinds and id(o) not in before
            )

    monkeypatch.setattr(distributed, "session", watched)
    args = [*RUN, "trainer.steps=1", "trainer.eval_every=0", "trainer.save_every=0"]
    assert main(["train", "sokoban-rl", *args, "--out", str(tmp_path / "run")]) == 0
    assert left == []


def test_fsdp_in_one_process_says_it_has_no_effect(capsys):
    trainer = Trainer(config.load("sokoban-rl", [*RUN, *FSDP]))
    assert "trainer.parallel=fsdp has no effect in one process" in capsys.readouterr().out
    assert not fsdp.is_sharded(trainer.m.policy)


def test_groups_that_do_not_split_over_the_processes_are_refused(monkeypatch, tmp_path, capsys):
    # the environment torchrun gives rank 0 of 2: each rank refuses before joining the group
    launched = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**launched, "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "never"
    assert main(["train", "sokoban-rl", *RUN, "rollout.groups=3", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "ragen: rollout.groups=3 cannot be split evenly over 2 processes: set rollout.groups=4 "
        "(a multiple of 2) or launch a process count that divides 3\n"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer >= 1: launch with torchrun"),
        (
            {"WORLD_SIZE": "2"},
            "WORLD_SIZE is set but not RANK, MASTER_ADDR, MASTER_PORT: launch with torchrun",
        ),
    ],
)
def test_a_broken_launch_environment_is_one_line_with_the_fix(
    env, message, monkeypatch, tmp_path, capsys
):
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "never"
    assert main(["train", "sokoban-rl", "model.spec=tiny", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()
