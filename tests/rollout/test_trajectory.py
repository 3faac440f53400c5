import pytest
import torch

from ragen.rollout.trajectory import Trajectory, Turn, collate


def _turn(start, end, reward, actions=("Up",)):
    return Turn(
        observation="grid",
        reply="<think>x</think><answer>Up</answer>",
        think="x",
        answer="Up",
        actions=list(actions),
        rewards=[reward],
        reward=reward,
        format_ok=True,
        problems=[],
        unknown_actions=0,
        think_tokens=1,
        reply_start=start,
        reply_end=end,
    )


def _two_turn_trajectory(group=0):
    # layout: 3 prompt tokens, 2 sampled, 2 env tokens, 3 sampled
    t = Trajectory(env="sokoban", group=group, copy=0, seed=7)
    t.append([10, 11, 12], sampled=False)
    t.append([20, 21], sampled=True, logprobs=[-0.5, -0.25])
    t.append([13, 14], sampled=False)
    t.append([22, 23, 24], sampled=True, logprobs=[-1.0, -2.0, -3.0])
    t.turns = [_turn(3, 5, -0.1), _turn(7, 10, 10.9)]
    return t


def test_append_builds_exact_ids_mask_and_logprobs():
    t = _two_turn_trajectory()
    assert t.token_ids == [10, 11, 12, 20, 21, 13, 14, 22, 23, 24]
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert t.logprobs == [0, 0, 0, -0.5, -0.25, 0, 0, -1.0, -2.0, -3.0]
    assert t.total_reward == pytest.approx(10.8)


def test_reward_placement():
    t = _two_turn_trajectory()
    last = t.token_rewards("last_token")
    assert last[9] == pytest.approx(10.8) and sum(last[:9]) == 0
    per_turn = t.token_rewards("per_turn")
    assert per_turn[4] == pytest.approx(-0.1) and per_turn[9] == pytest.approx(10.9)
    assert [i for i, r in enumerate(per_turn) if r] == [4, 9]


def test_collate_right_pads_without_moving_tokens():
    long_t = _two_turn_trajectory(group=0)
    short = Trajectory(env="bandit", group=1, copy=0, seed=3)
    short.append([10, 11], sampled=False)
    short.append([30], sampled=True, logprobs=[-0.7])
    short.turns = [_turn(2, 3, 1.0)]
    batch = collate([long_t, short], pad_id=2)
    assert batch.input_ids.tolist() == [
        [10, 11, 12, 20, 21, 13, 14, 22, 23, 24],
        [10, 11, 30, 2, 2, 2, 2, 2, 2, 2],
    ]
    assert batch.attention_mask[1].tolist() == [1, 1, 1] + [0] * 7
    assert batch.loss_mask[1].tolist() == [0, 0, 1] + [0] * 7
    assert batch.loss_mask[0].tolist() == [float(m) for m in long_t.loss_mask]
    assert batch.rewards[1, 2].item() == 1.0 and batch.rewards[1].sum().item() == 1.0
    assert torch.equal(batch.group_ids, torch.tensor([0, 1]))
    assert batch.scores.tolist() == pytest.approx([10.8, 1.0])
    # each sampled token keeps its own position, so the token it follows is unchanged
    for row, t in enumerate([long_t, short]):
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        assert [batch.input_ids[row, i].item() for i in sampled] == [
            t.token_ids[i] for i in sampled
        ]


def test_record_has_the_episode_schema():
    record = _two_turn_trajectory().to_record()
    assert {"env", "group", "seed", "turns", "total_reward", "success", "end"} <= set(record)
    turn = record["turns"][0]
    assert {"observation", "reply", "think", "actions", "reward", "format_ok"} <= set(turn)
    assert (record["reply_tokens"], record["context_tokens"]) == (5, 10)
