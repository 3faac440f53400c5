"""Watching a run for collapse: step metrics (metrics), template-collapse scoring (template),
the online collapse detector and its rules (collapse), its settings for a replay (settings),
and the ``ragen monitor`` command (command)."""
