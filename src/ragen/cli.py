"""The `ragen` command line.

Every command validates its input before doing anything: a bad config, model spec or env
name prints one line saying what is wrong and how to fix it, and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from ragen import __version__

EXIT_OK, EXIT_USAGE = 0, 2


class UsageError(ValueError):
    """Input on the command line that the user must fix."""


# ------------------------------------------------------------------------------- model


def _cmd_model_prepare(args: argparse.Namespace) -> int:
    from ragen import models

    source = models.resolve(args.spec)
    if source.kind != "embedded":
        print(f"{args.spec}: nothing to prepare ({source.kind} model, loaded as it is)")
        return EXIT_OK
    if models.is_prepared(source) and not args.force:
        print(f"{source.spec}: ready in {source.path}")
        return EXIT_OK
    print(f"{source.spec}: converting the embedded GGUF to safetensors (about 20 s, once)...")
    started = time.perf_counter()
    models.prepare(args.spec, force=args.force)
    print(f"{source.spec}: ready in {source.path} ({time.perf_counter() - started:.1f} s)")
    return EXIT_OK


def _cmd_model_info(args: argparse.Namespace) -> int:
    from ragen import models

    models.prepare(args.spec)  # conversion time is not load time
    started = time.perf_counter()
    model, tokenizer = models.load_policy(
        args.spec, dtype=args.dtype, allow_download=args.allow_download
    )
    load_s = time.perf_counter() - started
    facts = models.describe(model, tokenizer)
    facts["bf16_native"] = models.bf16_supported("cpu")
    facts["load_seconds"] = round(load_s, 2)
    width = max(map(len, facts))
    print(f"model {args.spec}")
    for key, value in facts.items():
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
        print(f"  {key:<{width}}  {shown}")
    return EXIT_OK


def _cmd_model_chat(args: argparse.Namespace) -> int:
    from ragen import models

    if len(args.words) == 1:
        spec, text = models.DEFAULT_SPEC, args.words[0]
    elif len(args.words) == 2:
        spec, text = args.words
    else:
        raise UsageError('usage: ragen model chat [SPEC] "text" (quote the text)')
    model, tokenizer = models.load_policy(
        spec, dtype=args.dtype, allow_download=args.allow_download
    )
    print(models.greedy_reply(model, tokenizer, text, max_new_tokens=args.max_new_tokens))
    return EXIT_OK


# ------------------------------------------------------------------------------ config


def _cmd_config_show(args: argparse.Namespace) -> int:
    from ragen import config

    print(config.to_yaml(config.load(args.preset, args.overrides), doc=args.doc), end="")
    return EXIT_OK


def _cmd_config_list(_: argparse.Namespace) -> int:
    from ragen import config

    names = config.preset_names()
    width = max(map(len, names))
    for name in names:
        first = (config.preset_dir() / f"{name}{config.PRESET_SUFFIX}").read_text().splitlines()
        summary = first[0].lstrip("# ") if first and first[0].startswith("#") else ""
        print(f"{name:<{width}}  {summary}")
    return EXIT_OK


# -------------------------------------------------------------------------------- envs


def _cmd_envs(_: argparse.Namespace) -> int:
    from ragen.envs.play import describe_envs

    print(describe_envs())
    return EXIT_OK


def _cmd_play(args: argparse.Namespace) -> int:
    from ragen import envs
    from ragen.envs.play import play

    if args.name not in envs.names():
        raise UsageError(f"unknown environment {args.name!r}: use one of {', '.join(envs.names())}")
    actions = None
    if args.actions is not None:
        actions = [a.strip() for a in args.actions.replace("||", ",").split(",") if a.strip()]
    return play(args.name, seed=args.seed, actions=actions)


# ------------------------------------------------------------------------------ parser


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights dtype (auto: bfloat16 where the CPU runs it natively, else float32)",
    )
    parser.add_argument(
        "--allow-download",
        action="store_true",
        help="allow fetching a Hugging Face Hub id (off: never touch the network)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragen",
        description="Train LLM agents with multi-turn RL (StarPO / StarPO-S).",
    )
    parser.add_argument("--version", action="version", version=f"ragen {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    model = commands.add_parser(
        "model",
        help="prepare, inspect and smoke-test a model",
        description="prepare, inspect and smoke-test a model",
    )
    model_cmds = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    spec_help = "smollm2-135m (default), tiny, a local HF model folder, or a Hub id"
    p = model_cmds.add_parser(
        "prepare",
        help="convert the embedded model to safetensors (once)",
        description="convert the embedded model to safetensors (once)",
    )
    p.add_argument("spec", nargs="?", default="smollm2-135m", help=spec_help)
    p.add_argument("--force", action="store_true", help="convert again even if cached")
    p.set_defaults(func=_cmd_model_prepare)
    p = model_cmds.add_parser(
        "info",
        help="architecture, size, dtype, chat template, load time",
        description="architecture, size, dtype, chat template, load time",
    )
    p.add_argument("spec", nargs="?", default="smollm2-135m", help=spec_help)
    _model_args(p)
    p.set_defaults(func=_cmd_model_info)
    p = model_cmds.add_parser(
        "chat",
        help="print one greedy reply: ragen model chat [SPEC] TEXT",
        description="print one greedy reply: ragen model chat [SPEC] TEXT",
    )
    p.add_argument("words", nargs="+", metavar="[SPEC] TEXT", help=f"SPEC: {spec_help}")
    p.add_argument("--max-new-tokens", type=_positive_int, default=128, help="reply budget")
    _model_args(p)
    p.set_defaults(func=_cmd_model_chat)

    cfg = commands.add_parser(
        "config",
        help="list presets and show resolved configs",
        description="list presets and show resolved configs",
    )
    cfg_cmds = cfg.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    p = cfg_cmds.add_parser(
        "show",
        help="print the resolved YAML of a preset plus overrides",
        description="print the resolved YAML of a preset plus overrides",
    )
    p.add_argument("preset", help="preset name (see `ragen config list`) or a .yaml path")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.clip_high=0.28")
    p.add_argument("--doc", action="store_true", help="print each field's documentation")
    p.set_defaults(func=_cmd_config_show)
    p = cfg_cmds.add_parser(
        "list", help="the presets shipped with ragen", description="the presets shipped with ragen"
    )
    p.set_defaults(func=_cmd_config_list)

    p = commands.add_parser(
        "envs", help="list the environments", description="list the environments"
    )
    p.set_defaults(func=_cmd_envs)
    p = commands.add_parser(
        "play",
        help="play an environment in the terminal",
        description="play an environment in the terminal",
    )
    p.add_argument("name", help="environment name (see `ragen envs`)")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="level seed")
    p.add_argument(
        "--actions",
        help='play a fixed sequence non-interactively, e.g. "Up,Left,Left"',
    )
    p.set_defaults(func=_cmd_play)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative integer")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (2 for input the user must fix)."""
    from ragen.config import ConfigError
    from ragen.models import ModelError
    from ragen.monitor.logging import RunDirError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ModelError, RunDirError, UsageError) as err:
        print(f"ragen: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ragen: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
