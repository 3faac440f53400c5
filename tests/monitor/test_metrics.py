"""Rollout and diversity metrics of a step's episodes, on hand-built trajectories."""

import pytest

from ragen.monitor.metrics import (
    DIVERSITY_METRICS,
    distinct_ngram_ratio,
    distinct_ratio,
    diversity_metrics,
    example_thought,
    rollout_metrics,
    template_thinks,
)
from ragen.rollout.trajectory import Trajectory, Turn


def _episode(group, copy, *thinks, answer="Up"):
    t = Trajectory(env="sokoban", group=group, copy=copy, seed=group)
    for think in thinks:
        reply = f"<think>{think}</think><answer>{answer}</answer>"
        t.turns.append(
            Turn(
                observation="grid",
                reply=reply,
                think=think,
                answer=answer,
                actions=[answer],
                rewards=[0.0],
                reward=0.0,
                format_ok=True,
                problems=[],
                unknown_actions=0,
                think_tokens=len(think.split()),
                reply_start=0,
                reply_end=1,
            )
        )
    return t


def test_distinct_ratio_folds_case_and_blanks():
    assert distinct_ratio(["Go up", "go  up ", "go down"]) == pytest.approx(2 / 3)
    assert distinct_ratio(["a"] * 4) == 0.25
    assert distinct_ratio([]) == 0.0


def test_distinct_bigrams_by_hand():
    # "a b a b" -> (a,b) (b,a) (a,b): 2 distinct of 3; "a b" adds (a,b) again: 2 of 4
    assert distinct_ngram_ratio(["a b a b"]) == pytest.approx(2 / 3)
    assert distinct_ngram_ratio(["a b a b", "A b"]) == pytest.approx(2 / 4)
    # n-grams never span two texts, and punctuation marks are words
    assert distinct_ngram_ratio(["a", "b"]) == 0.0
    assert distinct_ngram_ratio(["up."], n=2) == 1.0
    assert distinct_ngram_ratio(["x y z"], n=3) == 1.0


def test_example_thought_is_the_prompts_example():
    assert example_thought() == "I look at the state, then plan."


def test_template_thinks_need_several_groups_or_the_example():
    trajs = [
        _episode(0, 0, "push the box left", "same old"),
        _episode(1, 0, "same old"),
        _episode(2, 0, "Same  old"),
        _episode(2, 1, "push the box left"),  # two groups only: may fit both states
        _episode(3, 0, example_thought()),
    ]
    assert template_thinks(trajs) == {"same old", "i look at the state, then plan."}
    assert template_thinks(trajs, min_groups=2) >= {"push the box left"}
    assert template_thinks(trajs, examples=()) == {"same old"}


def test_diversity_metrics_by_hand():
    trajs = [
        # group 0: two copies, identical replies: 1 distinct of 2
        _episode(0, 0, "the box is left so I go left"),
        _episode(0, 1, "the box is left so I go left"),
        # group 1: one copy with two turns, one with an empty think: 2 distinct of 2
        _episode(1, 0, "I look at the state, then plan.", ""),
    ]
    m = diversity_metrics(trajs)
    assert set(m) == set(DIVERSITY_METRICS)
    assert m["diversity/distinct_reply"] == pytest.approx((1 / 2 + 2 / 2) / 2)
    # group 0: 8 words per think, 14 bigrams, 7 distinct; group 1: "i look at the state ,
    # then plan ." is 9 words, 8 bigrams, all distinct (the empty think has none)
    assert m["diversity/distinct_2gram_think"] == pytest.approx((7 / 14 + 8 / 8) / 2)
    assert m["think/tokens_mean"] == pytest.approx((8 + 8 + 7 + 0) / 4)
    assert m["think/empty_share"] == pytest.approx(1 / 4)
    assert m["think/template_share"] == pytest.approx(1 / 4)  # the example thought
    # Failed action sequences: (Up,) twice, (Up, Up) once; the longer one is no prefix of it.
    assert m["diversity/action_template_share"] == pytest.approx(2 / 3)


def test_diversity_metrics_of_nothing_are_zero():
    assert diversity_metrics([]) == dict.fromkeys(DIVERSITY_METRICS, 0.0)
    assert diversity_metrics([Trajectory(env="bandit", group=0, copy=0, seed=0)])[
        "think/empty_share"
    ] == pytest.approx(0.0)


def _ended(end, *rewards):
    t = _episode(0, 0, *["go"] * len(rewards))
    for turn, reward in zip(t.turns, rewards, strict=True):
        turn.reward = reward
    t.end = end
    return t


def test_each_end_reason_reports_its_share_and_what_it_paid():
    # Sokoban's shape: playing the action budget out at -0.1 per action pays less than
    # ending the episode with one cut reply (format penalty only): the early-ending signal
    episodes = [
        _ended("truncated:reply_length", -0.1),
        _ended("truncated:reply_length", -0.2, -0.1),
        _ended("truncated:actions", -0.5, -0.5),
        _ended("terminated", -0.3, 10.8),
    ]
    logged = rollout_metrics(episodes)
    assert logged["rollout/episodes"] == 4.0  # what the success is a share of
    assert logged["rollout/end_truncated_reply_length"] == 0.5
    assert logged["rollout/end_truncated_actions"] == 0.25
    assert logged["rollout/end_truncated_turns"] == 0.0
    assert logged["rollout/return_end_truncated_reply_length"] == pytest.approx(-0.2)
    assert logged["rollout/return_end_truncated_actions"] == pytest.approx(-1.0)
    assert logged["rollout/return_end_terminated"] == pytest.approx(10.5)
    assert "rollout/return_end_truncated_turns" not in logged  # no episode ended so
