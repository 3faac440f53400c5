"""Episodes over a chat-completions API, against a real HTTP server on a loopback port whose
replies the test writes: the same replies played locally and over the API make the same
turns from the same dialogue; cut replies, the context limit, the request seeds, and the
first failure stopping the rest."""

import pytest
from tests.rollout.chat_server import chat_server, completion, error
from tests.rollout.test_loop import ScriptedReplies

from ragen import envs, models
from ragen.agent.prompts import SYSTEM_PROMPT
from ragen.envs.sokoban import solve
from ragen.rollout.api_loop import api_rollout, check_api_spec, request_seed
from ragen.rollout.chat_api import ApiError, ChatClient
from ragen.rollout.loop import RolloutSpec, rollout

pytest.importorskip("openai", reason="the API client is an extra: pip install -e '.[api]'")

SEED = 4


def _turn(body: dict) -> int:
    """The turn a request asks for: the assistant messages it holds (no demonstrations)."""
    return sum(m["role"] == "assistant" for m in body["messages"])


def _client(url: str) -> ChatClient:
    return ChatClient(url, "scripted", "sk-test", retries=0, backoff=0.01)


def _plan() -> list[list[str]]:
    env = envs.make("sokoban")
    env.reset(SEED)
    plan = solve(env.room)
    return [plan[i : i + 2] for i in range(0, len(plan), 2)]


def test_the_same_replies_make_the_same_turns_from_the_same_dialogue(tokenizer):
    # A reply that names no action (a format penalty, nothing run), then the solution.
    answers = [["Jump"], *_plan()]
    replies = [
        f"<think>step {i}</think><answer>{' || '.join(a)}</answer>" for i, a in enumerate(answers)
    ]
    actions = sum(len(a) for a in answers)
    spec = RolloutSpec(
        max_turns=len(replies),
        max_actions_per_turn=2,
        max_actions_per_episode=actions,
        max_reply_tokens=64,
    )
    local = rollout(
        ScriptedReplies(tokenizer, [r.removeprefix("<think>") for r in replies]),
        tokenizer,
        "sokoban",
        [SEED],
        2,
        spec,
    )
    with chat_server(
        lambda body, n: (200, completion(replies[_turn(body)], "stop", 50, 7), {})
    ) as s:
        remote = api_rollout(_client(s.url), "sokoban", [SEED], 2, spec, concurrency=2)
    assert [(t.group, t.copy) for t in remote] == [(0, 0), (0, 1)]
    for mine, theirs in zip(remote, local, strict=True):
        assert (mine.success, mine.end, mine.total_reward) == (
            theirs.success,
            theirs.end,
            theirs.total_reward,
        )
        assert mine.success and mine.end == "terminated"
        for a, b in zip(mine.turns, theirs.turns, strict=True):
            fields = ("observation", "reply", "think", "answer", "actions", "rewards", "terms")
            assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
            assert (a.reply_start, a.reply_end, a.think_tokens) == (
                50,
                57,
                0,
            )  # the server's counts
    # Each request held the dialogue the local rollout rendered, less the reply prefix.
    first = local[0]
    asked = {_turn(b): b for _, b in s.requests if b["seed"] == request_seed(0, 0, _turn(b))}
    assert sorted(asked) == list(range(len(replies)))  # copy 0's requests, one a turn
    for number, turn in enumerate(first.turns):
        messages = asked[number]["messages"]
        assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        rendered = models.render_chat(tokenizer, messages, generation_prompt=True)
        assert rendered + "<think>" == tokenizer.decode(first.token_ids[: turn.reply_start])
    assert first.turns[0].terms["format"] == spec.format_penalty < 0
    assert first.turns[0].actions == [] and first.turns[0].unknown_actions == 1
    assert remote[0].to_record()["reply_tokens"] == 7 * len(replies)


def test_request_seeds_differ_by_copy_and_turn_and_repeat():
    seeds = {request_seed(0, stream, turn) for stream in range(4) for turn in range(3)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)
    assert request_seed(3, 1, 2) == request_seed(3, 1, 2) != request_seed(4, 1, 2)


def test_a_cut_reply_runs_nothing_and_ends_the_episode():
    spec = RolloutSpec(max_turns=3, max_reply_tokens=8, cut_reply_penalty=-1.0)
    with chat_server(lambda body, n: (200, completion("<think>a long", "length", 40, 8), {})) as s:
        [traj] = api_rollout(_client(s.url), "sokoban", [0], 1, spec, concurrency=1)
    assert traj.end == "truncated:reply_length" and len(s.requests) == 1
    [turn] = traj.turns
    assert turn.actions == [] and not turn.format_ok and turn.reward == pytest.approx(-1.0)


def test_a_prompt_over_the_context_limit_ends_the_episode_unplayed():
    # The server counts 100 prompt tokens on turn 1, then 970: 970 + 64 > 1024.
    def answer(body, n):
        prompt = 100 if _turn(body) == 0 else 970
        return 200, completion("<think>x</think><answer>Up</answer>", "stop", prompt, 12), {}

    spec = RolloutSpec(max_turns=5, max_reply_tokens=64, max_context_tokens=1024)
    with chat_server(answer) as s:
        [traj] = api_rollout(_client(s.url), "sokoban", [0], 1, spec, concurrency=1)
    assert traj.end == "truncated:context" and len(traj.turns) == 1 and len(s.requests) == 2
    assert traj.to_record()["context_tokens"] == 112


def test_the_first_failure_stops_every_episode():
    spec = RolloutSpec(max_turns=3, max_reply_tokens=8)
    with (
        chat_server(lambda body, n: error(500, "down")) as s,
        pytest.raises(ApiError, match="HTTP 500: down"),
    ):
        api_rollout(_client(s.url), "sokoban", list(range(6)), 2, spec, concurrency=2)
    assert 1 <= len(s.requests) <= 2  # those under way when it failed; no episode after


def test_reward_terms_that_count_think_tokens_are_refused():
    check_api_spec(RolloutSpec(reward_terms=(("think_bonus", 0.1),)))
    with pytest.raises(ValueError, match="think_tokens counts think tokens"):
        check_api_spec(RolloutSpec(reward_terms=(("think_tokens", -0.01),)))


def test_a_context_window_other_than_full_is_refused():
    check_api_spec(RolloutSpec(context_window="full"))
    with pytest.raises(ValueError, match=r"set rollout\.context_window=full"):
        check_api_spec(RolloutSpec(context_window="single_turn"))
