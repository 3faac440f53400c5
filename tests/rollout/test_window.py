"""Context windows (rollout.context_window): what the model is shown at each turn of a 3-turn
FrozenLake episode, written out by hand in the embedded model's ChatML, against what the loop
fed the generator, what the trajectory holds and the training samples cut from it.

The replies are scripted (through the real tokenizer, env, template and parser) so that every
turn's state, and so every context, is known in advance."""

from __future__ import annotations

import pytest
import torch

from ragen import envs
from ragen.rollout.engines import Sample, make_generator
from ragen.rollout.loop import RolloutSpec, rollout
from ragen.rollout.samples import TurnSamples
from ragen.rollout.trajectory import collate
from ragen.rollout.window import first_shown
from ragen.train.forward import token_logprobs

SYSTEM = "You are an agent playing a text game. Follow the rules and the reply format."
RULE = "Always reply as <think>...</think><answer>...</answer>."
SEED = 3  # a lake whose start has two safe steps Down, then one Right
REPLIES = [
    "a</think><answer>Down</answer>",
    "b</think><answer>Down</answer>",
    "c</think><answer>Right</answer>",
]


class Recorder:
    """Answers turn t of every episode with ``replies[t]`` (ending with the eos token) and
    keeps the context of every request it was sent."""

    def __init__(self, tokenizer, replies) -> None:
        self.tokenizer, self.replies = tokenizer, replies
        self.contexts: dict = {}

    def generate(self, requests, *, max_new_tokens, temperature, top_p=1.0, seed=0):
        out = []
        for request in requests:
            seen = self.contexts.setdefault(request.key, [])
            seen.append(list(request.context_ids))
            text = self.replies[len(seen) - 1]
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"]]
            ids.append(self.tokenizer.eos_token_id)
            out.append(Sample(ids, [-0.25] * len(ids), "stop"))
        return out

    def release(self, keys):
        pass


@pytest.fixture(scope="module")
def lake():
    """The env's instructions and the three states the episode acts from."""
    env = envs.make("frozen-lake", slippery=False)
    states = [env.reset(SEED)]
    states += [env.step(action).observation for action in ("Down", "Down")]
    return env.instructions(), states


def _play(tokenizer, window: str, k: int = 1, format_rule: str = "every_turn"):
    spec = RolloutSpec(
        max_turns=3,
        max_actions_per_turn=1,
        max_reply_tokens=48,
        context_window=window,
        context_turns=k,
        format_rule=format_rule,
    )
    recorder = Recorder(tokenizer, REPLIES)
    [traj] = rollout(
        recorder, tokenizer, "frozen-lake", [SEED], 1, spec, env_options={"slippery": False}
    )
    [contexts] = recorder.contexts.values()
    return traj, contexts


def _chat(*messages: tuple[str, str]) -> str:
    """ChatML, written out: the system line, the messages, the assistant header and prefix."""
    turns = [("system", SYSTEM), *messages]
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + "<|im_start|>assistant\n<think>"


def _turn(number: int, state: str, left: int) -> str:
    return f"Turn {number}:\nState:\n{state}\nYou have {left} actions left."


def _expected(lake, window: str, k: int) -> list[str]:
    """The three contexts the model must be shown, by hand."""
    instructions, (s1, s2, s3) = lake
    u1 = f"{instructions}\n{_turn(1, s1, 10)}\n{RULE}"
    u2 = f"Reward: 0\n{_turn(2, s2, 9)}\n{RULE}"
    u3 = f"Reward: 0\n{_turn(3, s3, 8)}\n{RULE}"
    a1, a2 = ("assistant", "<think>" + REPLIES[0]), ("assistant", "<think>" + REPLIES[1])
    full = [_chat(("user", u1)), _chat(("user", u1), a1, ("user", u2))]
    full.append(_chat(("user", u1), a1, ("user", u2), a2, ("user", u3)))
    if window == "full" or (window == "limited_multi_turn" and k in (0, 3)):
        return full
    if window == "limited_multi_turn" and k == 2:  # turn 3 shows turns 2 and 3
        return [
            *full[:2],
            _chat(("user", f"{instructions}\n{_turn(2, s2, 9)}\n{RULE}"), a2, ("user", u3)),
        ]
    if window == "single_turn" and k == 1:  # the current state alone
        alone = [
            f"{instructions}\n{_turn(2, s2, 9)}\n{RULE}",
            f"{instructions}\n{_turn(3, s3, 8)}\n{RULE}",
        ]
        return [full[0], *(_chat(("user", u)) for u in alone)]
    assert (window, k) == ("single_turn", 2)  # the turn before summarised, then the state
    past1 = f"Turn 1:\nState:\n{s1}\nActions: Down\nReward: 0\n"
    past2 = f"Turn 2:\nState:\n{s2}\nActions: Down\nReward: 0\n"
    return [
        full[0],
        _chat(("user", f"{instructions}\n{past1}{_turn(2, s2, 9)}\n{RULE}")),
        _chat(("user", f"{instructions}\n{past2}{_turn(3, s3, 8)}\n{RULE}")),
    ]


