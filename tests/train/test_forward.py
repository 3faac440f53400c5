"""The training forward pass (shared prefix once, LM head on sampled positions only) gives
the plain full forward's log-probs, entropies, values and gradients."""

import copy

import pytest
import torch

from ragen import models
from ragen.train.forward import (
    MIN_SHARED_PREFIX,
    SharedOpening,
    shared_prefix_length,
    state_values,
    token_logprobs,
)


def _reference(lm, ids, mask):
    """Log-probs and entropies (B, T) from the whole model's logits, position t for token t."""
    logits = lm(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    pad = torch.nn.functional.pad
    return pad(logp, (1, 0)), pad(ent, (1, 0))


def _batch(vocab: int, prefix: int, tails=(7, 3, 12), seed: int = 0):
    """Rows sharing ``prefix`` tokens then different tails, right-padded; loss mask on the
    last 2 tokens of every row."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(5, vocab, (prefix,), generator=g)
    width = prefix + max(tails)
    ids = torch.zeros(len(tails), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss = torch.zeros(ids.shape)
    for row, n in enumerate(tails):
        ids[row, : prefix + n] = torch.cat([head, torch.randint(5, vocab, (n,), generator=g)])
        mask[row, : prefix + n] = 1
        loss[row, prefix + n - 2 : prefix + n] = 1
    return ids, mask, loss


def test_shared_prefix_length_counts_common_tokens_and_leaves_each_row_one_of_its_own():
    ids, mask, _ = _batch(100, 20)
    assert shared_prefix_length(ids, mask) == 20
    # the shortest row has 3 own tokens; were they equal too, one would still stay its own
    same = ids.clone()
    same[:, :23] = ids[1, :23]
    assert shared_prefix_length(same, mask) == 22
    assert shared_prefix_length(ids[:1], mask[:1]) == 0  # one row: nothing to share
    short, short_mask, _ = _batch(100, MIN_SHARED_PREFIX - 1)
    assert shared_prefix_length(short, short_mask) == 0  # too short to pay


@pytest.mark.parametrize("prefix", [0, 24])
def test_logprobs_and_entropy_equal_the_full_forward(tiny, prefix):
    lm = tiny[0]
    ids, mask, loss = _batch(lm.config.vocab_size, prefix)
    ref_logp, ref_ent = _reference(lm, ids, mask)
    logp, ent = token_logprobs(lm, ids, mask, loss)
    on = loss > 0
    torch.testing.assert_close(logp[on], ref_logp[on], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[on], ref_ent[on], atol=1e-5, rtol=1e-5)
    assert (logp[~on] == 0).all() and (ent[~on] == 0).all()
    # without a loss mask every real position after the first is scored
    all_logp, _ = token_logprobs(lm, ids, mask)
    real = mask.bool()
    real[:, 0] = False
    torch.testing.assert_close(all_logp[real], ref_logp[real], atol=1e-5, rtol=1e-5)


def test_gradients_equal_the_full_forward(tiny):
    lm = copy.deepcopy(tiny[0]).train()
    ids, mask, loss = _batch(lm.config.vocab_size, 24)
    weights = torch.linspace(-1, 1, loss.numel()).view(loss.shape) * loss

    (token_logprobs(lm, ids, mask, loss)[0] * weights).sum().backward()
    fast = {n: p.grad.clone() for n, p in lm.named_parameters()}
    lm.zero_grad()
    (_reference(lm, ids, mask)[0] * weights).sum().backward()
    for name, param in lm.named_parameters():
        torch.testing.assert_close(fast[name], param.grad, atol=1e-5, rtol=1e-4, msg=name)


def _losses(lm, critic, ids, mask, loss, opening=None, critic_opening=None):
    """A loss of log-probs and values with weights that differ by position, so every
    gradient path (opening's keys, values and hidden states) carries something."""
    weights = torch.linspace(-1, 1, loss.numel()).view(loss.shape) * loss
    logp = token_logprobs(lm, ids, mask, loss, opening=opening)[0]
    values = state_values(critic, ids, mask, critic_opening)
    return (logp * weights).sum() + (values * weights.flip(0)).sum()


def test_a_mini_batch_opening_gives_the_gradients_of_micro_batches_that_run_their_own(tiny):
    lm = copy.deepcopy(tiny[0]).train()
    critic = models.ValueModel(copy.deepcopy(tiny[0])).train()
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    # 5 rows sharing 24 tokens; rows 0 and 1 share 4 more, as a group's copies share their
    # first observation: a micro-batch of those two rows shares more than its mini-batch
    ids, mask, loss = _batch(lm.config.vocab_size, 24, tails=(9, 7, 3, 12, 5))
    ids[1, 24:28] = ids[0, 24:28]
    micro = [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4])]
    params = [*lm.parameters(), *critic.parameters()]

    for rows in micro:  # each micro-batch runs its own shared prefix
        _losses(lm, critic, ids[rows], mask[rows], loss[rows]).backward()
    want = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None

    opening = SharedOpening(lm.get_decoder(), ids, mask)
    critic_opening = SharedOpening(critic.body, ids, mask)
    assert opening.length == critic_opening.length == 24
    for rows in micro:
        _losses(lm, critic, ids[rows], mask[rows], loss[rows], opening, critic_opening).backward()
    opening.backward()
    critic_opening.backward()
    assert opening.length == 0  # released
    for p, w in zip(params, want, strict=True):
        torch.testing.assert_close(p.grad, w, atol=1e-5, rtol=1e-4)


