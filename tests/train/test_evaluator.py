import pytest
from tests.rollout.test_trajectory import _two_turn_trajectory

from ragen import config
from ragen.envs.sokoban import SokobanEnv
from ragen.monitor.metrics import action_template
from ragen.rollout.engines import make_generator
from ragen.rollout.engines.memory import kept_cache_episodes
from ragen.rollout.loop import EVAL_SEED_BASE, SPLIT_SEED_BASES, RolloutSpec
from ragen.train import evaluator
from ragen.train.evaluator import EvalRequest, eval_seeds, evaluate, summarize


def _episode(group, copy, success, end):
    t = _two_turn_trajectory(group)  # turns of 2 and 3 sampled tokens, rewards -0.1 and 10.9
    t.copy, t.success, t.end = copy, success, end
    return t


def test_summary_of_two_seeds_with_two_tries_each():
    episodes = [
        _episode(0, 0, True, "terminated"),
        _episode(0, 1, False, "truncated:turns"),
        _episode(1, 0, False, "truncated:actions"),
        _episode(1, 1, False, "truncated:actions"),
    ]
    episodes[3].turns = episodes[3].turns[:1]  # one turn of 2 tokens, reward -0.1
    s = summarize(episodes)
    assert (s["episodes"], s["seeds"], s["k"]) == (4, 2, 2)
    assert s["success"] == 0.25  # 1 of 4 episodes
    assert s["pass_at_k"] == 0.5  # seed 0 solved by one of its 2 tries, seed 1 by neither
    assert s["seed_successes"] == [1, 0]  # per seed, in seed order: its tries that succeeded
    assert s["reward_mean"] == pytest.approx((3 * 10.8 - 0.1) / 4)
    assert s["turns_mean"] == 7 / 4 and s["actions_mean"] == 7 / 4  # one action per turn
    assert s["reply_tokens_mean"] == pytest.approx((3 * 5 + 2) / 7)  # sampled tokens per turn
    assert s["end"]["terminated"] == 0.25 and s["end"]["truncated:actions"] == 0.5
    assert s["end"]["truncated:context"] == 0.0


def test_nothing_to_summarize_is_refused():
    with pytest.raises(ValueError, match="no trajectories"):
        summarize([])


def test_eval_seeds_are_the_same_for_every_call():
    assert eval_seeds(3) == [1_000_000_000, 1_000_000_001, 1_000_000_002]
    assert eval_seeds(2, "test") == [3_000_000_000, 3_000_000_001]


def test_the_splits_are_disjoint_from_each_other_and_from_training_seeds():
    # Training seeds are drawn below EVAL_SEED_BASE; the largest evaluation of each split
    # stays inside its own range, and test inside 32 bits.
    dev, test = (eval_seeds(config.MAX_EVAL_EPISODES, s) for s in config.EVAL_SPLITS)
    assert dev[0] == EVAL_SEED_BASE and dev[-1] < test[0] and test[-1] < 2**32
    assert sorted(SPLIT_SEED_BASES) == sorted(config.EVAL_SPLITS)


def test_a_test_split_evaluation_plays_the_test_seeds(tiny):
    model, tokenizer = tiny
    c = config.load(
        "sokoban-rl",
        ["model.spec=tiny", "rollout.demos=0", "rollout.max_turns=1", "rollout.max_reply_tokens=4"],
    )
    request = EvalRequest(env="sokoban", n=2, split="test")
    summary, episodes = evaluate(
        make_generator("hf", model, tokenizer), tokenizer, c, request, progress=False
    )
    first = [e.turns[0].observation for e in episodes]
    assert first == [SokobanEnv().reset(3_000_000_000 + i) for i in range(2)]
    assert summary["split"] == "test"


def test_an_eval_env_is_built_with_its_eval_options(tiny):
    model, tokenizer = tiny
    c = config.load(
        "sokoban-rl",
        [
            "model.spec=tiny",
            "rollout.demos=0",
            "rollout.max_turns=1",
            "rollout.max_reply_tokens=4",
            "env.eval_names=[sokoban, sokoban-large]",
            "env.eval_options.sokoban-large.spaced=true",
        ],
    )
    generator = make_generator("hf", model, tokenizer)
    request = EvalRequest(env="sokoban-large", n=2, temperature=1.0)
    _, episodes = evaluate(generator, tokenizer, c, request, progress=False)
    large = SokobanEnv(height=8, width=8, num_boxes=2, max_actions=200, spaced=True)
    assert [e.turns[0].observation for e in episodes] == [
        large.reset(EVAL_SEED_BASE + i) for i in range(2)
    ]
    # The training env keeps env.options (none here): its rooms are drawn unspaced.
    _, plain = evaluate(generator, tokenizer, c, EvalRequest(env="sokoban", n=1), progress=False)
    assert plain[0].turns[0].observation == SokobanEnv().reset(EVAL_SEED_BASE)


