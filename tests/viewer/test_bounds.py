"""The viewer under load: races, FIFOs, huge files, and floods of connections.

Each test copies the real tiny run and plants what a hostile hand could leave there (or
opens what a hostile client could open), then asks the real store, app, export or server.
Every loop is bounded in time or count and stops by itself; sockets stay on loopback.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from ragen.run.jsonl import RunDirError, read_jsonl, to_json_line
from ragen.run.rundir import RunDir
from ragen.viewer import index as index_module
from ragen.viewer import store as store_module
from ragen.viewer.app import create_app
from ragen.viewer.connections import make_server
from ragen.viewer.export import export_data, export_step
from ragen.viewer.files import size_text
from ragen.viewer.index import FileIndex, IndexCache
from ragen.viewer.store import NotFound, RunStore

STEPS = 3  # as the viewer_run fixture trains
SECRET = "SECRET-OUTSIDE-THE-RUN"


def _records(run: Path, step: int) -> list[dict]:
    return read_jsonl(RunDir(run).trajectory_file(step)).records


def _with_reply(record: dict, reply: str, group: int | None = None) -> dict:
    """A copy of a real episode whose every turn replied ``reply``."""
    out = copy.deepcopy(record)
    for turn in out["turns"]:
        turn["reply"] = reply
    if group is not None:
        out["group"] = group
    return out


def _write_step(run: Path, step: int, records: list[dict]) -> Path:
    path = RunDir(run).trajectory_file(step)
    path.write_text("".join(to_json_line(r) + "\n" for r in records), encoding="utf-8")
    return path


# ---------------------------------------------------------------- item 3: the swap race


def test_a_step_file_swapped_for_a_symlink_mid_request_is_never_served(
    viewer_run, copy_run, tmp_path
):
    run = copy_run(viewer_run, tmp_path / "raced")
    real = RunDir(run).trajectory_file(1)
    outside = tmp_path / "outside.jsonl"
    base = _records(run, 1)
    outside.write_text(
        "".join(to_json_line(_with_reply(r, SECRET)) + "\n" for r in base), encoding="utf-8"
    )
    inside_copy = real.with_name(".inside.jsonl")
    inside_copy.write_bytes(real.read_bytes())
    link = real.with_name(".link.jsonl")
    store = RunStore(run)
    stop = threading.Event()

    def swap() -> None:  # alternate the real file and a symlink out, as fast as renames go
        while not stop.is_set():
            link.unlink(missing_ok=True)
            link.symlink_to(outside)
            os.replace(link, real)
            os.link(inside_copy, link)
            os.replace(link, real)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    served, refused, requests = [], 0, 0
    # A check-then-open reader served the secret about once a second: 5 s of racing would
    # miss it in about 1 run of 150 (e**-5).
    deadline = time.monotonic() + 5.0
    try:
        while time.monotonic() < deadline:
            requests += 1
            try:
                answer = json.dumps(store.episode(1, 0)) + json.dumps(
                    store.episodes(1, store_module.EpisodeQuery())
                )
            except NotFound:
                refused += 1
                continue
            if SECRET in answer:
                served.append(requests)
    finally:
        stop.set()
        swapper.join(timeout=5)
    assert served == []
    assert refused > 0 and requests > refused  # both states were seen while racing


# ---------------------------------------------------------------- item 15: FIFOs


def _finishes(fn, seconds: float = 10.0):
    """``fn()``'s result, or AssertionError if it is still running after ``seconds``."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{fn} hung for {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _unblock(fifo: Path) -> None:
    # a reader stuck in open() on a FIFO (the old code) returns once a writer opens it
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_fifos_in_the_run_are_named_not_read(viewer_run, copy_run, tmp_path):
    run = copy_run(viewer_run, tmp_path / "fifos")
    files = RunDir(run)
    fifos = [files.trajectory_file(STEPS), files.metrics, files.config, files.evals]
    for fifo in fifos:
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
    try:
        store = _finishes(lambda: RunStore(run))
        overview = _finishes(store.overview)
        for name in ("metrics.jsonl", "config.yaml", "eval.jsonl"):
            assert (
                f"{name} is not a regular file (a FIFO, device or folder) and is not read"
                in (overview["notices"])
            )
        assert overview["config"] == {}
        with pytest.raises(NotFound, match=r"step_0*3\.jsonl is not a regular file"):
            _finishes(lambda: store.episode(STEPS, 0))
        assert _finishes(lambda: store.episode(1, 0))["record"]["turns"]  # the rest still reads
        with pytest.raises(RunDirError, match="is not a regular file"):
            _finishes(lambda: export_step(run, STEPS, tmp_path / "fifo.html"))
        assert not (tmp_path / "fifo.html").exists()
    finally:
        for fifo in fifos:
            _unblock(fifo)


