"""The reference for the opening run once per mini-batch: the update and its scoring pass with
every micro-batch running the opening its rows share itself, as they do for models sharded
by FSDP2 (``update.Openings.of``, ``scoring.score_batch``'s ``share_opening``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ragen.train import trainer, update
from ragen.train.scoring import score_batch


def _score_each_micro_batch(*args, **kwargs):
    return score_batch(*args, **{**kwargs, "share_opening": False})


@contextmanager
def each_micro_batch_runs_its_opening() -> Iterator[None]:
    """Within it, no opening is run once for a mini-batch or a scoring pass."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(update.Openings, "of", classmethod(lambda cls, *args: cls()))
        patch.setattr(trainer, "score_batch", _score_each_micro_batch)
        yield
