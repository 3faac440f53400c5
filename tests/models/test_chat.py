"""Chat templates that break the sandbox or run too long are refused, naming the model."""

import sys

import pytest

from ragen import models
from ragen.rollout.dialogue import ChatFormat

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
    tiny_folder, template, message, refused, monkeypatch
):
    monkeypatch.setattr("ragen.models.chat.TEMPLATE_SECONDS", 0.1)
    (tiny_folder / "chat_template.jinja").write_text(template)
    with pytest.raises(models.ModelError, match=f"the chat template of {tiny_folder} {message}"):
        models.load_tokenizer(str(tiny_folder))
    refused(tiny_folder, message)


def test_a_chat_template_that_runs_too_long_later_is_stopped_mid_dialogue(tiny_folder, monkeypatch):
    monkeypatch.setattr("ragen.models.chat.TEMPLATE_SECONDS", 0.1)
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
