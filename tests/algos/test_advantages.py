"""Advantage estimators: hand-computed values, masked-value invariance, vectorised vs loop."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.algos import advantages as adv
from ragen.algos.packing import discounted_suffix_sum
from ragen.config import ESTIMATOR_NAMES, AlgoConfig

# ---------------------------------------------------------------------- plain-loop references


def loop_suffix_sum(x: list[float], c: float) -> list[float]:
    out, acc = [0.0] * len(x), 0.0
    for k in reversed(range(len(x))):
        acc = x[k] + c * acc
        out[k] = acc
    return out


def loop_gae(rewards, values, mask, gamma, lam):
    """Per row, per token: walk back over the sampled tokens only. Lists in, tensors out."""
    rewards, values, mask = rewards.tolist(), values.tolist(), mask.tolist()
    a = [[0.0] * len(row) for row in mask]
    ret = [[0.0] * len(row) for row in mask]
    for b, row in enumerate(mask):
        next_value, last = 0.0, 0.0  # nothing after the last sampled token
        for t in reversed([t for t, m in enumerate(row) if m != 0]):
            v = values[b][t]
            delta = rewards[b][t] + gamma * next_value - v
            last = delta + gamma * lam * last
            a[b][t], ret[b][t] = last, last + v
            next_value = v
    return torch.tensor(a, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def split_turns(row: list[float], ids: list[int] | None) -> list[list[int]]:
    """Sampled positions grouped into turns: runs of consecutive sampled tokens, or by id."""
    turns: list[list[int]] = []
    for t, m in enumerate(row):
        if m == 0:
            continue
        if not turns:
            same_turn = False
        elif ids is None:
            same_turn = turns[-1][-1] == t - 1
        else:
            same_turn = ids[t] == ids[turns[-1][-1]]
        if same_turn:
            turns[-1].append(t)
        else:
            turns.append([t])
    return turns


def loop_bi_level(rewards, values, mask, gamma, lam, turn_gamma, turn_lam, turn_ids=None):
    """The docstring's definition, written out turn by turn and token by token."""
    rewards, values, mask = rewards.tolist(), values.tolist(), mask.tolist()
    ids = turn_ids.tolist() if turn_ids is not None else None
    a = [[0.0] * len(row) for row in mask]
    ret = [[0.0] * len(row) for row in mask]
    for b, row in enumerate(mask):
        turns = split_turns(row, ids[b] if ids else None)
        w = [values[b][turn[-1]] for turn in turns]  # W_k = V(e_k)
        r = [sum(rewards[b][t] for t in turn) for turn in turns]  # R_k: whole turn
        adv_turn, last = [0.0] * len(turns), 0.0
        for k in reversed(range(len(turns))):
            w_next = w[k + 1] if k + 1 < len(turns) else 0.0
            last = r[k] + turn_gamma * w_next - w[k] + turn_gamma * turn_lam * last
            adv_turn[k] = last
        for k, turn in enumerate(turns):
            acc = adv_turn[k]  # seeded at the turn's last token
            a[b][turn[-1]] = acc
            for i in reversed(range(len(turn) - 1)):
                v, v_next = values[b][turn[i]], values[b][turn[i + 1]]
                acc = gamma * v_next - v + gamma * lam * acc
                a[b][turn[i]] = acc
            for t in turn:
                ret[b][t] = a[b][t] + values[b][t]
    return torch.tensor(a, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def random_batch(seed: int, rows: int = 5, width: int = 40):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) < 0.6).float()
    mask[0] = 0.0  # a row with nothing sampled
    mask[1, :] = 1.0  # a row sampled end to end
    rewards = torch.randn(rows, width, generator=g) * mask
    values = torch.randn(rows, width, generator=g)
    return rewards, values, mask


