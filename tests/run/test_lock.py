"""One writer per run directory: a second one is refused by name, a dead one's lock is free."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from ragen import config
from ragen.cli import main
from ragen.run.jsonl import RunDirError
from ragen.run.lock import hold
from ragen.run.rundir import RunDir, create_run_dir

TINY = [
    "model.spec=tiny",
    "rollout.groups=4",
    "rollout.group_size=2",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2",
    "logging.progress=false",
]

HOLDER = """
import sys, time
from pathlib import Path
from ragen.run.rundir import RunDir
from ragen.run.lock import hold
with hold(RunDir(Path(sys.argv[1]))), hold(RunDir(Path(sys.argv[2]))):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_writer_is_refused_and_a_killed_holders_lock_is_taken_over(tmp_path, tiny, capsys):
    resumed = create_run_dir(tmp_path / "resumed", config.load("bandit", TINY))
    fresh = RunDir(tmp_path / "fresh")
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(resumed.root), str(fresh.root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "held"
        holder = f"pid {child.pid} on host {socket.gethostname()}"
        with pytest.raises(RunDirError, match=holder), hold(resumed):
            pass
        # both ways into a run directory take the lock, before anything is written
        before = resumed.config.read_text()
        assert main(["train", "--resume", str(resumed.root)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"ragen: {resumed.root} is in use by {holder}")
        assert resumed.config.read_text() == before
        assert main(["train", "bandit", *TINY, "--out", str(fresh.root)]) == 2
        assert holder in capsys.readouterr().err
        assert not fresh.config.exists()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # the kernel dropped the dead holder's lock: the next writer takes it and names itself
    with hold(resumed):
        assert json.loads(resumed.lock.read_text())["pid"] == os.getpid()
    with hold(resumed):  # released at the end of the block
        pass


LIMITED_HOLD = """
import resource, signal, sys
from pathlib import Path
from ragen.run.jsonl import RunDirError
from ragen.run.rundir import RunDir
from ragen.run.lock import hold
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (10, 10))
try:
    with hold(RunDir(Path(sys.argv[1]))):
        print("held")
except RunDirError as err:
    print(err)
"""


@pytest.mark.parametrize("folder", ["new", "existing"])
def test_a_lock_that_cannot_be_written_is_refused_in_one_line_and_left_nowhere(tmp_path, folder):
    # Under a 10-byte file size limit the holder's record cannot be written, as on a disk
    # that fills between a command's writability check and its lock: no empty .lock is left,
    # nor a folder the lock made; a folder that was there keeps what it had.
    run = RunDir(tmp_path / "run")
    if folder == "existing":
        create_run_dir(run.root, config.load("bandit", TINY))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = subprocess.run(
        [sys.executable, "-c", LIMITED_HOLD, str(run.root)], capture_output=True, text=True
    )
    assert proc.stdout == (
        f"cannot write {run.lock}: File too large; free space or fix permissions, then run again\n"
    )
    assert proc.stderr == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
