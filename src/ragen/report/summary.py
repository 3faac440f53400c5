"""A report's summary: a table of every run's success and alert timing (summary.md), and what
happened in words, with the change of success read against its standard error."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ragen import metric_names as names
from ragen.report.curves import logged_keys, series
from ragen.report.paired import agreement, paired_summaries
from ragen.report.runs import RunData
from ragen.run.rundir import BEFORE_TRAINING


@dataclass
class RunSummary:
    """One row of summary.md: the success curve it reads, and the alerts' timing."""

    run: str
    success_of: str
    before: float | None
    """Success of the starting policy: the evaluation before training, or for the train
    rollouts those of step 0 (sampled before its update); None when not measured."""
    peak: float | None
    peak_step: int | None
    final: float | None
    collapse_step: int | None
    warning_step: int | None

    @property
    def lead_time(self) -> int | None:
        """Steps from the first warning to the collapse (None unless the warning came first)."""
        if self.collapse_step is None or self.warning_step is None:
            return None
        lead = self.collapse_step - self.warning_step
        return lead if lead >= 0 else None


def summarize_run(run: RunData) -> list[RunSummary]:
    """One row per evaluated env (before training, peak, final); with no evaluation, one
    row on the train rollouts' success instead; of an evaluation folder, one row per
    summary, its success as the final one."""
    if run.evaluation:
        return [
            RunSummary(run.name, e["env"], None, None, None, e["success"], None, None)
            for e in run.evals
        ]
    keys = fnmatch.filter(logged_keys(run.records), "eval/*/success")
    sources = [(k, k.split("/")[1]) for k in keys] or [(names.SUCCESS, "train rollouts")]
    collapse = next((a.step for a in run.alerts if a.kind == "collapse"), None)
    warning = next((a.step for a in run.alerts if a.kind == "warning"), None)
    rows = []
    for key, label in sources:
        steps, values = series(run.records, key)
        start = BEFORE_TRAINING if key != names.SUCCESS else 0
        best = max(range(len(values)), key=values.__getitem__) if values else None
        rows.append(
            RunSummary(
                run=run.name,
                success_of=label,
                before=values[0] if steps and steps[0] == start else None,
                peak=values[best] if best is not None else None,
                peak_step=steps[best] if best is not None else None,
                final=values[-1] if values and steps[-1] != BEFORE_TRAINING else None,
                collapse_step=collapse,
                warning_step=warning,
            )
        )
    return rows


