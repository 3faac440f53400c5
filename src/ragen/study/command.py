"""The ``ragen study`` command: list the shipped studies, plan one, run it, or show where it
stands.

    ragen study list
    ragen study NAME|FILE [--scale cpu|paper] [--seeds K] [--out DIR] [--adopt DIR]
                         [--plan | --status]

The default ``--out`` is fixed by the study and scale (``runs/study-NAME-SCALE``), so running
the same command again after a kill continues the study where it stopped, and ``--status``
with the same arguments reads where it stands (status.py).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ragen.study.spec import (
    DEFAULT_SCALE,
    MAX_SEEDS,
    SCALES,
    SFT,
    check_logged,
    check_planned,
    load_study,
    plan,
    scale_of,
    study_dir,
    study_names,
    study_path,
    summary_line,
)

SUMMARY = "run one of the paper's findings as a study: its runs, one report, a table"
EXIT_FAIL = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", help="a shipped study (`ragen study list`), a .yaml file, or list"
    )
    parser.add_argument(
        "--scale",
        choices=SCALES,
        default=DEFAULT_SCALE,
        help="cpu: the embedded model on this machine (default); paper: the paper's presets",
    )
    parser.add_argument(
        "--seeds", type=_seeds, help="seeds per run (default: the study's, for the scale)"
    )
    parser.add_argument(
        "--out", help="study folder (default: runs/study-NAME-SCALE; the same one resumes)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--plan", action="store_true", help="print the runs' commands and stop; nothing runs"
    )
    mode.add_argument(
        "--status",
        action="store_true",
        help="print each run's state, the time left and the table of the runs done so far; "
        "reads only (safe while the study runs)",
    )
    parser.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each finished run's checkpoints (default: removed, the study reads its logs)",
    )
    mode.add_argument(
        "--adopt",
        metavar="DIR",
        help="first take the finished runs that DIR (a copy of a study folder's RUN/seed-K "
        "logs, without checkpoints) holds as done; the study runs the rest",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="dotted overrides of every run, after the study's (e.g. model.spec=DIR)",
    )


def run(args: argparse.Namespace) -> int:
    """List, plan or run a study. Bad input raises ConfigError or RunDirError (the caller
    prints it and exits 2); a run that fails ends the study with exit status 1; Ctrl-C or
    SIGTERM stops it and its run with 130, saying how to go on."""
    from ragen.run.rundir import RunDir
    from ragen.study.runner import StudyError, command_line, run_all, stopping_on_sigterm

    if args.name == "list":
        return _list()
    study = load_study(args.name)  # every run's config judged before anything runs
    key = study_path(args.name).stem
    seeds = args.seeds or scale_of(study, args.scale).seeds
    out = Path(args.out) if args.out else Path("runs") / f"study-{key}-{args.scale}"
    planned = plan(study, args.scale, seeds, out, tuple(args.overrides))
    if args.overrides:
        # the study's own were judged as it loaded
        evaluated = check_planned(planned, args.scale)
        check_logged(study.metric, evaluated, f"at scale {args.scale} with these overrides")
    if args.status:
        from ragen.study.status import show_status  # the table's modules load only here

        try:
            print(show_status(study, key, args.scale, seeds, planned, out), end="")
        except StudyError as err:
            print(f"ragen: {err}", file=sys.stderr)
            return EXIT_FAIL
        return 0
    if args.plan:
        for p in planned:
            print(shlex.join(["ragen", *command_line(p, resume=False)]))
        warm = sum(p.command == SFT for p in planned)
        also = f" after {warm} warm starts" if warm else ""
        print(f"{len(planned) - warm} runs of {key}{also} at scale {args.scale} in {out}")
        return 0
    RunDir(out).check_writable()  # a full or read-only disk: said before any run starts
    try:
        with stopping_on_sigterm():
            state = run_all(
                planned,
                out,
                study=key,
                scale=args.scale,
                keep_checkpoints=args.keep_checkpoints,
                adopt_from=Path(args.adopt) if args.adopt else None,
            )
    except StudyError as err:
        print(f"ragen: {err}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        where = ["--scale", args.scale, "--seeds", str(seeds), "--out", str(out)]
        kept = ["--keep-checkpoints"] if args.keep_checkpoints else []
        again = shlex.join(["ragen", "study", args.name, *where, *kept, *args.overrides])
        print(f"interrupted; continue with: {again}", file=sys.stderr)
        return 130
    from ragen.study.outputs import write_outputs  # matplotlib loads only now

    written = write_outputs(study, args.scale, planned, state, out)
    for path in written.files:
        print(path)
    print()
    print(written.table, end="")
    return 0


def _list() -> int:
    names = study_names()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {summary_line(study_dir() / f'{name}.yaml')}")
    return 0


def _seeds(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"{text} is not a seed count from 1 to {MAX_SEEDS}")
    return value
