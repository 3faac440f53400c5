"""benchmarks/baseline.py: a measurement run in a fresh process against a worktree of a
commit, and the work counts that must not depend on the baseline's ragen."""

import subprocess
from argparse import Namespace

import pytest
import torch

from benchmarks import baseline, measure
from ragen.train.update import UpdateData, mini_batch_rows


def _in_git_checkout() -> bool:
    done = subprocess.run(["git", "-C", str(baseline.ROOT), "rev-parse", "HEAD"], check=False)
    return done.returncode == 0


@pytest.mark.skipif(not _in_git_checkout(), reason="needs the git repository of this checkout")
def test_a_measurement_runs_in_a_worktree_of_a_commit_and_the_worktree_goes():
    with baseline.checkout("HEAD") as tree:
        assert (tree / "src" / "ragen" / "__init__.py").is_file()
        # call() checks that the process imported ragen from the worktree's src
        assert baseline.call(tree / "src", "os.path:join", "a", "b") == "a/b"
        listed = subprocess.run(
            ["git", "-C", str(baseline.ROOT), "worktree", "list"], capture_output=True, text=True
        ).stdout
        assert str(tree) in listed
    assert not tree.exists()
    listed = subprocess.run(
        ["git", "-C", str(baseline.ROOT), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert str(tree) not in listed


def test_a_process_that_imports_another_ragen_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match=r"imported ragen from|exited with"):
        baseline.call(tmp_path, "os.path:join", "a", "b")  # no ragen there: this checkout's


@pytest.mark.skipif(not _in_git_checkout(), reason="needs the git repository of this checkout")
def test_an_unknown_commit_is_refused_in_one_line():
    with pytest.raises(SystemExit, match="--baseline no-such-commit: no such commit"):
        baseline.resolve("no-such-commit")


def test_the_sides_a_benchmark_measures():
    args = Namespace(set=["a=1"], baseline=None, baseline_set=[])
    with baseline.sides(args) as sides:
        assert sides == {"current": (baseline.SRC, ["a=1"])}
    args.baseline_set = ["b=2"]
    with baseline.sides(args) as sides:
        assert sides["baseline"] == (baseline.SRC, ["a=1", "b=2"])
        assert sides["current"] == (baseline.SRC, ["a=1"])
    assert baseline.command_words(args) == ["--baseline-set b=2"]


def test_the_counted_mini_batches_are_the_updates():
    lengths = torch.tensor([5, 9, 2, 7, 7, 3, 8])
    mask = (torch.arange(10)[None, :] < lengths[:, None]).long()
    ids = torch.arange(70).view(7, 10) * mask
    data = UpdateData(ids, mask, mask, None, None, None, None, None)
    counted = [m.input_ids[:, 0].tolist() for m in measure.update_minis(data, 2, 3, seed=4)]
    run = [ids[rows, 0].tolist() for rows in mini_batch_rows(mask, 2, 3, 4)]
    assert counted == run
