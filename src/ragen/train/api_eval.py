"""`ragen eval --api MODEL --base-url URL`: evaluate a model behind any OpenAI-compatible
chat-completions server on the fixed seeds, prompts and parser of a local evaluation, into a
normal evaluation folder (eval.jsonl and trajectories/eval.jsonl, read by `ragen view` and
`ragen report`).

``cli.py`` adds the flags to ``ragen eval`` (:func:`add_arguments`), checks them
(:func:`checked_client`, ValueError with one line) and runs :func:`run`, which returns the exit
status: 0 done, 1 when the server failed for good (one line on stderr, nothing written).

The key is read from the environment variable ``--api-key-env`` names: it is never a flag
(it would stay in the shell's history and the process list), and the folder records only the
variable's name.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ragen.rollout.chat_api import DEFAULT_RETRIES

if TYPE_CHECKING:
    from ragen.config import Config
    from ragen.rollout.chat_api import ChatClient
    from ragen.rollout.trajectory import Trajectory
    from ragen.train.evaluator import EvalRequest

EXIT_OK, EXIT_FAIL = 0, 1
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_CONCURRENCY = 16


def add_arguments(parser: argparse.ArgumentParser, positive_int, non_negative_int) -> None:
    """The flags of an evaluation over an API, as their own group of ``ragen eval``."""
    group = parser.add_argument_group(
        "a model behind an OpenAI-compatible server (needs pip install 'ragen[api]')"
    )
    group.add_argument("--api", metavar="MODEL", help="the model's name on the server")
    group.add_argument("--base-url", metavar="URL", help="e.g. http://127.0.0.1:8080/v1")
    group.add_argument(
        "--api-key-env",
        default=DEFAULT_KEY_ENV,
        metavar="VAR",
        help=f"environment variable holding the key (default {DEFAULT_KEY_ENV})",
    )
    group.add_argument(
        "--concurrency",
        type=positive_int,
        default=DEFAULT_CONCURRENCY,
        help=f"episodes played at once (default {DEFAULT_CONCURRENCY})",
    )
    group.add_argument(
        "--retries",
        type=non_negative_int,
        default=DEFAULT_RETRIES,
        help=f"retries of a request on 429, 5xx or a lost connection (default {DEFAULT_RETRIES})",
    )


def checked_client(args: argparse.Namespace, config: Config) -> ChatClient:
    """The client the flags describe, once they and the rollout settings are checked;
    ValueError with one line saying what to fix. Nothing is sent yet."""
    from ragen.rollout.api_loop import check_api_spec
    from ragen.rollout.chat_api import ChatClient
    from ragen.rollout.loop import RolloutSpec
    from ragen.train import distributed

    if args.api is None or args.base_url is None:
        raise ValueError("--api MODEL and --base-url URL go together: give both")
    if args.model is not None or args.backend is not None:
        raise ValueError("--api evaluates a model behind a server: drop --model and --backend")
    if distributed.launched_world_size() > 1:
        raise ValueError(
            "ragen eval --api runs in one process (--concurrency plays episodes at once): "
            "start it without torchrun"
        )
    check_api_spec(RolloutSpec.from_config(config.rollout))
    url = urlsplit(args.base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(
            f"--base-url {args.base_url!r}: give the server's http(s) URL, "
            "e.g. http://127.0.0.1:8080/v1"
        )
    if url.username is not None or url.password is not None:
        raise ValueError(
            "--base-url holds a user or password: put the key in the environment variable "
            "--api-key-env names, so that no file of the run records it"
        )
    key = os.environ.get(args.api_key_env, "")
    if not key:
        raise ValueError(
            f"the environment variable {args.api_key_env} holds no API key: export it (a "
            "server without keys, such as llama-server, takes any value)"
        )
    return ChatClient(args.base_url, args.api, key, retries=args.retries)


def run(args: argparse.Namespace, config: Config, client: ChatClient) -> int:
    """Evaluate, write the folder, print the summary; 1 (nothing written) when a request
    failed for good."""
    from pathlib import Path

    from ragen.rollout.chat_api import ApiError
    from ragen.run.rundir import check_eval_out, default_run_root
    from ragen.train.evaluator import EvalRequest, format_summary, write_eval
    from ragen.train.preflight import check_demonstrations, import_envs, import_reward_terms

    out = Path(args.out) if args.out else default_run_root(f"eval-{args.env}")
    check_eval_out(out)
    import_envs(config)  # user code, imported only now that a run starts
    check_demonstrations(config, [args.env])
    import_reward_terms(config)
    request = EvalRequest.of(config.trainer, args.env)  # the flags' values, see cli._eval_config
    try:
        summary, trajectories = evaluate_api(
            client, config, request, concurrency=args.concurrency, progress=True
        )
    except ApiError as err:
        print(f"ragen: {err}", file=sys.stderr)
        return EXIT_FAIL
    write_eval(out, summary, trajectories, model=client.model, config=config)
    print(format_summary(args.env, summary))
    print(f"episodes written to {out / 'trajectories' / 'eval.jsonl'}")
    return EXIT_OK


def evaluate_api(
    client: ChatClient, config: Config, request: EvalRequest, *, concurrency: int, progress: bool
) -> tuple[dict, list[Trajectory]]:
    """`ragen.train.evaluator.evaluate` with the model behind ``client``: the same seeds,
    dialogue and parser (`ragen.rollout.api_loop`), up to ``concurrency`` episodes at once.
    The summary says so under ``api``: the server, that no reply prefix was written
    (``prefill``: false), and the requests, retries and tokens the server counted."""
    import time

    from tqdm import tqdm

    from ragen.config import env_options
    from ragen.rollout.api_loop import api_rollout
    from ragen.train.evaluator import eval_seeds, eval_spec, summarize

    spec = eval_spec(config, request)
    seeds = eval_seeds(request.n, request.split)
    bar = tqdm(
        total=len(seeds) * request.k,
        desc=f"eval {request.env} over the API",
        unit="episode",
        disable=not progress,
    )
    started = time.perf_counter()
    try:
        trajectories = api_rollout(
            client,
            request.env,
            seeds,
            request.k,
            spec,
            concurrency=concurrency,
            env_options=env_options(config, request.env),
            sample_seed=config.trainer.seed,
            on_episode=lambda: bar.update(1),
        )
    finally:
        bar.close()
    summary = summarize(trajectories)
    summary.update(env=request.env, temperature=request.temperature, split=request.split)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    summary["api"] = {
        "base_url": client.base_url,
        "prefill": False,
        "concurrency": concurrency,
        **client.usage,
    }
    return summary, trajectories
