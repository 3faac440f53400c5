"""Context windows in training: the update's rows, masks and advantages of a FrozenLake group
in each window, computed by hand; every estimator on turn samples; short runs on the tiny
model.

The group's three episodes are scripted through the real loop, tokenizer, env and parser
(the tiny random model never closes a reply, so it never plays a second turn): copy 0 steps
Down, Down, Right (3 turns, return 0), copy 1's first reply runs past the token budget
(1 turn, -0.1), copy 2 names no action then runs past it (2 turns, -0.2)."""

from __future__ import annotations

import math

import pytest
import torch
from tests.rollout.test_loop import scripted_sample
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen import config
from ragen.algos import whiten
from ragen.rollout.loop import rollout
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train.loop import RunLoop
from ragen.train.sft import SftTrainer
from ragen.train.state import RunState
from ragen.train.trainer import Trainer
from ragen.train.update import mini_batch_rows

SEED = 3  # a lake whose start has two safe steps Down, then one Right
LONG = "x " * 40  # past max_reply_tokens: cut, the episode ends
SCRIPTS = [
    [
        "a</think><answer>Down</answer>",
        "b</think><answer>Down</answer>",
        "c</think><answer>Right</answer>",
    ],
    [LONG],
    ["d</think><answer>Jump</answer>", LONG],
]
RETURNS = [0.0, -0.1, -0.2]
TURNS = [3, 1, 2]
WINDOWS = [("full", 1), ("limited_multi_turn", 2), ("single_turn", 1)]


class Scripted:
    """Answers turn t of copy c with ``SCRIPTS[c][t]`` (ending with eos), cut at the budget."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.turns = tokenizer, {}

    def generate(self, requests, *, max_new_tokens, temperature, top_p=1.0, seed=0):
        out = []
        for request in requests:
            copy = request.key[2]
            turn = self.turns[request.key] = self.turns.get(request.key, -1) + 1
            out.append(scripted_sample(self.tokenizer, SCRIPTS[copy][turn], max_new_tokens))
        return out

    def release(self, keys):
        pass


def _config(window: str, k: int = 1, *overrides: str):
    return config.load(
        "frozen-lake-rl",
        [
            *TINY_RL,
            NO_TENSORBOARD,
            "rollout.groups=1",
            "rollout.group_size=3",
            "rollout.max_turns=3",
            "rollout.max_actions_per_turn=1",
            "rollout.max_reply_tokens=24",
            "env.options.slippery=false",
            "algo.filter_ratio=1",
            "trainer.mini_batch_size=3",
            "trainer.micro_batch_size=2",
            f"rollout.context_window={window}",
            f"rollout.context_turns={k}",
            *overrides,
        ],
    )


def _prepared(window: str, k: int = 1, *overrides: str):
    """(trainer, the scripted group, its UpdateData)."""
    trainer = Trainer(_config(window, k, *overrides))
    c = trainer.config
    episodes = rollout(
        Scripted(trainer.m.tokenizer),
        trainer.m.tokenizer,
        c.env.name,
        [SEED],
        c.rollout.group_size,
        trainer.spec,
        env_options=c.env.options,
    )
    assert [len(e.turns) for e in episodes] == TURNS
    assert [e.total_reward for e in episodes] == pytest.approx(RETURNS)
    return trainer, episodes, trainer.prepare(episodes)


def _per_turn(data, episodes, window: str) -> list[list[torch.Tensor]]:
    """Each turn's advantages on its reply tokens, episode by episode, in either layout."""
    out = []
    row = 0
    for b, episode in enumerate(episodes):
        turns = []
        for turn in episode.turns:
            if window == "full":
                turns.append(data.advantages[b, turn.reply_start : turn.reply_end])
            else:
                start = turn.reply_start - turn.context_start
                turns.append(data.advantages[row, start : start + turn.reply_tokens])
                row += 1
        out.append(turns)
    return out


@pytest.mark.parametrize(("window", "k"), WINDOWS)
def test_grpo_rows_masks_and_advantages_by_hand(window, k):
    _, episodes, data = _prepared(window, k, "algo.estimator=grpo")
    # One entry per episode: mean -0.1, unbiased std sqrt(0.02 / 2) = 0.1.
    std = math.sqrt(0.02 / 2)
    want = [(r + 0.1) / (std + 1e-6) for r in RETURNS]  # 1, 0, -1
    # Had each turn sample been an entry, copy 0's three turns would pull the mean to -1/12
    # and its advantage to 0.847.
    entries = torch.tensor([r for r, n in zip(RETURNS, TURNS, strict=True) for _ in range(n)])
    assert abs((0 - entries.mean()) / entries.std() - want[0]) > 0.15
    if window == "full":
        assert data.episodes is None and len(data.input_ids) == 3
        for b, episode in enumerate(episodes):
            n = len(episode.token_ids)
            assert data.input_ids[b, :n].tolist() == episode.token_ids
            assert data.loss_mask[b, :n].tolist() == episode.loss_mask
            assert data.advantages[b].tolist() == pytest.approx(
                [want[b] * m for m in data.loss_mask[b].tolist()]
            )
        return
    assert data.episodes.tolist() == [0, 0, 0, 1, 2, 2]  # one row per turn
    row = 0
    for b, episode in enumerate(episodes):
        for turn in episode.turns:
            n = turn.reply_end - turn.context_start
            context = turn.reply_start - turn.context_start
            assert data.input_ids[row, :n].tolist() == episode.token_ids[turn.sample]
            mask = [0.0] * context + [1.0] * turn.reply_tokens
            assert data.loss_mask[row].tolist() == mask + [0.0] * (data.loss_mask.shape[1] - n)
            assert data.attention_mask[row].sum() == n
            adv = data.advantages[row]
            assert adv[context:n].tolist() == pytest.approx([want[b]] * turn.reply_tokens)
            assert adv[:context].abs().sum() == 0 and adv[n:].abs().sum() == 0
            row += 1
    # rollout/context_tokens: the tokens of the episode's samples
    rows = data.attention_mask.sum(dim=1)
    for b, episode in enumerate(episodes):
        assert episode.context_tokens == int(rows[data.episodes == b].sum())
        assert episode.to_record()["context_tokens"] == episode.context_tokens


