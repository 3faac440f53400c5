"""The training side: evaluation runs now; the StarPO trainer joins it."""
