"""The collapse detector's settings for a replay of a finished or running run: the run's own
``monitor:`` section of config.yaml, with ``key=value`` overrides over it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from ragen import config
from ragen.config import MonitorConfig
from ragen.run.rundir import RunDir


def monitor_config_from_file(path: str | Path, overrides: Sequence[str] = ()) -> MonitorConfig:
    """The ``monitor:`` section of a run's config.yaml (defaults where absent or no file),
    with ``key=value`` overrides (``std_drop=0.4`` or ``monitor.std_drop=0.4``).

    Raises ConfigError naming the key when a value is unknown, mistyped or out of range, or
    an override sets another section of the config.
    """
    sections = {f.name for f in fields(config.Config)} - {"monitor"}
    for override in overrides:
        head = override.split("=", 1)[0].split(".", 1)[0]
        if head in sections:
            raise config.ConfigError(
                f"monitor: {override!r} sets the {head} section; a replay takes only the "
                "collapse detector's settings (std_drop=0.4, or monitor.std_drop=0.4)"
            )
    path = Path(path)
    data = config.read_yaml(path) if path.is_file() else {}
    section = data.get("monitor")
    dotted = [o if o.startswith("monitor.") else f"monitor.{o}" for o in overrides]
    section = config.apply_overrides({"monitor": section or {}}, dotted)["monitor"]
    return config.build_schema(MonitorConfig, section, "monitor.")


def detector_settings(run: RunDir, overrides: Sequence[str] = ()) -> tuple[MonitorConfig, str]:
    """The collapse detector's settings for ``run`` and where they came from, in words: a
    replay with other settings than the run's own finds other alerts, so say which."""
    monitor = monitor_config_from_file(run.config, overrides)  # ConfigError in one line
    if run.config.is_file():
        source = f"settings from {run.config}"
    else:
        source = f"default settings: {run.root} has no config.yaml"
    return monitor, " + ".join([source, *overrides])
