"""What a run shows: the run directory and its logs (logging), step metrics (metrics),
template-collapse scoring (template), the online collapse detector (collapse), plots and
summaries (report), and the monitor/report commands (commands)."""
