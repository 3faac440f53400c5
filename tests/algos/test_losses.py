"""Losses: hand-computed PPO terms, clip fractions, aggregation modes, chunked log-probs."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from ragen.algos import losses
from ragen.algos.advantages import Coefficients, estimate
from ragen.config import AlgoConfig

LOG = math.log

# ------------------------------------------------------------------------------ policy loss

# One crafted row of 6 tokens, clip_low = .2, clip_high = .28 (range [.8, 1.28]).
#   tok  A    ratio  -A*r   -A*clip(r)   loss    clipped side
#   0   +1    1.5    -1.5   -1.28        -1.28   high (A > 0, r > 1.28)
#   1   +1    0.5    -0.5   -0.8         -0.5    none (A > 0 is never clipped below)
#   2   -1    0.5     0.5    0.8          0.8    low  (A < 0, r < 0.8)
#   3   -1    1.5     1.5    1.28         1.5    none
#   4   +2    1.0    -2.0   -2.0         -2.0    none
#   5   masked, ratio e^30 and A = inf: must not matter
RATIOS = [1.5, 0.5, 0.5, 1.5, 1.0]
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0, math.inf]])
MASK = torch.tensor([[1.0, 1, 1, 1, 1, 0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0, -40.0]])
NEW = OLD + torch.tensor([[*map(LOG, RATIOS), 30.0]])


def test_policy_loss_hand_computed():
    loss, stats = losses.policy_loss(NEW, OLD, ADV, MASK, 0.2, 0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.28, -0.5, 0.8, 1.5, -2.0, 0.0]]))
    assert float(stats["clipfrac_high"]) == pytest.approx(1 / 5)
    assert float(stats["clipfrac_low"]) == pytest.approx(1 / 5)
    assert float(stats["clipfrac_dual"]) == 0.0
    # k3: (r - 1) - log r per token, mean over the 5 masked tokens
    k3 = [(r - 1) - LOG(r) for r in RATIOS]
    assert float(stats["approx_kl"]) == pytest.approx(sum(k3) / 5, rel=1e-5)
    assert float(stats["ratio_mean"]) == pytest.approx(sum(RATIOS) / 5, rel=1e-6)
    assert float(stats["ratio_max"]) == pytest.approx(1.5, rel=1e-6)
    assert all(v.dim() == 0 and v.dtype == torch.float32 for v in stats.values())


def test_policy_loss_decoupled_clip_is_asymmetric():
    # ratio 1.25 with A > 0: inside [.8, 1.28] -> not clipped; with a symmetric .2 it would be.
    new = torch.tensor([[LOG(1.25)]])
    zero, one, a = torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1)
    loss, stats = losses.policy_loss(new, zero, a, one, 0.2, 0.28)
    assert float(loss) == pytest.approx(-1.25) and float(stats["clipfrac_high"]) == 0
    loss, stats = losses.policy_loss(new, zero, a, one, 0.2, 0.2)
    assert float(loss) == pytest.approx(-1.2) and float(stats["clipfrac_high"]) == 1


def test_policy_loss_dual_clip():
    # A = -1, ratio 5: PPO loss max(5, 1.28) = 5; dual clip c = 3 caps it at -c*A = 3.
    # A = -1, ratio 2: loss 2 < 3, untouched. A = +1, ratio 5: dual clip never applies (-1.28).
    new = torch.tensor([[LOG(5.0), LOG(2.0), LOG(5.0)]])
    a = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, stats = losses.policy_loss(new, torch.zeros(1, 3), a, torch.ones(1, 3), 0.2, 0.28, 3.0)
    torch.testing.assert_close(loss, torch.tensor([[3.0, 2.0, -1.28]]))
    assert float(stats["clipfrac_dual"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="dual_clip"):
        losses.policy_loss(new, new, a, a, 0.2, 0.2, 0.5)


def test_policy_loss_gradients():
    # d loss / d logp = -A * ratio where the unclipped term is chosen, 0 where the clip holds.
    new = NEW.clone().requires_grad_(True)
    loss, _ = losses.policy_loss(new, OLD, ADV, MASK, 0.2, 0.28)
    loss.sum().backward()
    want = torch.tensor([[0.0, -0.5, 0.0, 1.5, -2.0, 0.0]])
    torch.testing.assert_close(new.grad, want)


def test_sequence_ratio_is_each_rows_geometric_mean_and_clips_whole_rows():
    # row 0: ratios 1.5, 0.5, 2 -> s = 1.5^(1/3) ~ 1.145, inside [.8, 1.28]: loss -s per token,
    #        and d loss / d logp_t = -A * s on every token (the GSPO-token gradient)
    # row 1: ratios 2, 2 -> s = 2 > 1.28 with A > 0: the whole row clipped, no gradient
    # row 2: ratios 0.25, 1 -> s = 0.5 < 0.8 with A < 0: the whole row clipped at 0.8, even
    #        its token whose own ratio (1) a token-level clip would have kept
    old = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-1.0, -1.0, 0.0, 0.0], [-2.0, -3.0, 0.0, 0.0]])
    ratios = torch.tensor([[1.5, 0.5, 2.0, 1.0], [2.0, 2.0, 1.0, 1.0], [0.25, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]])
    adv = torch.tensor([[1.0] * 4, [1.0] * 4, [-1.0] * 4])
    new = (old + ratios.log()).requires_grad_(True)
    new.data[0, 3] = math.nan  # masked garbage
    loss, stats = losses.policy_loss(new, old, adv, mask, 0.2, 0.28, ratio_level="sequence")
    loss.sum().backward()
    s = 1.5 ** (1 / 3)
    want = torch.tensor([[-s, -s, -s, 0.0], [-1.28, -1.28, 0, 0], [0.8, 0.8, 0, 0]])
    torch.testing.assert_close(loss, want)
    grad = torch.tensor([[-s, -s, -s, 0.0], [0.0] * 4, [0.0] * 4])
    torch.testing.assert_close(new.grad, grad)
    assert float(stats["clipfrac_high"]) == pytest.approx(2 / 7)
    assert float(stats["clipfrac_low"]) == pytest.approx(2 / 7)
    token, _ = losses.policy_loss(new.detach(), old, adv, mask, 0.2, 0.28)
    assert float(token[2, 1]) == pytest.approx(1.0)  # the token-level loss keeps that token
    with pytest.raises(ValueError, match="ratio_level"):
        losses.policy_loss(new, old, adv, mask, 0.2, 0.28, ratio_level="episode")


def test_truncated_importance_weights_hand_computed():
    train = torch.tensor([[-1.0, -2.0, -0.5]])
    rollout = torch.tensor([[-1.1, -1.0, math.nan]])  # the third token is masked out
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights, stats = losses.truncated_is_weights(train, rollout, mask, cap=1.05)
    # ratios e^0.1 = 1.105 (cut to 1.05) and e^-1 = 0.368
    torch.testing.assert_close(weights, torch.tensor([[1.05, math.exp(-1.0), 0.0]]))
    assert float(stats["tis_capped"]) == pytest.approx(1 / 2)
    assert float(stats["rollout_mismatch"]) == pytest.approx((0.1 + 1.0) / 2, rel=1e-6)
    weights, stats = losses.truncated_is_weights(train, rollout, mask, cap=None)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 0.0]]))
    assert float(stats["tis_capped"]) == 0.0
    assert float(stats["rollout_mismatch"]) == pytest.approx(0.55, rel=1e-6)


def test_ratio_levels_match_config():
    levels = typing.get_args(typing.get_type_hints(AlgoConfig)["ratio_level"])
    assert levels == losses.RATIO_LEVELS


def test_policy_loss_masked_garbage_never_leaks():
    new = NEW.clone()
    new[0, 5] = math.nan
    new.requires_grad_(True)
    loss, stats = losses.policy_loss(new, OLD, ADV, MASK, 0.2, 0.28)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(new.grad).all()
    assert all(math.isfinite(float(v)) for v in stats.values())


def test_policy_loss_empty_mask():
    z = torch.zeros(2, 3)
    loss, stats = losses.policy_loss(z, z, z, z, 0.2, 0.28)
    assert not loss.any() and all(float(v) == 0 for v in stats.values())


# ------------------------------------------------------------------------------- value loss


def test_value_loss_hand_computed():
    # clip .5, returns 1 everywhere:
    #   V .0, old .0: clipped V = 0          -> .5*max(1, 1)      = .5
    #   V 2., old .0: clipped V = .5         -> .5*max(1, .25)    = .5     (unclipped larger)
    #   V .9, old 2.: clipped V = 1.5        -> .5*max(.01, .25)  = .125   (clipped larger)
    #   masked
    values = torch.tensor([[0.0, 2.0, 0.9, 9.0]])
    old = torch.tensor([[0.0, 0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 0]])
    loss, stats = losses.value_loss(values, old, torch.ones(1, 4), mask, 0.5)
    torch.testing.assert_close(loss, torch.tensor([[0.5, 0.5, 0.125, 0.0]]))
    assert float(stats["vf_clipfrac"]) == pytest.approx(1 / 3)
    assert float(stats["values_mean"]) == pytest.approx(2.9 / 3)


def test_value_loss_inside_the_clip_band_is_the_unclipped_loss_and_never_counted_clipped():
    # old + (V - old) is not V in float32 (0.1 + (0.3 - 0.1) rounds away from 0.3): the
    # clipped term must be V itself inside the band, or ties turn into clip counts by rounding.
    values = torch.tensor([[0.3, 1e-8, 7.123457, -2.5]])
    old = torch.tensor([[0.1, 0.7, 7.0, -2.4]])
    returns = torch.tensor([[0.9, -0.2, 3.3, 1.0]])
    mask = torch.ones(1, 4)
    loss, stats = losses.value_loss(values, old, returns, mask, 1.0)
    assert torch.equal(loss, 0.5 * (values - returns).square())
    assert float(stats["vf_clipfrac"]) == 0.0


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1, 1, 0]])
    assert float(losses.explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    # constant prediction: Var[R - c] = Var[R] -> 0
    assert float(losses.explained_variance(torch.full((1, 4), 7.0), returns, mask)) == 0.0
    # R = (1, 2, 3): Var[R] = 2/3. V = (1, 2, 2): residual (0, 0, 1), mean 1/3,
    #   Var = (1/9 + 1/9 + 4/9) / 3 = 2/9 -> 1 - (2/9) / (2/3) = 2/3
    v = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    assert float(losses.explained_variance(v, returns, mask)) == pytest.approx(2 / 3)
    # returns without variance: 0, not NaN
    flat = torch.ones(1, 4)
    assert float(losses.explained_variance(v, flat, mask)) == 0.0
    assert float(losses.explained_variance(v, returns, torch.zeros(1, 4))) == 0.0


# ---------------------------------------------------------------------------------------- KL


def test_kl_penalty_hand_computed():
    # p = .5, p_ref = .25: k1 = log 2 = .693147; k3: d = log(.25/.5) = -log 2,
    #   exp(d) - d - 1 = .5 + .693147 - 1 = .193147
    logp, ref = torch.tensor([LOG(0.5)]), torch.tensor([LOG(0.25)])
    assert float(losses.kl_penalty(logp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(losses.kl_penalty(logp, ref, "k3")) == pytest.approx(0.5 + math.log(2) - 1)
    assert float(losses.kl_penalty(ref, ref, "k3")) == 0.0
    assert torch.isfinite(losses.kl_penalty(torch.tensor([-100.0]), torch.tensor([0.0]), "k3"))
    with pytest.raises(ValueError, match="choose one of"):
        losses.kl_penalty(logp, ref, "k2")


def test_kl_kinds_match_config():
    assert set(losses.KL_KINDS) == set(
        typing.get_args(typing.get_type_hints(AlgoConfig)["kl_type"])
    )


# ------------------------------------------------------------------------------- aggregation

# Row 0: tokens 1, 2, 3 masked in; row 1: 4 only; row 2: nothing.
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 50.0], [4.0, 60.0, 70.0, 80.0], [90.0, 9, 9, 9]])
AGG_MASK = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("token_mean", (1 + 2 + 3 + 4) / 4),  # 10 / 4 tokens = 2.5
        ("seq_mean_token_mean", (6 / 3 + 4 / 1) / 2),  # rows: 2, 4 -> 3 (row 2 has none)
        ("seq_mean_token_sum", (6 + 4) / 2),  # rows: 6, 4 -> 5
    ],
)
def test_aggregate_modes(mode, want):
    assert float(losses.aggregate(PER_TOKEN, AGG_MASK, mode)) == pytest.approx(want)


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_aggregate_empty_mask_is_zero_not_nan(mode):
    got = losses.aggregate(torch.full((2, 3), math.inf), torch.zeros(2, 3), mode)
    assert float(got) == 0.0


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_aggregate_micro_batches_add_up_with_a_normalizer(mode):
    full = losses.aggregate(PER_TOKEN, AGG_MASK, mode)
    total = AGG_MASK.sum() if mode == "token_mean" else (AGG_MASK.sum(dim=1) > 0).sum()
    parts = [
        losses.aggregate(PER_TOKEN[s], AGG_MASK[s], mode, normalizer=total)
        for s in (slice(0, 1), slice(1, 3))
    ]
    torch.testing.assert_close(sum(parts), full)


def test_aggregate_modes_match_config_and_reject_unknown():
    hint = typing.get_type_hints(AlgoConfig)["loss_agg"]  # LossAgg | None: null follows dr_grpo
    literal, none = typing.get_args(hint)
    assert set(losses.AGG_MODES) == set(typing.get_args(literal)) and none is type(None)
    with pytest.raises(ValueError, match="choose one of"):
        losses.aggregate(PER_TOKEN, AGG_MASK, "mean")


# Dr. GRPO on a hand-made batch: groups {0, 1} with returns 1, 0 and {2, 3} with 3, 0; replies
# of 3, 1, 2 and 1 tokens; on-policy (ratio 1), so each token's loss is -A.
DR_MASK = torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]])
DR_SCORES = torch.tensor([1.0, 0, 3, 0])
DR_GROUPS = torch.tensor([0, 0, 1, 1])


def _grpo_loss(algo: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages (4, 3), the aggregated policy loss) of the batch under ``algo``."""
    a, _ = estimate(
        "grpo",
        rewards=torch.zeros(4, 3),
        mask=DR_MASK,
        scores=DR_SCORES,
        group_ids=DR_GROUPS,
        coefs=Coefficients.of(algo),
    )
    logp = torch.full((4, 3), -1.0)
    pg_tok, _ = losses.policy_loss(logp, logp, a, DR_MASK, algo.clip_low, algo.clip_high)
    return a, losses.aggregate(pg_tok, DR_MASK, algo.aggregation())