def scramble_masked(x: torch.Tensor, mask: torch.Tensor, seed: int) -> torch.Tensor:
    """x with every masked-out entry replaced by noise, inf or NaN."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape, generator=g) * 100
    noise[0, ::3] = math.inf
    noise[-1, ::5] = math.nan
    return torch.where(mask != 0, x, noise)


# -------------------------------------------------------------------------- suffix sums


@pytest.mark.parametrize("discount", [0.0, 0.5, 0.9, 1.0])
@pytest.mark.parametrize(("size", "block"), [(1, 4), (7, 4), (8, 4), (37, 8), (300, 128)])
def test_suffix_sum_matches_loop(discount, size, block):
    x = torch.randn(3, size, dtype=torch.float64, generator=torch.Generator().manual_seed(size))
    got = discounted_suffix_sum(x, discount, block=block)
    want = torch.tensor([loop_suffix_sum(row.tolist(), discount) for row in x], dtype=torch.float64)
    torch.testing.assert_close(got, want)


def test_suffix_sum_hand_and_edges():
    # [1, 2, 3] with c = 0.5: 3; 2 + 0.5*3 = 3.5; 1 + 0.5*3.5 = 2.75
    got = discounted_suffix_sum(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64), 0.5, block=2)
    torch.testing.assert_close(got, torch.tensor([[2.75, 3.5, 3.0]], dtype=torch.float64))
    assert discounted_suffix_sum(torch.zeros(2, 0), 0.9).shape == (2, 0)
    with pytest.raises(ValueError, match="discount"):
        discounted_suffix_sum(torch.zeros(1, 3), 1.5)


# ----------------------------------------------------------------------------------- gae


# One row: [prompt, s1, s2, env, s3, pad]; values 0.5 on sampled tokens (junk elsewhere),
# reward 1 on the last sampled token. Over the sampled tokens only:
#   delta3 = 1 - 0.5 = 0.5                 (V_next = 0 after the last sampled token)
#   delta2 = delta1 = gamma * 0.5 - 0.5
#   A3 = 0.5, A2 = delta2 + gamma*lam*A3, A1 = delta1 + gamma*lam*A2
#   (1, 1):     delta = 0, 0, .5;     A = .5, .5, .5;           R = A + .5 = 1, 1, 1
#   (.9, 1):    delta = -.05,-.05,.5; A2 = -.05+.9*.5 = .4;     A1 = -.05+.9*.4 = .31
#   (1, .9):    delta = 0, 0, .5;     A2 = .9*.5 = .45;         A1 = .9*.45 = .405
#   (.9, .9):   delta = -.05,-.05,.5; A2 = -.05+.81*.5 = .355;  A1 = -.05+.81*.355 = .23755
GAE_CASES = [
    (1.0, 1.0, [0.5, 0.5, 0.5]),
    (0.9, 1.0, [0.31, 0.4, 0.5]),
    (1.0, 0.9, [0.405, 0.45, 0.5]),
    (0.9, 0.9, [0.23755, 0.355, 0.5]),
]
ROW_MASK = torch.tensor([[0.0, 1, 1, 0, 1, 0]])
ROW_REWARDS = torch.tensor([[0.0, 0, 0, 0, 1, 0]])
ROW_VALUES = torch.tensor([[7.0, 0.5, 0.5, -3.0, 0.5, 11.0]])


@pytest.mark.parametrize(("gamma", "lam", "expected"), GAE_CASES)
def test_gae_hand_computed(gamma, lam, expected):
    a, r = adv.gae(ROW_REWARDS, ROW_VALUES, ROW_MASK, gamma, lam)
    want = torch.tensor([[0.0, expected[0], expected[1], 0.0, expected[2], 0.0]])
    torch.testing.assert_close(a, want)
    torch.testing.assert_close(r, (want + 0.5) * ROW_MASK)
    assert a.dtype == torch.float32


def test_gae_zero_values_gives_discounted_return():
    # V = 0, lam = 1: returns are the return-to-go, discounted per sampled token: .9^2, .9, 1
    a, r = adv.gae(ROW_REWARDS, torch.zeros(1, 6), ROW_MASK, 0.9, 1.0)
    torch.testing.assert_close(r, torch.tensor([[0.0, 0.81, 0.9, 0.0, 1.0, 0.0]]))
    torch.testing.assert_close(a, r)


def test_gae_single_token_and_empty_rows():
    mask = torch.tensor([[0.0, 0, 0], [0, 1, 0]])
    rewards = torch.tensor([[0.0, 0, 0], [0, 2, 0]])
    values = torch.tensor([[1.0, 1, 1], [0, 0.5, 0]])
    a, r = adv.gae(rewards, values, mask, 0.9, 0.9)
    # only token: delta = 2 + 0 - 0.5 = 1.5
    torch.testing.assert_close(a, torch.tensor([[0.0, 0, 0], [0, 1.5, 0]]))
    torch.testing.assert_close(r, torch.tensor([[0.0, 0, 0], [0, 2.0, 0]]))
    a, r = adv.gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), 1.0, 1.0)
    assert not a.any() and not r.any()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (0.99, 0.0), (0.0, 0.5)])
def test_gae_matches_loop(seed, gamma, lam):
    rewards, values, mask = random_batch(seed, width=30 + 37 * seed)
    a, r = adv.gae(rewards, values, mask, gamma, lam)
    want_a, want_r = loop_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(a, want_a.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r, want_r.float(), atol=1e-5, rtol=1e-5)


def test_gae_masked_values_and_rewards_never_matter():
    rewards, values, mask = random_batch(7)
    a, r = adv.gae(rewards, values, mask, 0.95, 0.9)
    a2, r2 = adv.gae(
        scramble_masked(rewards, mask, 1), scramble_masked(values, mask, 2), mask, 0.95, 0.9
    )
    torch.testing.assert_close(a, a2)
    torch.testing.assert_close(r, r2)
    assert not (a * (1 - mask)).any()


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    width=st.integers(1, 25),
)
def test_gae_invariance_property(seed, gamma, lam, width):
    rewards, values, mask = random_batch(seed, rows=3, width=width)
    a, r = adv.gae(rewards, values, mask, gamma, lam)
    a2, r2 = adv.gae(rewards, scramble_masked(values, mask, seed + 1), mask, gamma, lam)
    assert torch.equal(a, a2) and torch.equal(r, r2)
    want_a, _ = loop_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(a, want_a.float(), atol=1e-5, rtol=1e-5)


def test_gae_float64_in_float64_out():
    a, _ = adv.gae(ROW_REWARDS.double(), ROW_VALUES.double(), ROW_MASK, 1.0, 1.0)
    assert a.dtype == torch.float64


def test_gae_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        adv.gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3), 1.0, 1.0)


# -------------------------------------------------------------------------- bi-level gae

# Row: [prompt, a1, a2, env, env, b1, b2, b3, pad]; turn 1 = a1 a2, turn 2 = b1 b2 b3.
# Per-turn rewards: -0.1 on a2 (a format penalty), 1.0 on b3.
# Values: a1 .2, a2 .4, b1 .3, b2 .5, b3 .6 (junk on masked positions).
BI_MASK = torch.tensor([[0.0, 1, 1, 0, 0, 1, 1, 1, 0]])
BI_REWARDS = torch.tensor([[0.0, 0, -0.1, 0, 0, 0, 0, 1.0, 0]])
BI_VALUES = torch.tensor([[5.0, 0.2, 0.4, -9, 9, 0.3, 0.5, 0.6, 1.0]])


def test_bi_level_gae_hand_computed_lambda_one():
    # gamma = lam = 1, turn_gamma = .95, turn_lam = 1.
    # Turn values W1 = V(a2) = .4, W2 = V(b3) = .6.
    # D2 = 1 - .6 = .4;  D1 = -.1 + .95*.6 - .4 = .07
    # A^turn2 = .4;  A^turn1 = .07 + .95*.4 = .45;  G1 = .85, G2 = 1.0
    # Turn 2 tokens: A(b3) = .4, A(b2) = .6 - .5 + .4 = .5, A(b1) = .5 - .3 + .5 = .7
    # Turn 1 tokens: A(a2) = .45, A(a1) = .4 - .2 + .45 = .65   (= G1 - V(a1))
    a, r = adv.bi_level_gae(BI_REWARDS, BI_VALUES, BI_MASK, 1.0, 1.0, 0.95, 1.0)
    want = torch.tensor([[0.0, 0.65, 0.45, 0, 0, 0.7, 0.5, 0.4, 0]])
    torch.testing.assert_close(a, want)
    torch.testing.assert_close(r, torch.tensor([[0.0, 0.85, 0.85, 0, 0, 1, 1, 1, 0]]))


def test_bi_level_gae_hand_computed_lambda_below_one():
    # gamma = lam = .9 inside turns, turn_gamma = .95, turn_lam = .9.
    # D as above; A^turn2 = .4; A^turn1 = .07 + .95*.9*.4 = .07 + .342 = .412
    # Turn 2: A(b3) = .4
    #   A(b2) = (.9*.6 - .5) + .81*.4 = .04 + .324 = .364
    #   A(b1) = (.9*.5 - .3) + .81*.364 = .15 + .29484 = .44484
    # Turn 1: A(a2) = .412
    #   A(a1) = (.9*.4 - .2) + .81*.412 = .16 + .33372 = .49372
    a, r = adv.bi_level_gae(BI_REWARDS, BI_VALUES, BI_MASK, 0.9, 0.9, 0.95, 0.9)
    want = torch.tensor([[0.0, 0.49372, 0.412, 0, 0, 0.44484, 0.364, 0.4, 0]])
    torch.testing.assert_close(a, want)
    torch.testing.assert_close(r, (want + BI_VALUES) * BI_MASK)


def turn_end_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rewards kept only on the last token of each run of sampled tokens (per-turn placement)."""
    ends = (mask != 0) & (torch.nn.functional.pad(mask[:, 1:], (0, 1)) == 0)
    return rewards * ends


