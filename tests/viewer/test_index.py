"""The byte-offset index of a trajectories file: incremental, cached, tolerant of bad lines."""

from __future__ import annotations

import json
import os

import pytest

from ragen.run.jsonl import append_jsonl, read_jsonl, rewrite_jsonl
from ragen.run.rundir import RunDir
from ragen.viewer import index as index_module
from ragen.viewer.index import EpisodeSummary, FileIndex, IndexCache


def _index(path):
    """The index of ``path``, a file of the test's own folder (its run directory here)."""
    return FileIndex(path, path.parent, path.name).refresh()


@pytest.fixture(scope="module")
def records(viewer_run):
    return read_jsonl(RunDir(viewer_run).trajectory_file(0)).records


def test_index_matches_the_file(records, tmp_path):
    path = tmp_path / "step.jsonl"
    append_jsonl(path, records)
    index = _index(path)
    assert len(index.summaries) == len(records) and not index.skipped and not index.torn_tail
    assert [index.record(i) for i in range(len(records))] == records
    assert index.by_group == {g: [2 * g, 2 * g + 1] for g in range(4)}
    assert index.envs == {"sokoban": len(records)}
    assert index.texts[1] == records[1]["turns"][0]["reply"].lower()


def test_appended_lines_are_read_alone(records, tmp_path, monkeypatch):
    path = tmp_path / "step.jsonl"
    append_jsonl(path, records[:3])
    index = _index(path)
    parsed = []
    real_loads = index_module.loads
    monkeypatch.setattr(index_module, "loads", lambda b: parsed.append(b) or real_loads(b))
    index.refresh()
    assert parsed == []  # unchanged file: nothing read
    append_jsonl(path, records[3:])
    index.refresh()
    assert len(parsed) == len(records) - 3
    assert [index.record(i) for i in range(len(records))] == records


def test_a_line_being_written_is_indexed_once_complete(records, tmp_path):
    path = tmp_path / "step.jsonl"
    append_jsonl(path, records[:1])
    line = json.dumps(records[1])
    with open(path, "a") as fh:
        fh.write(line[:20])
    index = _index(path)
    assert len(index.summaries) == 1 and index.torn_tail
    with open(path, "a") as fh:
        fh.write(line[20:] + "\n")
    index.refresh()
    assert len(index.summaries) == 2 and not index.torn_tail
    assert index.record(1) == records[1]


def test_replaced_or_shrunk_files_are_indexed_again(records, tmp_path):
    path = tmp_path / "step.jsonl"
    append_jsonl(path, records)
    index = _index(path)
    rewrite_jsonl(path, records[:2])  # what a resume does: a new file under the old name
    index.refresh()
    assert [index.record(i) for i in range(2)] == records[:2] and len(index.summaries) == 2
    os.remove(path)
    assert not index.refresh().exists and index.summaries == []


def test_bad_lines_are_skipped_and_numbered(records, tmp_path):
    path = tmp_path / "step.jsonl"
    good = json.dumps(records[0]).encode()
    nan = json.dumps({**records[0], "total_reward": float("nan")}).encode()  # Python writes NaN
    lines = [good, b"not json", b"[1, 2]", b"", nan, b'{"env": "\xff\xfe"}']
    path.write_bytes(b"\n".join(lines) + b"\n")
    index = _index(path)
    assert index.skipped == [2, 3, 6]  # not JSON, not an object, not UTF-8
    assert len(index.summaries) == 2
    # NaN is not JSON a browser can read: it is served as null
    assert index.record(1)["total_reward"] is None and index.summaries[1].reward is None


def test_summary_survives_records_of_the_wrong_shape():
    odd = {"env": 3, "group": "x", "turns": [None, {"reply": 5, "actions": "Up"}], "success": 1}
    summary = EpisodeSummary.from_record(0, odd)
    assert (summary.env, summary.group, summary.turns, summary.actions) == ("", -1, 1, 0)
    assert summary.success is False and summary.preview == "" and summary.reward is None
    assert json.dumps(summary.to_json())


def test_cache_keeps_the_most_recent_files(records, tmp_path):
    cache = IndexCache(tmp_path, files=2)
    paths = []
    for n in range(3):
        paths.append(tmp_path / f"step_{n}.jsonl")
        append_jsonl(paths[-1], records)
    first = cache.get(paths[0])
    assert cache.get(paths[0]) is first
    cache.get(paths[1])
    cache.get(paths[2])
    assert cache.get(paths[0]) is not first  # evicted, indexed again
    assert len(cache.get(paths[0]).summaries) == len(records)
