"""Experiments that measure learning and behaviour rather than speed: does a preset learn
(``learn``), how many minutes a whole recipe needs to reach a good policy (``speedrun``), does
a policy carry over to envs it never saw (``generalize``), does a thought read the state it
was written on (``grounding``), and the floors and ceilings a success rate is read against
(``blind_play``, ``lake_ceiling``).

Each module is a command run from the repository root, ``python -m experiments.NAME [--help]``;
it writes ``experiments/results/*.json`` (and, for a training run, a report in its run
directory); a figure a docs page shows is copied into ``docs/``.
"""
