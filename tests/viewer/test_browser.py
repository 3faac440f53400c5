"""The page in a real browser: Debian's chromium driven by Playwright (marked `browser`).

Run with `make test-browser` (or `pytest -m browser tests/viewer`). Set
RAGEN_SCREENSHOT_DIR=docs to also save the README's screenshot (viewer.png) there.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from ragen.run.jsonl import read_jsonl, to_json_line
from ragen.run.metrics_logger import MetricsLogger
from ragen.run.rundir import RunDir
from ragen.viewer.app import create_app
from ragen.viewer.connections import make_server
from ragen.viewer.export import export_step

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
STEPS = 3  # as the viewer_run fixture trains
TIMEOUT_MS = 10_000


class Server:
    """uvicorn serving one run directory from a thread, on a free loopback port."""

    def __init__(self, root: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        app = create_app(root, allowed_hosts=["127.0.0.1", "localhost"])
        self.server = make_server(app, "127.0.0.1", self.port)  # as `ragen view` serves
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the viewer's server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def url(self, route: str = "", poll_ms: int | None = None) -> str:
        query = f"?poll={poll_ms}" if poll_ms else ""
        return f"http://127.0.0.1:{self.port}/{query}#/{route}"


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install it with `sudo apt-get install -y chromium`")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: `make install` (it is in the dev extra)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield chromium
        chromium.close()


class Watched:
    """A page whose console, dialogs and page errors are recorded."""

    def __init__(self, browser) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.set_default_timeout(TIMEOUT_MS)
        self.console: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.console.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def pwned(self) -> bool:
        """A payload ran, or tried to: a handler blocked by the Content-Security-Policy
        still means model text was parsed as markup, so it counts."""
        flag = self.page.evaluate("() => window.__pwned")
        said = any("pwned" in line or "Content Security Policy" in line for line in self.console)
        return flag is not None or said or bool(self.dialogs)


@pytest.fixture
def watched(browser):
    page = Watched(browser)
    yield page
    page.page.close()


@pytest.fixture(scope="module")
def server(viewer_run):
    with Server(viewer_run) as running:
        yield running


@pytest.fixture(scope="module")
def hostile_server(planted_run):
    with Server(planted_run) as running:
        yield running


def _screenshot(page, name: str) -> None:
    folder = os.environ.get("RAGEN_SCREENSHOT_DIR")
    if folder:
        page.screenshot(path=str(Path(folder) / name))


def test_step_list_loads_for_a_tiny_model_run(server, watched, viewer_run):
    page = watched.page
    page.goto(server.url())
    rows = page.locator("#steps-table tbody tr")
    rows.first.wait_for()
    assert rows.count() == STEPS
    assert page.locator("#run-name").text_content() == viewer_run.name
    assert "env sokoban" in page.locator("#run-config").text_content()
    assert page.locator("svg.chart polyline:not([class*='term-'])").count() == 3
    # the gradient reporter's step 2: grpo's task gradient is 0 on the tiny model (every
    # episode scores the same), so the entropy term alone is drawn, at bucket_1 and all
    card = page.locator("#gradient-buckets")
    assert "step 2" in card.locator("figcaption").text_content()
    assert card.locator(".legend span").all_text_contents() == ["entropy"]
    assert card.locator("circle.dot").count() == 2
    assert "bucket_1 · entropy" in card.locator("circle.dot title").first.text_content()
    assert not watched.errors


def test_alerts_are_marked_on_the_charts_and_steps(hostile_server, watched, planted):
    page = watched.page
    page.goto(hostile_server.url())
    page.locator("#steps-table tbody tr").first.wait_for()
    assert page.locator("svg.chart .alert-mark").count() == 3  # one per chart
    badge = page.locator(f"#steps-table tr[data-step='{planted.alert['step']}'] .badge")
    assert badge.inner_text() == "collapse"
    assert planted.alert["message"] in badge.get_attribute("title")
    assert not watched.errors


def test_a_known_reply_shows_its_think_text(server, watched, viewer_run):
    records = read_jsonl(RunDir(viewer_run).trajectory_file(1)).records
    turn = records[2]["turns"][0]
    page = watched.page
    page.goto(server.url("step/1?ep=2"))
    think = page.locator("#dialogue .think").first
    think.wait_for()
    assert think.inner_text() == turn["think"]
    assert page.locator("#dialogue pre.grid").first.inner_text() == turn["observation"]
    for problem in turn["problems"]:
        assert page.locator("#dialogue .chip.problem", has_text=problem).count() == 1
    assert page.locator(".card.selected").get_attribute("data-index") == "2"
    _screenshot(page, "viewer.png")
    assert not watched.errors


def test_planted_payloads_show_as_text_and_run_nothing(hostile_server, watched, planted):
    page = watched.page
    step = STEPS - 1
    page.goto(hostile_server.url(f"step/{step}"))
    page.locator("#matched").wait_for()
    card = page.locator(".card.ok")  # the planted episode is the only success
    card.click()
    think = page.locator("#dialogue .think")
    think.wait_for()
    time.sleep(0.3)  # any onerror handler of a planted <img> would have fired by now
    assert not watched.pwned()
    assert "<script>" in think.inner_text()
    page.locator("#dialogue details.raw summary").click()
    assert page.locator("#dialogue details.raw pre").inner_text() == planted.reply
    assert page.locator("#dialogue .chip.action").inner_text().startswith("<svg onload=")
    page.select_option("#f-env", planted.env)  # the env name is a payload too
    page.wait_for_function("() => document.querySelectorAll('.card').length === 1")
    assert page.locator("#dialogue dd", has_text="onerror").count() == 1
    # the notices of the broken and torn lines are shown, and the page still works
    notices = page.locator("#notices").inner_text()
    assert "broken line skipped" in notices and "last line is incomplete" in notices
    assert page.locator("script").count() == 1  # only the viewer's own
    assert page.locator("#main img, #main svg[onload], #main a[href^='javascript']").count() == 0
    time.sleep(0.3)  # any onerror handler of a planted <img> would have fired by now
    assert not watched.pwned()
    assert not watched.errors


def test_filters_narrow_the_step_view(hostile_server, watched, planted):
    page = watched.page
    page.goto(hostile_server.url(f"step/{STEPS - 1}"))
    cards = page.locator(".card")
    page.wait_for_function("() => document.querySelectorAll('.card').length === 9")
    page.select_option("#f-success", "false")
    page.wait_for_function("() => document.querySelectorAll('.card').length === 8")
    assert page.locator(".card.ok").count() == 0
    page.select_option("#f-success", "")
    page.select_option("#f-end", "terminated")
    page.wait_for_function("() => document.querySelectorAll('.card').length === 1")
    page.select_option("#f-end", "")
    # Wait for the unfiltered view first: otherwise the one card left by the end filter
    # would satisfy the wait below before the debounced text search re-renders.
    page.wait_for_function("() => document.querySelectorAll('.card').length === 9")
    page.fill("#f-q", "ONERROR")
    page.wait_for_function(
        "() => document.querySelector('#matched').textContent.startsWith('1 of 9 episodes match')"
    )
    assert page.locator(".card").count() == 1
    assert "q=ONERROR" in page.url
    page.fill("#f-q", "no reply says this")
    page.wait_for_function("() => document.querySelectorAll('.card').length === 0")
    assert cards.count() == 0 and not watched.pwned()


def test_same_group_over_time_shows_each_steps_replies(server, watched, viewer_run):
    page = watched.page
    page.goto(server.url("step/0"))
    page.locator(".group .over-time").nth(1).click()  # group 1
    columns = page.locator("#columns .column")
    columns.first.wait_for()
    assert columns.count() == STEPS
    for step in range(STEPS):
        records = [
            r
            for r in read_jsonl(RunDir(viewer_run).trajectory_file(step)).records
            if r["group"] == 1
        ]
        replies = columns.nth(step).locator("pre.reply")
        assert replies.all_inner_texts() == [r["turns"][0]["reply"] for r in records]
    page.fill("#group-steps", "0,2")
    page.click("text=show")
    page.wait_for_function("() => document.querySelectorAll('#columns .column').length === 2")
    assert "steps=0%2C2" in page.url or "steps=0,2" in page.url
    assert not watched.errors


def test_a_live_run_shows_new_steps_without_reload(viewer_run, copy_run, tmp_path, watched):
    run = copy_run(viewer_run, tmp_path / "live")
    with Server(run) as live:
        page = watched.page
        page.goto(live.url(poll_ms=300))
        page.wait_for_function(
            f"() => document.querySelectorAll('#steps-table tr[data-step]').length === {STEPS}"
        )
        episodes = read_jsonl(RunDir(run).trajectory_file(0)).records
        with MetricsLogger(RunDir(run), tensorboard=False) as log:
            log.log(STEPS, {"rollout/success": 0.5, "rollout/reward_mean": 1.0})
            log.log_episodes(STEPS, episodes)
        page.locator(f"#steps-table tr[data-step='{STEPS}'] a").wait_for()
        page.locator(f"#steps-table tr[data-step='{STEPS}'] a").click()
        page.wait_for_function(
            f"() => document.querySelectorAll('.card').length === {len(episodes)}"
        )
    assert not watched.errors


def test_exported_file_works_offline_and_runs_no_payload(planted_run, tmp_path, watched, planted):
    out = tmp_path / "step.html"
    export_step(planted_run, STEPS - 1, out)
    page = watched.page
    page.goto(out.as_uri() + f"#/step/{STEPS - 1}")
    page.wait_for_function("() => document.querySelectorAll('.card').length === 9")
    page.locator(".card.ok").click()
    page.locator("#dialogue .think").wait_for()
    assert "<script>" in page.locator("#dialogue .think").inner_text()
    page.select_option("#f-success", "false")
    page.wait_for_function("() => document.querySelectorAll('.card').length === 8")
    page.goto(out.as_uri() + "#/")
    page.locator("#steps-table tbody tr").first.wait_for()
    assert page.locator("svg.chart polyline:not([class*='term-'])").count() == 3
    assert page.locator("#gradient-buckets circle.dot").count() == 2
    time.sleep(0.3)
    assert not watched.pwned()
    assert not watched.errors


EXAMPLES = "the instructions (with worked examples)"


def test_each_turn_says_what_a_windowed_context_showed(viewer_run, copy_run, tmp_path, watched):
    """A real episode of the run, rewritten as three turns played with a window of 2 turns
    (limited_multi_turn) and as single_turn: each turn names what its context showed; an
    episode of the full window shows no such line."""
    run = copy_run(viewer_run, tmp_path / "windowed")
    path = RunDir(run).trajectory_file(1)
    records = read_jsonl(path).records
    windowed = []
    for window in ("limited_multi_turn", "single_turn"):
        record = {**records[0], "context_window": window}
        record["turns"] = [{**records[0]["turns"][0], "first_shown": n} for n in (1, 1, 2)]
        windowed.append(record)
    path.write_text("".join(to_json_line(r) + "\n" for r in [*windowed, *records[1:]]))
    want = {  # the run's sokoban-rl preset shows 2 worked examples after the rules
        0: [
            f"{EXAMPLES} and this turn only",
            f"{EXAMPLES}, then turns 1–2 as a chat",
            f"{EXAMPLES}, then turns 2–3 as a chat",
        ],
        1: [
            f"{EXAMPLES} and this turn's state only",
            f"{EXAMPLES}, turn 1 summarised, then this turn's state",
            f"{EXAMPLES}, turn 2 summarised, then this turn's state",
        ],
    }
    from playwright.sync_api import expect

    with Server(run) as server:
        page = watched.page
        saw = page.locator("#dialogue .field", has_text="model saw").locator(".value")
        # Only the hash changes between episodes, so the page re-renders without a reload:
        # `expect` waits for the new episode's lines instead of reading the old one's.
        for ep, lines in want.items():
            page.goto(server.url(f"step/1?ep={ep}"))
            expect(saw).to_have_text(lines, timeout=TIMEOUT_MS)
        page.goto(server.url("step/1?ep=2"))
        selected = page.locator(".card.selected")
        expect(selected).to_have_attribute("data-index", "2", timeout=TIMEOUT_MS)
        page.locator("#dialogue .turn").first.wait_for()
        expect(saw).to_have_count(0, timeout=TIMEOUT_MS)
    # a run without worked examples (rollout.demos: 0): its windows open with the rules alone
    config = RunDir(run).config
    config.write_text(config.read_text().replace("demos: 2", "demos: 0"))
    with Server(run) as server:
        watched.page.goto(server.url("step/1?ep=0"))
        plain = [line.replace(EXAMPLES, "the instructions") for line in want[0]]
        expect(saw).to_have_text(plain, timeout=TIMEOUT_MS)
    assert not watched.errors