def test_dr_grpo_is_the_two_settings_it_stands_for():
    dr = _grpo_loss(AlgoConfig(estimator="grpo", dr_grpo=True))
    spelled = _grpo_loss(
        AlgoConfig(estimator="grpo", grpo_norm_by_std=False, loss_agg="seq_mean_token_sum")
    )
    # centred, not divided: 0.5, -0.5, 1.5, -1.5; row sums of -A: -1.5, 0.5, -3, 1.5; / 4 rows
    want = torch.tensor([0.5, -0.5, 1.5, -1.5])[:, None] * DR_MASK
    for advantages, loss in (dr, spelled):
        torch.testing.assert_close(advantages, want)
        torch.testing.assert_close(loss, torch.tensor(-2.5 / 4))
    # plain grpo divides by each group's unbiased std (0.5 √2, 1.5 √2): ±1/√2; token mean of
    # -A over 7 tokens
    advantages, loss = _grpo_loss(AlgoConfig(estimator="grpo"))
    half = 0.5**0.5
    want = torch.tensor([half, -half, half, -half])[:, None] * DR_MASK
    torch.testing.assert_close(advantages, want)
    torch.testing.assert_close(loss, torch.tensor(-3 / 7 * half))


def test_aggregate_gradient_only_on_masked_tokens():
    x = PER_TOKEN.clone().requires_grad_(True)
    losses.aggregate(x, AGG_MASK, "token_mean").backward()
    torch.testing.assert_close(x.grad, AGG_MASK / 4)