def test_bi_level_gae_with_all_ones_equals_gae():
    rewards, values, mask = random_batch(3, width=60)
    rewards = turn_end_rewards(rewards, mask)
    a, r = adv.bi_level_gae(rewards, values, mask, 1.0, 1.0, 1.0, 1.0)
    a2, r2 = adv.gae(rewards, values, mask, 1.0, 1.0)
    torch.testing.assert_close(a, a2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r, r2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "coefs", [(1.0, 1.0, 0.95, 1.0), (0.9, 0.8, 0.95, 0.7), (0.99, 0.0, 0.5, 0.0)]
)
def test_bi_level_gae_matches_loop(seed, coefs):
    rewards, values, mask = random_batch(seed, width=25 + 20 * seed)
    a, r = adv.bi_level_gae(rewards, values, mask, *coefs)
    want_a, want_r = loop_bi_level(rewards, values, mask, *coefs)
    torch.testing.assert_close(a, want_a.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r, want_r.float(), atol=1e-5, rtol=1e-5)
    a2, r2 = adv.bi_level_gae(
        scramble_masked(rewards, mask, seed), scramble_masked(values, mask, seed), mask, *coefs
    )
    torch.testing.assert_close(a, a2)
    torch.testing.assert_close(r, r2)


def test_bi_level_gae_explicit_turn_ids():
    rewards, values, mask = random_batch(11, width=50)
    g = torch.Generator().manual_seed(0)
    # ids that change at random points, some runs merged into one turn, some split
    turn_ids = torch.cumsum((torch.rand(mask.shape, generator=g) < 0.15).long(), dim=1)
    coefs = (0.9, 0.9, 0.95, 0.8)
    a, r = adv.bi_level_gae(rewards, values, mask, *coefs, turn_ids=turn_ids)
    want_a, want_r = loop_bi_level(rewards, values, mask, *coefs, turn_ids=turn_ids)
    torch.testing.assert_close(a, want_a.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r, want_r.float(), atol=1e-5, rtol=1e-5)
    # ids equal to the runs of the mask give the default split
    runs = torch.cumsum((mask != 0) & (torch.nn.functional.pad(mask[:, :-1], (1, 0)) == 0), dim=1)
    a1, _ = adv.bi_level_gae(rewards, values, mask, *coefs, turn_ids=runs)
    a0, _ = adv.bi_level_gae(rewards, values, mask, *coefs)
    torch.testing.assert_close(a1, a0)


