"""Chat-template pieces as token ids, appended to a dialogue without re-tokenising it.

The template is rendered as text (so any Hugging Face chat template works, within the time
bound of `ragen.models.render_chat`) and only the new piece is tokenised: the opening (system
+ first user message + assistant header + reply prefix), and after each reply the
continuation (the template's end of the assistant turn, the next user message, the next
assistant header and prefix). The sampled reply itself is never rendered or re-encoded: its
ids are appended as the model produced them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragen.models import render_chat

# A placeholder for a reply while rendering: split on it to find the template's text after
# an assistant turn. Characters no template or model reply is expected to contain.
_REPLY_SLOT = "\u27e6reply\u27e7"


class ChatFormat:
    """Builds the token ids of a dialogue's non-sampled pieces for one tokenizer."""

    def __init__(self, tokenizer, system: str, reply_prefix: str) -> None:
        self.tokenizer = tokenizer
        self.system = system
        self.reply_prefix = reply_prefix
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        eos = tokenizer.eos_token_id
        self.stop_ids = {eos} if isinstance(eos, int) else set(eos or ())
        self._eos_text = tokenizer.eos_token or ""

    def _render(self, messages: Sequence[dict], *, generation_prompt: bool) -> str:
        if self.has_template:
            return render_chat(self.tokenizer, messages, generation_prompt=generation_prompt)
        # A base model without a template: a plain transcript, one "role: text" block each.
        text = "".join(f"{m['role']}: {m['content']}\n\n" for m in messages)
        return text + ("assistant: " if generation_prompt else "")

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def opening(self, user: str, demos: Sequence[dict] = ()) -> list[int]:
        """Ids of: system, the demonstration exchanges (user/assistant messages, if any), the
        first user message, the assistant header, the reply prefix."""
        messages = [
            {"role": "system", "content": self.system},
            *demos,
            {"role": "user", "content": user},
        ]
        return self._encode(self._render(messages, generation_prompt=True) + self.reply_prefix)

    def continuation(self, history: Sequence[dict], user: str, *, reply_stopped: bool) -> list[int]:
        """Ids that follow a reply: the end of the assistant turn, the next user message, the
        next assistant header and the reply prefix.

        ``history`` is the dialogue so far ending with the user message the reply answered;
        ``reply_stopped`` says the reply already ended with the eos token, which the template
        would otherwise write again.
        """
        messages = [
            {"role": "system", "content": self.system},
            *history,
            {"role": "assistant", "content": _REPLY_SLOT},
            {"role": "user", "content": user},
        ]
        rendered = self._render(messages, generation_prompt=True)
        after = rendered.split(_REPLY_SLOT, 1)[1]
        if reply_stopped and self._eos_text and after.startswith(self._eos_text):
            after = after[len(self._eos_text) :]
        return self._encode(after + self.reply_prefix)

    def reply_text(self, sampled_ids: Sequence[int]) -> str:
        """The reply as text for parsing and logs: the prefix plus the sampled tokens, without
        a final stop token."""
        ids = list(sampled_ids)
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.reply_prefix + self.tokenizer.decode(ids, skip_special_tokens=False)
