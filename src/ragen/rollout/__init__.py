"""Multi-turn rollouts: generation backends, the episode loop and token trajectories."""