CRITIC_FREE = [
    ("grpo", "last_token"),
    ("rloo", "last_token"),
    ("reinforce_pp", "last_token"),
    ("reinforce_pp", "per_turn"),
    ("gigpo", "per_turn"),
]


@pytest.mark.parametrize("window", ["limited_multi_turn", "single_turn"])
@pytest.mark.parametrize(("name", "placement"), CRITIC_FREE)
def test_critic_free_estimators_give_each_turn_what_the_full_window_gives_it(
    window, name, placement
):
    """Without a critic an episode's advantages read its turns' tokens and rewards, which
    the windows share: each turn's advantages are the full window's, to float rounding."""
    extra = [f"rollout.reward_placement={placement}"]
    _, full_episodes, full = _prepared("full", 1, f"algo.estimator={name}", *extra)
    _, episodes, data = _prepared(window, 1, f"algo.estimator={name}", *extra)
    got, want = _per_turn(data, episodes, window), _per_turn(full, full_episodes, "full")
    assert [len(t) for t in got] == TURNS
    for turns_got, turns_want in zip(got, want, strict=True):
        for a, b in zip(turns_got, turns_want, strict=True):
            torch.testing.assert_close(a, b)
    assert any(float(t.abs().max()) > 0 for turns in got for t in turns)


def test_gae_targets_are_each_episode_return_on_every_turn_sample():
    trainer, _, data = _prepared("single_turn", 1)  # the preset's gae, with a critic
    assert trainer.m.critic is not None and data.advantages is not None
    on = data.loss_mask != 0
    # gamma = lam = 1: every reply token's target is its episode's return
    per_row = torch.tensor([RETURNS[int(b)] for b in data.episodes], dtype=data.returns.dtype)
    torch.testing.assert_close(data.returns[on], per_row[:, None].expand_as(on)[on])
    raw = (data.returns - data.old_values) * data.loss_mask  # the values of each sample's row
    torch.testing.assert_close(data.advantages, whiten(raw, data.loss_mask))


@pytest.mark.parametrize("window", ["full", "single_turn"])
def test_bi_level_gae_discounts_between_the_turn_samples_of_an_episode(window):
    """lam = 1: a turn's target is the discounted return from it (turn_gamma 0.95), whatever
    the values; each turn sample of copy 2 gets its own, as the full window's turns do."""
    # two mini-batches: a scoring pass gives the returns (not the critic-first shortcut)
    _, episodes, data = _prepared(
        window, 1, "algo.estimator=bi_level_gae", "trainer.mini_batch_size=2"
    )
    want = [[0.0, 0.0, 0.0], [-0.1], [0.95 * -0.2, -0.2]]
    row = 0
    for b, episode in enumerate(episodes):
        for n, turn in enumerate(episode.turns):
            if window == "full":
                returns = data.returns[b, turn.reply_start : turn.reply_end]
            else:
                start = turn.reply_start - turn.context_start
                returns = data.returns[row, start : start + turn.reply_tokens]
                row += 1
            assert returns.tolist() == pytest.approx([want[b][n]] * turn.reply_tokens)


def test_filter_weights_reach_every_turn_sample_of_their_episode():
    """RAGEN-2's soft reweight is one weight per episode (sigma / (max sigma + 1e-6), sigma
    the group's unbiased std of returns: 0.1 here), given to each of its turn samples."""
    trainer, episodes, data = _prepared(
        "single_turn", 1, "algo.estimator=grpo", "algo.soft_advantage_reweight=true"
    )
    weighted, metrics = trainer.weigh(data, episodes)
    factor = 0.1 / (0.1 + 1e-6)
    assert metrics["filter/weight_mean"] == pytest.approx(factor)
    torch.testing.assert_close(weighted.advantages, data.advantages * factor)


