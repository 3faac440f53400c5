"""The episode loop. Budget and end-reason tests script the replies (through the real
tokenizer, env, chat template and parser) so every reward can be computed by hand; the
model tests at the bottom run real policies through the real generators."""

from collections.abc import Sequence

import pytest

from ragen import config, envs
from ragen.agent.parsing import parse_reply
from ragen.envs.sokoban_levels import solve
from ragen.rollout.engines import Sample, make_generator
from ragen.rollout.loop import RolloutSpec, rollout


def scripted_sample(tokenizer, text: str, max_new_tokens: int) -> Sample:
    """``text`` as an engine would return it: its ids and eos, cut at ``max_new_tokens``
    (finish ``length``), each at log-prob -0.5."""
    ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    finish = "stop" if len(ids) <= max_new_tokens else "length"
    ids = ids[:max_new_tokens]
    return Sample(ids, [-0.5] * len(ids), finish)


class ScriptedReplies:
    """A Generator that answers turn t of every episode with ``script[t]`` (the text after
    the reply prefix), stopping with the eos token, or cut at ``max_new_tokens``."""

    def __init__(self, tokenizer, script: Sequence[str]) -> None:
        self.tokenizer, self.script = tokenizer, list(script)
        self.turn_of: dict = {}
        self.released: set = set()

    def generate(self, requests, *, max_new_tokens, temperature, top_p=1.0, seed=0):
        out = []
        for req in requests:
            turn = self.turn_of.get(req.key, 0)
            self.turn_of[req.key] = turn + 1
            out.append(scripted_sample(self.tokenizer, self.script[turn], max_new_tokens))
        return out

    def release(self, keys):
        self.released.update(keys)


def _sokoban_solution(seed: int) -> list[str]:
    env = envs.make("sokoban")
    env.reset(seed)
    return solve(env.room)


def test_solution_replayed_over_turns_succeeds(tokenizer):
    seed = 4
    plan = _sokoban_solution(seed)
    per_turn = [plan[i : i + 2] for i in range(0, len(plan), 2)]
    script = [f"ok</think><answer>{' || '.join(a)}</answer>" for a in per_turn]
    spec = RolloutSpec(
        max_turns=len(script),
        max_actions_per_turn=2,
        max_actions_per_episode=len(plan),
        max_reply_tokens=64,
    )
    gen = ScriptedReplies(tokenizer, script)
    [traj] = rollout(gen, tokenizer, "sokoban", [seed], 1, spec)
    assert traj.end == "terminated" and traj.success
    assert [a for t in traj.turns for a in t.actions] == plan
    # -0.1 per action, +1 box on target, +10 solved: the last push lands the only box
    assert traj.total_reward == pytest.approx(-0.1 * len(plan) + 11)
    assert all(t.format_ok for t in traj.turns)
    assert gen.released == {(k[0], 0, 0) for k in gen.turn_of}


def test_each_end_reason(tokenizer):
    def run(script, **changes):
        spec = RolloutSpec(**{"max_turns": 3, "max_reply_tokens": 48, **changes})
        return rollout(ScriptedReplies(tokenizer, script), tokenizer, "sokoban", [0], 1, spec)[0]

    wander = "x</think><answer>Up || Down</answer>"
    assert run([wander] * 3).end == "truncated:turns"
    assert run([wander] * 3, max_actions_per_episode=4, max_actions_per_turn=2).end == (
        "truncated:actions"
    )
    cut = run(["a very long thought " * 20], max_reply_tokens=8)
    assert cut.end == "truncated:reply_length"
    assert cut.turns[0].actions == [] and cut.turns[0].reward == pytest.approx(-0.1)
    # a cut reply priced above a played-out failure (3 turns of Up || Down: -0.6)
    priced = run(["a very long thought " * 20], max_reply_tokens=8, cut_reply_penalty=-1.0)
    assert priced.end == "truncated:reply_length" and priced.total_reward == pytest.approx(-1.0)
    assert priced.turns[0].terms["format"] == pytest.approx(-1.0)
    # a bad reply that is not cut keeps format_penalty
    bad = run(["x</think><answer>Jump</answer>"] * 3, cut_reply_penalty=-1.0)
    assert [t.reward for t in bad.turns] == pytest.approx([-0.1] * 3)
    small = run([wander] * 3, max_context_tokens=300, max_reply_tokens=48)
    assert small.end == "truncated:context" and len(small.token_ids) + 48 > 300


