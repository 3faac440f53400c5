"""Template collapse: the pure statistics by hand, the cross-scoring against plain
full-sequence scoring on the tiny model, and pairs taken from real rollouts."""

import math

import pytest
import torch

from ragen.monitor.template import (
    collapse_stats,
    cross_loglik,
    reasoning_length,
    sample_pairs,
    template_collapse_metrics,
)
from ragen.rollout.engines import Sample
from ragen.rollout.loop import RolloutSpec, rollout
from ragen.rollout.trajectory import Trajectory, Turn
from ragen.train.scoring import policy_logprobs

# ---------------------------------------------------------------------------- statistics


def test_stats_of_a_two_by_two_matrix_by_hand():
    loglik = torch.tensor([[0.0, -1.0], [-2.0, -1.0]])  # [i, j] = log p(r_i | x_j)
    stats = collapse_stats(loglik, torch.tensor([2.0, 4.0]))
    mi_0 = 0.0 - math.log((math.exp(0.0) + math.exp(-1.0)) / 2)
    mi_1 = -1.0 - math.log((math.exp(-2.0) + math.exp(-1.0)) / 2)
    assert stats == pytest.approx(
        {
            "collapse/retrieval_acc": 1.0,
            "collapse/mi_estimate": (mi_0 + mi_1) / 2,
            "collapse/pairs": 2.0,
            "collapse/think_entropy": 3.0,
        }
    )


def test_a_reasoning_that_ignores_its_prompt_carries_no_information():
    loglik = torch.full((4, 4), -7.0)  # every prompt explains every reasoning equally
    stats = collapse_stats(loglik)
    assert stats["collapse/mi_estimate"] == pytest.approx(0.0)
    assert stats["collapse/retrieval_acc"] == pytest.approx(0.25)  # ties share the credit
    assert "collapse/think_entropy" not in stats


def test_a_perfectly_retrievable_sample_reaches_log_n():
    loglik = torch.full((3, 3), -200.0).fill_diagonal_(-1.0)
    stats = collapse_stats(loglik)
    assert stats["collapse/retrieval_acc"] == 1.0
    assert stats["collapse/mi_estimate"] == pytest.approx(math.log(3))


def test_wrong_retrieval_and_partial_ties():
    loglik = torch.tensor([[-3.0, -1.0, -3.0], [-1.0, -1.0, -5.0], [-2.0, -2.0, -1.0]])
    # row 0: prompt 1 wins (0); row 1: tie of prompts 0 and 1 (1/2); row 2: right (1)
    assert collapse_stats(loglik)["collapse/retrieval_acc"] == pytest.approx(0.5)


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (4,)])
def test_stats_need_a_square_matrix_of_two_or_more(shape):
    with pytest.raises(ValueError, match="square"):
        collapse_stats(torch.zeros(shape))


# ---------------------------------------------------------------------------- pairs


def _decode_with(vocab):
    return lambda ids: "".join(vocab[i] for i in ids)


@pytest.mark.parametrize(
    ("vocab", "ids", "expected"),
    [
        (["I go", ".</", "think", "><", "answer", ">"], [0, 1, 2, 3, 4, 5], 1),  # merged tag
        (["a", "b", "</think>", "c"], [0, 1, 2, 3], 2),  # the tag as one token
        (["</", "think", ">x"], [0, 1, 2], 0),  # no reasoning at all
        (["a", "b"], [0, 1, 0], 3),  # never closed: everything is reasoning
        (["</th", "ink>", "</think>"], [0, 1, 2], 0),  # the first tag counts
    ],
)
def test_reasoning_length_finds_where_the_tag_begins(vocab, ids, expected):
    assert reasoning_length(ids, _decode_with(vocab)) == expected


