"""Chat templates, rendered within a time bound: a template comes with the model, from
whoever made it, so one that breaks the sandbox or runs too long is a ModelError naming the
model folder (:func:`render_chat`), not a hang."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from jinja2 import TemplateError

from ragen.models.source import ModelError, first_line

TEMPLATE_SECONDS = 5.0
"""The longest one rendering of a chat template may run: real templates render ragen's
dialogues in a small fraction of it, so only a runaway template (nested loops over huge
ranges) comes near it."""

# What a model's chat template is first asked to render as its tokenizer loads: the shape of
# every dialogue ragen renders (system, user, a reply, the next user message, the header).
PROBE_DIALOGUE = (
    {"role": "system", "content": "You play a game."},
    {"role": "user", "content": "State: start. Your move?"},
    {"role": "assistant", "content": "<answer>left</answer>"},
    {"role": "user", "content": "State: next. Your move?"},
)


class _OutOfTime(Exception):
    """Raised inside a chat template's code when its rendering has run out of time."""


@contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    """Stop a chat template still rendering after ``seconds`` (raises `_OutOfTime` inside it).

    Jinja compiles a template into Python code whose file name is ``<template>``; a trace
    function that sees every line of that code can raise inside it however deep its loops
    nest. A signal cannot do this from any thread (SIGALRM reaches only the main one), and a
    thread left rendering cannot be stopped at all. Other code gets no line tracing, which
    keeps the cost of a rendering small. One step done in C is not cut short (the sandbox bounds
    ``range`` to 100,000 items, not a string repeated ``n`` times). A tracer already set (a
    debugger, coverage) is put back afterwards and misses the rendering itself.
    """
    deadline = time.monotonic() + seconds

    def in_template(frame, event, arg):
        if time.monotonic() > deadline:
            raise _OutOfTime
        return in_template

    def on_call(frame, event, arg):
        return in_template if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)


def render_chat(tokenizer, messages: Sequence[dict], *, generation_prompt: bool) -> str:
    """``messages`` rendered as text by the tokenizer's chat template, within
    `TEMPLATE_SECONDS`. A template that runs longer, or breaks the sandbox's rules (reads
    ``__class__``...) or its own, is a ModelError naming the model folder: a template comes
    with the model, from whoever made it."""
    try:
        with _time_bound(TEMPLATE_SECONDS):
            return tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=generation_prompt
            )
    except _OutOfTime:
        problem = f"did not finish rendering a dialogue within {TEMPLATE_SECONDS:g} s"
    except TemplateError as err:
        problem = f"failed on a dialogue ({type(err).__name__}: {first_line(err).rstrip('.')})"
    raise ModelError(
        f"the chat template of {tokenizer.name_or_path} {problem}: fix or remove the template "
        "(chat_template.jinja, or chat_template in tokenizer_config.json)"
    )


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of one user message, rendered with the chat template when the model has one."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": text}]
        rendered = render_chat(tokenizer, messages, generation_prompt=True)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


@torch.no_grad()
def greedy_reply(model, tokenizer, text: str, *, max_new_tokens: int = 64) -> str:
    """One greedy chat reply to ``text`` (a smoke test for a freshly loaded model)."""
    ids = torch.tensor([chat_prompt_ids(tokenizer, text)], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
