"""A small real HTTP server that speaks the chat-completions protocol, for the tests of the
API client and loop: it listens on a free loopback port, records every request (headers and
JSON body) and answers each with what the test's ``answer(body, number)`` returns: a status,
a JSON body and extra headers. The client under test talks to it over real sockets."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = tuple[int, dict, dict]  # status, JSON body, extra headers


def completion(text: str, finish: str = "stop", prompt_tokens: int = 0, completion_tokens: int = 0):
    """A chat-completions response body holding one reply."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "test",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def error(status: int, message: str) -> Answer:
    return status, {"error": {"message": message, "type": "test", "code": status}}, {}


@dataclass
class ChatServer:
    url: str
    requests: list[tuple[dict, dict]] = field(default_factory=list)
    """(headers with lower-case names, JSON body) of every request, in arrival order."""


@contextmanager
def chat_server(answer: Callable[[dict, int], Answer]) -> Iterator[ChatServer]:
    """Serve ``answer(body, n)`` (n: the request's number from 0) at ``ChatServer.url``
    (ends in /v1) until the block ends."""
    lock = threading.Lock()
    server_state = ChatServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            with lock:
                number = len(server_state.requests)
                server_state.requests.append(
                    ({k.lower(): v for k, v in self.headers.items()}, body)
                )
            status, payload, headers = answer(body, number)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # the test's output stays clean
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_state.url = f"http://127.0.0.1:{httpd.server_port}/v1"
    # shutdown() waits for the serving loop to look up: every 10 ms, not the default 0.5 s
    serve = partial(httpd.serve_forever, poll_interval=0.01)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server_state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
