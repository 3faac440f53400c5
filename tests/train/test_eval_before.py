"""trainer.eval_before: the starting policy evaluated once, at step -1, changing nothing else;
trainer.eval_before_cache: that evaluation shared by runs from the same weights;
trainer.eval_k: tries per evaluation seed."""

import copy
import json

import pytest
import torch
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen import config
from ragen.models import load_tokenizer
from ragen.report.runs import load_run
from ragen.report.summary import story
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import BEFORE_TRAINING, RunDir, create_run_dir
from ragen.train import eval_cache, loop
from ragen.train.evaluator import EvalRequest, evaluate
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

TINY_BANDIT = [
    *TINY_RL,
    NO_TENSORBOARD,
    "algo.estimator=grpo",  # critic-free: the cheapest real run
    "trainer.eval_every=2",
    "trainer.eval_episodes=2",
    "trainer.save_every=2",
    "env.eval_names=[bandit]",
]


def _train(root, *overrides, resume=False):
    cfg = config.load("bandit", [*TINY_BANDIT, *overrides])
    run = RunDir(root)
    if not resume:
        create_run_dir(run.root, cfg)
    loop = RunLoop(Trainer(cfg), run)
    if resume:
        loop.resume()
    loop.train()
    return run


def _training(run):
    """The run's metrics without its wall-clock figures."""
    return [
        {k: v for k, v in r.items() if not k.startswith(("time", "perf/"))}
        for r in read_jsonl(run.metrics).records
    ]


def test_the_base_evaluation_is_recorded_once_and_changes_no_training_step(tmp_path):
    plain = _train(tmp_path / "plain", "trainer.steps=3")
    run = _train(tmp_path / "base", "trainer.steps=2", "trainer.eval_before=true")
    _train(tmp_path / "base", "trainer.steps=3", "trainer.eval_before=true", resume=True)
    evals = read_jsonl(run.evals).records
    # before training, after step 1 (eval_every=2), after the last step; the resume from
    # step 2 does not evaluate the starting policy again
    assert [e["step"] for e in evals] == [BEFORE_TRAINING, 1, 2]
    assert evals[0]["env"] == "bandit" and evals[0]["episodes"] == 2
    # each evaluation keeps how its 2 levels went, in seed order, to be read level by level
    for e in evals:
        assert len(e["seed_successes"]) == 2 and sum(e["seed_successes"]) == 2 * e["success"]
    assert "level by level on 2 levels" in story([load_run(run.root)])[0]
    # the base evaluation samples from its own seeds: every training step is as without it
    assert _training(run) == _training(plain)
    assert [e["step"] for e in read_jsonl(plain.evals).records] == [1, 2]


def test_an_evaluation_plays_eval_k_tries_a_seed(tmp_path):
    run = _train(tmp_path / "k3", "trainer.steps=1", "trainer.eval_before=true", "trainer.eval_k=3")
    evals = read_jsonl(run.evals).records
    assert [e["step"] for e in evals] == [BEFORE_TRAINING, 0]
    for e in evals:
        # 2 seeds × 3 tries: each seed's successes counted among its 3 tries
        assert (e["episodes"], e["seeds"], e["k"]) == (6, 2, 3)
        assert all(0 <= v <= 3 for v in e["seed_successes"])
        assert sum(e["seed_successes"]) == round(6 * e["success"])
        assert e["pass_at_k"] == sum(v > 0 for v in e["seed_successes"]) / 2


def test_an_evaluation_past_its_episode_bound_is_refused():
    with pytest.raises(config.ConfigError, match=r"trainer\.eval_episodes and trainer\.eval_k"):
        config.load("bandit", ["trainer.eval_episodes=1000", "trainer.eval_k=1001"])


def _evals_before(run):
    return [e for e in read_jsonl(run.evals).records if e["step"] == BEFORE_TRAINING]


def test_runs_from_the_same_weights_share_one_evaluation_before_training(tmp_path, monkeypatch):
    played = []

    def counted(*args, **kwargs):
        played.append(args[3].env)  # the request
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", counted)
    cache = f"trainer.eval_before_cache={tmp_path / 'kept'}"
    first = _train(tmp_path / "first", "trainer.steps=1", "trainer.eval_before=true", cache)
    assert played == ["bandit", "bandit"]  # before training, after the last step
    # another estimator and more steps: the same starting weights and evaluation
    second = _train(
        tmp_path / "second",
        "trainer.steps=2",
        "algo.estimator=rloo",
        "trainer.eval_before=true",
        cache,
    )
    assert played == ["bandit"] * 3  # after its last step only: the one before is read
    (kept,) = _evals_before(first)
    (reused,) = _evals_before(second)
    assert reused == {**kept, eval_cache.REUSED_FROM: str(first.root)}
    assert eval_cache.REUSED_FROM not in kept
    # what the second run trained is what it trains without the cache
    plain = _train(
        tmp_path / "plain", "trainer.steps=2", "algo.estimator=rloo", "trainer.eval_before=true"
    )
    assert _training(second) == _training(plain) and len(played) == 5
    # and the figures it read are those it plays without it (all but the clocks)
    clocks = ("seconds", "cost", eval_cache.REUSED_FROM)
    (played_before,) = _evals_before(plain)
    assert {k: v for k, v in reused.items() if k not in clocks} == {
        k: v for k, v in played_before.items() if k not in clocks
    }
    # another training seed samples the evaluation differently: played again, kept beside
    _train(
        tmp_path / "seed1", "trainer.steps=1", "trainer.eval_before=true", "trainer.seed=1", cache
    )
    assert len(played) == 7 and len(list((tmp_path / "kept").iterdir())) == 2