MODES = [
    ("full", 1),
    ("limited_multi_turn", 2),
    ("limited_multi_turn", 0),
    ("single_turn", 1),
    ("single_turn", 2),
]


@pytest.mark.parametrize(("window", "k"), MODES)
def test_each_turn_is_shown_what_the_window_holds_and_trained_as_sampled(
    tokenizer, lake, window, k
):
    traj, contexts = _play(tokenizer, window, k)
    assert traj.end == "truncated:turns" and [t.actions for t in traj.turns] == [
        ["Down"],
        ["Down"],
        ["Right"],
    ]
    expected = _expected(lake, window, k)
    replies = [
        [*tokenizer(r, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        for r in REPLIES
    ]
    for turn, context, want, reply in zip(traj.turns, contexts, expected, replies, strict=True):
        assert tokenizer.decode(context) == want  # what the model was shown
        # the trajectory holds exactly those ids, then exactly the sampled ones
        assert traj.token_ids[turn.context_start : turn.reply_start] == context
        assert traj.token_ids[turn.reply_start : turn.reply_end] == reply
    shown = [t.first_shown for t in traj.turns]
    assert shown == ([1, 1, 1] if window == "full" else [first_shown(n, k) for n in (1, 2, 3)])

    episodes = collate([traj], tokenizer.pad_token_id)
    if window == "full":  # one sample: the whole dialogue, the three replies trained
        assert [t.context_start for t in traj.turns] == [0, 0, 0]
        assert episodes.input_ids[0].tolist() == contexts[2] + replies[2]
        want_mask = [0] * len(contexts[0]) + [1] * len(replies[0])
        want_mask += [0] * (len(contexts[1]) - len(want_mask)) + [1] * len(replies[1])
        want_mask += [0] * (len(contexts[2]) - len(want_mask)) + [1] * len(replies[2])
        assert episodes.loss_mask[0].tolist() == want_mask
        return
    samples = TurnSamples.of([traj]).batch(episodes, tokenizer.pad_token_id)
    assert len(samples.input_ids) == 3
    for n, (context, reply) in enumerate(zip(contexts, replies, strict=True)):
        length = len(context) + len(reply)
        pad = samples.input_ids.shape[1] - length
        row = samples.input_ids[n].tolist()
        assert row == context + reply + [tokenizer.pad_token_id] * pad
        mask = [0] * len(context) + [1] * len(reply) + [0] * pad
        assert samples.loss_mask[n].tolist() == mask  # the loss on this turn's reply alone
        assert samples.attention_mask[n].tolist() == [1] * length + [0] * pad
        assert samples.turn_ids[n].tolist() == [-1] * len(context) + [n] * len(reply) + [-1] * pad
        lp = samples.logprobs[n].tolist()
        assert lp == [0.0] * len(context) + [-0.25] * len(reply) + [0.0] * pad
    assert samples.scores.tolist() == [0.0] * 3 and samples.group_ids.tolist() == [0] * 3


@pytest.mark.parametrize(("window", "k"), [("full", 1), ("limited_multi_turn", 2)])
def test_the_format_rule_stated_once_closes_only_the_opening_message(tokenizer, lake, window, k):
    instructions, (s1, s2, s3) = lake
    _, contexts = _play(tokenizer, window, k, format_rule="first_turn")
    u1 = f"{instructions}\n{_turn(1, s1, 10)}\n{RULE}"
    u2, u3 = f"Reward: 0\n{_turn(2, s2, 9)}", f"Reward: 0\n{_turn(3, s3, 8)}"
    a1, a2 = ("assistant", "<think>" + REPLIES[0]), ("assistant", "<think>" + REPLIES[1])
    if window == "full":
        last = _chat(("user", u1), a1, ("user", u2), a2, ("user", u3))
    else:  # turn 3 shows turns 2 and 3: the opening message, turn 2's, keeps the rule
        last = _chat(("user", f"{instructions}\n{_turn(2, s2, 9)}\n{RULE}"), a2, ("user", u3))
    want = [_chat(("user", u1)), _chat(("user", u1), a1, ("user", u2)), last]
    assert [tokenizer.decode(c) for c in contexts] == want
    _, every = _play(tokenizer, window, k)
    saved = len(every[2]) - len(contexts[2])  # the rule's tokens, once per later message
    rule = len(tokenizer("\n" + RULE, add_special_tokens=False)["input_ids"])
    assert saved == (2 if window == "full" else 1) * rule


def test_a_window_of_every_turn_samples_the_full_dialogue_turn_by_turn(tokenizer):
    full, full_contexts = _play(tokenizer, "full")
    every, contexts = _play(tokenizer, "limited_multi_turn", 0)
    assert contexts == full_contexts  # the same ids, the earlier replies as sampled
    assert len(every.token_ids) == sum(len(c) for c in contexts) + sum(
        t.reply_tokens for t in every.turns
    )
    assert [t.reward for t in every.turns] == [t.reward for t in full.turns]


def test_records_name_the_window_only_when_it_is_not_full(tokenizer):
    full, _ = _play(tokenizer, "full")
    record = full.to_record()
    assert "context_window" not in record
    assert all("first_shown" not in t and "context_start" not in t for t in record["turns"])
    windowed, _ = _play(tokenizer, "single_turn", 2)
    record = windowed.to_record()
    assert record["context_window"] == "single_turn"
    assert [t["first_shown"] for t in record["turns"]] == [1, 1, 2]
    assert all("context_start" not in t for t in record["turns"])


def test_samples_move_values_between_episodes_and_turns(tokenizer):
    """A value placed on a sample's token lands on that token of its episode's row, and back."""
    trajs = [_play(tokenizer, "single_turn", 1)[0], _play(tokenizer, "limited_multi_turn", 2)[0]]
    episodes = collate(trajs, tokenizer.pad_token_id)
    samples = TurnSamples.of(trajs)
    assert samples.episode.tolist() == [0, 0, 0, 1, 1, 1]
    positions = torch.arange(episodes.input_ids.numel(), dtype=torch.float64)
    positions = positions.view(episodes.input_ids.shape) + 1  # each place its own number
    cut = samples.to_samples(positions)
    for r in range(6):
        b, s, n = (int(x[r]) for x in (samples.episode, samples.start, samples.length))
        assert cut[r, :n].tolist() == positions[b, s : s + n].tolist()
        assert cut[r, n:].abs().sum() == 0
    back = samples.to_episodes(cut, episodes.input_ids.shape)
    covered = torch.zeros_like(back, dtype=torch.bool)
    for t, traj in enumerate(trajs):
        for turn in traj.turns:
            covered[t, turn.sample] = True
    assert torch.equal(back, torch.where(covered, positions, 0.0))


@pytest.mark.parametrize(("window", "k"), [("limited_multi_turn", 2), ("single_turn", 1)])
def test_engines_play_windowed_turns_alike_and_score_them_as_sampled(tiny, window, k):
    """The tiny model through both engines, three turns (a stop string it writes often closes
    its replies): the hf engine, whose kept caches hold the previous turn's context, samples
    what naive's fresh prefills do although each context drops what the last one showed;
    and each turn sample scored afresh gives its reply the log-probs it was sampled with."""
    model, tokenizer = tiny
    spec = RolloutSpec(
        max_turns=3, max_reply_tokens=8, temperature=1.0, context_window=window, context_turns=k
    )
    played = {}
    for name in ("naive", "hf"):
        generator = make_generator(name, model, tokenizer, stop_strings=("e",))
        played[name] = rollout(generator, tokenizer, "sokoban", [1, 2], 2, spec, sample_seed=5)
        if name == "hf":
            assert generator.stats.reused_tokens > 0  # the shared opening, at least
    for a, b in zip(played["naive"], played["hf"], strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    trajs = played["hf"]
    assert max(len(t.turns) for t in trajs) == 3
    for traj in trajs:  # each later context starts afresh right after the reply before it
        ends = [0] + [t.reply_end for t in traj.turns[:-1]]
        assert [t.context_start for t in traj.turns] == ends
    samples = TurnSamples.of(trajs).batch(collate(trajs, 0), 0)
    with torch.no_grad():  # the reply tokens, as the update scores them
        logp, _ = token_logprobs(
            model, samples.input_ids, samples.attention_mask, samples.loss_mask
        )
    on = samples.loss_mask != 0
    assert (logp[on] - samples.logprobs[on]).abs().max() < 1e-4
