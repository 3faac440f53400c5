"""The ``ragen monitor`` command: replay a run's metrics through the collapse detector.

``cli.py`` adds it as a subcommand::

    p = _command(commands, "monitor", SUMMARY)
    add_arguments(p)
    p.set_defaults(func=run)

It returns an exit status: 0 done, 2 for input the user must fix (the message, on stderr,
says what to do).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ragen.config import ConfigError
from ragen.monitor.collapse import replay
from ragen.monitor.settings import detector_settings
from ragen.run.jsonl import RunDirError, read_jsonl
from ragen.run.rundir import RunDir, check_metrics

SUMMARY = "replay a run's metrics through the collapse detector and print its alerts"
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
    """Replay RUN_DIR/metrics.jsonl (torn lines skipped) and print one line per alert."""
    run_dir = RunDir(Path(args.run_dir))
    try:
        check_metrics(run_dir)
        monitor, source = detector_settings(run_dir, args.overrides)
        read = read_jsonl(run_dir.metrics)
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
