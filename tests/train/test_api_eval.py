"""`ragen eval --api` end to end against a real HTTP server on a loopback port whose replies
the test writes: the folder it leaves is a normal evaluation folder (the viewer serves it,
`ragen report` reads it), it records the requests and tokens and that no prefix was written,
the key is in none of its files, bad flags are refused before any request, and a server that
keeps failing ends the command with one line and no folder."""

import json

import pytest
from fastapi.testclient import TestClient
from tests.rollout.chat_server import chat_server, completion, error

from ragen import config
from ragen.cli import main
from ragen.viewer.app import create_app

pytest.importorskip("openai", reason="the API client is an extra: pip install -e '.[api]'")

KEY = "sk-test-api-eval-7d2c90-never-written"
REPLY = "<think>the box</think><answer>Up</answer>"


def _answer(body: dict, number: int):
    # prompt tokens: a fixed count plus 10 a message, so that totals can be summed by hand
    return 200, completion(REPLY, "stop", 100 + 10 * len(body["messages"]), 9), {}


def _eval(url: str, out, *extra: str) -> int:
    flags = ["--api", "scripted", "--base-url", url, "--concurrency", "2", "--out", str(out)]
    return main(["eval", "--env", "sokoban", "--n", "3", *flags, *extra])


def test_an_api_evaluation_is_a_normal_evaluation_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAGEN_TEST_KEY", KEY)
    out = tmp_path / "api-eval"
    with chat_server(_answer) as s:
        assert _eval(s.url, out, "--api-key-env", "RAGEN_TEST_KEY", "rollout.demos=0") == 0
    printed = capsys.readouterr().out
    assert "no reply prefix" in printed and f"{len(s.requests)} requests (0 retried)" in printed
    summary = json.loads((out / "eval.jsonl").read_text())
    assert (summary["model"], summary["env"], summary["episodes"], summary["seeds"]) == (
        "scripted",
        "sokoban",
        3,
        3,
    )
    prompts = [100 + 10 * len(body["messages"]) for _, body in s.requests]
    assert summary["api"] == {
        "base_url": s.url,
        "prefill": False,
        "concurrency": 2,
        "requests": len(s.requests),
        "retries": 0,
        "prompt_tokens": sum(prompts),
        "completion_tokens": 9 * len(s.requests),
    }
    assert all(h["authorization"] == f"Bearer {KEY}" for h, _ in s.requests)
    assert "machine" not in summary  # the model ran behind the server, not here
    played = config.load(str(out / "eval-config.yaml"))  # the settings it played by
    assert (played.rollout.demos, played.trainer.eval_episodes, played.env.name) == (
        0,
        3,
        "sokoban",
    )
    episodes = [json.loads(line) for line in (out / "trajectories" / "eval.jsonl").open()]
    assert sum(e["num_turns"] for e in episodes) == len(s.requests)  # no demonstrations
    assert summary["reply_tokens_mean"] == 9.0
    assert {t["reply"] for e in episodes for t in e["turns"]} == {REPLY}
    # The key is in no file of the folder.
    for path in out.rglob("*"):
        assert not path.is_file() or KEY.encode() not in path.read_bytes(), path
    # The viewer serves it, the report reads it.
    client = TestClient(create_app(out))
    run = client.get("/api/run").json()
    assert run["eval_episodes"] is True and run["evals"][0]["model"] == "scripted"
    assert client.get("/api/steps/eval/episodes").json()["total"] == 3
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    told = capsys.readouterr().out
    success = f"{summary['success']:.1%}"
    assert f"sokoban: success {success} of 3 episodes by scripted over the API at {s.url}" in told


def test_a_server_that_keeps_failing_ends_it_in_one_line_with_no_folder(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = tmp_path / "failed"
    with chat_server(lambda body, n: error(503, "overloaded")) as s:
        assert _eval(s.url, out, "--retries", "1") == 1
    err = capsys.readouterr().err
    assert KEY not in err
    *_, err = err.strip().splitlines()  # after the progress bar, one line
    assert err.startswith(f"ragen: {s.url} failed after 2 attempts (HTTP 503: overloaded)")
    assert not out.exists()
    assert 2 <= len(s.requests) <= 4  # two attempts of each episode under way, none after


def test_it_runs_in_one_process(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would start it
    assert _eval("http://127.0.0.1:1/v1", tmp_path / "never") == 2
    assert "start it without torchrun" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--api", "m"], "--api MODEL and --base-url URL go together"),
        (["--base-url", "http://127.0.0.1:1/v1"], "--api MODEL and --base-url URL go together"),
        (["--api", "m", "--base-url", "ftp://host/v1"], "give the server's http(s) URL"),
        (["--api", "m", "--base-url", "http://u:pw@host/v1"], "holds a user or password"),
        (["--api", "m", "--base-url", "http://h/v1", "--model", "tiny"], "drop --model"),
        (["--api", "m", "--base-url", "http://h/v1", "--api-key-env", "NO_SUCH_VAR_X"], "holds no"),
        (
            ["--api", "m", "--base-url", "http://h/v1", "rollout.reward_terms={think_tokens: -1}"],
            "counts think tokens",
        ),
    ],
)
def test_bad_flags_are_refused_before_any_request(flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = tmp_path / "never"
    assert main(["eval", "--env", "sokoban", "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
