"""Episodes played by a model behind a chat-completions API: the seeds, dialogue, parser,
rewards and end rules of `ragen.rollout.loop.rollout`, with each reply requested from a server
(`ragen.rollout.chat_api`) instead of sampled here.

What differs from a local rollout, and why:

- No reply prefix. Locally the rollout writes ``<think>`` (``<answer>`` with
  ``rollout.think=false``) after the assistant header and the model continues it; an API
  writes the whole assistant turn, so the reply is parsed as it comes, and one that opens its
  own ``<think>`` parses as a local reply does. The dialogue (system line, demonstrations,
  user messages with the format rule, earlier replies) is the one the local rollout builds.
- Token counts are the server's: a turn's ``reply_start`` is the request's prompt tokens and
  its ``reply_end`` adds the reply's, by the server's tokenizer and chat template; no token ids
  are kept. No API counts the think block alone, so ``think_tokens`` is 0 and the reward terms
  that read it are refused (:func:`check_api_spec`).
- The context limit is judged on the server's count, after the request: a prompt that leaves
  fewer than ``max_reply_tokens`` within ``max_context_tokens`` ends the episode
  (``truncated:context``), its reply unused, as the local rollout would have ended it before
  generating.
- Each episode plays its turns in order on its own, up to ``concurrency`` episodes at once;
  the first request that fails for good stops the others before their next request.
- Sampling noise: each request carries a seed of (``sample_seed``, the episode's stream, the
  turn), so a server that samples by its seed repeats an evaluation at a temperature above 0.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ragen.agent.prompts import SYSTEM_PROMPT
from ragen.rollout.chat_api import ChatClient
from ragen.rollout.loop import (
    Episode,
    RolloutSpec,
    make_episodes,
    open_dialogue,
    play_reply,
    reward_terms,
)
from ragen.rollout.trajectory import Trajectory

UNCOUNTED_TERMS = ("think_tokens", "answered_think_tokens")
"""Built-in reward terms that read a think block's token count, which no API reports."""


def check_api_spec(spec: RolloutSpec) -> None:
    """Refuse, in one line, rollout settings an API evaluation cannot honour."""
    uncounted = [name for name, _ in spec.reward_terms if name in UNCOUNTED_TERMS]
    if uncounted:
        raise ValueError(
            f"rollout.reward_terms {', '.join(uncounted)} counts think tokens, which an API "
            "does not report: drop it for an evaluation over an API"
        )
    if spec.context_window != "full":
        raise ValueError(
            f"rollout.context_window={spec.context_window}: an evaluation over an API sends "
            "the whole dialogue; set rollout.context_window=full"
        )


def request_seed(sample_seed: int, stream: int, turn: int) -> int:
    """The seed sent with an episode's request at ``turn``: a 31-bit hash of the three, so
    copies of a seed and turns of an episode ask for different noise."""
    digest = hashlib.blake2b(f"{sample_seed}:{stream}:{turn}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


def _uncounted(_: str) -> int:
    return 0


def _play(
    client: ChatClient,
    ep: Episode,
    spec: RolloutSpec,
    terms: dict,
    sample_seed: int,
    stop: threading.Event,
) -> None:
    """Play one episode to its end, one request a turn; return early once ``stop`` is set."""
    open_dialogue(ep, spec)
    for turn in range(spec.max_turns):
        if stop.is_set():
            return
        reply = client.complete(
            [{"role": "system", "content": SYSTEM_PROMPT}, *ep.messages],
            max_tokens=spec.max_reply_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            seed=request_seed(sample_seed, ep.stream, turn),
        )
        if reply.prompt_tokens + spec.max_reply_tokens > spec.max_context_tokens:
            ep.finish("truncated:context")
            return
        start = reply.prompt_tokens
        user = play_reply(
            ep,
            reply.text,
            cut=reply.cut,
            span=(start, start + reply.completion_tokens),
            think_tokens=_uncounted,
            spec=spec,
            terms=terms,
            turn=turn,
        )
        if user is None:
            return
        ep.messages += [
            {"role": "assistant", "content": reply.text},
            {"role": "user", "content": user},
        ]


def api_rollout(
    client: ChatClient,
    env_name: str,
    seeds: Sequence[int],
    group_size: int,
    spec: RolloutSpec,
    *,
    concurrency: int,
    env_options: dict | None = None,
    sample_seed: int = 0,
    on_episode: Callable[[], None] | None = None,
) -> list[Trajectory]:
    """Play ``group_size`` copies of each seed through ``client``, at most ``concurrency``
    episodes at a time; the trajectories come group by group, numbered as `rollout` numbers
    them. ``on_episode()`` is called as each episode ends (for progress display). A request
    that fails for good (`ragen.rollout.chat_api.ApiError`) stops the rest and is raised."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    check_api_spec(spec)
    terms = reward_terms(spec)
    episodes = make_episodes(env_name, seeds, group_size, spec, env_options, 0)
    stop = threading.Event()

    def play(ep: Episode) -> None:
        try:
            _play(client, ep, spec, terms, sample_seed, stop)
        except BaseException:
            stop.set()
            raise
        if on_episode is not None:
            on_episode()

    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="ragen-api")
    try:
        for future in [pool.submit(play, ep) for ep in episodes]:
            future.result()  # a failure, raised here
    except BaseException:  # a failure, or Ctrl-C: no episode sends another request
        stop.set()
        raise
    finally:
        pool.shutdown(cancel_futures=True)  # waits for the requests under way
    return [ep.traj for ep in episodes]
