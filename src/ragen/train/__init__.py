"""Training: the StarPO step (trainer.py) and the supervised one (sft.py), built by setup.py
and driven by the run loop (loop.py), which checkpoints (checkpoint.py), resumes (resume.py)
and evaluates (evaluator.py)."""