def test_masked_mean():
    x = torch.tensor([[1.0, math.nan], [3.0, math.inf]])
    assert float(losses.masked_mean(x, torch.tensor([[1.0, 0], [1, 0]]))) == 2.0
    assert float(losses.masked_mean(x, torch.zeros(2, 2))) == 0.0


# ------------------------------------------------------------------- log-probs and entropy


def test_entropy_hand_computed():
    # uniform over 4: log 4; two equal logits and two at -1e4: log 2
    logits = torch.tensor([[[0.0, 0, 0, 0], [5.0, 5.0, -1e4, -1e4]]])
    torch.testing.assert_close(
        losses.entropy_from_logits(logits), torch.tensor([[math.log(4), math.log(2)]])
    )
    # large logits do not overflow
    assert torch.isfinite(losses.entropy_from_logits(torch.tensor([[1e4, -1e4, 0.0]]))).all()


def reference(logits, labels, temperature=1.0):
    z = logits.float() / temperature
    logq = torch.log_softmax(z, dim=-1)
    logp = logq.gather(-1, labels[..., None]).squeeze(-1)
    ent = -(logq.exp() * logq).sum(-1)
    return logp, ent


@pytest.mark.parametrize("chunk", [1, 5, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_match_reference_values_and_grads(chunk, temperature):
    g = torch.Generator().manual_seed(chunk)
    logits = (torch.randn(3, 7, 11, generator=g) * 3).requires_grad_(True)
    labels = torch.randint(0, 11, (3, 7), generator=g)
    w1, w2 = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)

    logp, ent = losses.logprobs_and_entropy(logits, labels, chunk=chunk, temperature=temperature)
    ((logp * w1).sum() + (ent * w2).sum()).backward()
    got_grad, logits.grad = logits.grad, None

    ref_logp, ref_ent = reference(logits, labels, temperature)
    ((ref_logp * w1).sum() + (ref_ent * w2).sum()).backward()
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(got_grad, logits.grad)


def test_token_logprobs_bf16_and_no_entropy():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 13, generator=g).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 13, (2, 5), generator=g)
    logp = losses.token_logprobs(logits, labels, chunk=3)
    assert logp.dtype == torch.float32 and logp.shape == (2, 5)
    torch.testing.assert_close(logp, reference(logits, labels)[0])
    logp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    _, ent = losses.logprobs_and_entropy(logits, labels, with_entropy=False)
    assert not ent.any()


def test_logprobs_shape_mismatch():
    with pytest.raises(ValueError, match="disagree"):
        losses.logprobs_and_entropy(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_logprobs_gradient_of_entropy_alone():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 6, generator=g).requires_grad_(True)
    labels = torch.randint(0, 6, (2, 3), generator=g)
    _, ent = losses.logprobs_and_entropy(logits, labels, chunk=4)
    ent.sum().backward()
    got, logits.grad = logits.grad, None
    reference(logits, labels)[1].sum().backward()
    torch.testing.assert_close(got, logits.grad)
