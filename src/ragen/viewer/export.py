"""One step of a run as a single self-contained HTML file, for sharing.

The file holds the page's own CSS and JavaScript inline, the run's step list (for the
charts) and every episode of the step as JSON in a ``<script type="application/json">``
block, which browsers never execute. Inside that block every ``<``, ``>`` and ``&`` is
written as a JSON escape, so no reply can close the block. The file's
Content-Security-Policy admits exactly the two inline blocks by their SHA-256 hashes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from ragen.run.jsonl import RunDirError, write_atomic
from ragen.viewer.app import static_text
from ragen.viewer.files import size_text
from ragen.viewer.store import EVAL, NotFound, RunStore, StepKey, file_notices

EXPORT_BYTES = 64 * 2**20
"""Episode bytes (as stored in the step file) one export holds: a page that big still opens;
the episodes after it are left out and the page and the command say how many."""

_STYLE_LINK = '<link rel="stylesheet" href="/static/viewer.css">'
_SCRIPT_TAG = '<script src="/static/viewer.js"></script>'
_ICON_LINK = '<link rel="icon" href="/static/favicon.svg">\n'


def default_step(store: RunStore) -> StepKey:
    """The latest training step with episodes, else the evaluation episodes."""
    steps = store.episode_steps()
    if steps:
        return steps[-1]
    if store.has_eval_episodes():
        return EVAL
    raise RunDirError(
        f"{store.run.root} has no trajectories to export (trajectories/step_*.jsonl): "
        "train with logging.save_trajectories=true"
    )


def export_data(store: RunStore, step: StepKey, max_bytes: int = EXPORT_BYTES) -> dict:
    """What the exported page shows: the run overview and the step's full episodes, as many
    as fit in ``max_bytes`` of the step file (the first ones, at least one)."""
    try:
        index = store.index(step)
    except NotFound as err:
        raise RunDirError(f"cannot export: {err}") from err
    kept, size = 0, 0
    for start, stop in index.spans:
        size += stop - start
        if kept and size > max_bytes:
            break
        kept += 1
    try:
        records = [index.record(i) for i in range(kept)]
    except ValueError as err:  # the file was replaced while being exported
        raise RunDirError(f"cannot export step {step}: {err}; try again") from err
    name = str(store.trajectory_path(step).name)
    notices = file_notices(index, name)
    total = len(index.summaries)
    if kept < total:
        notices.append(
            f"{name}: this export holds the first {kept} of {total} episodes (an export "
            f"holds at most {size_text(max_bytes)} of episodes); `ragen view` shows them all"
        )
    return {
        "run": store.overview(),
        "step": step,
        "summaries": [s.to_json() for s in index.summaries[:kept]],
        "records": records,
        "total": total,
        "notices": notices,
    }


def json_for_html(data: object) -> str:
    """JSON that cannot end the <script> element holding it (nor open a comment)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # "<", ">" and "&" occur in JSON only inside strings, where "\u003c" means the same.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def render_export(data: dict) -> str:
    """The page with the CSS, the JS and ``data`` inlined, under a hash-based CSP."""
    css, js = static_text("viewer.css"), static_text("viewer.js")
    if "</style" in css.lower() or "</script" in js.lower():
        raise RuntimeError("viewer static files must not contain closing style/script tags")
    csp = (
        f"default-src 'none'; script-src '{_sha256(js)}'; style-src '{_sha256(css)}'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    page = static_text("index.html")
    replacements = {
        _ICON_LINK: "",
        '<meta charset="utf-8">': (
            f'<meta charset="utf-8">\n<meta http-equiv="Content-Security-Policy" content="{csp}">'
        ),
        _STYLE_LINK: f"<style>{css}</style>",
        _SCRIPT_TAG: (
            f'<script type="application/json" id="ragen-data">{json_for_html(data)}</script>\n'
            f"<script>{js}</script>"
        ),
    }
    for old, new in replacements.items():
        if page.count(old) != 1:
            raise RuntimeError(f"index.html no longer holds {old!r} exactly once")
        page = page.replace(old, new)
    return page


def export_step(
    root: str | Path, step: StepKey | None, out: str | Path
) -> tuple[StepKey, int, int]:
    """Write step ``step`` (None: the latest) of run ``root`` to ``out``; returns the step,
    the number of episodes written and the step's number of episodes. The page is written
    aside and renamed over ``out``, so a failed export leaves an existing ``out`` as it was."""
    store = RunStore(root)
    chosen = default_step(store) if step is None else step
    data = export_data(store, chosen)
    out = Path(out)
    if out.is_dir():
        raise RunDirError(f"--export {out} is a folder: name a file, e.g. {out / 'step.html'}")
    if not out.parent.is_dir():
        raise RunDirError(f"--export {out}: folder {out.parent} does not exist; create it first")
    page = render_export(data)
    try:
        write_atomic(out, page)
    except OSError as err:
        raise RunDirError(
            f"cannot write --export {out} ({err.strerror or err}); nothing was changed: "
            "free space, or name a file in a folder you can write"
        ) from err
    return chosen, len(data["records"]), data["total"]
