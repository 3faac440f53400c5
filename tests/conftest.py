"""Shared fixtures. The whole session runs against a private RAGEN_HOME, so the embedded
model is converted fresh (once per session, however many xdist workers share it) and no user
cache is read or written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import ragen

# Under pytest-xdist (`make test` runs `-n 2`) each worker computes on one thread, as do the
# runs it starts: two workers of two threads each on a 2-core machine wait on each other.
if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    """The session's RAGEN_HOME: made by the process that runs the session (xdist's
    controller, or pytest alone) and handed to each worker, so the workers convert the
    embedded model once between them (``models.prepare`` locks the conversion: one process
    converts, the others wait and read its folder). Removed when the session ends: the
    converted model takes half a gigabyte, and a session that kept its home filled the disk.

    Under xdist the controller starts the conversion at once, in a process of its own, beside
    the workers' collection and first tests: a worker that converted it itself would keep the
    other waiting, a core idle, for the ~20 s it takes."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        os.environ["RAGEN_HOME"] = workerinput["ragen_home"]
        return
    home = tempfile.mkdtemp(prefix="ragen-test-home-")
    os.environ["RAGEN_HOME"] = home
    converter = None
    if config.getoption("numprocesses", None):
        here = str(Path(ragen.__file__).parents[1])  # the ragen these tests import
        path = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
        converter = subprocess.Popen(
            [sys.executable, "-m", "ragen", "model", "prepare"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"},
        )

    def end() -> None:
        if converter is not None:  # still converting if no test needed the model
            converter.kill()
            converter.wait()
        shutil.rmtree(home, ignore_errors=True)

    config.add_cleanup(end)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist's controller gives each worker it starts the session's RAGEN_HOME."""
    node.workerinput["ragen_home"] = os.environ["RAGEN_HOME"]


@pytest.fixture(scope="session")
def ragen_home() -> str:
    return os.environ["RAGEN_HOME"]


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M as (model, tokenizer), float32, converted once per session."""
    from ragen import models

    return models.load_policy("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded model's tokenizer (the tiny model's too), loaded once per session."""
    from ragen import models

    return models.load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tiny():
    """The tiny 2-layer test model as (model, tokenizer)."""
    from ragen import models

    return models.load_policy("tiny", dtype="float32")


@pytest.fixture(autouse=True)
def _torch_threads_unchanged(request):
    """Fail a test that leaves torch's thread count other than it found it: every test after
    it would compute with that count, and two threads beside a busy core wait on each other
    at every barrier (the embedded-model tests ran ten times slower). The count is restored
    either way."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        pytest.fail(f"{request.node.nodeid} left torch at {after} threads, not {before}")


@pytest.fixture
def keep_threads():
    """For a test that sets torch's thread count: the count it found is given back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