# ---------------------------------------------------------------- item 16: memory


@pytest.fixture
def long_replies(viewer_run, copy_run, tmp_path):
    """A run whose step 1 holds 40 real episodes with 200,000-character replies (~8 MB per
    turn count), all in group 0."""
    run = copy_run(viewer_run, tmp_path / "long")
    base = _records(run, 1)[0]
    reply = ("abcdefghij" * 20_000)[:200_000]
    records = [_with_reply(base, f"{i:04d}{reply}", group=0) for i in range(40)]
    path = _write_step(run, 1, records)
    return run, path, records


def test_indexing_a_large_file_holds_a_chunk_not_the_file(long_replies, monkeypatch):
    run, path, records = long_replies
    monkeypatch.setattr(index_module, "READ_CHUNK_BYTES", 256 * 1024)
    size = path.stat().st_size
    assert size > 8_000_000
    tracemalloc.start()
    try:
        index = FileIndex(path, run.resolve(), "step").refresh()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index.summaries) == 40 and index.skipped == [] and index.too_long == []
    # the old reader held the whole file and every reply: peak above 2 x 8 MB
    assert peak < 3_000_000, peak
    turns = len(records[0]["turns"])
    search_chars = min(index_module.SEARCH_CHARS, turns * 200_005)
    assert [len(t) for t in index.texts] == [search_chars] * 40
    assert index.nbytes < 40 * (search_chars + 2_000)
    assert index.record(39)["turns"][0]["reply"][:4] == "0039"  # spans still exact


def test_a_line_over_the_bound_is_skipped_and_named(long_replies, monkeypatch):
    run, _, records = long_replies
    monkeypatch.setattr(index_module, "READ_CHUNK_BYTES", 64 * 1024)
    monkeypatch.setattr(index_module, "MAX_LINE_BYTES", 150_000)
    monkeypatch.setattr(store_module, "MAX_LINE_BYTES", 150_000)
    short = _with_reply(records[0], "a short reply", group=1)
    _write_step(run, 1, [short, records[1], short, records[2], short])
    store = RunStore(run)
    page = store.episodes(1, store_module.EpisodeQuery())
    assert page["total"] == 3  # the three short episodes; lines 2 and 4 over the bound
    notice = "trajectories/step_000001.jsonl: 2 lines over 146 KB not shown (line 2, …)"
    assert notice in page["notices"]
    assert [store.episode(1, i)["record"]["turns"][0]["reply"] for i in range(3)] == [
        "a short reply"
    ] * 3


