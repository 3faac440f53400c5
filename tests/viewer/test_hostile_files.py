"""A run directory someone else made: symlinks out of it, and lines no page can show.

Each test copies the real tiny run and plants what a careless or hostile hand could leave
there, then asks the real app (and the export) for everything.
"""

from __future__ import annotations

import itertools
import json
import os

import pytest
from fastapi.testclient import TestClient

from ragen.cli import main
from ragen.run.jsonl import RunDirError, read_jsonl, to_json_line
from ragen.run.rundir import RunDir
from ragen.viewer.app import create_app
from ragen.viewer.export import export_step

STEPS = 3  # as the viewer_run fixture trains
SECRET = "SECRET-OUTSIDE-THE-RUN"
# Lines json.loads accepts but no page or file can carry, one per kind; each is a real
# episode with one field changed, so only the planted value makes it unusable.
UNUSABLE = {
    "lone surrogate": ('"reply":"', '"reply":"\\ud800'),
    "number past a float": ('"total_reward":', '"total_reward":1e999,"was":'),
    "int past the digit limit": ('"seed":', '"seed":' + "7" * 5000 + ',"was":'),
}


def _episode_line(run, step: int) -> str:
    return to_json_line(read_jsonl(RunDir(run).trajectory_file(step)).records[0])


def _every_response(client: TestClient, steps) -> str:
    """The text of every page the viewer serves for ``steps``, asserting each is a 200."""
    texts = []
    for url in ["/api/run", *(f"/api/steps/{s}/episodes?limit=500" for s in steps)]:
        response = client.get(url)
        assert response.status_code == 200, url
        texts.append(response.text)
    for step in steps:
        for item in client.get(f"/api/steps/{step}/episodes?limit=500").json()["items"]:
            response = client.get(f"/api/steps/{step}/episodes/{item['index']}")
            assert response.status_code == 200, (step, item)
            texts.append(response.text)
    return "\n".join(texts)


def test_files_linking_outside_the_run_are_never_read(viewer_run, copy_run, tmp_path, capsys):
    run = copy_run(viewer_run, tmp_path / "linked")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = _episode_line(run, 1).replace('"reply":"', f'"reply":"{SECRET}', 1)
    (elsewhere / "episodes.jsonl").write_text(planted + "\n", encoding="utf-8")
    (elsewhere / "metrics.jsonl").write_text('{"step": 1, "secret": 1}\n', encoding="utf-8")
    (elsewhere / "config.yaml").write_text(f"env: {{name: {SECRET}}}\n", encoding="utf-8")
    files = RunDir(run)
    step_file = files.trajectory_file(1)
    step_file.unlink()
    step_file.symlink_to(elsewhere / "episodes.jsonl")
    (files.trajectories / "eval.jsonl").symlink_to(elsewhere / "episodes.jsonl")
    for name in ("metrics.jsonl", "config.yaml"):
        (run / name).unlink()
        (run / name).symlink_to(elsewhere / name)

    client = TestClient(create_app(run))
    overview = client.get("/api/run").json()
    assert {
        "metrics.jsonl links outside the run directory and is not read",
        "config.yaml links outside the run directory and is not read",
        "trajectories/step_000001.jsonl links outside the run directory and is not read",
    } <= set(overview["notices"])
    assert [s["step"] for s in overview["steps"] if s["episodes"]] == [0, 2]
    assert overview["eval_episodes"] is False and overview["config"] == {}
    for url in ("/api/steps/1/episodes", "/api/steps/1/episodes/0", "/api/steps/eval/episodes"):
        response = client.get(url)
        assert response.status_code == 404 and "links outside" in response.json()["detail"]
    assert client.get("/api/groups/0?steps=0,1,2").json()["available"] == [0, 2]
    assert SECRET not in _every_response(client, [0, 2])

    with pytest.raises(RunDirError, match=r"step_000001\.jsonl links outside the run directory"):
        export_step(run, 1, tmp_path / "step1.html")
    assert main(["view", str(run), "--export", str(tmp_path / "latest.html")]) == 0
    assert SECRET not in (tmp_path / "latest.html").read_text(encoding="utf-8")
    capsys.readouterr()

    # the whole trajectories folder linked elsewhere: nothing in it is read
    os.rename(files.trajectories, elsewhere / "trajectories")
    files.trajectories.symlink_to(elsewhere / "trajectories")
    overview = client.get("/api/run").json()
    assert "trajectories links outside the run directory and is not read" in overview["notices"]
    assert not any(s["episodes"] for s in overview["steps"])
    assert client.get("/api/steps/0/episodes").status_code == 404


