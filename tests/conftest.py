"""Shared fixtures. The whole session runs against a private RAGEN_HOME, so the embedded
model is converted fresh (once per session) and no user cache is read or written."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

_HOME = tempfile.mkdtemp(prefix="ragen-test-home-")
os.environ["RAGEN_HOME"] = _HOME
# The converted model takes half a gigabyte: a session that kept its home filled the disk.
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def ragen_home() -> str:
    return _HOME


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M as (model, tokenizer), float32, converted once per session."""
    from ragen import models

    return models.load_policy("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def tiny():
    """The tiny 2-layer test model as (model, tokenizer)."""
    from ragen import models

    return models.load_policy("tiny", dtype="float32")
