"""The embedded SmolLM2: converted once from its GGUF file, holding exactly its weights."""

import fcntl
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ragen import models
from ragen.models.embedded import package_folder


def test_embedded_conversion_is_complete_and_done_once(embedded):
    source = models.resolve("smollm2-135m")
    folder = source.path
    assert models.is_prepared(source)
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config  # the GGUF marker would block later saves
    assert (folder / "model.safetensors").stat().st_size > 500e6  # float32, dequantised
    marker = json.loads((folder / "ragen-converted.json").read_text())
    assert marker["gguf_bytes"] == 98362432
    before = (folder / "model.safetensors").stat().st_mtime_ns
    models.prepare("smollm2-135m")
    assert (folder / "model.safetensors").stat().st_mtime_ns == before


def test_embedded_tokenizer_has_the_special_tokens_of_its_gguf_file(embedded):
    """The file's own ids, whatever a transformers release reads from it (5.17 read the eos
    as <|im_start|>, so replies and dialogue pieces closed on the wrong token)."""
    _, tokenizer = embedded
    entry = models.EMBEDDED["smollm2-135m"]
    ids = models.gguf_special_ids(package_folder(entry) / entry.gguf_file)
    assert ids == {"bos_token": 1, "eos_token": 2, "unk_token": 0, "pad_token": 2}
    got = [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    assert [*got, tokenizer.pad_token_id] == [1, 2, 0, 2]
    assert tokenizer.eos_token == "<|im_end|>"


def test_crashed_conversion_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN_HOME", str(tmp_path))
    source = models.resolve("smollm2-135m")
    source.path.mkdir(parents=True)
    (source.path / "model.safetensors").write_bytes(b"half written")
    assert not models.is_prepared(source)


def _waiting_on(lock) -> bool:
    """True when some process or thread waits to take the flock of the open file ``lock``:
    /proc/locks lists a blocked request as ``-> FLOCK ...`` with the file's inode."""
    inode = f":{os.fstat(lock.fileno()).st_ino} "
    lines = Path("/proc/locks").read_text().splitlines()
    return any("-> FLOCK" in line and inode in line for line in lines)


def test_a_conversion_under_way_is_waited_for_not_repeated(embedded, tmp_path, monkeypatch):
    """Processes that start on an empty cache together convert once: ``prepare`` waits for
    the converter's lock, then finds its folder and converts nothing. A temporary folder that
    a killed converter left is removed."""
    finished = models.resolve("smollm2-135m").path  # the session's conversion
    monkeypatch.setenv("RAGEN_HOME", str(tmp_path))
    source = models.resolve("smollm2-135m")
    source.path.parent.mkdir(parents=True)
    leftover = source.path.parent / ".smollm2-135m.tmp-99999"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half written")
    with (
        open(source.path.parent / ".smollm2-135m.lock", "a") as lock,
        ThreadPoolExecutor(1) as pool,
    ):
        fcntl.flock(lock, fcntl.LOCK_EX)  # another converter at work
        waiting = pool.submit(models.prepare, "smollm2-135m")
        while not _waiting_on(lock):
            assert not waiting.done(), waiting.result()
            time.sleep(0.01)
        # the converter finishes as prepare does: a whole folder renamed into place
        tmp = source.path.parent / ".smollm2-135m.tmp-1"
        shutil.copytree(finished, tmp, copy_function=os.link)  # the same files, linked
        os.replace(tmp, source.path)
        fcntl.flock(lock, fcntl.LOCK_UN)
        assert waiting.result(timeout=60) == source
    weights = (source.path / "model.safetensors").stat()
    assert weights.st_ino == (finished / "model.safetensors").stat().st_ino  # not converted
    assert models.is_prepared(source) and not leftover.exists()


def test_embedded_model_holds_the_weights_of_its_gguf_file(embedded):
    """The converted model is the file's model: its shape as the file's metadata gives it,
    as many parameters as the file stores numbers (nothing dropped, nothing stored twice: the
    file has no output.weight, so the LM head must be the embedding table), and tensors read
    straight from the file and dequantised by gguf equal the model's: the Q8_0 embedding, a
    Q4_1 matrix and a float32 norm."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    model, tokenizer = embedded
    entry = models.EMBEDDED["smollm2-135m"]
    reader = GGUFReader(package_folder(entry) / entry.gguf_file)
    meta = {k: reader.fields[f"llama.{k}"].contents() for k in ("block_count", "embedding_length")}
    tensors = {t.name: t for t in reader.tensors}
    facts = models.describe(model, tokenizer)
    assert facts["architecture"] == "LlamaForCausalLM"
    assert (facts["layers"], facts["hidden_size"]) == (
        meta["block_count"],
        meta["embedding_length"],
    )
    assert facts["vocab_size"] == len(tokenizer) == tensors["token_embd.weight"].shape[1]
    assert facts["parameters"] == sum(int(t.n_elements) for t in reader.tensors)
    assert "output.weight" not in tensors
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight

    def from_file(name: str) -> torch.Tensor:
        return torch.tensor(dequantize(tensors[name].data, tensors[name].tensor_type))

    layer = model.model.layers[0]
    assert torch.equal(model.get_input_embeddings().weight, from_file("token_embd.weight"))
    assert torch.equal(layer.mlp.down_proj.weight, from_file("blk.0.ffn_down.weight"))
    assert torch.equal(layer.input_layernorm.weight, from_file("blk.0.attn_norm.weight"))
    assert facts["chat_template"] is True
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id is not None


def test_embedded_model_answers_sensibly(embedded):
    model, tokenizer = embedded
    reply = models.greedy_reply(model, tokenizer, "What is the capital of France?")
    assert "Paris" in reply