def test_format_penalty_and_per_turn_limit(tokenizer):
    script = [
        "hmm</think><answer>Jump</answer>",  # no valid action: penalty, nothing executed
        "go</think><answer>Up || Up || Up || Up</answer>",  # capped at 2 per turn
    ]
    spec = RolloutSpec(max_turns=2, max_actions_per_turn=2, max_reply_tokens=48)
    [traj] = rollout(ScriptedReplies(tokenizer, script), tokenizer, "sokoban", [0], 1, spec)
    first, second = traj.turns
    assert first.actions == [] and first.reward == pytest.approx(-0.1) and not first.format_ok
    assert second.actions == ["Up", "Up"]
    assert second.reward == pytest.approx(sum(second.rewards))


def test_format_penalty_mode_any_invalid_penalises_any_unknown_piece(tokenizer):
    script = [
        "a</think><answer>Up || Jump</answer>",  # one valid action, one unknown piece
        "b</think><answer>Left || Left || Left</answer>",  # capped at 2, none unknown
        "c</think><answer>Fly</answer>",  # nothing valid
    ]

    def play(mode):
        spec = RolloutSpec.from_config(
            config.RolloutConfig(
                max_turns=3,
                max_actions_per_turn=2,
                max_reply_tokens=48,
                demos=0,
                format_penalty=-0.25,
                format_penalty_mode=mode,
            )
        )
        gen = ScriptedReplies(tokenizer, script)
        return rollout(gen, tokenizer, "sokoban", [0], 1, spec)[0].turns

    plain, strict = play("no_action"), play("any_invalid")
    for turns in (plain, strict):  # the mode changes the reward, never what runs
        assert [t.actions for t in turns] == [["Up"], ["Left", "Left"], []]
        assert [t.unknown_actions for t in turns] == [1, 0, 1]
    assert [t.terms["format"] for t in plain] == [0.0, 0.0, -0.25]
    assert [t.terms["format"] for t in strict] == [-0.25, 0.0, -0.25]
    for a, b in zip(plain, strict, strict=True):
        assert b.reward == pytest.approx(a.reward + b.terms["format"] - a.terms["format"])
    with pytest.raises(ValueError, match="any_invalid"):
        RolloutSpec(format_penalty_mode="always")


def test_ids_mask_and_transcript_are_exact(tokenizer):
    script = ["a</think><answer>Left</answer>", "b</think><answer>Right</answer>"]
    spec = RolloutSpec(max_turns=2, max_reply_tokens=48)
    trajs = rollout(ScriptedReplies(tokenizer, script), tokenizer, "sokoban", [1, 2], 2, spec)
    assert [(t.group, t.copy, t.seed) for t in trajs] == [
        (0, 0, 1),
        (0, 1, 1),
        (1, 0, 2),
        (1, 1, 2),
    ]
    for traj in trajs:
        sampled = [i for i, m in enumerate(traj.loss_mask) if m]
        spans = [i for t in traj.turns for i in range(t.reply_start, t.reply_end)]
        assert sampled == spans  # the mask covers exactly the sampled tokens
        text = tokenizer.decode(traj.token_ids)
        for turn, reply in zip(traj.turns, script, strict=True):
            assert "<think>" + reply in text  # each reply appears verbatim
            assert turn.observation in text
        assert text.count("<|im_start|>assistant\n<think>") == 2
        assert all(lp == -0.5 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m)