def test_bi_level_gae_empty_batch_rows():
    z = torch.zeros(2, 4)
    a, r = adv.bi_level_gae(z, z, z, 1.0, 1.0, 0.95, 1.0)
    assert a.shape == (2, 4) and not a.any() and not r.any()


# --------------------------------------------------------------------------- sequence level


def test_grpo_known_groups():
    # group 3: [1, 0, 1, 1]: mean .75, squares .0625 × 3 + .5625 = .75, unbiased std
    #   sqrt(.75 / 3) = .5: A = .25 / .5 = .5, -.75 / .5 = -1.5
    # group 10: [2, 2]: constant -> 0;  group 7: [5]: one member -> 0
    scores = torch.tensor([1.0, 2.0, 0.0, 5.0, 1.0, 2.0, 1.0])
    groups = torch.tensor([3, 10, 3, 7, 3, 10, 3])
    got = adv.grpo(scores, groups)
    up, down = 0.5, -1.5
    torch.testing.assert_close(got, torch.tensor([up, 0, down, 0, up, 0, up]), rtol=1e-5, atol=1e-5)
    centred = adv.grpo(scores, groups, norm_by_std=False)
    torch.testing.assert_close(centred, torch.tensor([0.25, 0, -0.75, 0, 0.25, 0, 0.25]))