def _tiny_lake(turns: int, reply_tokens: int):
    """The frozen-lake-rl config on the tiny model, no worked examples, short episodes."""
    overrides = [f"rollout.max_turns={turns}", f"rollout.max_reply_tokens={reply_tokens}"]
    return config.load("frozen-lake-rl", ["model.spec=tiny", "rollout.demos=0", *overrides])


def test_an_evaluation_played_in_waves_plays_the_same_episodes(tiny, monkeypatch):
    """Seeds played a few at a time (to bound the caches kept between turns) sample exactly
    what one rollout of them all does, and summarise the same."""
    model, tokenizer = tiny
    c = _tiny_lake(turns=2, reply_tokens=6)
    generator = make_generator("hf", model, tokenizer)
    request = EvalRequest(env="frozen-lake", n=5, k=2, temperature=1.0)
    whole, once = evaluate(generator, tokenizer, c, request, progress=False)
    monkeypatch.setattr(evaluator, "eval_wave", lambda *_: 2)  # waves of 2, 2 and 1 seeds
    waved, in_waves = evaluate(generator, tokenizer, c, request, progress=False)
    assert [(t.group, t.copy) for t in in_waves] == [(g, k) for g in range(5) for k in range(2)]
    assert [[turn.reply for turn in t.turns] for t in in_waves] == [
        [turn.reply for turn in t.turns] for t in once
    ]
    drop = ("seconds", "cost")
    assert {k: v for k, v in waved.items() if k not in drop} == {
        k: v for k, v in whole.items() if k not in drop
    }


def test_only_a_generator_that_keeps_caches_plays_in_waves(tiny):
    model, tokenizer = tiny
    spec = RolloutSpec.from_config(config.load("frozen-lake-rl", ["model.spec=tiny"]).rollout)
    naive = make_generator("naive", model, tokenizer)
    assert evaluator.eval_wave(naive, spec, 2, 7) == 7
    cached = make_generator("hf", model, tokenizer)
    assert evaluator.eval_wave(cached, spec, 2, 7) == 7  # the tiny model's caches all fit
    assert evaluator.eval_wave(cached, spec, 10**12, 7) == 1  # never fewer than one seed
    # Kept caches of 10^12 tokens fit nowhere, and one seed is still played.
    assert kept_cache_episodes(model, 10**12, wanted=4).size == 1


def test_an_evaluation_whose_waves_free_memory_cut_says_so(tiny, monkeypatch):
    model, tokenizer = tiny
    c = _tiny_lake(turns=1, reply_tokens=4)
    generator = make_generator("hf", model, tokenizer)
    request = EvalRequest(env="frozen-lake", n=3, k=1, temperature=1.0)
    monkeypatch.setattr("ragen.rollout.engines.memory.available_memory", lambda: 2**40)
    ample, _ = evaluate(generator, tokenizer, c, request, progress=False)
    assert ample["cost"]["memory_cuts"] == 0
    assert "memory:" not in evaluator.format_summary("frozen-lake", ample)
    # About 1 kB free: the kept caches play one seed a wave, and every decode batch one row.
    monkeypatch.setattr("ragen.rollout.engines.memory.available_memory", lambda: 1000)
    with pytest.warns(UserWarning, match="free memory is short"):
        short, _ = evaluate(generator, tokenizer, c, request, progress=False)
    assert short["cost"]["memory_cuts"] == 1  # the waves; each wave's one row is not cut
    assert "free memory cut 1 decode batch(es) or wave(s)" in evaluator.format_summary(
        "frozen-lake", short
    )


def test_the_action_template_is_the_most_frequent_unsolved_sequence_and_its_prefixes():
    episodes = [
        (["Right", "Right", "Up", "Up"], False),
        (["Right", "Right", "Up", "Up"], False),
        (["Right", "Right"], True),  # solved on the template's way: it follows it
        (["Right"], False),  # cut short without success: a prefix, it follows it too
        (["Down", "Down", "Up", "Up"], False),
        (["Left"], True),
    ]
    assert action_template(episodes) == (("Right", "Right", "Up", "Up"), 4 / 6)
    assert action_template([(["Up"], True)]) == ((), 0.0)  # all solved: none
    # an episode that made no move follows no sequence of moves, only the template of none
    blank = [([], False)] * 2
    assert action_template([*blank, *episodes, *episodes]) == (
        ("Right", "Right", "Up", "Up"),
        8 / 14,
    )
    assert action_template([*blank, *blank, (["Up"], False)]) == ((), 4 / 5)


def test_the_summary_names_the_action_template_and_its_share():
    episodes = [
        _episode(0, 0, True, "terminated"),
        _episode(0, 1, False, "truncated:turns"),
        _episode(1, 0, False, "truncated:actions"),
    ]
    moves = [[turn.actions for turn in t.turns] for t in episodes]
    s = summarize(episodes)
    assert s["action_template"] == [a for turn in moves[1] for a in turn]
    assert s["action_template_share"] == 1.0  # the three play the same two-turn moves
    assert "one action sequence 100.0%" in evaluator.format_summary("sokoban", s)
