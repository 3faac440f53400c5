"""End-to-end training on the tiny model: what changes, what is written, exact resume."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen import config, models
from ragen import metric_names as names
from ragen.algos import whiten
from ragen.algos.gigpo import anchor_ids, gigpo
from ragen.cli import main
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train import checkpoint
from ragen.train.loop import RunLoop
from ragen.train.scoring import policy_logprobs
from ragen.train.state import RunState
from ragen.train.trainer import Trainer, step_env_seeds
from ragen.train.update import UpdateData, UpdateSettings, ppo_update

SMALL = [*TINY_RL, NO_TENSORBOARD, "trainer.actor_lr=1e-3", "trainer.critic_lr=1e-3"]


def _config(*overrides):
    return config.load("sokoban-rl", [*SMALL, *overrides])


def _train(tmp_path, name, *overrides, resume=False):
    cfg = _config(*overrides)
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


def test_env_seeds_are_fresh_each_step_and_below_eval_seeds():
    a, b = step_env_seeds(0, 0, 8), step_env_seeds(0, 1, 8)
    assert a != b and a == step_env_seeds(0, 0, 8)
    assert max(a + b) < 1_000_000_000


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """One 2-step run, a checkpoint after each step and the template probe on each, that
    the tests below only read: (the loop after training, its run directory)."""
    folder = tmp_path_factory.mktemp("two-steps")
    every_step = ("trainer.save_every=1", "monitor.template_every=1")
    return _train(folder, "run", "trainer.steps=2", *every_step)


def test_training_changes_weights_and_writes_the_run(two_steps):
    before = models.load_policy("tiny", dtype="float32")[0].state_dict()
    loop, run = two_steps
    after = loop.trainer.m.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    records = read_jsonl(run.metrics).records
    assert [r["step"] for r in records] == [0, 1]
    for key in (
        "rollout/reward_mean",
        "rollout/reward_std",
        "filter/kept_groups",
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "actor/clipfrac_low",
        "actor/clipfrac_high",
        "actor/approx_kl",
        "critic/value_loss",
        "critic/explained_var",
        "time/rollout_s",
        "time/update_s",
        "perf/train_tokens_per_s",
        "perf/threads",
        "perf/memory_cuts",
        "perf/rollout_peak_rss_gib",
        "perf/update_peak_rss_gib",
        "rollout/end_truncated_reply_length",
    ):
        assert key in records[0], key
    # the process's peak memory in each phase: at least the float32 policy it holds
    size = sum(t.numel() * t.element_size() for t in after.values()) / 2**30
    assert records[0]["perf/update_peak_rss_gib"] > size
    assert records[0]["filter/kept_groups"] == 2  # ceil(4 groups × 0.5)
    assert [r["perf/memory_cuts"] for r in records] == [0, 0]  # plenty free here
    episodes = read_jsonl(run.trajectory_file(1)).records
    assert len(episodes) == 8 and {"env", "group", "seed", "turns"} <= set(episodes[0])
    ckpt = run.checkpoint(2)
    assert [p.name for p in checkpoint.complete_checkpoints(run)] == ["step_000001", "step_000002"]
    loaded, _ = models.load_policy(str(ckpt), dtype="float32")  # HF layout, loads as is
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, after[name]), name


def test_a_step_whose_decode_batches_free_memory_cut_counts_them(tmp_path, monkeypatch):
    # About 1 kB free: each turn's 8 live episodes decode a row at a time, not together.
    monkeypatch.setattr("ragen.rollout.engines.memory.available_memory", lambda: 1000)
    with pytest.warns(UserWarning, match="free memory is short"):
        loop, run = _train(tmp_path, "short", "trainer.steps=1")
    [record] = read_jsonl(run.metrics).records
    calls = loop.trainer.generator.stats.calls  # one per turn of the step's rollout
    assert calls >= 1 and record["perf/memory_cuts"] == calls


def test_resume_replays_the_uninterrupted_run(tmp_path):
    # The warm-up outlasts the first run, so the resumed half must pick the schedule up.
    warm = ("trainer.save_every=2", "trainer.lr_warmup_steps=3")
    straight, run_a = _train(tmp_path, "a", "trainer.steps=4", *warm)
    _train(tmp_path, "b", "trainer.steps=2", *warm)
    resumed, run_b = _train(tmp_path, "b", "trainer.steps=4", *warm, resume=True)
    assert resumed.start_step == 2
    a = [_stable(r) for r in read_jsonl(run_a.metrics).records]
    b = [_stable(r) for r in read_jsonl(run_b.metrics).records]
    assert a == b
    assert [r["actor/lr"] for r in a] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    wa, wb = straight.trainer.m.policy.state_dict(), resumed.trainer.m.policy.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ca, cb = straight.trainer.m.critic.state_dict(), resumed.trainer.m.critic.state_dict()
    assert all(torch.equal(ca[k], cb[k]) for k in ca)


def test_a_run_saved_with_keys_since_removed_resumes(tmp_path, capsys):
    _, run = _train(tmp_path, "old", "trainer.steps=1")
    removed = "trainer:\n  scoring_pass: always\n  prefix_sharing: micro_batch\n"
    run.config.write_text(run.config.read_text().replace("trainer:\n", removed, 1))
    # the saved keys are dropped; an override that sets one is refused, as in a new run
    assert main(["train", "--resume", str(run.root), "trainer.scoring_pass=auto"]) == 2
    assert "trainer.scoring_pass was removed" in capsys.readouterr().err
    assert main(["train", "--resume", str(run.root), "trainer.steps=2"]) == 0
    assert [r["step"] for r in read_jsonl(run.metrics).records] == [0, 1]
    assert "scoring_pass" not in run.config.read_text()  # it records what it ran with


def test_killed_run_resumes_from_its_last_checkpoint(tmp_path, ragen_home):
    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "ragen",
        "train",
        "sokoban-rl",
        *SMALL,
        "trainer.steps=4",
        "trainer.save_every=1",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAGEN_HOME": ragen_home},
    )
    run = RunDir(out)
    deadline = time.monotonic() + 240
    while len(checkpoint.complete_checkpoints(run)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = checkpoint.complete_checkpoints(run)
    assert done, "no checkpoint was written before the kill"
    last = int(done[-1].name.removeprefix("step_"))
    assert last < 4
    assert main(["train", "--resume", str(out)]) == 0  # here: only the kill needs a process
    steps = [r["step"] for r in read_jsonl(run.metrics).records]
    assert steps == list(range(4))  # every step exactly once, none lost, none doubled
    assert checkpoint.complete_checkpoints(run)[-1].name == "step_000004"


def test_grpo_trains_without_a_critic(tmp_path):
    loop, run = _train(tmp_path, "grpo", "algo.estimator=grpo", "trainer.steps=1")
    assert loop.trainer.m.critic is None and "critic" not in loop.trainer.m.optimizers
    record = read_jsonl(run.metrics).records[0]
    assert "actor/pg_loss" in record and "critic/value_loss" not in record
    assert not (run.checkpoint(1) / "critic_trainable.safetensors").exists()


def test_gigpo_gives_each_turn_the_credit_of_its_anchor_group():
    overrides = ("algo.estimator=gigpo", "rollout.reward_placement=per_turn", "algo.filter_ratio=1")
    trainer = Trainer(_config(*overrides, "trainer.steps=1"))
    kept, _ = trainer.filter(trainer.collect(0))
    data = trainer.prepare(kept)
    assert trainer.m.critic is None and data.advantages is not None
    # the same numbers from the turns' own rewards and observations, through the math alone
    width = max(len(t.turns) for t in kept)
    valid = torch.tensor([[n < len(t.turns) for n in range(width)] for t in kept])
    rewards = torch.tensor(
        [[t.turns[n].reward if n < len(t.turns) else 0.0 for n in range(width)] for t in kept]
    )
    ids = anchor_ids([[u.observation for u in t.turns] for t in kept], [t.group for t in kept])
    want = gigpo(
        torch.tensor([t.total_reward for t in kept]),
        rewards,
        valid,
        ids,
        torch.tensor([t.group for t in kept]),
        gamma=0.95,
        step_weight=1.0,
        norm_by_std=False,
        turn_penalties=torch.tensor(
            [
                [t.turns[n].terms["format"] if n < len(t.turns) else 0.0 for n in range(width)]
                for t in kept
            ]
        ),
    )
    assert any(u.terms["format"] < 0 for t in kept for u in t.turns)  # the deduction is used
    for row, t in enumerate(kept):
        for n, turn in enumerate(t.turns):
            got = data.advantages[row, turn.reply_start : turn.reply_end]
            torch.testing.assert_close(got, torch.full_like(got, float(want[row, n])))
    assert data.advantages[data.loss_mask == 0].abs().sum() == 0
    trainer.update(data, 0)  # the update runs on them
    # what the step logs of its anchor groups: the share of turns paired with another
    turns = [(t.group, u.observation) for t in kept for u in t.turns]
    paired = sum(turns.count(key) > 1 for key in turns) / len(turns)
    logged = trainer.credit_metrics(kept)
    assert logged[names.GIGPO_ANCHORED_SHARE] == pytest.approx(paired)
    assert logged[names.GIGPO_TURNS_PER_ANCHOR] == pytest.approx(len(turns) / len(set(turns)))


def test_a_gigpo_step_groups_its_anchors_once(monkeypatch):
    # the estimator and the gigpo/* metrics read the same anchor ids: one grouping a step
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return anchor_ids(*args, **kwargs)

    monkeypatch.setattr("ragen.algos.gigpo.anchor_ids", counted)
    overrides = ("algo.estimator=gigpo", "rollout.reward_placement=per_turn", "algo.filter_ratio=1")
    trainer = Trainer(_config(*overrides, "trainer.steps=1"))
    metrics, played = trainer.step(0, RunState())
    assert len(calls) == 1 and metrics["actor/optimizer_steps"] > 0
    # the same figures as the metrics built on their own
    kept, _ = trainer.filter(played)
    logged = {k: v for k, v in metrics.items() if k.startswith("gigpo/")}
    assert logged and logged == pytest.approx(trainer.credit_metrics(kept))


def test_lora_trains_only_adapters_and_saves_a_merged_model(tmp_path):
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
    merged, _ = models.load_policy(str(run.checkpoint(1)), dtype="float32")
    assert not any("lora" in n for n in merged.state_dict())


def _update_data(policy, tokenizer, advantages):
    rows = [tokenizer(text)["input_ids"] for text in ("a b c d e f", "u v w x y z")]
    assert len(rows[0]) == len(rows[1])
    ids = torch.tensor(rows)
    mask = torch.ones_like(ids)
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, 3:] = 1
    with torch.no_grad():
        old = policy_logprobs(policy, ids, mask)[0]
    adv = torch.tensor(advantages).view(2, 1) * loss_mask
    return UpdateData(ids, mask, loss_mask, adv, adv, old, None, None)


def _settings(**trainer_changes):
    algo = config.AlgoConfig(clip_low=0.2, clip_high=0.28, entropy_coef=0.0, kl_coef=0.0)
    trainer = config.TrainerConfig(
        **{"grad_clip": 1.0, "ppo_epochs": 1, "mini_batch_size": 2, "micro_batch_size": 1}
        | trainer_changes
    )
    return UpdateSettings(algo, trainer, temperature=1.0, autocast_dtype=None)


def test_update_raises_logprobs_of_positive_advantages():
    policy, tokenizer = models.load_policy("tiny", dtype="float32")
    data = _update_data(policy, tokenizer, [1.0, -1.0])
    opt = {"actor": torch.optim.SGD(policy.parameters(), lr=0.5)}
    stats = ppo_update(policy, None, opt, data, _settings(), seed=0)
    assert stats["actor/optimizer_steps"] == 1 and stats["actor/skipped_steps"] == 0
    with torch.no_grad():
        new = policy_logprobs(policy, data.input_ids, data.attention_mask)[0]
    delta = ((new - data.old_logprobs) * data.loss_mask).sum(dim=1)
    assert delta[0] > 0 > delta[1]


def test_truncated_importance_sampling_weights_the_policy_loss():
    policy, tokenizer = models.load_policy("tiny", dtype="float32")
    data = _update_data(policy, tokenizer, [1.0, 1.0])
    # the sampler reported half the trainer's probability on every token: ratio 2, cut to 1.5
    sampled = replace(data, rollout_logprobs=data.old_logprobs - math.log(2.0))
    frozen = {"actor": torch.optim.SGD(policy.parameters(), lr=0.0)}  # both see one policy
    plain = ppo_update(policy, None, frozen, data, _settings(), seed=0)
    algo = config.AlgoConfig(clip_low=0.2, clip_high=0.28, entropy_coef=0.0, tis_cap=1.5)
    weighted = ppo_update(policy, None, frozen, sampled, replace(_settings(), algo=algo), seed=0)
    assert weighted["actor/pg_loss"] == pytest.approx(1.5 * plain["actor/pg_loss"], rel=1e-5)
    assert weighted["actor/tis_capped"] == 1.0
    assert weighted["actor/rollout_mismatch"] == pytest.approx(math.log(2.0), rel=1e-5)


def test_a_batch_smaller_than_the_mini_batch_is_one_optimiser_step():
    # a top_p filter may keep fewer episodes than trainer.mini_batch_size
    policy, tokenizer = models.load_policy("tiny", dtype="float32")
    data = _update_data(policy, tokenizer, [1.0, -1.0])
    opt = {"actor": torch.optim.SGD(policy.parameters(), lr=0.5)}
    stats = ppo_update(policy, None, opt, data, _settings(mini_batch_size=32), seed=0)
    assert stats["actor/optimizer_steps"] == 1 and stats["actor/skipped_steps"] == 0


def _trainer(*overrides):
    return Trainer(_config("trainer.steps=1", *overrides))


def _spread_returns(episodes):
    """Episode i returns i: every group varies, no two episodes tie."""
    for i, episode in enumerate(episodes):
        for turn in episode.turns:
            turn.reward = 0.0
        episode.turns[-1].reward = float(i)
    return episodes


def test_gae_advantages_are_whitened_and_their_targets_are_not():
    trainer = _trainer("algo.filter_ratio=1")
    assert trainer.config.algo.whiten_advantages is None  # the default: by estimator
    data = trainer.prepare(_spread_returns(trainer.collect(0)))
    on = data.loss_mask != 0
    adv = data.advantages[on].double()
    assert abs(float(adv.mean())) < 1e-5 and float(adv.var(correction=1)) == pytest.approx(1.0)
    # gamma = lam = 1: every reply token's target is its episode's return, i
    rows = torch.arange(len(on), dtype=data.returns.dtype)[:, None].expand_as(on)
    torch.testing.assert_close(data.returns[on], rows[on])
    raw = (data.returns - data.old_values) * data.loss_mask  # the GAE advantages
    torch.testing.assert_close(data.advantages, whiten(raw, data.loss_mask))


def test_grpo_advantages_are_not_whitened():
    trainer = _trainer("algo.estimator=grpo", "algo.filter_ratio=1")
    data = trainer.prepare(_spread_returns(trainer.collect(0)))
    # each group holds returns 2g and 2g + 1: unbiased std √.5, so
    # (s - mean) / (std + 1e-6) = ±.5 / (√.5 + 1e-6)
    sign = torch.tensor([-1.0, 1.0]).repeat(len(data.advantages) // 2)[:, None]
    want = sign * 0.5 / (0.5**0.5 + 1e-6) * data.loss_mask
    torch.testing.assert_close(data.advantages, want)


def test_a_step_whose_groups_are_all_dropped_skips_the_update(tmp_path, monkeypatch):
    trainer = _trainer("algo.filter_mode=top_p", "algo.filter_include_zero=false")
    collect = trainer.collect

    def constant_returns(step):  # every group's returns equal: no group has any std
        episodes = collect(step)
        for episode in episodes:
            for turn in episode.turns:
                turn.reward = -0.1
        return episodes

    monkeypatch.setattr(trainer, "collect", constant_returns)
    before = {k: v.clone() for k, v in trainer.m.policy.state_dict().items()}
    run = create_run_dir(tmp_path / "run", trainer.config)
    RunLoop(trainer, run).train()
    record = read_jsonl(run.metrics).records[0]
    assert record["filter/empty"] == 1 and record["filter/kept_groups"] == 0
    assert record["actor/optimizer_steps"] == 0 and "actor/pg_loss" not in record
    assert all(torch.equal(before[k], v) for k, v in trainer.m.policy.state_dict().items())
    assert checkpoint.complete_checkpoints(run)  # the step still ends as usual


def test_non_finite_loss_skips_the_step_and_keeps_the_weights():
    policy, tokenizer = models.load_policy("tiny", dtype="float32")
    data = _update_data(policy, tokenizer, [float("nan"), 1.0])
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    opt = {"actor": torch.optim.AdamW(policy.parameters(), lr=0.1)}
    stats = ppo_update(policy, None, opt, data, _settings(), seed=0)
    assert stats["actor/skipped_steps"] == 1 and stats["actor/optimizer_steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_train_command_refuses_bad_config_without_a_run_dir(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["train", "bandit", "algo.clip_hgh=1", "--out", str(out)]) == 2
    assert "algo.clip_hgh" in capsys.readouterr().err
    assert not out.exists()
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_config_yaml_of_a_run_reloads(tmp_path):
    cfg = _config("trainer.steps=1")
    run = create_run_dir(tmp_path / "r", cfg)
    assert config.load(str(run.config)) == cfg
    json.dumps(config.to_dict(cfg))  # the W&B config is plain data


def test_logged_losses_do_not_depend_on_the_micro_batch_size():
    logged = []
    for micro in (1, 2):
        policy, tokenizer = models.load_policy("tiny", dtype="float32")
        data = _update_data(policy, tokenizer, [1.0, -0.5])
        opt = {"actor": torch.optim.SGD(policy.parameters(), lr=0.0)}
        logged.append(
            ppo_update(policy, None, opt, data, _settings(micro_batch_size=micro), seed=0)
        )
    with torch.no_grad():
        ent = policy_logprobs(policy, data.input_ids, data.attention_mask)[1]
    on = data.loss_mask > 0
    assert logged[0]["actor/entropy"] == pytest.approx(float(ent[on].mean()), rel=1e-5)
    assert logged[0]["actor/pg_loss"] == pytest.approx(-float(data.advantages[on].mean()), rel=1e-5)
    for key in ("actor/entropy", "actor/pg_loss", "actor/grad_norm"):
        assert logged[0][key] == pytest.approx(logged[1][key], rel=1e-5)


def test_a_step_writes_every_metric_name_that_readers_rely_on(two_steps):
    _, run = two_steps  # its first step, the template probe run
    written = set(read_jsonl(run.metrics).records[0])
    other = {names.SFT_LOSS, names.SFT_GRAD_NORM} | names.GIGPO_ONLY  # not this run's kind
    assert names.PRODUCED - other <= written, sorted(names.PRODUCED - other - written)
