"""A run directory and its files: the layout and its creation (rundir), append-only JSONL and
atomic writes (jsonl), the one-writer lock (lock), and the per-step metrics logger
(metrics_logger)."""
