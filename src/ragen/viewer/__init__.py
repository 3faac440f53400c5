"""A local web page over a run directory: steps, rollouts and dialogues, read from the files.

The viewer only reads: ``index`` keeps a byte-offset index of each trajectories JSONL file,
``store`` answers the page's questions from the run directory, ``app`` serves them with
FastAPI, ``export`` writes one step as a self-contained HTML file, and ``command`` is the
``ragen view`` entry point. The page itself (``static/``) is plain HTML, CSS and JavaScript.
"""
