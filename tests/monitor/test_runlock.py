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
from ragen.monitor.jsonl import RunDirError
from ragen.monitor.rundir import RunDir, create_run_dir
from ragen.monitor.runlock import hold

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
from ragen.monitor.rundir import RunDir
from ragen.monitor.runlock import hold
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
