"""Studies: each finding of the paper as one command (`ragen study NAME`).

spec.py reads and judges study files (the shipped ones are in ragen/studies/), runner.py runs
their `ragen train` runs one after the other and resumes a killed study, table.py sets each
run's end figure beside the paper's and judges the expected comparisons, aligned.py draws the
signals around each collapse, outputs.py writes the report, table and figures, command.py is
the command line.
"""
