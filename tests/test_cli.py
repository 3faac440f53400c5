import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen import config, models
from ragen.cli import build_parser, main
from ragen.run.lock import hold
from ragen.run.rundir import RunDir
from ragen.viewer.app import create_app


def _all_commands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _all_commands(sub, (*prefix, name))


COMMANDS = [(), *_all_commands(build_parser())]
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "ragen")
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ragen")
    parser = build_parser()
    for name in command:  # walk down to this command's own parser
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    assert parser.description and parser.description in " ".join(out.split())


def test_the_readme_command_table_lists_every_command_and_no_other():
    section = README.read_text().split("## Command line", 1)[1].split("\n## ", 1)[0]
    documented = {
        tuple(m.group(1).split())
        for m in re.finditer(r"^\| `ragen ((?:[a-z]+ ?){1,2})", section, re.MULTILINE)
    }
    # the commands a user runs: those without subcommands of their own
    leaves = {c for c in COMMANDS if c and not any(o[: len(c)] == c != o for o in COMMANDS)}
    assert documented == leaves


def test_console_script_is_installed():
    out = subprocess.run(
        [sys.executable, "-m", "ragen", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.startswith("ragen 0.")


def test_config_show_prints_loadable_yaml(capsys, tmp_path):
    assert main(["config", "show", "bandit", "algo.clip_high=0.3", "--doc"]) == 0
    text = capsys.readouterr().out
    assert "  clip_high: 0.3\n" in text and "  # PPO clip above" in text
    path = tmp_path / "shown.yaml"
    path.write_text(text)
    assert config.load(str(path)) == config.load("bandit", ["algo.clip_high=0.3"])


def test_config_list_names_every_preset(capsys):
    assert main(["config", "list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == config.preset_names()


def test_model_info_of_tiny(capsys, tiny):
    assert main(["model", "info", "tiny", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    described = models.describe(*tiny)  # the count itself is checked in test_models.py
    assert f"{described['parameters']:,}" in out and type(tiny[0]).__name__ in out
    assert "load_seconds_incl_imports" in out


def test_model_prepare_says_ready(capsys, embedded):
    assert main(["model", "prepare"]) == 0
    assert "ready in" in capsys.readouterr().out


def test_bad_model_spec_exits_2(capsys):
    assert main(["model", "chat", "gpt-5", "hello"]) == 2
    assert "unknown model spec 'gpt-5'" in capsys.readouterr().err


def test_eval_of_a_checkpoint_plays_by_the_settings_of_its_run(tmp_path, capsys):
    run = tmp_path / "run"
    eval_8x8 = [
        "env.eval_names=[frozen-lake, frozen-lake-8x8]",
        "env.eval_options.frozen-lake-8x8.spaced=false",
    ]
    settings = ["env.options.edges=false", *eval_8x8]
    steps = ["sft.warm_start=false", "trainer.steps=1", "trainer.save_every=1", NO_TENSORBOARD]
    assert main(["train", "frozen-lake", "--out", str(run), *TINY_RL, *steps, *settings]) == 0
    step = run / "checkpoints" / "step_000001"
    for env, options in (
        ("frozen-lake", {"random_ends": True, "spaced": True, "offsets": True, "edges": False}),
        ("frozen-lake-8x8", {"spaced": False}),  # as the run would evaluate it
    ):
        out = tmp_path / f"eval-{env}"
        args = ["eval", "--env", env, "--model", str(step), "--n", "2", "--out", str(out)]
        assert main([*args, "rollout.max_turns=3"]) == 0
        assert f"settings: {run / 'config.yaml'} (the run of the checkpoint" in (
            capsys.readouterr().out
        )
        played = config.load(str(out / "eval-config.yaml"))
        assert played.env.options == options and played.model.spec == str(step)
        # the run's settings (its reply length), the command's override on top
        assert (played.rollout.max_reply_tokens, played.rollout.max_turns) == (6, 3)
    # --preset chooses other settings: the preset's env options (edges on)
    out = tmp_path / "eval-preset"
    args = ["eval", "--env", "frozen-lake", "--model", str(step), "--n", "2", "--out", str(out)]
    assert main([*args, "--preset", "frozen-lake", "rollout.max_reply_tokens=7"]) == 0
    assert "settings:" not in capsys.readouterr().out
    assert config.load(str(out / "eval-config.yaml")).env.options["edges"] is True


def test_envs_and_play(capsys):
    assert main(["envs"]) == 0
    assert "sokoban-large" in capsys.readouterr().out
    assert main(["play", "bandit", "--seed", "3", "--actions", "Dragon"]) == 0
    assert "Dragon" in capsys.readouterr().out
    assert main(["play", "chess"]) == 2
    assert "unknown environment 'chess'" in capsys.readouterr().err


def test_eval_writes_summary_and_episodes(tiny, tmp_path, capsys):
    out = tmp_path / "ev"
    args = ["eval", "--env", "frozen-lake", "--model", "tiny", "--n", "3", "--k", "2"]
    assert main([*args, "--out", str(out), "rollout.max_reply_tokens=6"]) == 0
    printed = capsys.readouterr().out
    assert "frozen-lake: success 0.00%  pass@2 0.00%" in printed
    summary = json.loads((out / "eval.jsonl").read_text())
    assert (summary["episodes"], summary["seeds"], summary["k"]) == (6, 3, 2)
    assert summary["end"]["truncated:reply_length"] == 1.0  # a random model never closes
    episodes = [json.loads(line) for line in (out / "trajectories" / "eval.jsonl").open()]
    assert sorted((e["group"], e["copy"]) for e in episodes) == [
        (g, c) for g in range(3) for c in range(2)
    ]
    assert {"env", "seed", "turns", "total_reward", "success", "end"} <= set(episodes[0])
    # what it played by: the preset's settings, the override, the command's flags
    played = config.load(str(out / "eval-config.yaml"))
    assert (played.env.name, played.model.spec, played.rollout.max_reply_tokens) == (
        "frozen-lake",
        "tiny",
        6,
    )
    t = played.trainer
    assert (t.eval_episodes, t.eval_k, t.eval_split, played.rollout.backend) == (3, 2, "dev", "hf")
    assert not (out / "config.yaml").exists()  # it trained nothing
    machine = summary["machine"]  # where it ran: model.dtype=auto depends on the CPU
    assert machine["model_dtype"] in ("float32", "bfloat16") and machine["cores"] >= 1
    # Its cost: every sampled token counted once, and the time of each rollout phase.
    cost = summary["cost"]
    assert cost["generated_tokens"] == sum(e["reply_tokens"] for e in episodes)
    assert cost["prefilled_tokens"] > 0 and cost["prefill_s"] > 0 and cost["decode_s"] > 0
    # Each of the four figures is rounded to 0.01 s: the phases may overshoot by 4 × 0.005.
    phases = cost["prefill_s"] + cost["decode_s"] + cost["env_s"]
    assert phases <= summary["seconds"] + 0.02 + 1e-9
    assert "time: prefill" in printed and "decode" in printed
    assert main([*args, "--out", str(out)]) == 2  # never overwrites an evaluation
    assert "already exists" in capsys.readouterr().err
    # a folder another evaluation is writing, or a training run's: refused
    busy = tmp_path / "busy"
    with hold(RunDir(busy)):
        assert main([*args, "--out", str(busy)]) == 2
    assert f"{busy} is in use by pid" in capsys.readouterr().err
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "config.yaml").write_text("{}\n")
    assert main([*args, "--out", str(trained)]) == 2
    assert f"{trained} is a training run's folder" in capsys.readouterr().err


def test_eval_refuses_bad_input_before_loading(capsys):
    assert main(["eval", "--env", "chess"]) == 2
    assert "unknown environment 'chess'" in capsys.readouterr().err
    assert main(["eval", "--env", "bandit", "rollout.max_turns=0"]) == 2
    assert "rollout.max_turns=0" in capsys.readouterr().err


def _old_config_yaml(cfg: config.Config) -> str:
    """``cfg`` as a run saved it while trainer.scoring_pass, prefix_sharing and
    sort_micro_batches existed (since removed)."""
    removed = ["scoring_pass: auto", "prefix_sharing: mini_batch", "sort_micro_batches: true"]
    old = "trainer:\n" + "".join(f"  {line}\n" for line in removed)
    return config.to_yaml(cfg).replace("trainer:\n", old, 1)


def test_monitor_report_and_view_run_from_the_command_line(tmp_path, capsys):
    from tests.monitor.streams import collapsing

    run = tmp_path / "run"
    run.mkdir()
    # a run saved before keys were removed from the config: its readers still read it
    (run / "config.yaml").write_text(_old_config_yaml(config.load("bandit")))
    lines = [json.dumps(r) for r in collapsing(0)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["monitor", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "WARNING rollout/reward_std" in printed and "COLLAPSE rollout/success" in printed
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "summary.md").is_file()
    overview = TestClient(create_app(run)).get("/api/run").json()
    assert overview["config"]["env"] == "bandit" and overview["notices"] == []
    assert main(["view", str(tmp_path / "nothing")]) == 2
    assert "run directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--n", "1000000000"], "--n 1000000000 seeds x --k 1 tries is 1,000,000,000 episodes"),
        (["--k", "1000000000"], "--n 256 seeds x --k 1000000000 tries"),
    ],
)
def test_eval_sizes_are_bounded(flags, message, tmp_path, capsys):
    out = tmp_path / "ev"
    assert main(["eval", "--env", "bandit", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ragen: {message}") and err.count("\n") == 1
    assert f"{config.MAX_EVAL_EPISODES:,}" in err and not out.exists()


def test_eval_refuses_an_infinite_temperature(capsys):
    with pytest.raises(SystemExit) as done:
        main(["eval", "--env", "bandit", "--temperature", "inf"])
    assert done.value.code == 2
    assert "inf is not a finite non-negative number" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:  # logits / 1e-40 overflow: NaN samples
        main(["eval", "--env", "bandit", "--temperature", "1e-40"])
    assert done.value.code == 2
    assert "1e-40 is below 0.001" in capsys.readouterr().err
    assert main(["eval", "--env", "bandit", "rollout.temperature=1e-9"]) == 2
    assert "rollout.temperature=1e-09 is below 0.001" in capsys.readouterr().err


def test_eval_refuses_settings_its_flags_set_and_torchrun(monkeypatch, capsys):
    for override, flag in (
        ("trainer.eval_split=test", "--split"),
        ("rollout.backend=naive", "--backend"),
    ):
        assert main(["eval", "--env", "bandit", override]) == 2
        assert f"is what `ragen eval {flag}` sets: pass {flag}" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would start it
    for command in (["eval", "--env", "bandit"], ["sft", "bandit"]):
        assert main(command) == 2
        assert "start it without torchrun" in capsys.readouterr().err


def test_eval_model_named_like_a_number_is_a_folder(tiny, tmp_path, monkeypatch, capsys):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "123")
    tokenizer.save_pretrained(tmp_path / "123")
    monkeypatch.chdir(tmp_path)
    argv = ["eval", "--env", "bandit", "--model", "123", "--n", "1", "--out", "ev"]
    assert main([*argv, "rollout.max_reply_tokens=4"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "ev" / "eval.jsonl").read_text())["model"] == "123"


def test_overrides_may_follow_options(capsys):
    from ragen.cli import parse_args

    args = parse_args(["train", "bandit", "--out", "R", "model.spec=tiny", "trainer.steps=2"])
    assert (args.preset, args.out) == ("bandit", "R")
    assert args.overrides == ["model.spec=tiny", "trainer.steps=2"]
    args = parse_args(["eval", "rollout.max_turns=3", "--env", "bandit", "trainer.seed=4"])
    assert args.overrides == ["rollout.max_turns=3", "trainer.seed=4"]
    assert main(["config", "show", "bandit", "--doc", "algo.clip_high=0.31"]) == 0
    assert "clip_high: 0.31" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # an unknown option stays an error
        parse_args(["train", "bandit", "--out", "R", "--bogus", "model.spec=tiny"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
