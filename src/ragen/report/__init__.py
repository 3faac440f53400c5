"""Reports of one or more runs: what is read from a run directory (runs), the curves and
their data (curves), the matplotlib figures (figures), summary.md and the story in words
(summary), paired comparisons of evaluations (paired), writing it all (write), and the
``ragen report`` command (command)."""