def test_grpo_constant_groups_exactly_zero():
    # 0.1 three times: the float mean need not equal 0.1 exactly; the result must still be 0
    scores = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7])
    got = adv.grpo(scores, torch.tensor([0, 0, 0, 1, 1]))
    assert torch.equal(got, torch.zeros(5))
    assert torch.isfinite(got).all()


def test_grpo_group_has_unit_std():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(16, generator=g)
    got = adv.grpo(scores, torch.arange(16) // 4, eps=0.0)
    for k in range(4):
        part = got[4 * k : 4 * k + 4].double()
        assert abs(part.mean()) < 1e-6
        assert abs(part.std() - 1) < 1e-5


def test_rloo_known_group():
    # [1, 0, 1, 1]: A_0 = 1 - (0+1+1)/3 = 1/3; A_1 = 0 - 1 = -1; one member -> 0
    got = adv.rloo(torch.tensor([1.0, 0.0, 1.0, 1.0, 4.0]), torch.tensor([0, 0, 0, 0, 1]))
    torch.testing.assert_close(got, torch.tensor([1 / 3, -1.0, 1 / 3, 1 / 3, 0.0]))


def test_sequence_estimators_reject_bad_shapes():
    with pytest.raises(ValueError, match=r"\(B,\)"):
        adv.grpo(torch.zeros(3), torch.zeros(4, dtype=torch.long))


def test_reinforce_pp_hand_computed():
    # row 0: [s, s, env, s] rewards 0, 0, -, 1 with gamma .9 -> G = .81, .9, 1
    # row 1: [s, pad, pad, pad] reward 1 -> G = 1
    # batch of sampled G: .81, .9, 1, 1; mean 3.71/4 = .9275
    # deviations -.1175, -.0275, .0725, .0725; squares sum to .025075; Bessel-corrected
    # var = .025075/3 (verl's masked_whiten, as its REINFORCE++ uses)
    mask = torch.tensor([[1.0, 1, 0, 1], [1, 0, 0, 0]])
    rewards = torch.tensor([[0.0, 0, 5, 1], [1, 0, 0, 0]])  # the 5 sits on an env token
    a, r = adv.reinforce_pp(rewards, mask, 0.9, eps=0.0)
    torch.testing.assert_close(r, torch.tensor([[0.81, 0.9, 0, 1], [1, 0, 0, 0]]))
    std = math.sqrt(0.025075 / 3)
    want = torch.tensor([[-0.1175, -0.0275, 0, 0.0725], [0.0725, 0, 0, 0]]) / std
    torch.testing.assert_close(a, want, rtol=1e-5, atol=1e-5)


def test_reinforce_pp_constant_returns_give_zero():
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    a, _ = adv.reinforce_pp(torch.tensor([[0.0, 1, 0], [1, 0, 0]]), mask, 1.0)
    assert torch.equal(a, torch.zeros(2, 3))


# ------------------------------------------------------------------------------ whitening


def test_whiten_hand_computed():
    # sampled: 1, 2, 3 (row 0) and 4 (row 1); mean 2.5; deviations -1.5, -.5, .5, 1.5;
    # squares sum to 5; Bessel-corrected var 5/3 (population: 5/4); scale sqrt(3/5)
    mask = torch.tensor([[1.0, 1, 0, 1], [0, 1, 0, 0]])
    values = torch.tensor([[1.0, 2, 100, 3], [math.nan, 4, -7, math.inf]])  # masked: ignored
    scale = math.sqrt(3 / 5)
    want = torch.tensor([[-1.5, -0.5, 0, 0.5], [0, 1.5, 0, 0]]) * scale
    torch.testing.assert_close(adv.whiten(values, mask, eps=0.0), want)
    # the default eps 1e-8 sits under the square root: sqrt(5/3 + 1e-8)
    eps_scale = 1 / math.sqrt(5 / 3 + 1e-8)
    got = adv.whiten(values, mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want / scale * eps_scale)
    assert torch.equal(got[mask == 0], torch.zeros(4))  # masked positions stay exactly 0


def test_whiten_gives_mean_zero_and_unbiased_variance_one():
    _, values, mask = random_batch(3)
    out = adv.whiten(scramble_masked(values, mask, 3), mask).double()
    on = out[mask != 0]
    assert abs(float(on.mean())) < 1e-6  # float32 out
    assert float(on.var(correction=1)) == pytest.approx(1.0, rel=1e-6)
    # against the formula written with torch's own unbiased variance
    x = values[mask != 0].double()
    want = torch.zeros_like(out)
    want[mask != 0] = (x - x.mean()) / torch.sqrt(x.var(correction=1) + 1e-8)
    torch.testing.assert_close(out, want)


def test_whiten_degenerate_batches_give_zero():
    mask = torch.tensor([[1.0, 0, 1], [0, 1, 0]])
    assert torch.equal(adv.whiten(torch.full((2, 3), 0.1), mask), torch.zeros(2, 3))  # all equal
    one = torch.tensor([[0.0, 1, 0], [0, 0, 0]])
    assert torch.equal(adv.whiten(torch.randn(2, 3), one), torch.zeros(2, 3))  # n = 1
    assert torch.equal(adv.whiten(torch.randn(2, 3), torch.zeros(2, 3)), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="one"):
        adv.whiten(torch.zeros(2, 3), torch.zeros(3, 2))


# ------------------------------------------------------------------------------- registry


def test_registry_names_match_config():
    assert tuple(adv.ESTIMATORS) == ESTIMATOR_NAMES
    assert {"gae", "bi_level_gae"} == adv.NEEDS_CRITIC


def coefs(**changes) -> adv.Coefficients:
    """The coefficients of the default config, with ``changes`` to its algo section."""
    return adv.Coefficients.of(AlgoConfig(**changes))


@pytest.mark.parametrize("name", sorted(adv.ESTIMATORS))
def test_every_estimator_shares_one_call_shape(name):
    rewards, values, mask = random_batch(5, rows=4, width=20)
    scores = rewards.sum(dim=1)
    a, r = adv.estimate(
        name,
        rewards=rewards,
        mask=mask,
        values=values,
        scores=scores,
        group_ids=torch.tensor([0, 0, 1, 1]),
        anchor_ids=torch.zeros(4, 20, dtype=torch.long),  # every turn from one state (gigpo)
        coefs=coefs(gamma=0.95, lam=0.9),
    )
    assert a.shape == r.shape == rewards.shape
    assert torch.isfinite(a).all() and not (a * (1 - mask)).any()


@pytest.mark.parametrize("name", sorted(adv.ESTIMATORS))
def test_every_estimator_gives_zeros_to_a_batch_without_a_sampled_token(name):
    # every row's reply cut before its first token: no turn anywhere (gigpo: M = 0 turns)
    a, r = adv.estimate(
        name,
        rewards=torch.zeros(2, 5),
        mask=torch.zeros(2, 5),
        values=torch.zeros(2, 5),
        scores=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        anchor_ids=torch.zeros(2, 0, dtype=torch.long),
        coefs=coefs(),
    )
    assert a.shape == (2, 5) and not a.any() and not r.any()


def test_sequence_estimators_broadcast_over_sampled_tokens():
    mask = torch.tensor([[0.0, 1, 1, 0], [1, 1, 0, 0]])
    a, r = adv.estimate(
        "grpo",
        rewards=torch.zeros(2, 4),
        mask=mask,
        scores=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        coefs=coefs(grpo_norm_by_std=False),
    )
    torch.testing.assert_close(a, torch.tensor([[0.0, 0.5, 0.5, 0], [-0.5, -0.5, 0, 0]]))
    torch.testing.assert_close(r, a)


def test_estimate_errors_name_the_fix():
    z, c = torch.zeros(1, 3), coefs()
    with pytest.raises(ValueError, match=r"use one of gae, grpo, .*, or module:function"):
        adv.estimate("ppo", rewards=z, mask=z, coefs=c)
    with pytest.raises(ValueError, match="needs values"):
        adv.estimate("gae", rewards=z, mask=z, coefs=c)
    with pytest.raises(ValueError, match="needs scores, group_ids"):
        adv.estimate("rloo", rewards=z, mask=z, coefs=c)


def test_estimate_passes_each_coefficient_to_its_function():
    rewards, values, mask = random_batch(2)
    c = coefs(gamma=0.9, lam=0.8, turn_gamma=0.7)
    kw = {"rewards": rewards, "mask": mask, "values": values, "coefs": c}
    # bi_level_gae uses lam at both levels, as RAGEN does: the config has one lambda
    want = adv.bi_level_gae(rewards, values, mask, 0.9, 0.8, 0.7, 0.8)
    torch.testing.assert_close(adv.estimate("bi_level_gae", **kw), want)
    torch.testing.assert_close(adv.estimate("gae", **kw), adv.gae(rewards, values, mask, 0.9, 0.8))
    torch.testing.assert_close(
        adv.estimate("reinforce_pp", **kw), adv.reinforce_pp(rewards, mask, 0.9)
    )


def test_bi_level_gae_counts_an_inner_reward_at_the_turn_end():
    moved = BI_REWARDS.clone()
    moved[0, 7], moved[0, 6] = 0.4, 0.6  # turn 2's reward of 1.0 split over b2 and b3
    a, _ = adv.bi_level_gae(moved, BI_VALUES, BI_MASK, 0.9, 0.9, 0.95, 0.9)
    a0, _ = adv.bi_level_gae(BI_REWARDS, BI_VALUES, BI_MASK, 0.9, 0.9, 0.95, 0.9)
    torch.testing.assert_close(a, a0)


def test_long_turns_and_many_turns_span_several_blocks():
    # 300-token replies and 150 one-token turns: both scans run over more than one block
    long = torch.zeros(2, 700)
    long[0, 10:310] = 1.0
    long[0, 320:620] = 1.0
    long[1, 0:300:2] = 1.0
    g = torch.Generator().manual_seed(4)
    rewards = turn_end_rewards(torch.randn(2, 700, generator=g), long)
    values = torch.randn(2, 700, generator=g)
    coefs = (0.99, 0.95, 0.95, 0.9)
    a, r = adv.bi_level_gae(rewards, values, long, *coefs)
    want_a, want_r = loop_bi_level(rewards, values, long, *coefs)
    torch.testing.assert_close(a, want_a.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r, want_r.float(), atol=1e-5, rtol=1e-5)
    a, _ = adv.gae(rewards, values, long, 0.99, 0.95)
    torch.testing.assert_close(a, loop_gae(rewards, values, long, 0.99, 0.95)[0].float())
