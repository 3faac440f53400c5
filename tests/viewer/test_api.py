"""The viewer's HTTP API over a real tiny-model run, through FastAPI's TestClient."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from ragen.run.jsonl import append_jsonl, read_jsonl, to_json_line
from ragen.run.metrics_logger import MetricsLogger
from ragen.run.rundir import RunDir
from ragen.viewer.app import CSP, create_app
from ragen.viewer.store import MAX_BUCKETS, RunStore


@pytest.fixture(scope="module")
def client(viewer_run):
    return TestClient(create_app(viewer_run))


STEPS = 3  # as the viewer_run fixture trains


@pytest.fixture(scope="module")
def hostile(planted_run):
    return TestClient(create_app(planted_run))


def _records(run, step):
    return read_jsonl(RunDir(run).trajectory_file(step)).records


def test_run_overview_lists_every_step_with_its_metrics(client, viewer_run):
    body = client.get("/api/run").json()
    assert body["name"] == viewer_run.name
    assert body["config"]["env"] == "sokoban" and body["config"]["model"] == "tiny"
    assert body["config"]["demos"] == "2"  # what a windowed turn's context opens with
    metrics = read_jsonl(RunDir(viewer_run).metrics).records
    assert [s["step"] for s in body["steps"]] == list(range(STEPS))
    for row, record in zip(body["steps"], metrics, strict=True):
        assert row["episodes"] is True
        for key in ("rollout/success", "rollout/reward_mean", "rollout/reward_std"):
            assert row[key] == pytest.approx(record[key])
    assert body["alerts"] == [] and body["notices"] == []
    assert "unclosed_think" in body["problems"]


def test_the_overview_carries_the_last_gradient_analysis(client, viewer_run):
    body = client.get("/api/run").json()
    analysed = [r for r in read_jsonl(RunDir(viewer_run).metrics).records if r["step"] == 2]
    [record] = analysed
    # one group kept (filter_ratio 0.25): one bucket, and all; grpo has no critic or KL
    assert body["gradients"]["step"] == 2
    buckets = dict(body["gradients"]["buckets"])
    assert list(buckets) == ["bucket_1", "all"]
    for bucket, numbers in buckets.items():
        assert set(numbers) == {"task", "entropy", "rows", "tokens", "reward_std_min",
                                "reward_std_max"}  # fmt: skip
        for quantity, value in numbers.items():
            assert value == pytest.approx(record[f"grad_norm/{bucket}/{quantity}"])
    assert buckets["all"]["rows"] == 2 and buckets["all"]["entropy"] > 0


def test_gradient_buckets_are_sent_in_order_and_bounded(tmp_path):
    run = RunDir(tmp_path / "hand")
    record = {"step": 4, "grad_norm/all/task": 1.0, "grad_norm/bad": 2.0}
    record |= {f"grad_norm/bucket_{k}/task": float(k) for k in (10, 2, 1)}
    append_jsonl(run.metrics, [record, {"step": 5, "rollout/success": 0.5}])
    gradients = RunStore(run.root).overview()["gradients"]
    assert gradients == {
        "step": 4,
        "buckets": [[f"bucket_{k}", {"task": float(k)}] for k in (1, 2, 10)]
        + [["all", {"task": 1.0}]],
    }
    many = {f"grad_norm/b{k}/task": 1.0 for k in range(MAX_BUCKETS + 5)}
    run.metrics.write_text(to_json_line({"step": 0, **many}) + "\n", encoding="utf-8")
    assert len(RunStore(run.root).overview()["gradients"]["buckets"]) == MAX_BUCKETS
    run.metrics.write_text(to_json_line({"step": 0}) + "\n", encoding="utf-8")
    assert RunStore(run.root).overview()["gradients"] is None


def test_step_page_lists_the_files_episodes_in_order(client, viewer_run):
    records = _records(viewer_run, 1)
    body = client.get("/api/steps/1/episodes").json()
    assert body["total"] == body["matched"] == len(records) == 8
    assert body["groups"] == 4 and body["envs"] == {"sokoban": 8}
    for item, record in zip(body["items"], records, strict=True):
        assert (item["group"], item["copy"], item["seed"]) == (
            record["group"],
            record["copy"],
            record["seed"],
        )
        assert item["reward"] == pytest.approx(record["total_reward"])
        assert item["end"] == record["end"] and item["success"] == record["success"]
        assert item["preview"] == record["turns"][0]["reply"][:160]


def test_pagination_is_done_by_the_server(client):
    first = client.get("/api/steps/0/episodes?limit=3").json()
    second = client.get("/api/steps/0/episodes?limit=3&offset=3").json()
    assert [i["index"] for i in first["items"]] == [0, 1, 2]
    assert [i["index"] for i in second["items"]] == [3, 4, 5]
    assert first["matched"] == 8
    assert client.get("/api/steps/0/episodes?limit=100000").status_code == 422


def test_one_episode_is_the_full_record(client, viewer_run):
    records = _records(viewer_run, 2)
    body = client.get("/api/steps/2/episodes/5").json()
    assert body["record"] == records[5]
    assert body["summary"]["index"] == 5 and body["count"] == 8


def test_filters_and_search(hostile, planted, planted_run):
    real = _records(planted_run, 0)  # step 0 is untouched
    step = STEPS - 1
    every = hostile.get(f"/api/steps/{step}/episodes").json()
    assert every["total"] == 9  # 8 real + the planted one; broken lines skipped
    assert set(every["envs"]) == {"sokoban", planted.env}
    wins = hostile.get(f"/api/steps/{step}/episodes?success=true").json()
    assert wins["matched"] == 1 and wins["items"][0]["env"] == planted.env
    losses = hostile.get(f"/api/steps/{step}/episodes?success=false").json()
    assert losses["matched"] == 8
    env = hostile.get(f"/api/steps/{step}/episodes", params={"env": "sokoban"}).json()
    assert env["matched"] == 8
    end = hostile.get(f"/api/steps/{step}/episodes?end=terminated").json()
    assert end["matched"] == 1
    found = hostile.get(f"/api/steps/{step}/episodes", params={"q": "ONERROR"}).json()
    assert found["matched"] == 1 and found["items"][0]["preview"] == planted.reply[:160]
    word = real[3]["turns"][0]["reply"].split()[-1]
    hits = hostile.get("/api/steps/0/episodes", params={"q": word}).json()
    assert 3 in [i["index"] for i in hits["items"]]
    group = hostile.get("/api/steps/0/episodes?group=2").json()
    assert [i["group"] for i in group["items"]] == [2, 2]


def test_broken_and_torn_lines_are_skipped_with_a_notice(hostile):
    body = hostile.get(f"/api/steps/{STEPS - 1}/episodes").json()
    notices = " ".join(body["notices"])
    assert "1 broken line skipped (line 9)" in notices
    assert "last line is incomplete" in notices


def test_alerts_are_served(hostile, planted):
    assert hostile.get("/api/run").json()["alerts"] == [planted.alert]


def test_group_over_time_puts_one_group_of_each_step_side_by_side(client, viewer_run):
    body = client.get("/api/groups/1").json()
    assert body["available"] == list(range(STEPS))
    assert [c["step"] for c in body["columns"]] == list(range(STEPS))
    for column in body["columns"]:
        records = [r for r in _records(viewer_run, column["step"]) if r["group"] == 1]
        assert [e["replies"] for e in column["episodes"]] == [
            [t["reply"] for t in r["turns"]] for r in records
        ]
        assert column["seeds"] == sorted({r["seed"] for r in records})
        assert 1 <= column["distinct"] <= len(records)
    chosen = client.get("/api/groups/1?steps=2,0,99").json()["columns"]
    assert [c["step"] for c in chosen] == [0, 2, 99] and chosen[2]["missing"] is True


@pytest.mark.parametrize(
    "path",
    [
        "/api/steps/-1/episodes",
        "/api/steps/1e3/episodes",
        "/api/steps/%2e%2e/episodes",
        "/api/steps/..%2f..%2fconfig.yaml/episodes",
        "/api/steps/0x1/episodes",
        "/api/steps/1234567890/episodes",
        "/api/steps/%D9%A1/episodes",  # an Arabic-Indic digit: str.isdigit would take it
        "/api/groups/0?steps=../config",
    ],
)
def test_bad_step_values_are_refused(client, path):
    response = client.get(path)
    assert response.status_code in (400, 404, 422), response.text
    assert "sokoban" not in response.text  # nothing of the run leaks into the error


@pytest.mark.parametrize(
    "path", ["/static/..%2fapp.py", "/static/index.html", "/static/../store.py", "/config.yaml"]
)
def test_only_the_pages_own_files_are_served(client, path):
    assert client.get(path).status_code == 404


def test_missing_steps_and_episodes_say_what_exists(client):
    missing = client.get("/api/steps/7/episodes")
    assert missing.status_code == 404 and "from 0 to 2" in missing.json()["detail"]
    assert client.get("/api/steps/0/episodes/8").status_code == 404
    assert client.get("/api/steps/0/episodes/-1").status_code == 404
    assert client.get("/api/steps/eval/episodes").status_code == 404


def test_every_response_carries_a_strict_csp(client):
    for path in ("/", "/static/viewer.js", "/api/run", "/api/steps/x/episodes"):
        headers = client.get(path).headers
        assert headers["content-security-policy"] == CSP, path
        assert headers["x-content-type-options"] == "nosniff"
    assert "unsafe" not in CSP and "script-src 'self'" in CSP
    assert client.get("/api/run").headers["cache-control"] == "no-store"


def test_loopback_server_refuses_other_host_names(viewer_run):
    guarded = TestClient(create_app(viewer_run, allowed_hosts=["127.0.0.1", "localhost", "::1"]))
    assert guarded.get("/", headers={"host": "127.0.0.1:8765"}).status_code == 200
    assert guarded.get("/", headers={"host": "[::1]:8765"}).status_code == 200
    assert guarded.get("/api/run", headers={"host": "evil.example:8765"}).status_code == 400


def test_new_steps_appear_without_a_restart(viewer_run, copy_run, tmp_path):
    run = copy_run(viewer_run, tmp_path / "live")
    client = TestClient(create_app(run))
    before = client.get("/api/run").json()
    assert client.get("/api/version").json()["version"] == before["version"]
    episodes = _records(run, STEPS - 1)
    with MetricsLogger(RunDir(run), tensorboard=False) as log:
        log.log(STEPS, {"rollout/success": 0.5, "rollout/reward_mean": 1.0})
        log.log_episodes(STEPS, episodes)
    after = client.get("/api/run").json()
    assert after["version"] != before["version"]
    assert after["steps"][-1]["step"] == STEPS and after["steps"][-1]["rollout/success"] == 0.5
    assert client.get(f"/api/steps/{STEPS}/episodes").json()["total"] == len(episodes)
    with MetricsLogger(RunDir(run), tensorboard=False) as log:
        log.log_episodes(STEPS, episodes[:2])  # the same step's file grows
    assert client.get(f"/api/steps/{STEPS}/episodes").json()["total"] == len(episodes) + 2


def test_evaluation_episodes_are_served_under_eval(viewer_run, copy_run, tmp_path):
    run = copy_run(viewer_run, tmp_path / "with-eval")
    trajectories = RunDir(run).trajectories
    (trajectories / "eval.jsonl").write_bytes((trajectories / "step_000000.jsonl").read_bytes())
    client = TestClient(create_app(run))
    assert client.get("/api/run").json()["eval_episodes"] is True
    body = client.get("/api/steps/eval/episodes").json()
    assert body["step"] == "eval" and body["total"] == 8
    assert client.get("/api/steps/eval/episodes/7").json()["record"] == _records(run, 0)[7]
    assert client.get("/api/groups/0?steps=eval").status_code == 400
