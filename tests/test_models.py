import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragen import models
from ragen.cli import main


def test_resolve_embedded_points_into_ragen_home(ragen_home):
    source = models.resolve("SmolLM2-135M")
    assert source.kind == "embedded"
    assert source.spec == "smollm2-135m"
    assert source.path == Path(ragen_home) / "models" / "smollm2-135m"


def test_resolve_tiny_local_and_hub(tmp_path):
    assert models.resolve("tiny").kind == "tiny"
    (tmp_path / "config.json").write_text("{}")
    local = models.resolve(str(tmp_path))
    assert (local.kind, local.path) == ("local", tmp_path)
    assert models.resolve("Qwen/Qwen2.5-0.5B-Instruct").kind == "hub"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("gpt-5", "unknown model spec"), ("./no/such/dir", "unknown model spec")],
)
def test_resolve_refuses_unknown_specs(spec, needle):
    with pytest.raises(models.ModelError, match=needle) as err:
        models.resolve(spec)
    assert "smollm2-135m" in str(err.value)  # the message lists what is accepted


def test_folder_without_config_json_is_refused(tmp_path):
    with pytest.raises(models.ModelError, match=r"config\.json"):
        models.resolve(str(tmp_path))


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
    ids = models.gguf_special_ids(models._package_folder(entry) / entry.gguf_file)
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
    reader = GGUFReader(models._package_folder(entry) / entry.gguf_file)
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