def test_unusable_lines_are_skipped_like_torn_ones(viewer_run, copy_run, tmp_path):
    run = copy_run(viewer_run, tmp_path / "unusable")
    files = RunDir(run)
    line = _episode_line(run, STEPS - 1)
    before = len(read_jsonl(files.trajectory_file(STEPS - 1)).records)
    with open(files.trajectory_file(STEPS - 1), "a", encoding="utf-8") as fh:
        for old, new in UNUSABLE.values():
            assert old in line
            fh.write(line.replace(old, new, 1) + "\n")
    with open(files.metrics, "a", encoding="utf-8") as fh:
        fh.write('{"step": 9, "rollout/success": ' + "9" * 5000 + "}\n")
        fh.write('{"step": 9, "rollout/success": 1e999}\n')

    client = TestClient(create_app(run))
    text = _every_response(client, range(STEPS))
    overview = client.get("/api/run").json()
    metrics_lines = len(files.metrics.read_text().splitlines())
    assert (
        f"metrics.jsonl: 2 broken lines skipped (line {metrics_lines - 1}, {metrics_lines})"
        in (overview["notices"])
    )
    assert [s["step"] for s in overview["steps"]] == list(range(STEPS))
    page = client.get(f"/api/steps/{STEPS - 1}/episodes").json()
    assert page["total"] == before
    assert page["notices"] == [
        f"trajectories/step_{STEPS - 1:06d}.jsonl: 3 broken lines skipped "
        f"(line {before + 1}, {before + 2}, {before + 3})"
    ]
    assert "\\ud800" not in text

    out = tmp_path / "step.html"
    assert export_step(run, None, out) == (STEPS - 1, before, before)
    assert "broken lines skipped" in out.read_text(encoding="utf-8")


def test_a_folder_where_a_log_should_be_is_a_notice(viewer_run, copy_run, tmp_path):
    run = copy_run(viewer_run, tmp_path / "folder")
    RunDir(run).metrics.unlink()
    RunDir(run).metrics.mkdir()
    client = TestClient(create_app(run))
    overview = client.get("/api/run").json()
    notice = "metrics.jsonl is not a regular file (a FIFO, device or folder) and is not read"
    assert notice in overview["notices"]
    assert [s["step"] for s in overview["steps"]] == list(range(STEPS))  # from trajectories
    out = tmp_path / "step.html"
    export_step(run, 0, out)
    data = json.loads(
        out.read_text(encoding="utf-8").split('id="ragen-data">')[1].split("</script>")[0]
    )
    assert len(data["records"]) == len(read_jsonl(RunDir(run).trajectory_file(0)).records)


def test_a_config_that_expands_past_the_bounds_is_a_notice(viewer_run, copy_run, tmp_path):
    # Nine levels of nine aliases: 9**9 values once expanded, from 400 bytes of YAML.
    laughs = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    laughs += [f"{n}: &{n} [{','.join(['*' + p] * 9)}]" for p, n in itertools.pairwise("abcdefghi")]
    run = copy_run(viewer_run, tmp_path / "laughs")
    RunDir(run).config.write_text("\n".join(laughs) + "\n", encoding="utf-8")
    overview = TestClient(create_app(run)).get("/api/run").json()
    assert "config.yaml could not be read; the run's settings are not shown" in overview["notices"]