def test_a_no_grad_opening_scores_what_each_micro_batch_scores(tiny):
    lm = tiny[0]
    ids, mask, loss = _batch(lm.config.vocab_size, 24, tails=(9, 7, 3, 12))
    with torch.no_grad():
        opening = SharedOpening(lm.get_decoder(), ids, mask)
        for rows in (torch.tensor([0, 1]), torch.tensor([2, 3])):
            got = token_logprobs(lm, ids[rows], mask[rows], loss[rows], opening=opening)
            want = token_logprobs(lm, ids[rows], mask[rows], loss[rows])
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    opening.backward()  # nothing to back-propagate: a no-op


def test_values_equal_the_value_model(tiny):
    critic = models.ValueModel(copy.deepcopy(tiny[0]))
    torch.nn.init.normal_(critic.head.weight, std=0.1)  # a zero head would hide any error
    ids, mask, _ = _batch(critic.config.vocab_size, 24)
    # a plain forward of the body, then the head: the value after each token, (B, T)
    hidden = critic.body(input_ids=ids, attention_mask=mask).last_hidden_state
    full = critic.head(hidden).squeeze(-1)
    values = state_values(critic, ids, mask)
    real = mask.bool()
    real[:, 0] = False
    expected = torch.nn.functional.pad(full[:, :-1], (1, 0))
    torch.testing.assert_close(values[real], expected[real], atol=1e-5, rtol=1e-5)


def test_embedded_model_logprobs_equal_the_full_forward(embedded):
    lm = embedded[0]
    ids, mask, loss = _batch(lm.config.vocab_size, 40, tails=(5, 9))
    ref_logp, _ = _reference(lm, ids, mask)
    logp, _ = token_logprobs(lm, ids, mask, loss, with_entropy=False)
    on = loss > 0
    torch.testing.assert_close(logp[on], ref_logp[on], atol=1e-4, rtol=1e-4)


def test_values_keep_float32_precision_under_bf16_autocast(tiny):
    critic = models.ValueModel(copy.deepcopy(tiny[0]))
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    ids, mask, _ = _batch(critic.config.vocab_size, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = state_values(critic, ids, mask)
        hidden = critic.body(input_ids=ids, attention_mask=mask).last_hidden_state
    # The body runs in bf16 (the two paths to its output differ by ~1e-3, up to 2e-3 with
    # another thread count); the head, a float32 layer, must not round what it writes to
    # bf16 (~1e-2 at these values, which the last assertion checks on its own).
    expected = torch.nn.functional.pad(critic.head(hidden.float()).squeeze(-1)[:, :-1], (1, 0))
    real = mask.bool()
    real[:, 0] = False
    assert values.dtype == torch.float32
    torch.testing.assert_close(values[real], expected[real], atol=4e-3, rtol=0)
    rounded = values[real].bfloat16().float()
    assert (values[real] != rounded).float().mean() > 0.9  # float32 values, not bf16 ones