def test_mini_batches_hold_whole_episodes():
    episodes = torch.tensor([0, 0, 0, 1, 2, 2, 3])
    mask = torch.ones(7, 5, dtype=torch.long)
    minis = list(mini_batch_rows(mask, 2, 2, 0, episodes))
    assert len(minis) == 4  # 2 epochs of ceil(4 episodes / 2)
    for epoch in (minis[:2], minis[2:]):
        rows = sorted(int(r) for mini in epoch for r in mini)
        assert rows == list(range(7))
        for mini in epoch:
            held = set(episodes[mini].tolist())
            assert sorted(mini.tolist()) == [r for r in range(7) if int(episodes[r]) in held]
            assert len(held) == 2


@pytest.mark.parametrize(("window", "k"), WINDOWS)
def test_an_update_takes_as_many_optimiser_steps_in_every_window(window, k):
    trainer, _, data = _prepared(window, k, "algo.estimator=grpo", "trainer.mini_batch_size=2")
    metrics = trainer.update(data, 0)
    assert metrics["actor/optimizer_steps"] == 2  # ceil(3 episodes / 2)


def _train(tmp_path, window: str, k: int, *overrides: str) -> RunDir:
    cfg = config.load(
        "frozen-lake-rl",
        [
            *TINY_RL,
            NO_TENSORBOARD,
            "trainer.steps=2",
            f"rollout.context_window={window}",
            f"rollout.context_turns={k}",
            *overrides,
        ],
    )
    run = RunDir(tmp_path / f"{window}-{k}")
    create_run_dir(run.root, cfg)
    RunLoop(Trainer(cfg), run).train()
    return run


@pytest.mark.parametrize(("window", "k"), WINDOWS)
def test_a_short_run_trains_in_each_window(tmp_path, window, k):
    run = _train(tmp_path, window, k)
    records = read_jsonl(run.metrics).records
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["actor/optimizer_steps"] >= 1 for r in records)
    assert all(math.isfinite(r["actor/pg_loss"]) for r in records)
    episodes = read_jsonl(run.trajectory_file(1)).records
    assert all(e.get("context_window") == (None if window == "full" else window) for e in episodes)


def test_a_windowed_run_repeats_its_numbers(tmp_path):
    def stable(run):
        return [
            {k: v for k, v in r.items() if not k.startswith(("time", "perf/"))}
            for r in read_jsonl(run.metrics).records
        ]

    first = _train(tmp_path / "a", "single_turn", 1)
    again = _train(tmp_path / "b", "single_turn", 1)
    assert stable(first) == stable(again)
    for step in (0, 1):
        a = read_jsonl(first.trajectory_file(step)).records
        assert a == read_jsonl(again.trajectory_file(step)).records


def test_sft_trains_on_each_turn_sample(tmp_path):
    """The expert plays whole episodes; in single_turn its batch holds one row per turn,
    each with the loss on that turn's reply alone."""
    cfg = config.load(
        "frozen-lake-rl",
        [
            "model.spec=tiny",
            "rollout.context_window=single_turn",
            "rollout.max_actions_per_turn=1",
            "sft.dialogues=2",
            "logging.progress=false",
        ],
    )
    trainer = SftTrainer(cfg)
    dialogues, _ = trainer.dialogues(0)
    batch = trainer.batch(dialogues)
    turns = sorted((turn for d in dialogues for turn in d.turns), key=lambda t: t.reply_tokens)
    assert len(batch.input_ids) == sum(len(d.turns) for d in dialogues) > len(dialogues)
    assert sorted(batch.loss_mask.sum(dim=1).tolist()) == [float(t.reply_tokens) for t in turns]
    for mask, length in zip(batch.loss_mask, batch.attention_mask.sum(dim=1), strict=True):
        ones = mask.nonzero().squeeze(1).tolist()
        assert ones == list(range(ones[0], int(length)))  # the sample ends with its reply
    metrics, _ = trainer.step(0, RunState())
    assert math.isfinite(metrics["sft/loss"]) and metrics["sft/skipped"] == 0


def test_a_batch_without_a_turn_sample_skips_its_update_as_the_full_window_trains_it():
    # 64 tokens: no lake's opening leaves room for a 6-token reply, so every episode ends
    # before its first reply; the full window trains such rows to zero sampled tokens
    metrics = {}
    for window in ("full", "single_turn"):
        cfg = config.load(
            "frozen-lake-rl",
            [
                *TINY_RL,
                NO_TENSORBOARD,
                f"rollout.context_window={window}",
                "rollout.max_context_tokens=64",
                "algo.filter_ratio=1",
            ],
        )
        metrics[window], episodes = Trainer(cfg).step(0, RunState())
        assert {e.end for e in episodes} == {"truncated:context"}
        assert not any(e.turns for e in episodes)
        # the rows' tokens: the full window's opening; no turn sample, none
        rows = {"full": [len(e.token_ids) for e in episodes], "single_turn": [0] * len(episodes)}
        assert [e.context_tokens for e in episodes] == rows[window]
        assert metrics[window]["rollout/context_tokens"] == sum(rows[window]) / len(episodes)
    assert metrics["single_turn"]["actor/optimizer_steps"] == 0
    assert metrics["full"]["actor/optimizer_steps"] == 0
