"""A disk that cannot take a command's files, and a path the file system refuses: each
command says so in one line and exits 2, before any work where it can, and leaves nothing
half-written behind (no empty lock, no partial episode file, an old file as it was).

A full disk is simulated as round one did, by a child process whose files may not grow past
a size limit (RLIMIT_FSIZE, SIGXFSZ ignored): its writes fail with EFBIG ("File too large"),
which takes the same path through ragen as ENOSPC.
"""

import os
import subprocess
import sys

import pytest
from tests.small import TINY_RL

from ragen import config
from ragen.cli import main
from ragen.run.rundir import create_run_dir
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

SIZE_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from ragen.cli import main
sys.exit(main(sys.argv[2:]))
"""

FULL = 10
"""A limit under the block the writability check writes (and under a lock's record)."""

ROOM_FOR_THE_CHECK = 8192
"""A limit the check's block passes, and 2 bandit episodes (~2.7 kB) fit, but 8 (~11 kB)
do not."""

FIX = "free space or fix permissions, then run again"


def _limited(limit: int, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SIZE_LIMITED, str(limit), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


COMMANDS = {
    "train": ["train", "bandit", *TINY_RL],
    "sft": ["sft", "bandit", *TINY_RL],
    "eval": ["eval", "--env", "bandit", "--model", "tiny", "--n", "2"],
    "study": ["study", "collapse"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_full_disk_is_refused_in_one_line_before_any_work(tmp_path, command):
    out = tmp_path / "out"
    child = _limited(FULL, [*COMMANDS[command], "--out", str(out)])
    assert child.returncode == 2
    assert child.stderr.splitlines() == [f"ragen: cannot write {out}: File too large; {FIX}"]
    assert child.stdout == ""  # no progress, no run directory announced: nothing ran
    assert _files(tmp_path) == []  # no folder, no empty .lock


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a folder's permissions")
@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_folder_is_refused_in_one_line_before_any_work(tmp_path, command, capsys):
    tmp_path.chmod(0o555)
    out = tmp_path / "out"
    try:
        assert main([*COMMANDS[command], "--out", str(out)]) == 2
    finally:
        tmp_path.chmod(0o755)
    err = capsys.readouterr().err
    assert err == f"ragen: cannot write {out}: Permission denied; {FIX}\n"
    assert _files(tmp_path) == []


@pytest.mark.parametrize(
    "episodes, old_summaries",
    [(8, None), (2, '{"model": "earlier", "pad": "' + "x" * 8100 + '"}\n')],
    ids=["episodes-do-not-fit", "summary-does-not-fit"],
)
def test_a_write_failing_after_an_evaluation_leaves_nothing_partial(
    tmp_path, tiny, episodes, old_summaries
):
    # The folder passes the check, then the episodes (8 of them) or the summary appended to
    # an eval.jsonl already near the limit do not fit: as on a disk that fills meanwhile.
    # (`tiny`: the tokenizer it shares with the embedded model is converted here, unlimited.)
    out = tmp_path / "out"
    if old_summaries is not None:
        out.mkdir()
        (out / "eval.jsonl").write_text(old_summaries)
    args = ["eval", "--env", "bandit", "--model", "tiny", "--n", str(episodes), "--out"]
    child = _limited(ROOM_FOR_THE_CHECK, [*args, str(out)])
    assert child.returncode == 2 and "Traceback" not in child.stderr
    assert child.stderr.splitlines()[-1] == (
        f"ragen: cannot write {out}: File too large; free space or fix permissions, "
        "then run `ragen eval` again"
    )
    assert not (out / "trajectories" / "eval.jsonl").exists()
    assert not (out / "eval-config.yaml").exists()
    if old_summaries is None:
        assert not (out / "eval.jsonl").exists()
    else:
        assert (out / "eval.jsonl").read_text() == old_summaries
    assert [f for f in _files(out) if f.endswith(".tmp")] == []


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished 1-step run of the tiny model, for the viewer's export."""
    cfg = config.load("bandit", [*TINY_RL, "trainer.steps=1", "trainer.save_every=0"])
    run = create_run_dir(tmp_path_factory.mktemp("disk") / "run", cfg)
    RunLoop(Trainer(cfg), run).train()
    return run.root


LONG = "a" * 300
"""A file or folder name past the 255 bytes Linux file systems take."""


@pytest.mark.parametrize(
    "command",
    ["train", "sft", "eval", "study", "view", "view --export", "monitor", "train --resume"],
)
def test_a_name_over_255_bytes_is_refused_in_one_line(tmp_path, run_dir, command, capsys):
    long = tmp_path / LONG
    args = {
        "view": ["view", str(long)],
        "view --export": ["view", str(run_dir), "--export", f"{long}.html"],
        "monitor": ["monitor", str(long)],
        "train --resume": ["train", "--resume", str(long)],
    }.get(command) or [*COMMANDS[command], "--out", str(long / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ragen: cannot ") and LONG in err[0]
    assert err[0].endswith(
        ": File name too long; a file or folder name may have at most 255 bytes: "
        "choose a shorter one"
    )
    assert _files(tmp_path) == []