def test_the_index_cache_is_bounded_by_bytes(long_replies):
    run, path, records = long_replies
    one = FileIndex(path, run.resolve(), "x").refresh().nbytes
    for step in range(2, 7):
        _write_step(run, step, records)
    cache = IndexCache(run.resolve(), files=16, max_bytes=int(2.5 * one))
    for step in range(1, 7):
        cache.get(RunDir(run.resolve()).trajectory_file(step))
        assert cache.nbytes <= 2.5 * one
    assert len(cache._items) == 2
    # the index just asked for is kept even when it alone passes the bound
    small = IndexCache(run.resolve(), files=16, max_bytes=one // 2)
    assert small.get(path).summaries and small.nbytes == one


def test_the_over_time_answer_is_bounded(long_replies, monkeypatch):
    run, _, records = long_replies
    for step in (0, 2):
        _write_step(run, step, records)
    monkeypatch.setattr(store_module, "GROUP_RESPONSE_CHARS", 3 * 100_000)
    store = RunStore(run)
    answer = store.group_over_time(0, [0, 1, 2])
    turns = len(records[0]["turns"])
    per_episode = turns * store_module.GROUP_REPLY_CHARS
    for column in answer["columns"]:
        shown = sum(len(r) for e in column["episodes"] for r in e["replies"])
        assert shown == 100_000  # one column's share, spent exactly
        assert len(column["episodes"]) == -(-100_000 // per_episode)
        assert column["omitted"] == 40 - len(column["episodes"])
        assert all(e["cut"] for e in column["episodes"])
    assert len(json.dumps(answer)) < 3 * 100_000 + 200_000


def test_an_export_holds_at_most_its_bound(long_replies):
    run = long_replies[0]
    store = RunStore(run)
    index = store.index(1)
    line = index.spans[0][1] - index.spans[0][0]
    data = export_data(store, 1, max_bytes=5 * line + 10)
    assert len(data["records"]) == len(data["summaries"]) == 5 and data["total"] == 40
    assert (
        f"step_000001.jsonl: this export holds the first 5 of 40 episodes (an export holds at "
        f"most {size_text(5 * line + 10)} of episodes); `ragen view` shows them all"
        in data["notices"]
    )
    assert len(export_data(store, 1, max_bytes=1)["records"]) == 1  # never an empty page


# ---------------------------------------------------------------- item 17: connections


class _Serving:
    """The viewer's own server (connections bounded) in a thread on a free loopback port."""

    def __init__(self, root: Path, **bounds) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        app = create_app(root, allowed_hosts=["127.0.0.1"])
        self.server = make_server(app, "127.0.0.1", self.port, **bounds)
        self.server.config.install_signal_handlers = False  # not the main thread
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Serving:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "no server"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def open(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def get(self, path: str) -> bytes:
        with self.open() as conn:
            conn.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def _read_response(conn: socket.socket) -> bytes:
    """One whole response (headers, then the content-length's bytes of body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def _closed_by_server(conn: socket.socket, seconds: float) -> bool:
    conn.settimeout(seconds)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_and_slow_connections_are_bounded_and_closed(viewer_run, caplog):
    limit, timeout = 16, 1.0
    with _Serving(viewer_run, max_connections=limit, request_timeout_s=timeout) as serving:
        idle = [serving.open() for _ in range(200)]  # never send a byte
        slow = serving.open()
        slow.sendall(b"GET /api/version HTTP/1.1\r\n")  # headers that never end
        time.sleep(0.3)
        assert len(serving.server.server_state.connections) <= limit
        assert _closed_by_server(idle[-1], 0.5)  # past the limit: closed at once
        started = time.monotonic()
        assert _closed_by_server(slow, 5.0)
        assert _closed_by_server(idle[0], 5.0)
        assert time.monotonic() - started < 3 * timeout
        answer = serving.get("/api/version")
        assert answer.startswith(b"HTTP/1.1 200") and b'"version"' in answer
        for conn in [*idle, slow]:
            conn.close()
    loud = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR", "CRITICAL")]
    assert loud == []


def test_a_kept_alive_connection_gets_the_same_bound_for_its_next_request(viewer_run):
    with _Serving(viewer_run, request_timeout_s=1.0) as serving, serving.open() as conn:
        conn.sendall(b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        conn.settimeout(5)
        assert _read_response(conn).startswith(b"HTTP/1.1 200")
        conn.sendall(b"GET /api/version HTTP/1.1\r\n")  # a second request, never finished
        started = time.monotonic()
        assert _closed_by_server(conn, 5.0)
        assert time.monotonic() - started < 3.0
