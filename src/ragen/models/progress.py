"""transformers' own progress bars off while ragen loads or saves a model.

transformers draws a bar for every model it loads ("Loading weights") and saves ("Writing
model shards"). Inside a run they break ragen's own bar (a cursor-up escape each) and fill
its logs with one bar per checkpoint; for the models ragen trains they flash by. The switch
is transformers' global one, so it is set back as it was afterwards: a script that imports
ragen keeps its own setting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def without_transformers_bars() -> Iterator[None]:
    """transformers' progress bars off inside the block, back as they were after it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
