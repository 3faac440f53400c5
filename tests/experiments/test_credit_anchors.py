"""The credit replay: a GiGPO run's anchor groups and terms read back from its trajectory
records equal what the run logged step by step."""

import pytest
from tests.small import NO_TENSORBOARD, TINY_RL

from experiments.credit_anchors import COLUMNS, main, run_steps
from ragen import config
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

GIGPO = ["algo.estimator=gigpo", "rollout.reward_placement=per_turn", "rollout.max_turns=3"]


def test_the_replay_of_a_gigpo_run_equals_its_logged_metrics(tmp_path, monkeypatch):
    cfg = config.load("sokoban-rl", [*TINY_RL, NO_TENSORBOARD, *GIGPO, "trainer.steps=2"])
    run = RunDir(tmp_path / "gigpo")
    create_run_dir(run.root, cfg)
    RunLoop(Trainer(cfg), run).train()
    logged = read_jsonl(run.metrics).records
    replayed = run_steps(run.root)
    assert len(replayed) == len(logged) == 2
    for step, record in zip(replayed, logged, strict=True):
        assert step == pytest.approx({k: record[k] for k in COLUMNS})
    monkeypatch.setattr("experiments.credit_anchors.RESULTS", tmp_path)
    main([str(run.root), "--name", "t"])
    assert (tmp_path / "credit_anchors_t.json").is_file()


def test_a_directory_without_trajectories_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="not a run directory"):
        main([str(tmp_path)])