def _cell(value) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_markdown(runs: Sequence[RunData]) -> str:
    """summary.md: what happened in words, a table of every run's success and alert
    timing, then notes."""
    lines = ["# Run summary", "", *story(runs), ""]
    lines += [
        "| run | success of | before training | peak (step) | final | collapse step "
        "| first warning | lead time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        stages = [run] if run.warm_start is None else [run.warm_start, run]
        for s in (row for stage in stages for row in summarize_run(stage)):
            peak = f"{_cell(s.peak)} ({_cell(s.peak_step)})" if s.peak is not None else "—"
            cells = [s.run, s.success_of, _cell(s.before), peak, _cell(s.final)]
            cells += [_cell(s.collapse_step), _cell(s.warning_step), _cell(s.lead_time)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Before training is the evaluation made before the first update (step -1 in the",
        "plots; `trainer.eval_before=true`), or for the train rollouts those of step 0. Lead",
        "time counts the steps from the first warning to the collapse. Alerts come from each",
        "run's alerts.jsonl, or are replayed from metrics.jsonl through the detector where a",
        "run has none:",
        "",
    ]
    for run in runs:
        if run.evaluation:
            lines.append(
                f"- {run.name}: an evaluation folder (no training, no alerts)" + _memory_note(run)
            )
            continue
        if run.warm_start is not None:
            lines.append(f"- {run.warm_start.name}: the warm start ({_stage_words(run)})")
        torn = f"; {run.skipped_lines} torn line(s) skipped" if run.skipped_lines else ""
        lines.append(
            f"- {run.name}: {run.steps} steps, {len(run.alerts)} alert(s) "
            f"({run.alerts_source}){torn}{_memory_note(run)}"
        )
    return "\n".join(lines) + "\n"


def _memory_note(run: RunData) -> str:
    """The steps and evaluations whose decode batches free memory cut below their plan
    (`perf/memory_cuts`, an evaluation's ``cost``), and the steps whose update it cut to
    smaller micro-batches (`perf/update_memory_cuts`): their figures can differ slightly, at
    float rounding, from a rerun with more memory free, so the run may not repeat exactly."""
    steps = sum(r.get(names.MEMORY_CUTS, 0) > 0 for r in run.records)
    evals = sum(e.get("cost", {}).get("memory_cuts", 0) > 0 for e in run.evals)
    updates = sum(r.get(names.UPDATE_MEMORY_CUTS, 0) > 0 for r in run.records)
    notes = []
    if steps or evals:
        notes.append(
            f"free memory cut the decode batches of {steps} step(s) and {evals} "
            "evaluation(s), whose samples may not repeat exactly"
        )
    if updates:
        notes.append(
            f"free memory cut the update's micro-batches of {updates} step(s), whose "
            "gradients may not repeat exactly"
        )
    return "".join(f"; {note}" for note in notes)


SIGNIFICANT_Z = 2.0
"""A change of success counts as beyond the noise at two standard errors of the difference."""


def difference_z(before: dict, after: dict) -> float:
    """The change of success from ``before`` to ``after`` (evaluation summaries with
    ``success`` and ``episodes``) in standard errors of the difference of two proportions;
    infinite when both are certain (0 or 1) and differ."""
    p, q = before["success"], after["success"]
    var = p * (1 - p) / before["episodes"] + q * (1 - q) / after["episodes"]
    if var == 0:
        return 0.0 if p == q else math.copysign(math.inf, q - p)
    return (q - p) / math.sqrt(var)


def _verdict(z: float) -> str:
    if z >= SIGNIFICANT_Z:
        return "a gain beyond the noise"
    if z <= -SIGNIFICANT_Z:
        return "a loss beyond the noise"
    return f"within the noise (under {SIGNIFICANT_Z:g} standard errors)"


def _counted(summary: dict) -> bool:
    episodes = summary.get("episodes")
    return isinstance(episodes, int) and not isinstance(episodes, bool) and episodes > 0


def _eval_story(run: RunData) -> list[str]:
    """A sentence per evaluated env: the starting policy (`_starting_eval`) against the
    last evaluation."""
    out = []
    for env in dict.fromkeys(e["env"] for e in run.evals):
        mine = [e for e in run.evals if e["env"] == env]
        before, since = _starting_eval(run, env)
        after = next((e for e in reversed(mine) if e["step"] != BEFORE_TRAINING), None)
        if after is None:
            continue
        final = f"{after['success']:.1%} after step {after['step']}"
        if before is None:
            out.append(
                f"{env}: {final}; no evaluation before training to set it beside "
                "(trainer.eval_before=true makes one)."
            )
            continue
        change = f"{env}: {before['success']:.1%} {since}, {final}"
        if not (_counted(before) and _counted(after)):
            out.append(f"{change}.")
            continue
        points = 100 * (after["success"] - before["success"])
        paired = paired_summaries([before], [after])
        if paired is not None:
            z = paired.z
            read = (
                f"{z:+.1f} SE level by level on {paired.levels} levels: {paired.gained} "
                f"gained, {paired.lost} lost"
            )
        else:
            z = difference_z(before, after)
            sizes = {before["episodes"], after["episodes"]}
            episodes = f"{sizes.pop()} episodes" if len(sizes) == 1 else "episodes"
            read = f"{z:+.1f} SE on {episodes}"
        out.append(f"{change} ({points:+.1f} points, {read}): {_verdict(z)}.")
    return out


def _starting_eval(run: RunData, env: str) -> tuple[dict | None, str]:
    """The evaluation on ``env`` of the policy ``run`` started from, and its words: the one
    before training; without it, its warm start's last (the same policy, on the same seeds,
    as the same config evaluates them); None if neither."""
    mine = [e for e in run.evals if e["env"] == env and e["step"] == BEFORE_TRAINING]
    if mine:
        return mine[-1], "before training"
    if run.warm_start is not None:
        warm = [e for e in run.warm_start.evals if e["env"] == env]
        if warm and warm[-1]["step"] != BEFORE_TRAINING:
            return warm[-1], "after the warm start"
    return None, "before training"


def _alert_story(run: RunData) -> str:
    warnings = [a for a in run.alerts if a.kind == "warning"]
    collapse = next((a for a in run.alerts if a.kind == "collapse"), None)
    if collapse is None and not warnings:
        return "The collapse monitor raised no alert."
    said = []
    if warnings:
        first = warnings[0]
        said.append(f"warned first at step {first.step} ({first.signal}: {first.message})")
    if collapse is not None:
        said.append(
            f"saw a collapse at step {collapse.step} ({collapse.signal}: {collapse.message})"
        )
    return f"The collapse monitor {' and '.join(said)}."


def story(runs: Sequence[RunData]) -> list[str]:
    """What happened in each run, in words: success before and after training with its
    standard error, and what the collapse monitor saw; of evaluation folders, their success
    and, against the first one, on how many levels they agree."""
    lines = []
    for run in runs:
        if run.evaluation:
            head = f"{run.name}: " if len(runs) > 1 else ""
            lines.append(head + " ".join(_evaluation_story(e) for e in run.evals))
            continue
        head = f"{run.name} ({run.steps} steps): " if len(runs) > 1 else ""
        told = _eval_story(run) or [_row_story(row) for row in summarize_run(run)]
        if run.warm_start is not None:
            told.insert(0, _warm_start_story(run))
        lines.append(head + " ".join([*filter(None, told), _alert_story(run)]))
    evaluations = [run for run in runs if run.evaluation]
    for other in evaluations[1:]:
        lines += _agreement_story(evaluations[0], other)
    return lines


def _stage_words(run: RunData) -> str:
    """The warm start of ``run`` in a few words: its steps (and minutes, from stage.json)."""
    assert run.warm_start is not None
    stage = run.warm_start.stage
    minutes = f" in {stage['minutes']:.1f} min" if stage is not None else ""
    return f"{run.warm_start.steps} steps of ragen sft{minutes}"


def _warm_start_story(run: RunData) -> str:
    """The warm start ``run`` began with, in a sentence: its steps and minutes, its loss at
    the first and last step, and its last evaluation of each env."""
    assert run.warm_start is not None
    warm = run.warm_start
    said = [f"Warm start ({warm.name}): {_stage_words(run)}"]
    _, losses = series(warm.records, names.SFT_LOSS)
    if losses:
        said.append(f"loss {losses[0]:.3f} → {losses[-1]:.3f} per reply token")
    last = {e["env"]: e for e in warm.evals if e["step"] != BEFORE_TRAINING}
    if last:
        shown = ", ".join(f"{env} {e['success']:.1%}" for env, e in last.items())
        said.append(f"then {shown} at its last evaluation")
    return "; ".join(said) + ". RL started from its last checkpoint."


def _evaluation_story(summary: dict) -> str:
    """One evaluation's success, of what, by which model (over an API: where, unprefixed)."""
    played = f" of {summary['episodes']} episodes" if _counted(summary) else ""
    model = summary.get("model")
    by = f" by {model}" if isinstance(model, str) else ""
    api = summary.get("api")
    if isinstance(api, dict) and isinstance(api.get("base_url"), str):
        by += f" over the API at {api['base_url']} (no reply prefix)"
    return f"{summary['env']}: success {summary['success']:.1%}{played}{by}."


def _agreement_story(first: RunData, other: RunData) -> list[str]:
    """A sentence per env both evaluated on the same levels: how many levels they agree on."""
    out = []
    for mine in other.evals:
        theirs = next((e for e in reversed(first.evals) if e["env"] == mine["env"]), None)
        agreed = agreement(theirs, mine) if theirs is not None else None
        if theirs is None or agreed is None:
            continue
        same, levels = agreed
        paired = paired_summaries([theirs], [mine])
        change = (
            f"; {paired.gained} gained, {paired.lost} lost ({paired.z:+.1f} SE level by level)"
            if paired is not None
            else ""
        )
        out.append(
            f"{other.name} against {first.name} on {mine['env']}: they agree on the success "
            f"of {same} of {levels} levels{change}."
        )
    return out


def _row_story(row: RunSummary) -> str:
    """A run without eval.jsonl summaries (no episode counts): the curve's ends only."""
    if row.final is None:
        return ""
    start = "" if row.before is None else f"{row.before:.1%} at the start, "
    return f"{row.success_of} success: {start}{row.final:.1%} at the end."
