"""The ``ragen monitor`` and ``ragen report`` commands: arguments and what they run.

``cli.py`` adds them as subcommands::

    p = _command(commands, "monitor", MONITOR_SUMMARY)
    add_monitor_arguments(p)
    p.set_defaults(func=run_monitor)

Both return an exit status: 0 done, 2 for input the user must fix (the message, on stderr,
says what to do).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from ragen.config import ConfigError
from ragen.monitor.collapse import detector_settings, replay
from ragen.monitor.jsonl import RunDirError, read_jsonl
from ragen.monitor.rundir import RunDir, check_metrics

MONITOR_SUMMARY = "replay a run's metrics through the collapse detector and print its alerts"
REPORT_SUMMARY = "plot one or more runs (PNG) and summarise success and collapse timing"
EXIT_USAGE = 2


def add_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (finished or running)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="detector settings over the run's own, e.g. std_drop=0.4 or monitor.warmup_steps=5",
    )
    parser.add_argument(
        "--json", action="store_true", help="print each alert as a JSON object, one per line"
    )


def run_monitor(args: argparse.Namespace) -> int:
    """Replay RUN_DIR/metrics.jsonl (torn lines skipped) and print one line per alert."""
    run = RunDir(Path(args.run_dir))
    try:
        check_metrics(run)
        monitor, source = detector_settings(run, args.overrides)
        read = read_jsonl(run.metrics)
    except (ConfigError, RunDirError) as err:
        print(f"ragen: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"detector: {source}", file=sys.stderr)
    records = [r for r in read.records if isinstance(r.get("step"), int)]
    alerts = replay(records, monitor)
    for alert in alerts:
        print(json.dumps(alert.to_record()) if args.json else alert.line())
    torn = f", {len(read.skipped)} unreadable line(s) skipped" if read.skipped else ""
    print(f"{len(alerts)} alert(s) in {len(records)} steps{torn}", file=sys.stderr)
    return 0


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
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


def run_report(args: argparse.Namespace) -> int:
    """Write the PNG plots and summary.md; print the paths, then what happened in words."""
    from ragen.monitor.report import write_report  # matplotlib loads only for this command

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
