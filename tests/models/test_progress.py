"""transformers' progress bars stay out of ragen's output, and their switch as it was."""

from transformers.utils import logging as hf_logging

from ragen import models


def test_loading_a_model_folder_draws_no_transformers_bar(tmp_path, tiny, capfd):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)  # transformers' own save: its bar, outside ragen
    tokenizer.save_pretrained(tmp_path)
    assert "Writing model shards" in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
    models.load_policy(str(tmp_path), dtype="float32")
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # a script's own setting is left as it was


def test_the_switch_stays_off_where_it_was_off(tmp_path, tiny):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    hf_logging.disable_progress_bar()
    try:
        models.load_policy(str(tmp_path), dtype="float32")
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
