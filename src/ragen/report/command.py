"""The ``ragen report`` command: plot one or more runs and summarise them.

``cli.py`` adds it as a subcommand::

    p = _command(commands, "report", SUMMARY)
    add_arguments(p)
    p.set_defaults(func=run)

It returns an exit status: 0 done, 2 for input the user must fix (the message, on stderr,
says what to do).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from ragen.config import ConfigError
from ragen.run.jsonl import RunDirError

SUMMARY = "plot one or more runs (PNG) and summarise success and collapse timing"
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, overlaid in the plots"
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="output folder (default: RUN_DIR/report for one run, runs/report-TIME for several)",
    )
    parser.add_argument(
        "--smoothing",
        type=_unit_interval,
        default=0.1,
        help="EMA weight of one step in the solid curves (1 = no smoothing; default 0.1)",
    )
    parser.add_argument(
        "--replay",
        nargs="*",
        metavar="KEY=VALUE",
        help="recompute every run's alerts with these detector settings over its own "
        "(alerts.jsonl ignored), e.g. --replay ema_alpha=0.5 warmup_steps=3",
    )


def run(args: argparse.Namespace) -> int:
    """Write the PNG plots and summary.md; print the paths, then what happened in words."""
    from ragen.report.write import write_report  # matplotlib loads only for this command

    if args.out:
        out = Path(args.out)
    elif len(args.run_dirs) == 1:
        out = Path(args.run_dirs[0]) / "report"
    else:
        out = Path("runs") / f"report-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    try:
        written = write_report(args.run_dirs, out, alpha=args.smoothing, replay_with=args.replay)
    except (ConfigError, RunDirError) as err:
        print(f"ragen: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        print(f"ragen: cannot write the report to {out} ({err.strerror or err})", file=sys.stderr)
        return EXIT_USAGE
    for path in written.files:
        print(path)
    print()
    print("\n".join(written.story))
    return 0


def _unit_interval(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 1]")
    return value
