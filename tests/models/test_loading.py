"""Loading tokenizers and causal LMs: dtypes, local folders, never the network unasked."""

import os
import subprocess
import sys

import pytest
import torch

from ragen import models


def test_hub_id_needs_opt_in_before_any_network():
    with pytest.raises(models.ModelError, match="allow_download"):
        models.load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")


def test_resolve_dtype():
    assert models.resolve_dtype("float32") is torch.float32
    assert models.resolve_dtype("bfloat16") is torch.bfloat16
    expected = torch.bfloat16 if models.bf16_supported("cpu") else torch.float32
    assert models.resolve_dtype("auto") is expected
    with pytest.raises(models.ModelError, match="float64"):
        models.resolve_dtype("float64")


def test_any_local_hf_folder_loads(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tok = models.load_policy(str(tmp_path), dtype="float32")
    ids = torch.tensor([tokenizer("a b c")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits)
    assert loaded_tok("a b c")["input_ids"] == ids[0].tolist()


def test_a_tokenizer_is_read_once_per_folder_as_its_files_are(tiny_folder):
    first = models.load_tokenizer(str(tiny_folder))
    assert models.load_tokenizer(str(tiny_folder)) is first
    assert models.load_policy(str(tiny_folder), dtype="float32")[1] is first
    first.save_pretrained(tiny_folder)  # rewritten in place: read again
    again = models.load_tokenizer(str(tiny_folder))
    assert again is not first and again("a b c")["input_ids"] == first("a b c")["input_ids"]


def test_chat_command_runs_offline(embedded, ragen_home):
    # Any network attempt would go to a dead local proxy and fail: loading must not try.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    dead = "http://127.0.0.1:9"
    env.update(RAGEN_HOME=ragen_home, HTTP_PROXY=dead, HTTPS_PROXY=dead, ALL_PROXY=dead)
    out = subprocess.run(
        [sys.executable, "-m", "ragen", "model", "chat", "What is the capital of France?"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
