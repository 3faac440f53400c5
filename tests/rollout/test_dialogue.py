from ragen.rollout.dialogue import ChatFormat


def test_pieces_decode_to_the_rendered_transcript(tokenizer):
    fmt = ChatFormat(tokenizer, "SYS", "<think>")
    user1, user2 = "Turn 1: state A", "Turn 2: state B"
    ids = fmt.opening(user1)
    reply1 = tokenizer(" left </think><answer>Left</answer>", add_special_tokens=False)[
        "input_ids"
    ] + [tokenizer.eos_token_id]  # the model stopped with <|im_end|>
    ids += reply1
    history = [
        {"role": "user", "content": user1},
        {"role": "assistant", "content": fmt.reply_text(reply1)},
    ]
    ids += fmt.continuation(history[:1], user2, reply_stopped=True)
    messages = [{"role": "system", "content": "SYS"}, *history, {"role": "user", "content": user2}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(ids) == expected + "<think>"


def test_a_reply_stopped_by_a_stop_string_gets_the_template_close(tokenizer):
    fmt = ChatFormat(tokenizer, "SYS", "<think>")
    history = [{"role": "user", "content": "u1"}]
    after_eos = fmt.continuation(history, "u2", reply_stopped=True)
    after_text = fmt.continuation(history, "u2", reply_stopped=False)
    assert after_text[: -len(after_eos)] == [tokenizer.eos_token_id]
    assert tokenizer.decode(after_text).startswith("<|im_end|>\n<|im_start|>user\nu2")


def test_reply_text_keeps_the_prefix_and_drops_the_stop_token(tokenizer):
    fmt = ChatFormat(tokenizer, "SYS", "<answer>")
    ids = tokenizer("Up</answer>", add_special_tokens=False)["input_ids"]
    assert fmt.reply_text([*ids, tokenizer.eos_token_id]) == "<answer>Up</answer>"
    assert fmt.reply_text(ids) == "<answer>Up</answer>"
