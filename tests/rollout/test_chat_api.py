"""The chat-completions client against a real HTTP server on a loopback port: replies, token
counts, cut replies, retries with backoff on 429 and 5xx, the one-line error after the last
retry, and a key that no error line shows."""

import socket

import pytest
from tests.rollout.chat_server import chat_server, completion, error

from ragen.rollout.chat_api import MAX_BACKOFF_S, ApiError, ChatClient, backoff_seconds

pytest.importorskip("openai", reason="the API client is an extra: pip install -e '.[api]'")

KEY = "sk-test-4f1e9a-never-written"
HELLO = [{"role": "user", "content": "hello"}]


def _client(url: str, retries: int = 3) -> ChatClient:
    return ChatClient(url, "test-model", KEY, retries=retries, backoff=0.01)


def _ask(client: ChatClient, max_tokens: int = 8):
    return client.complete(HELLO, max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=7)


def test_backoff_doubles_from_its_base_and_honours_retry_after_within_the_cap():
    assert [backoff_seconds(i, 1.0) for i in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_seconds(2, 0.5) == 2.0
    assert backoff_seconds(0, 1.0, retry_after=10.0) == 10.0  # the server asks for longer
    assert backoff_seconds(3, 1.0, retry_after=2.0) == 8.0  # ... or for less: the backoff
    assert backoff_seconds(10, 1.0) == MAX_BACKOFF_S
    assert backoff_seconds(0, 1.0, retry_after=1e9) == MAX_BACKOFF_S


def test_a_reply_its_request_and_its_token_counts():
    with chat_server(
        lambda body, n: (200, completion("<think>a</think>hi", "stop", 12, 5), {})
    ) as s:
        client = _client(s.url)
        reply = _ask(client)
    assert (reply.text, reply.cut, reply.prompt_tokens, reply.completion_tokens) == (
        "<think>a</think>hi",
        False,
        12,
        5,
    )
    headers, body = s.requests[0]
    assert headers["authorization"] == f"Bearer {KEY}"
    assert body["model"] == "test-model" and body["messages"] == HELLO
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (
        8,
        0.0,
        1.0,
        7,
    )
    assert client.usage == {
        "requests": 1,
        "retries": 0,
        "prompt_tokens": 12,
        "completion_tokens": 5,
    }


def test_a_reply_cut_by_its_length_is_a_cut_reply():
    with chat_server(lambda body, n: (200, completion("<think>and then", "length", 9, 8), {})) as s:
        reply = _ask(_client(s.url))
    assert reply.cut and reply.text == "<think>and then"


def test_reasoning_returned_apart_is_put_back_in_a_think_block():
    def answer(body, n):
        payload = completion("<answer>Up</answer>", "stop", 3, 4)
        payload["choices"][0]["message"]["reasoning_content"] = "the box is left"
        return 200, payload, {}

    with chat_server(answer) as s:
        reply = _ask(_client(s.url))
    assert reply.text == "<think>the box is left</think><answer>Up</answer>"


def test_429_and_500_are_retried_until_the_reply_comes():
    script = [error(429, "slow down"), error(500, "oops"), error(503, "busy")]

    def answer(body, n):
        return script[n] if n < len(script) else (200, completion("ok", "stop", 4, 1), {})

    with chat_server(answer) as s:
        client = _client(s.url, retries=3)
        reply = _ask(client)
    assert reply.text == "ok" and len(s.requests) == 4
    assert client.usage == {"requests": 1, "retries": 3, "prompt_tokens": 4, "completion_tokens": 1}


def test_the_last_failure_is_one_line_without_the_key():
    # The server echoes the key in its message, as some do in their 401s; it is masked.
    with chat_server(lambda body, n: error(500, f"internal error for key {KEY}\nline two")) as s:
        client = _client(s.url, retries=2)
        with pytest.raises(ApiError) as caught:
            _ask(client)
    line = str(caught.value)
    assert len(s.requests) == 3  # the first attempt and two retries
    assert "\n" not in line and KEY not in line
    assert "after 3 attempts" in line and "HTTP 500" in line and "***" in line
    assert client.usage["retries"] == 2 and client.usage["requests"] == 0


@pytest.mark.parametrize(
    ("status", "hint"), [(401, "check the key"), (404, "check --api MODEL"), (400, "check")]
)
def test_a_refusal_a_retry_cannot_cure_fails_at_once(status, hint):
    expected = f"at the first attempt \\(HTTP {status}: no\\): {hint}"
    with (
        chat_server(lambda body, n: error(status, "no")) as s,
        pytest.raises(ApiError, match=expected),
    ):
        _ask(_client(s.url, retries=3))
    assert len(s.requests) == 1


def test_a_server_that_is_not_there_is_retried_then_named():
    with socket.socket() as probe:  # a port that was free a moment ago, now closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(ApiError, match=f"^{url} failed after 2 attempts \\(APIConnectionError"):
        _ask(_client(url, retries=1))
