"""A client of any OpenAI-compatible chat-completions server: one request per turn, retried
on the failures a retry can cure, with a count of the requests and tokens used.

It uses the official ``openai`` package, an optional extra (``pip install 'ragen[api]'``)
imported only when a client is made, so the core install never needs it. The client's own
retries are off: this module retries, so that it can count them and end with one line.

What is retried: a 429 (rate limit), any 5xx, a refused or dropped connection and a timeout,
up to ``retries`` times, waiting ``backoff · 2^i`` seconds before retry ``i`` (capped at
:data:`MAX_BACKOFF_S`; longer when the server's ``Retry-After`` asks for it, within the cap).
Any other status (400 a bad request, 401 a wrong key, 404 an unknown model) fails at once.
Either way the failure is an :class:`ApiError` whose message is one line, with the key, if it
appears in a server's message, masked.

The key is held by the client object and sent in the Authorization header; it is never
logged, written or part of an error line.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, cast

API_EXTRA = "pip install 'ragen[api]'"
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
REQUEST_TIMEOUT_S = 300.0
"""The longest one request may take (connect, queue and generate) before it counts as failed."""
_ERROR_CHARS = 300  # of a server's error message, in the one line


class ApiError(RuntimeError):
    """An API request that failed for good; the message is one line saying what to do."""


@dataclass(frozen=True)
class ChatReply:
    """One reply: its text, whether it was cut by the token limit (finish_reason
    ``length``), and the server's token counts of the request (``usage``)."""

    text: str
    cut: bool
    prompt_tokens: int
    completion_tokens: int


@dataclass
class ApiUsage:
    """What a client has used so far: requests answered, retries made, tokens counted by the
    server (the figures an API bills)."""

    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def backoff_seconds(retry: int, base: float, retry_after: float | None = None) -> float:
    """The wait before retry number ``retry`` (0 for the first): ``base · 2^retry``, or the
    server's ``Retry-After`` when that is longer, never over :data:`MAX_BACKOFF_S`."""
    wait = base * 2.0**retry
    if retry_after is not None and retry_after > wait:
        wait = retry_after
    return min(wait, MAX_BACKOFF_S)


def _retry_after(err: Exception) -> float | None:
    """A numeric ``Retry-After`` header of a failed response, in seconds (an HTTP date or a
    junk value is ignored: the backoff applies)."""
    response = getattr(err, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None


class ChatClient:
    """Chat completions from ``model`` at ``base_url``; safe to call from several threads."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str,
        *,
        retries: int = DEFAULT_RETRIES,
        backoff: float = DEFAULT_BACKOFF_S,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        try:
            import openai
        except ImportError:
            raise ApiError(f"evaluating over an API needs the openai client: {API_EXTRA}") from None
        if retries < 0 or backoff < 0:
            raise ValueError(f"retries ({retries}) and backoff ({backoff}) must be >= 0")
        self._openai = openai
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout
        )
        self._key = api_key
        self.base_url, self.model = base_url, model
        self.retries, self.backoff = retries, backoff
        self._lock = threading.Lock()
        self._usage = ApiUsage()

    @property
    def usage(self) -> dict:
        """The counts so far (:class:`ApiUsage` as a dict)."""
        with self._lock:
            return asdict(self._usage)

    def complete(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
    ) -> ChatReply:
        """The reply to ``messages`` (system, user and assistant turns), at most
        ``max_tokens`` long; ``seed`` is passed to servers that sample by it."""
        openai = self._openai
        for attempt in range(self.retries + 1):
            try:
                response = self._client.chat.completions.create(
                    model=self.model,
                    messages=cast(Any, messages),  # plain dicts of the message shapes
                    max_tokens=max_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    seed=seed,
                )
            except (
                openai.RateLimitError,
                openai.InternalServerError,
                openai.APIConnectionError,
            ) as err:
                if attempt == self.retries:
                    raise ApiError(self._failed(err, attempt + 1)) from None
                with self._lock:
                    self._usage.retries += 1
                time.sleep(backoff_seconds(attempt, self.backoff, _retry_after(err)))
                continue
            except openai.APIError as err:
                raise ApiError(self._failed(err, attempt + 1)) from None
            return self._reply(response)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _reply(self, response: Any) -> ChatReply:
        if not response.choices:
            raise ApiError(f"{self.base_url} answered {self.model!r} with no choices")
        choice = response.choices[0]
        message = choice.message
        text = message.content or ""
        # A server that returns the reasoning apart (DeepSeek's reasoning_content) has it put
        # back where the reply format expects it.
        reasoning = (message.model_extra or {}).get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            text = f"<think>{reasoning}</think>{text}"
        usage = response.usage
        prompt = usage.prompt_tokens if usage is not None else 0
        completion = usage.completion_tokens if usage is not None else 0
        with self._lock:
            self._usage.requests += 1
            self._usage.prompt_tokens += prompt
            self._usage.completion_tokens += completion
        return ChatReply(text, choice.finish_reason == "length", prompt, completion)

    def _failed(self, err: Exception, attempts: int) -> str:
        """The one line of a request that failed for good, with the key masked."""
        status = getattr(err, "status_code", None)
        what = f"HTTP {status}" if status is not None else type(err).__name__
        body = getattr(err, "body", None)  # a status error's JSON "error" object, if any
        said = body.get("message") if isinstance(body, dict) else None
        detail = " ".join(str(said if isinstance(said, str) else err).split())[:_ERROR_CHARS]
        if self._key:
            detail = detail.replace(self._key, "***")
        if status == 429:
            hint = "the server limits the rate: lower --concurrency or raise --retries"
        elif status is not None and status >= 500:
            hint = "the server failed: see its log, or try again later"
        else:
            hint = {
                401: "check the key in the variable --api-key-env names",
                404: "check --api MODEL and --base-url (it usually ends in /v1)",
            }.get(status or 0, "check --base-url and that the server is up")
        tries = f"after {attempts} attempts" if attempts > 1 else "at the first attempt"
        return f"{self.base_url} failed {tries} ({what}: {detail}): {hint}"
