"""What a run shows: metrics, logs, the run directory (and later collapse warnings, reports)."""
