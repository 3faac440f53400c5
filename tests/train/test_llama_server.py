"""`ragen eval --api` against a real OpenAI-compatible server: llama.cpp's llama-server,
built from source by `make llama-server`, serving the embedded model's GGUF on a free
loopback port with a key it checks (marked `api`; `make test-api` builds it and runs these).

Skipped, with the command that builds it, where the server is not built."""

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ragen.cli import main
from ragen.models import EMBEDDED, embedded
from ragen.viewer.app import create_app

pytestmark = pytest.mark.api
pytest.importorskip("openai", reason="the API client is an extra: pip install -e '.[api]'")

SERVER = Path(__file__).resolve().parents[2] / ".bench/llama.cpp/build-api/bin/llama-server"
KEY = "sk-llama-server-test-5e0b31-never-written"
KEY_ENV = "RAGEN_LLAMA_SERVER_KEY"
SLOTS = 2
START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The base URL of a llama-server serving the embedded GGUF, stopped after the module."""
    if not SERVER.is_file():
        pytest.skip(f"llama-server is not built: run `make llama-server` (looked for {SERVER})")
    entry = EMBEDDED["smollm2-135m"]
    gguf = embedded.package_folder(entry) / entry.gguf_file
    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    command = [str(SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    # Two slots of 4096 tokens each (over any rollout.max_context_tokens here), one thread,
    # replies left whole (no <think> extraction), and a key it checks.
    command += ["-c", str(4096 * SLOTS), "-np", str(SLOTS), "-t", "1"]
    command += ["--reasoning-format", "none", "--no-webui", "--api-key", KEY]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                tail = log.read_text(errors="replace").splitlines()[-20:]
                lines = "\n".join(tail)
                pytest.fail(f"llama-server exited with {process.returncode}; {log} ends:\n{lines}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:  # not listening yet, or 503 while the model loads
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server did not start in {START_TIMEOUT_S} s: see {log}")
            time.sleep(0.5)
        yield f"{url}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _eval(url: str, out: Path, env: str, *extra: str) -> int:
    flags = ["--api", "smollm2-135m", "--base-url", url, "--api-key-env", KEY_ENV]
    return main(["eval", "--env", env, *flags, "--temperature", "0", "--out", str(out), *extra])


def test_an_evaluation_through_llama_server(server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, KEY)
    out = tmp_path / "sokoban"
    # sokoban-rl: the game with the instructions and two worked turns the prompts count below
    args = ["--preset", "sokoban-rl", "--n", "2", "--concurrency", str(SLOTS)]
    assert _eval(server, out, "sokoban", *args) == 0
    assert "no reply prefix" in capsys.readouterr().out
    summary = json.loads((out / "eval.jsonl").read_text())
    assert (summary["episodes"], summary["seeds"], summary["temperature"]) == (2, 2, 0.0)
    api = summary["api"]
    assert api["prefill"] is False and api["retries"] == 0
    episodes = [json.loads(line) for line in (out / "trajectories" / "eval.jsonl").open()]
    turns = [t for e in episodes for t in e["turns"]]
    ended_by_context = sum(e["end"] == "truncated:context" for e in episodes)
    assert api["requests"] == len(turns) + ended_by_context  # one a turn, one unused a cut
    # The server's token counts: every reply within the limit, the prompts the dialogue's.
    assert api["completion_tokens"] >= sum(e["reply_tokens"] for e in episodes) > 0
    assert all(0 < e["reply_tokens"] <= 96 * e["num_turns"] for e in episodes)
    assert api["prompt_tokens"] > 500 * api["requests"]  # the instructions and two demos
    for path in out.rglob("*"):
        assert not path.is_file() or KEY.encode() not in path.read_bytes(), path
    run = TestClient(create_app(out)).get("/api/run").json()
    assert run["eval_episodes"] is True and run["evals"][0]["model"] == "smollm2-135m"
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0


def test_replies_cut_by_the_token_limit_are_cut_replies(server, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    out = tmp_path / "cut"
    assert _eval(server, out, "bandit", "--n", "3", "rollout.max_reply_tokens=4") == 0
    summary = json.loads((out / "eval.jsonl").read_text())
    assert summary["end"]["truncated:reply_length"] == 1.0 and summary["format_ok"] == 0.0
    assert summary["reply_tokens_mean"] == 4.0
    assert summary["api"]["completion_tokens"] == 4 * 3


def test_a_wrong_key_is_refused_in_one_line(server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    assert _eval(server, tmp_path / "refused", "bandit", "--n", "1") == 1
    *_, line = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ragen: {server} failed at the first attempt (HTTP 401")
    assert "check the key" in line and not (tmp_path / "refused").exists()
