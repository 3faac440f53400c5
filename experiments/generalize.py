"""Does a trained policy carry over to envs it never saw? The paper's Table 4 on this CPU.

    python -m experiments.generalize sokoban --model RUN/checkpoints/step_N [overrides ...]

Evaluates the base model and a trained checkpoint on the envs of the paper's Table 4 for the
family the checkpoint was trained on (Sokoban: sokoban, sokoban-newvocab, sokoban-large,
frozen-lake; Bandit: bandit, bandit-rev), each env with its own preset's rollout settings
(for Sokoban's and FrozenLake's envs ``sokoban-rl`` and ``frozen-lake-rl``: RAGEN's five
turns with two worked turns), as ``ragen eval --env ENV --preset PRESET`` runs it, on
``--n`` fixed seeds at ``--temperature``. The
overrides apply to every env (``env.options.spaced=true`` draws every grid the way a policy
trained on spaced rooms saw them), except ``env.eval_options.ENV.KEY=VALUE``, which sets an
option of env ENV alone, as in a training run's evaluation
(``env.eval_options.frozen-lake.random_ends=true``: RAGEN's lakes).

Prints success per env beside the paper's 0.5B number, with the trained-minus-base change in
standard errors; writes ``experiments/results/generalize_<NAME>.json`` and
``docs/generalize-<NAME>.png``. Each evaluation is kept as it ends in
``--out/<base|trained>/<env>/`` (a folder ``ragen view`` opens, plus ``result.json`` with the
fingerprint of its conditions): a run stopped half-way, or rerun with ``--only``, measures
only what is missing, and refuses an evaluation kept under other conditions (ragen's source
may differ: each row records the digest it was measured with, ``source_sha256``).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.learn import (
    change,
    differing,
    eval_fingerprint,
    is_result_name,
    machine_record,
    shown_change,
)
from ragen import config, models
from ragen.host import threads
from ragen.rollout.engines import make_generator
from ragen.run.jsonl import write_atomic
from ragen.train.evaluator import EvalRequest, evaluate, format_summary, write_eval
from ragen.train.preflight import check_references
from ragen.train.setup import resolve_device

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).parent.parent / "docs"
RESULT_FILE = "result.json"
SOURCE = "source_sha256"  # the fingerprint's digest of ragen's source
MODELS = ("base", "trained")

# The paper's Table 4: success (%) of its RL-trained 0.5B model, by the env it was trained on
# (the first of each row) and the env it was evaluated on.
PAPER_TABLE4 = {
    "bandit": {"bandit": 100.00, "bandit-rev": 67.58},
    "sokoban": {
        "sokoban": 21.48,
        "sokoban-newvocab": 18.75,
        "sokoban-large": 2.34,
        "frozen-lake": 19.92,
    },
}


EVAL_OPTIONS = "env.eval_options."


def eval_option(override: str) -> tuple[str, str] | None:
    """(ENV, "KEY=V") of an ``env.eval_options.ENV.KEY=V`` override; None for any other."""
    if not override.startswith(EVAL_OPTIONS):
        return None
    name, dot, rest = override.removeprefix(EVAL_OPTIONS).partition(".")
    if not dot or "=" in name:
        raise config.ConfigError(
            f"config: {override!r}: give one option, {EVAL_OPTIONS}ENV.KEY=VALUE"
        )
    return name, rest


def env_overrides(env: str, overrides: list[str]) -> list[str]:
    """``overrides`` as they apply to ``env``: ``env.eval_options.ENV.KEY=V`` becomes
    ``env.options.KEY=V`` for that env and is dropped for the others."""
    own = []
    for override in overrides:
        option = eval_option(override)
        if option is None:
            own.append(override)
        elif option[0] == env:
            own.append(f"env.options.{option[1]}")
    return own


RL_ALONE = {"frozen-lake": "frozen-lake-rl", "sokoban": "sokoban-rl"}
"""The game presets whose CPU preset is a warm-started recipe (no worked turns, offsets
written out), and the preset of RL alone the table plays their envs with instead: the envs
as RAGEN shows them, five turns with two worked turns."""


def env_config(env: str, spec: str, overrides: list[str]) -> config.Config:
    """The config ``ragen eval --env ENV --preset PRESET --model SPEC`` would run with
    ``overrides``, PRESET the env's own (RL_ALONE's for Sokoban and FrozenLake)."""
    preset = config.preset_for_env(env)
    if preset in RL_ALONE:
        preset = RL_ALONE[preset]
    own = env_overrides(env, overrides)
    loaded = config.load(preset, [*own, f"env.name={env}", f"model.spec={json.dumps(spec)}"])
    return check_references(loaded)


def kept(folder: Path, fingerprint: dict) -> dict | None:
    """The summary kept in ``folder`` if measured under ``fingerprint``; None if none is kept.
    ragen's source may have changed since (a table is often measured over several sessions):
    the summary then carries the digest it was measured with, ``source_sha256``. Raises
    SystemExit naming what differs when one was measured under other conditions."""
    file = folder / RESULT_FILE
    if not file.is_file():
        return None
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
        summary, theirs = saved["summary"], saved["fingerprint"]
        differ = differing(fingerprint, theirs, ignore=(SOURCE,))
        if not isinstance(summary.get("success"), float | int):
            raise TypeError("its summary lacks a numeric success")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise SystemExit(
            f"{file} is unreadable ({err}): delete {folder} to measure it again"
        ) from None
    if differ:
        raise SystemExit(
            f"{file} was measured under other conditions (differs in: {', '.join(differ)}): "
            f"give another --out, or delete {folder} to measure it again"
        )
    return {**summary, SOURCE: theirs.get(SOURCE)}


def measure(label: str, spec: str, envs: list[str], args: argparse.Namespace) -> dict[str, dict]:
    """Summary per env of model ``spec``: kept ones read back, the rest of ``args.envs`` (all
    when None) evaluated (the model is loaded only if one is missing) and kept as each ends."""
    summaries, missing = {}, []
    for env in envs:
        cfg = env_config(env, spec, args.overrides)
        fingerprint = eval_fingerprint(cfg, args.n, args.temperature)
        folder = args.out / label / env
        summary = kept(folder, fingerprint)
        if summary is None and env in (args.envs or envs):
            missing.append((env, cfg, fingerprint, folder))
        elif summary is not None:
            summaries[env] = summary
            print(f"{label} {env}: kept in {folder} (success {summary['success']:.2%})")
    if not missing:
        return summaries
    first = missing[0][1]
    device = str(resolve_device(first.trainer.device))
    model, tokenizer = models.load_policy(
        spec, dtype=first.model.dtype, device=device, allow_download=first.model.allow_download
    )
    generator = make_generator(
        first.rollout.backend, model, tokenizer, attention=first.model.attention
    )
    for env, cfg, fingerprint, folder in missing:
        print(f"{label} ({spec}) on {env}: {args.n} seeds, T={args.temperature}")
        request = EvalRequest(env=env, n=args.n, temperature=args.temperature)
        with threads.computing_with(cfg.trainer.threads):
            summary, trajectories = evaluate(generator, tokenizer, cfg, request, progress=True)
        write_eval(folder, summary, trajectories, spec, request.in_config(cfg))
        saved = {"fingerprint": fingerprint, "summary": summary}
        write_atomic(folder / RESULT_FILE, json.dumps(saved, indent=2) + "\n")
        print(format_summary(env, summary))
        summaries[env] = {**summary, SOURCE: fingerprint[SOURCE]}
    return summaries


def plot(rows: dict[str, dict], n: int, title: str, path: Path) -> None:
    """Success per env: base and trained with ±1 standard error, the paper's number beside."""
    fig = Figure(figsize=(1.9 * len(rows) + 2, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.27
    for i, (label, color) in enumerate((("base", "#9e9e9e"), ("trained", "#1f77b4"))):
        xs, ys, errs = [], [], []
        for j, row in enumerate(rows.values()):
            if row[label] is not None:
                p = row[label]["success"]
                xs.append(j + (i - 1) * width)
                ys.append(100 * p)
                errs.append(100 * (p * (1 - p) / n) ** 0.5)
        ax.bar(xs, ys, width, yerr=errs, capsize=3, color=color, label=f"{label} (ours, ±1 SE)")
    paper = [(j + width, row["paper"]) for j, row in enumerate(rows.values()) if row["paper"]]
    ax.bar(
        [x for x, _ in paper],
        [y for _, y in paper],
        width,
        color="white",
        edgecolor="#d62728",
        hatch="//",
        label="paper, 0.5B RL",
    )
    ax.set_xticks(range(len(rows)), list(rows))
    ax.set_ylabel(f"success (%), {n} seeds")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(PAPER_TABLE4), help="what the model trained on")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, for every env")
    parser.add_argument("--model", required=True, help="the trained checkpoint (model spec)")
    parser.add_argument("--base", help="the model it started from (default: the preset's)")
    parser.add_argument("--n", type=int, default=256, help="fixed seeds per env")
    parser.add_argument("--temperature", type=float, default=0.5, help="evaluation temperature")
    parser.add_argument("--only", choices=MODELS, help="measure one model now, the other later")
    parser.add_argument(
        "--envs",
        nargs="+",
        metavar="ENV",
        help="measure these envs of the table now (default: all)",
    )
    parser.add_argument("--name", help="result name (default: FAMILY)")
    parser.add_argument("--out", type=Path, help="where evaluations are kept")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    args.name = args.name or args.family
    if not is_result_name(args.name):
        parser.error(f"--name takes letters, digits, - and _ only; got {args.name!r}")
    if args.n < 1 or args.temperature < 0:
        parser.error("--n must be >= 1 and --temperature >= 0")
    args.out = args.out or Path(f"runs/generalize-{args.name}")
    envs = list(PAPER_TABLE4[args.family])
    if args.envs and set(args.envs) - set(envs):
        parser.error(f"--envs: the {args.family} table has {', '.join(envs)}")
    try:  # every env's config is checked before any model loads
        args.base = args.base or config.load(config.preset_for_env(envs[0])).model.spec
        for env in envs:
            env_config(env, args.model, args.overrides)
        named = {option[0] for o in args.overrides if (option := eval_option(o))}
        if named - set(envs):
            raise config.ConfigError(
                f"config: env.eval_options names {', '.join(sorted(named - set(envs)))}, "
                f"not an env of the {args.family} table ({', '.join(envs)})"
            )
    except config.ConfigError as err:
        parser.error(str(err))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    envs = list(PAPER_TABLE4[args.family])
    started = time.perf_counter()
    specs = {"base": args.base, "trained": args.model}
    measured = {
        label: measure(label, spec, envs, args) if args.only in (None, label) else {}
        for label, spec in specs.items()
    }
    rows = {}
    for env in envs:
        base, trained = measured["base"].get(env), measured["trained"].get(env)
        both = base is not None and trained is not None
        rows[env] = {
            "paper": PAPER_TABLE4[args.family][env],
            "base": base,
            "trained": trained,
            "change": change(base["success"], trained["success"], args.n) if both else None,
        }
    print(f"\n{'env':<18}{'paper':>8}{'base':>9}{'trained':>9}   (success, {args.n} seeds)")
    for env, row in rows.items():
        shown = [f"{row[k]['success']:>9.2%}" if row[k] else f"{'—':>9}" for k in MODELS]
        moved = f"   {shown_change(row['change'])}" if row["change"] else ""
        print(f"{env:<18}{row['paper']:>7.2f}%" + "".join(shown) + moved)

    digests = {row[k][SOURCE] for row in rows.values() for k in MODELS if row[k]}
    if len(digests) > 1:
        print(f"note: measured with {len(digests)} versions of ragen's source ({SOURCE} per row)")
    command = [args.family, *args.overrides, f"--model {args.model}", f"--base {args.base}"]
    command += [f"--n {args.n}", f"--temperature {args.temperature:g}", f"--name {args.name}"]
    command += [f"--out {args.out}"] + ([f"--only {args.only}"] if args.only else [])
    command += [f"--envs {' '.join(args.envs)}"] if args.envs else []
    result = {
        "command": "python -m experiments.generalize " + " ".join(command),
        "family": args.family,
        "models": specs,
        "eval_seeds": args.n,
        "eval_temperature": args.temperature,
        "envs": rows,
        "seconds": round(time.perf_counter() - started, 1),
        "out": str(args.out),
        "machine": machine_record(),
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"generalize_{args.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    figure = DOCS / f"generalize-{args.name}.png"
    title = f"trained on {args.family}: {args.model}"
    plot(rows, args.n, title, figure)
    print(f"wrote {path} and {figure}")


if __name__ == "__main__":
    main()