def test_reasoning_length_with_the_real_tokenizer(tiny):
    _, tokenizer = tiny
    ids = tokenizer(" plan.</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
    n = reasoning_length(ids, tokenizer.decode)
    assert tokenizer.decode(ids[:n]) == " plan."


def _trajectory(group, copy, prompt, reasoning):
    vocab_close = [99]  # token 99 decodes to the closing tag
    t = Trajectory(env="bandit", group=group, copy=copy, seed=group)
    t.append(prompt, sampled=False)
    start = len(t.token_ids)
    t.append(reasoning + vocab_close, sampled=True)
    turn = Turn("", "", "", "", [], [], 0.0, True, [], 0, len(reasoning), start, start + 3)
    turn.reply_end = len(t.token_ids)
    t.turns.append(turn)
    return t


def test_pairs_have_distinct_prompts_and_real_reasoning():
    decode = _decode_with({**{i: f"<{i}>" for i in range(99)}, 99: "</think>"})
    trajs = [
        _trajectory(0, 0, [1, 2], [10, 11]),
        _trajectory(0, 1, [1, 2], [12]),  # same prompt as its group's other copy
        _trajectory(1, 0, [3], [13, 14, 15]),
        _trajectory(2, 0, [4, 5, 6], []),  # nothing to score
        _trajectory(3, 0, [7], [16]),
    ]
    pairs = sample_pairs(trajs, decode, max_pairs=10, seed=0)
    assert len(pairs) == 3
    assert {tuple(p) for p, _ in pairs} == {(1, 2), (3,), (7,)}
    by_prompt = {tuple(p): r for p, r in pairs}
    assert by_prompt[(3,)] == [13, 14, 15] and by_prompt[(7,)] == [16]
    assert by_prompt[(1, 2)] in ([10, 11], [12])
    assert sample_pairs(trajs, decode, max_pairs=2, seed=0) == pairs[:2]
    assert sample_pairs(trajs, decode, seed=5) == sample_pairs(trajs, decode, seed=5)


class _Thoughts:
    """A generator that answers every episode of group g with thought g (then eos)."""

    def __init__(self, tokenizer, thoughts):
        self.tokenizer, self.thoughts, self.calls = tokenizer, thoughts, 0

    def generate(self, requests, *, max_new_tokens, temperature, top_p=1.0, seed=0):
        out = []
        for req in requests:
            text = f"{self.thoughts[req.key[1]]}</think><answer>Up</answer>"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            ids.append(self.tokenizer.eos_token_id)
            out.append(Sample(ids, [-0.5] * len(ids), "stop"))
        return out

    def release(self, keys):
        pass


def test_pairs_from_real_rollouts_score_on_the_tiny_model(tiny):
    model, tokenizer = tiny
    thoughts = [" The box is left.", " I go up now", " Wall ahead, so"]
    spec = RolloutSpec(max_turns=2, max_reply_tokens=24)
    gen = _Thoughts(tokenizer, thoughts)
    trajs = rollout(gen, tokenizer, "sokoban", [3, 4, 5], 2, spec)
    pairs = sample_pairs(trajs, tokenizer.decode, max_pairs=8)
    assert len(pairs) == 3  # three groups, three distinct first prompts
    for prompt, reasoning in pairs:
        assert tokenizer.decode(prompt).endswith("<think>")
        assert tokenizer.decode(reasoning) in thoughts
    stats = template_collapse_metrics(model, pairs, micro_batch=2)
    assert set(stats) == {
        "collapse/retrieval_acc",
        "collapse/mi_estimate",
        "collapse/pairs",
        "collapse/think_entropy",
    }
    assert stats["collapse/pairs"] == 3 and stats["collapse/mi_estimate"] <= math.log(3) + 1e-6
    assert template_collapse_metrics(model, pairs[:1]) == {}


# ---------------------------------------------------------------------------- scoring


def test_cross_scoring_matches_full_sequences(tiny):
    model, _ = tiny
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5, 1), (9, 6), (4, 4), (6, 2)]  # (prompt, reasoning) lengths
    pairs = [
        (
            torch.randint(5, 1000, (p,), generator=g).tolist(),
            torch.randint(5, 1000, (r,), generator=g).tolist(),
        )
        for p, r in shapes
    ]
    loglik, entropy = cross_loglik(model, pairs, micro_batch=2)
    with torch.no_grad():
        for i, (_, reasoning) in enumerate(pairs):
            for j, (prompt, _) in enumerate(pairs):
                ids = torch.tensor([prompt + reasoning])
                logp, ent = policy_logprobs(model, ids, torch.ones_like(ids))
                assert loglik[i, j] == pytest.approx(float(logp[0, len(prompt) :].sum()), abs=1e-4)
                if i == j:
                    assert entropy[i] == pytest.approx(
                        float(ent[0, len(prompt) :].mean()), abs=1e-4
                    )
    # batching other rows beside a reasoning (padding) changes only rounding
    assert torch.allclose(loglik, cross_loglik(model, pairs, micro_batch=5)[0], atol=1e-4)


def test_cross_scoring_refuses_empty_input(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="at least one"):
        cross_loglik(model, [])
    with pytest.raises(ValueError, match="non-empty"):
        cross_loglik(model, [([1, 2], [])])