def test_tiny_model_is_small_seeded_and_runs(tiny):
    model, tokenizer = tiny
    assert model.config.num_hidden_layers == 2
    assert model.config.hidden_size == 64
    assert model.config.vocab_size == len(tokenizer) == 49152
    again = models.build_tiny(len(tokenizer), seed=0)
    other = models.build_tiny(len(tokenizer), seed=1)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.state_dict()[weight], again.state_dict()[weight])
    assert not torch.equal(model.state_dict()[weight], other.state_dict()[weight])
    ids = torch.tensor([tokenizer("hello world")["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], 49152)


def test_building_tiny_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    models.build_tiny(1000, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_any_local_hf_folder_loads(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tok = models.load_policy(str(tmp_path), dtype="float32")
    ids = torch.tensor([tokenizer("a b c")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits)
    assert loaded_tok("a b c")["input_ids"] == ids[0].tolist()


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


@pytest.fixture
def tiny_folder(tiny, tmp_path):
    """The tiny model saved as a Hugging Face folder, as a checkpoint holds it."""
    model, tokenizer = tiny
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _cut_in_half(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _set_config(folder: Path, **values) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(values)
    (folder / "config.json").write_text(json.dumps(config))


def _shard(folder: Path, index: dict) -> None:
    """``folder``'s weights as the one shard of a safetensors index, ``index`` less its
    weight map, which maps every weight to ``shard.safetensors``."""
    from safetensors import safe_open

    (folder / "model.safetensors").rename(folder / "shard.safetensors")
    with safe_open(str(folder / "shard.safetensors"), framework="pt") as weights:
        weight_map = dict.fromkeys(weights.keys(), "shard.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map, **index})
    )


def _index_outside(folder: Path) -> None:
    """An index whose weight map points at intact weights outside the folder."""
    _shard(folder, {"metadata": {}})
    (folder / "shard.safetensors").rename(folder.parent / "elsewhere.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = dict.fromkeys(index["weight_map"], "../elsewhere.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _pickle_weights(folder: Path) -> None:
    """The same weights, saved by torch.save as pytorch_model.bin (a pickle)."""
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: _cut_in_half(f / "model.safetensors"), r"model\.safetensors is corrupt"),
        (lambda f: (f / "config.json").write_text("{oops"), r"config\.json is not readable JSON"),
        (lambda f: (f / "config.json").write_text("[1]"), r"config\.json is not a JSON object"),
        (lambda f: (f / "model.safetensors").unlink(), "is incomplete: it lacks model.safetensors"),
        (lambda f: _set_config(f, num_hidden_layers=0), r"config\.json gives num_hidden_layers=0"),
        (
            lambda f: _set_config(f, hidden_size=128),
            r"config\.json does not match the weights: model\.embed_tokens\.weight is "
            r"\[49152, 64\] in model\.safetensors but config\.json makes it \[49152, 128\]",
        ),
        (
            lambda f: _set_config(f, vocab_size=1000),
            r"model\.embed_tokens\.weight is \[49152, 64\] in model\.safetensors but "
            r"config\.json makes it \[1000, 64\]",
        ),
        (_index_outside, r"names the shard '\.\./elsewhere\.safetensors', which is not a file"),
        (lambda f: _shard(f, {}), r"index\.json is not a weight index: it needs a \"metadata\""),
        (_pickle_weights, r"pytorch_model\.bin holds pickled .* ragen loads safetensors only"),
    ],
    ids=[
        "truncated-weights",
        "bad-json",
        "not-an-object",
        "no-weights",
        "zero-layers",
        "hidden-size-not-the-weights",
        "vocab-size-not-the-weights",
        "index-outside-the-folder",
        "index-without-metadata",
        "pickled-weights",
    ],
)
def test_a_damaged_folder_is_refused_naming_the_file(tiny_folder, damage, message, capsys):
    damage(tiny_folder)
    with pytest.raises(models.ModelError, match=message):
        models.load_policy(str(tiny_folder))
    with pytest.raises(models.ModelError, match=message):
        models.build_skeleton(str(tiny_folder))
    _assert_refused_by_every_command(tiny_folder, message, capsys)


def _assert_refused_by_every_command(folder: Path, message: str, capsys) -> None:
    """`ragen eval`, `ragen model info` and `ragen train` on ``folder`` each exit 2 with one
    line naming it and matching ``message``, and write nothing."""
    out = folder.parent / "out"
    commands = [
        ["eval", "--env", "bandit", "--model", str(folder), "--out", str(out)],
        ["model", "info", str(folder)],
        ["train", "bandit", f"model.spec={folder}", "trainer.steps=1", "--out", str(out)],
    ]
    for argv in commands:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("ragen: ") and err.count("\n") == 1, err
        assert str(folder) in err and re.search(message, err), err
        assert not out.exists()


def test_an_unknown_architecture_is_refused_in_one_line(tiny_folder):
    (tiny_folder / "config.json").write_text('{"model_type": "no-such-arch"}')
    with pytest.raises(models.ModelError, match=r"its config\.json is not a model config") as err:
        models.build_skeleton(str(tiny_folder))
    assert "\n" not in str(err.value)


def _with_own_code(folder: Path) -> Path:
    """``folder``'s config pointed at a configuration class in its own evilcode.py, which
    leaves a file behind when it is imported; the marker file's path is returned."""
    marker = folder / "code-ran"
    (folder / "evilcode.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'evil-llama'\n"
        "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n"
    )
    # a model type transformers does not know: only the folder's own code can read it
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "evil-llama"
    config["auto_map"] = {
        "AutoConfig": "evilcode.EvilConfig",
        "AutoModelForCausalLM": "evilcode.EvilModel",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return marker


def test_a_folder_that_ships_code_is_refused_unless_trusted(tiny_folder, capsys, monkeypatch):
    marker = _with_own_code(tiny_folder)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10))  # a yes on stdin changes nothing
    with pytest.raises(models.ModelError, match=r"model\.trust_remote_code=true") as err:
        models.build_skeleton(str(tiny_folder))
    assert "\n" not in str(err.value)
    argv = ["eval", "--env", "bandit", "--model", str(tiny_folder), "--out", str(tiny_folder / "e")]
    assert main(argv) == 2
    out = capsys.readouterr().err
    assert out.count("\n") == 1 and "trust_remote_code" in out
    assert main(["model", "info", str(tiny_folder)]) == 2
    assert not marker.exists()
    # trusted, the folder's code runs as transformers runs it
    models.build_skeleton(str(tiny_folder), trust_remote_code=True)
    assert marker.read_text() == "ran"


# A chat template that runs about 10^7 loop steps (seconds) once a dialogue has more than
# four messages, and renders a plain transcript after.
_SLOW_PAST_FOUR = (
    "{% if messages|length > 4 %}{% for i in range(100000) %}{% for j in range(100) %}"
    "{% endfor %}{% endfor %}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "{{ ''.__class__.__mro__ }}",
            r"failed on a dialogue \(SecurityError: access to attribute",
        ),
        (
            _SLOW_PAST_FOUR.replace("> 4", "> 0"),
            r"did not finish rendering a dialogue within 0\.1 s",
        ),
    ],
    ids=["breaks-the-sandbox", "runs-too-long"],
)
def test_a_bad_chat_template_is_refused_as_the_model_loads(
    tiny_folder, template, message, capsys, monkeypatch
):
    monkeypatch.setattr(models, "TEMPLATE_SECONDS", 0.1)
    (tiny_folder / "chat_template.jinja").write_text(template)
    with pytest.raises(models.ModelError, match=f"the chat template of {tiny_folder} {message}"):
        models.load_tokenizer(str(tiny_folder))
    _assert_refused_by_every_command(tiny_folder, message, capsys)


def test_a_chat_template_that_runs_too_long_later_is_stopped_mid_dialogue(tiny_folder, monkeypatch):
    from ragen.rollout.dialogue import ChatFormat

    monkeypatch.setattr(models, "TEMPLATE_SECONDS", 0.1)
    (tiny_folder / "chat_template.jinja").write_text(_SLOW_PAST_FOUR)
    tokenizer = models.load_tokenizer(str(tiny_folder))  # the four-message probe is quick
    chat = ChatFormat(tokenizer, system="Play.", reply_prefix="")
    assert (
        chat.opening("State 1")
        == tokenizer("system: Play.\nuser: State 1\nassistant: ")["input_ids"]
    )
    history = [
        {"role": "user", "content": "State 1"},
        {"role": "assistant", "content": "left"},
        {"role": "user", "content": "State 2"},
    ]
    tracer = sys.gettrace()
    with pytest.raises(models.ModelError, match="did not finish rendering a dialogue"):
        chat.continuation(history, "State 3", reply_stopped=False)
    assert sys.gettrace() is tracer  # a debugger's or coverage's tracer is put back