def test_demonstrations_open_the_dialogue_and_are_never_trained(tokenizer):
    script = ["I pull it.</think><answer>Dragon</answer>"]
    spec = RolloutSpec(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1, demos=2)
    trajs = rollout(ScriptedReplies(tokenizer, script), tokenizer, "bandit", [4], 2, spec)
    demos = envs.demonstrations(envs.make("bandit"))
    for traj in trajs:
        text = tokenizer.decode(traj.token_ids)
        worked = [f"<think>{d.thought}</think><answer>{d.answer[0]}</answer>" for d in demos]
        places = [text.index(w) for w in worked] + [text.index("<think>" + script[0])]
        assert places == sorted(places)  # demo 1, demo 2, then the real reply
        assert text.count("<|im_start|>user\n") == 3
        sampled = tokenizer.decode(
            [i for i, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
        )
        assert sampled == script[0] + tokenizer.eos_token  # only the real reply is trained
        assert traj.turns[0].actions == ["Dragon"] and traj.end == "terminated"
    with pytest.raises(ValueError, match="offers 0"):
        rollout(ScriptedReplies(tokenizer, script), tokenizer, "countdown", [4], 1, spec)


@pytest.mark.parametrize("name", ["sokoban", "frozen-lake"])
@pytest.mark.parametrize("per_turn", [1, 2, 5])
def test_worked_replies_parse_back_to_their_first_actions_within_the_turn_limit(
    tokenizer, name, per_turn
):
    spec = RolloutSpec(max_turns=1, max_actions_per_turn=per_turn, demos=2, max_reply_tokens=96)
    script = ["ok</think><answer>Up</answer>"]
    [traj] = rollout(ScriptedReplies(tokenizer, script), tokenizer, name, [0], 1, spec)
    env = envs.make(name)
    # The assistant turns of the rendered dialogue: the two worked replies, then the real one.
    text = tokenizer.decode(traj.token_ids)
    replies = [part.split("<|im_end|>")[0] for part in text.split("<|im_start|>assistant\n")[1:]]
    assert len(replies) == 3 and replies[2] == "<think>" + script[0]
    for demo, reply in zip(envs.demonstrations(env), replies[:2], strict=True):
        parsed = parse_reply(reply, env.actions, per_turn)
        assert parsed.format_ok and parsed.problems == ()
        assert parsed.think == demo.thought
        assert parsed.actions == demo.answer[:per_turn]
    worked = [parse_reply(r, env.actions, per_turn).actions for r in replies[:2]]
    expected = {
        ("sokoban", 1): [("Up",), ("Left",)],
        ("sokoban", 2): [("Up", "Right"), ("Left", "Left")],
        ("sokoban", 5): [("Up", "Right", "Down"), ("Left", "Left")],
        ("frozen-lake", 1): [("Down",), ("Right",)],
        ("frozen-lake", 2): [("Down", "Down"), ("Right", "Down")],
        ("frozen-lake", 5): [
            ("Down",) * 3 + ("Right",) * 2,
            ("Right", "Down", "Down", "Right", "Down"),
        ],
    }
    assert worked == expected[(name, per_turn)]


@pytest.mark.parametrize("backend", ["hf", "naive"])
def test_tiny_model_episodes(tiny, backend):
    model, tokenizer = tiny
    gen = make_generator(backend, model, tokenizer)
    spec = RolloutSpec(max_turns=2, max_reply_tokens=6, temperature=1.0)
    trajs = rollout(gen, tokenizer, "frozen-lake", [5, 6], 3, spec, sample_seed=1)
    assert len(trajs) == 6
    for traj in trajs:
        # a random 2-layer model never closes its answer within 6 tokens
        assert traj.end == "truncated:reply_length"
        assert sum(traj.loss_mask) == 6 and len(traj.turns) == 1
        assert traj.turns[0].reply_end == len(traj.token_ids)


def test_tiny_model_rollouts_are_deterministic(tiny):
    model, tokenizer = tiny
    spec = RolloutSpec(max_turns=1, max_reply_tokens=5)

    def once(seed):
        gen = make_generator("hf", model, tokenizer)
        return [
            t.token_ids
            for t in rollout(gen, tokenizer, "bandit", [0, 1], 2, spec, sample_seed=seed)
        ]

    assert once(3) == once(3)
    assert once(3) != once(4)


def test_shares_of_a_rollout_played_apart_equal_the_whole(tiny):
    # How data-parallel ranks split a step: each plays its groups, numbered from its first.
    model, tokenizer = tiny
    spec = RolloutSpec(max_turns=1, max_reply_tokens=5)

    def play(seeds, first_group=0):
        gen = make_generator("hf", model, tokenizer)
        trajs = rollout(
            gen, tokenizer, "bandit", seeds, 2, spec, sample_seed=3, first_group=first_group
        )
        return [(t.group, t.copy, t.seed, t.token_ids) for t in trajs]

    whole = play([10, 11, 12, 13])
    assert play([10, 11]) + play([12, 13], first_group=2) == whole
    assert [g for g, *_ in whole] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_embedded_model_plays_sokoban(embedded):
    # Greedy, the base model follows the example reply of the prompt: its actions run.
    model, tokenizer = embedded
    gen = make_generator("hf", model, tokenizer)
    spec = RolloutSpec(max_turns=1, max_actions_per_turn=2, max_reply_tokens=40, temperature=0.0)
    trajs = rollout(gen, tokenizer, "sokoban", [0, 1], 1, spec)
    assert any(t.turns[0].format_ok for t in trajs)
    for t in trajs:
        turn = t.turns[0]
        assert t.end in ("truncated:turns", "truncated:reply_length", "terminated")
        assert turn.format_ok == bool(turn.actions)
        assert set(turn.actions) <= {"Up", "Down", "Left", "Right"}
        assert len(turn.rewards) == len(turn.actions)