def test_a_kept_evaluation_that_is_not_one_is_played_again(tmp_path, capsys):
    cache = tmp_path / "kept"
    args = ("trainer.steps=1", "trainer.eval_before=true", f"trainer.eval_before_cache={cache}")
    _train(tmp_path / "first", *args)
    (kept,) = cache.iterdir()
    good = kept.read_text()
    for broken in ("{not json", "[]", good.replace('"success"', '"succes"')):
        kept.write_text(broken)
        run = _train(tmp_path / f"again-{len(broken)}", *args)
        (before,) = _evals_before(run)
        assert eval_cache.REUSED_FROM not in before  # played, and kept again
        assert json.loads(kept.read_text())["summary"][eval_cache.REUSED_FROM] == str(run.root)
    # a cache folder that cannot be written: the run goes on and says so
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    run = _train(tmp_path / "blocked", "trainer.steps=1", "trainer.eval_before=true",
                 f"trainer.eval_before_cache={blocked}")  # fmt: skip
    assert [e["step"] for e in read_jsonl(run.evals).records] == [BEFORE_TRAINING, 0]
    assert f"not kept in {blocked} (FileExistsError" in capsys.readouterr().out


def test_the_weights_digest_reads_every_byte():
    model = torch.nn.Linear(3, 2)
    same = torch.nn.Linear(3, 2)
    same.load_state_dict(model.state_dict())
    assert eval_cache.weights_digest(model) == eval_cache.weights_digest(same)
    with torch.no_grad():
        same.bias[1] = torch.nextafter(same.bias[1], torch.tensor(1.0))  # one float's last bit
    assert eval_cache.weights_digest(model) != eval_cache.weights_digest(same)
    assert eval_cache.weights_digest(model.to(torch.bfloat16)) != eval_cache.weights_digest(same)


HERE = {"dtype": "float32", "kernels": "cpu AVX2"}
W = {"weights": "w", "tokenizer": "t"}


def test_the_key_holds_what_the_evaluation_plays_by_and_not_what_only_training_reads():
    request = EvalRequest(env="bandit", n=2)
    base = config.load("bandit", TINY_BANDIT)
    key = eval_cache.eval_key(base, request, W, HERE)
    # P, N, the training temperature, reward placement, reuse_k: the same evaluation
    trained_only = config.load(
        "bandit",
        [
            *TINY_BANDIT,
            "rollout.groups=3",
            "rollout.group_size=5",
            "rollout.temperature=0.3",
            "algo.estimator=gigpo",
            "rollout.reward_placement=per_turn",
            "rollout.reuse_k=2",
        ],
    )
    assert eval_cache.eval_key(trained_only, request, W, HERE) == key
    # what the episodes play by, the engine, the weights and the request: each a new key
    for change in (
        "rollout.max_reply_tokens=33",
        "rollout.top_p=0.9",
        "rollout.think=false",
        "rollout.demos=1",
        "rollout.context_window=single_turn",
        "rollout.backend=naive",
        "env.options.low_payoff=0.2",
    ):
        changed = config.load("bandit", [*TINY_BANDIT, change])
        assert eval_cache.eval_key(changed, request, W, HERE) != key, change
    for policy in ({**W, "weights": "v"}, {**W, "tokenizer": "u"}):
        assert eval_cache.eval_key(base, request, policy, HERE) != key
    # the same weights read from elsewhere (a study folder moved): the same key
    moved = config.load("bandit", [*TINY_BANDIT, "model.spec=/elsewhere/step_000120"])
    assert eval_cache.eval_key(moved, request, W, HERE) == key
    other = EvalRequest(env="bandit", n=2, temperature=0.7)
    assert eval_cache.eval_key(base, other, W, HERE) != key
    # the same weights sampled in another dtype, or by another CPU's kernels: a new key
    for machine in ({**HERE, "dtype": "bfloat16"}, {**HERE, "kernels": "cpu AVX512"}):
        assert eval_cache.eval_key(base, request, W, machine) != key


def test_the_tokenizer_digest_reads_its_vocabulary_and_chat_template():
    tokenizer = load_tokenizer()
    digest = eval_cache.tokenizer_digest(tokenizer)
    assert eval_cache.tokenizer_digest(copy.deepcopy(tokenizer)) == digest
    added = copy.deepcopy(tokenizer)
    added.add_tokens(["<grid>"])
    templated = copy.deepcopy(tokenizer)
    templated.chat_template = "{{ messages[0]['content'] }}"
    assert len({digest, *map(eval_cache.tokenizer_digest, (added, templated))}) == 3


def test_the_sampling_machine_is_the_samplers_dtype_and_kernels():
    model = torch.nn.Linear(3, 2)
    isa = torch.backends.cpu.get_cpu_capability()
    assert eval_cache.sampling_machine(model) == {"dtype": "float32", "kernels": f"cpu {isa}"}
    assert eval_cache.sampling_machine(model.to(torch.bfloat16))["dtype"] == "bfloat16"
