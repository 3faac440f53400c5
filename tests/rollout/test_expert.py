"""Expert dialogues through the real rollout loop, tokenizer and chat template."""

import pytest

from ragen import config, envs
from ragen.agent.prompts import worked_reply
from ragen.envs.experts import ExpertError
from ragen.envs.sokoban_levels import solve
from ragen.rollout.engines import Sample, Stopper
from ragen.rollout.expert import ExpertGenerator, expert_dialogues, expert_seeds
from ragen.rollout.loop import EVAL_SEED_BASE, RolloutSpec, rollout


def _spec(preset: str) -> tuple[RolloutSpec, config.Config]:
    c = config.load(preset)
    return RolloutSpec.from_config(c.rollout), c


class Replay:
    """A Generator that answers each episode's turn t with given token ids, as a model
    that sampled exactly them would be answered (finish ``stop``, log-probs -1)."""

    def __init__(self, replies: dict[int, list[list[int]]]) -> None:
        self.replies, self.turn_of = replies, {}

    def generate(self, requests, *, max_new_tokens, temperature, top_p=1.0, seed=0):
        out = []
        for req in requests:
            turn = self.turn_of.get(req.key, 0)
            self.turn_of[req.key] = turn + 1
            ids = self.replies[req.stream][turn]
            out.append(Sample(ids, [-1.0] * len(ids), "stop"))
        return out

    def release(self, keys):
        pass


@pytest.mark.parametrize(
    "preset", ["sokoban", "sokoban-rl", "frozen-lake", "frozen-lake-rl", "countdown", "bandit"]
)
def test_expert_dialogue_is_the_rollout_of_a_model_that_wrote_its_replies(tokenizer, preset):
    spec, c = _spec(preset)
    seeds = expert_seeds(0, 0, 6)
    expert = expert_dialogues(
        tokenizer,
        c.env.name,
        seeds,
        spec,
        env_options=c.env.options,
        lake=c.sft.lake_expert,
        sokoban=c.sft.sokoban_expert,
    )  # the preset's own warm start, where it has one
    replies = {
        n: [d.token_ids[t.reply_start : t.reply_end] for t in d.turns] for n, d in enumerate(expert)
    }
    sampled = rollout(
        Replay(replies), tokenizer, c.env.name, seeds, 1, spec, env_options=c.env.options
    )
    for mine, theirs in zip(expert, sampled, strict=True):
        assert mine.token_ids == theirs.token_ids
        assert mine.loss_mask == theirs.loss_mask  # the SFT mask is the RL update's mask
        assert [t.reward for t in mine.turns] == [t.reward for t in theirs.turns]


@pytest.mark.parametrize("preset", ["sokoban-rl", "frozen-lake-rl"])
def test_located_thoughts_fit_the_presets_reply_budget_and_play_the_same_moves(tokenizer, preset):
    spec, c = _spec(preset)
    seeds = expert_seeds(0, 0, 16)
    options = {"spaced": True} if c.env.name == "sokoban" else {}
    relative = expert_dialogues(tokenizer, c.env.name, seeds, spec, env_options=options)
    located = expert_dialogues(
        tokenizer, c.env.name, seeds, spec, env_options=options, thought="located"
    )
    for plain, placed in zip(relative, located, strict=True):
        assert all(t.think.startswith("I am at row ") for t in placed.turns)
        assert [t.actions for t in placed.turns] == [t.actions for t in plain.turns]
        longest = max(t.reply_tokens for t in placed.turns)
        assert longest <= spec.max_reply_tokens  # the generator refuses longer replies


@pytest.mark.parametrize("thought", ["relative", "located"])
def test_toward_lake_dialogues_fit_the_reply_budget_and_repeat_one_move(tokenizer, thought):
    spec, c = _spec("frozen-lake")
    options = {"random_ends": True, "offsets": True}
    dialogues = expert_dialogues(
        tokenizer,
        c.env.name,
        expert_seeds(0, 0, 16),
        spec,
        env_options=options,
        thought=thought,
        lake="toward",
    )
    for dialogue in dialogues:
        for turn in dialogue.turns:
            assert len(set(turn.actions)) == 1 and f"so I go {turn.actions[0]}" in turn.think
            assert turn.reply_tokens <= spec.max_reply_tokens


def test_mask_covers_exactly_the_expert_replies_and_the_stop_rule_ends_them(tokenizer):
    spec, _ = _spec("sokoban")
    (dialogue,) = expert_dialogues(tokenizer, "sokoban", [11], spec)
    env = envs.make("sokoban")
    env.reset(11)
    solution = solve(env.room)
    assert dialogue.success and dialogue.end == "terminated"
    assert [a for t in dialogue.turns for a in t.actions] == solution
    stopper = Stopper(tokenizer, {tokenizer.eos_token_id}, ("</answer>",))
    masked = [i for i, m in enumerate(dialogue.loss_mask) if m]
    assert masked == [i for t in dialogue.turns for i in range(t.reply_start, t.reply_end)]
    for turn in dialogue.turns:
        ids = dialogue.token_ids[turn.reply_start : turn.reply_end]
        assert "<think>" + tokenizer.decode(ids) == worked_reply(turn.think, turn.actions)
        assert turn.format_ok and not turn.problems
        # a model that sampled these tokens (and more after them) stops exactly here
        assert stopper.cut([*ids, *ids], 2 * len(ids)) == (len(ids), "stop")
    # the opening (system line, worked examples, rules) is never trained
    assert (
        dialogue.loss_mask[: dialogue.turns[0].reply_start] == [0] * dialogue.turns[0].reply_start
    )


def test_expert_keeps_to_the_episode_budget(tokenizer):
    spec, _ = _spec("frozen-lake")
    spec = RolloutSpec(**{**spec.__dict__, "max_actions_per_episode": 3, "max_turns": 5})
    dialogues = expert_dialogues(tokenizer, "frozen-lake", range(20), spec)
    for d in dialogues:
        assert sum(len(t.actions) for t in d.turns) <= 3
        assert all(t.format_ok and not t.problems for t in d.turns)
        assert d.end in ("terminated", "truncated:actions")


def test_reply_longer_than_the_budget_is_refused(tokenizer):
    spec, _ = _spec("sokoban")
    spec = RolloutSpec(**{**spec.__dict__, "max_reply_tokens": 20})
    with pytest.raises(ExpertError, match=r"rollout\.max_reply_tokens=20: raise it"):
        expert_dialogues(tokenizer, "sokoban", [0], spec)


def test_expert_seeds_are_fixed_fresh_per_step_and_below_the_eval_seeds():
    assert expert_seeds(0, 3, 5) == expert_seeds(0, 3, 5)
    assert expert_seeds(0, 3, 5) != expert_seeds(0, 4, 5)
    assert expert_seeds(0, 3, 5) != expert_seeds(1, 3, 5)
    assert all(0 <= s < EVAL_SEED_BASE for s in expert_seeds(0, 0, 1000))


def test_generator_needs_the_env(tokenizer):
    from ragen.rollout.engines import Request

    generator = ExpertGenerator(tokenizer, RolloutSpec())
    with pytest.raises(ValueError, match="needs the episode's env"):
        generator.generate([Request("k", [1, 2])], max_new_tokens=10)
