"""Minutes until the policy is good: a whole recipe, from the embedded model, inside a budget.

    python -m experiments.speedrun PRESET [--budget 20] [--warmup 0] [--seeds 3] [--name NAME]
        [--test-n 256] [--dev-n 64] [--dev-every 0] [--out runs/speedrun-NAME] [overrides ...]

For each training seed 0..K-1 the recipe runs as a user would run it, nothing trained on disk
beforehand: ``ragen sft PRESET`` for up to ``--warmup`` minutes (the warm-up; none when 0),
then ``ragen train PRESET`` from its last checkpoint for the rest of ``--budget`` minutes,
both with the ``overrides`` (the recipe) and ``trainer.seed`` set to the seed; a stage also
ends at its ``sft.steps`` or ``trainer.steps``. A ``--warmup`` of the whole budget makes a
recipe of the warm-up alone: no RL stage follows, even where ``sft.steps`` ends it early
(a screen at a fixed step count). The warm-up is the driver's own: a preset's
``sft.warm_start`` is switched off in the RL stage (the frozen-lake and sokoban presets'
warm start is ``--warmup`` with their own sft settings). The clock is
the wall time of those two commands, process start, model load and their dev evaluations
included; a stage stops when another step at its pace so far would end past the budget
(``trainer.max_minutes``). The budget is fixed before the run: a run is never extended.

Evaluations follow the seed splits (``trainer.eval_split``): during the run only ``dev``
(``--dev-n`` seeds at the recipe's eval temperature, after the warm-up and every
``--dev-every`` RL steps and after the last; the curve of success against minutes); after
the clock stops, the final policy on ``--test-n`` ``test`` seeds at T=0.5 and greedily
(``ragen eval --split test``), beside the embedded model's own test figure (once, before
any training) and the floors a state-blind or one-line policy reaches on the same test
seeds (FrozenLake: uniform play, the move toward the goal, the careful rule and the optimum
for the recipe's turns; Sokoban: the best blind move sequence for the recipe's turns, the
push rule and the shortest solution; computed once per runs folder, ``floors.json``). Each
run's test success is given with its own standard error; the seeds' mean with the sd across
seeds. On Sokoban each final policy also plays the test seeds at T=0.5 shown the paired
rooms (``env.options.swap_view=true``): the points it loses there show that it reads the
room (issue 49 asks for 10).

Writes ``experiments/results/speedrun_NAME.json`` (recipe, commands, machine: CPU model and
flags, threads, a bf16 reference matmul measured in the same run so minutes from another
machine can be scaled; per seed the minutes of each stage, the RL stage's per-step record
(`experiments.step_record`), the dev curve, the test figures, the share of test episodes
the most frequent action sequence took) and
``docs/speedrun/NAME.png`` (dev success against minutes, the test figures at the end, the
floors and the target). NAME defaults to PRESET. Each seed's record is written into its run
folder as it lands; a rerun with the same ``--out`` keeps finished seeds, and a seed whose
folder exists without a record (a killed run) is moved aside and reported as killed, then
run again from nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from benchmarks.measure import cpu_flags, cpu_model, gemm_gflops
from experiments import blind_play, lake_ceiling, step_record
from ragen import config, envs
from ragen.envs.bandit import arm_order
from ragen.envs.experts import (
    PUSH_EXPERTS,
    careful_move,
    expert_move,
    goal_probabilities,
    policy_success,
    push_plan,
)
from ragen.envs.frozen_lake import (
    ACTIONS,
    SIDE_KINDS,
    neighbours,
    side_kinds,
    toward_goal,
    transition_table,
)
from ragen.envs.sokoban_levels import solve
from ragen.run.jsonl import read_jsonl, write_atomic
from ragen.train.evaluator import eval_seeds
from ragen.train.preflight import check_references

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).parent.parent / "docs" / "speedrun"
RAGEN = Path(sys.executable).parent / "ragen"  # the console script: the cwd is not imported
RECORD = "speedrun.json"  # a finished seed's record, in its run folder
MIN_STAGE_MINUTES = 1.0  # an RL stage left less training time than this is not started
STARTUP_MINUTES = 0.25  # a stage's process start and model load, before its trainer's clock
TEST_TEMPERATURES = {"t0.5": 0.5, "greedy": 0.0}  # the final figure's, and greedy beside it
TARGETS = {"frozen-lake": 0.45, "sokoban": 0.35, "bandit": 1.0}  # issue 49's test targets


def run(command: list[str], log: Path) -> float:
    """Run a ragen command with its output appended to ``log``; its wall seconds. Raises
    SystemExit with the log's tail when it fails."""
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code:
        tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise SystemExit(f"{' '.join(command)} exited with {code}; the end of {log}:\n{tail}")
    return time.perf_counter() - started


def last_checkpoint(run_dir: Path) -> Path:
    """The newest checkpoint folder of a run."""
    found = sorted((run_dir / "checkpoints").glob("step_*"))
    if not found:
        raise SystemExit(f"{run_dir} saved no checkpoint")
    return found[-1]


def evaluations(run_dir: Path) -> list[dict]:
    """The evaluation summaries a run wrote, in order."""
    path = run_dir / "eval.jsonl"
    return read_jsonl(path).records


def step_minutes(run_dir: Path, since: float) -> dict[int, float]:
    """Minutes from the wall time ``since`` to the logging of each step of a run (its
    metrics line, written after the step's evaluation)."""
    rows = read_jsonl(run_dir / "metrics.jsonl").records
    return {int(row["step"]): (float(row["time"]) - since) / 60 for row in rows}


def dev_points(stage: str, run_dir: Path, ends: dict[int, float]) -> list[dict]:
    """The curve's points of a stage: each dev evaluation at the minute its step ended."""
    return [
        {
            "stage": stage,
            "step": row["step"],
            "success": row["success"],
            "minutes": ends[row["step"]],
            "eval_minutes": row["seconds"] / 60,
        }
        for row in evaluations(run_dir)
        if row["step"] in ends
    ]


def rate_and_error(summary: dict) -> dict:
    """A test summary's success with its standard error over its seeds (per-seed success
    rates: the k tries of a seed are not independent draws of the level)."""
    p, n = summary["success"], summary["seeds"]
    return {
        "success": p,
        "se": math.sqrt(max(p * (1 - p), 0.0) / n) if n else None,
        "seeds": n,
        "format_ok": summary["format_ok"],
        "one_sequence_share": summary["action_template_share"],
        "template": summary.get("action_template"),
    }


def holes_beside_count(rows: tuple[str, ...], cell: int) -> int:
    """How many of the (up to four) cells beside ``cell`` are holes."""
    tiles = "".join(rows)
    return sum(near is not None and tiles[near] == "H" for near in neighbours(len(rows), cell))


# A sides thought's labels ("Left away, Down wall, Right toward, Up hole"), in any order of
# the four sides (the scan thought lists them Down, Up, Left, Right).
SIDE_LABEL = re.compile(rf"\b({'|'.join(ACTIONS)}) ({'|'.join(SIDE_KINDS)})\b")


def said_kinds(think: str) -> tuple[str, ...] | None:
    """The kinds a thought's labels give the four sides, in ACTIONS order; None unless it
    labels each side exactly once."""
    labels = SIDE_LABEL.findall(think)
    said = dict(labels)
    if len(labels) != len(ACTIONS) or len(said) != len(ACTIONS):
        return None
    return tuple(said[side] for side in ACTIONS)


def worst_kind_ties(rows: tuple[str, ...], cell: int) -> str:
    """How many sides of ``cell`` hold the worst kind there is beside it ("1" or "2+"): on a
    tie the careful move is decided by its tie-break, not by the kinds."""
    kinds = side_kinds(rows, cell)
    worst = max(kinds, key=SIDE_KINDS.index)
    return "1" if kinds.count(worst) == 1 else "2+"


def lake_agreement(episodes_file: Path, options: dict) -> dict:
    """The share of a FrozenLake evaluation's moves that equal the careful rule's and the
    toward rule's from the cell each was made on, and the careful share by how many holes
    lay beside that cell ("0", "1", "2+"; None where no move was made from such a cell): each
    episode replayed from its seed, whose slip stream makes every move land where it landed.
    What the policy reads of the lake, beside the share of episodes one action sequence took.

    ``careful_by_worst_ties``: the careful share by how many sides hold the worst kind beside
    the cell ("1", "2+"; `worst_kind_ties`), where the sides thoughts name the worst outright
    or must break a tie.

    ``side_labels``: where the turns' thoughts name what lies on each side (the sides
    expert's "Left away, Down wall, ..."), the share of those turns whose four labels all
    match `frozen_lake.side_kinds` of the cell, and per true kind the share labelled right;
    None when no thought names them."""
    env = envs.make("frozen-lake", **options)
    same = {"careful": 0, "toward": 0}
    moves = 0
    by_holes = {"0": [0, 0], "1": [0, 0], "2+": [0, 0]}  # [careful moves, moves]
    by_ties = {"1": [0, 0], "2+": [0, 0]}
    labelled, all_right = 0, 0
    by_kind = {kind: [0, 0] for kind in SIDE_KINDS}  # [labelled right, sides of that kind]
    for episode in read_jsonl(episodes_file).records:
        env.reset(int(episode["seed"]))
        table, goal = transition_table(env.rows, env.slippery), "".join(env.rows).index("G")
        over = False
        for turn in episode["turns"]:
            said = said_kinds(turn.get("think") or "")
            if said and turn["actions"]:
                truth = side_kinds(env.rows, env.state)
                labelled += 1
                all_right += said == truth
                for kind, label in zip(truth, said, strict=True):
                    by_kind[kind][0] += label == kind
                    by_kind[kind][1] += 1
            for action in turn["actions"]:
                careful = action == careful_move(env.rows, table, env.state)
                same["careful"] += careful
                same["toward"] += action == toward_goal(goal, env.state, len(env.rows))
                moves += 1
                count = holes_beside_count(env.rows, env.state)
                bucket = by_holes[("0", "1", "2+")[min(count, 2)]]
                bucket[0] += careful
                bucket[1] += 1
                ties = by_ties[worst_kind_ties(env.rows, env.state)]
                ties[0] += careful
                ties[1] += 1
                over = env.step(action).terminated
                if over:
                    break
            if over:
                break
    shares: dict = {who: count / moves if moves else None for who, count in same.items()}
    shares["careful_by_holes_beside"] = {
        k: (hit / n if n else None) for k, (hit, n) in by_holes.items()
    }
    shares["moves_by_holes_beside"] = {k: n for k, (_, n) in by_holes.items()}
    shares["careful_by_worst_ties"] = {
        k: (hit / n if n else None) for k, (hit, n) in by_ties.items()
    }
    shares["moves_by_worst_ties"] = {k: n for k, (_, n) in by_ties.items()}
    shares["side_labels"] = (
        {
            "turns": labelled,
            "all_right": all_right / labelled,
            "right_by_kind": {k: (hit / n if n else None) for k, (hit, n) in by_kind.items()},
        }
        if labelled
        else None
    )
    return shares


def evaluate(
    args: argparse.Namespace,
    model: str | None,
    seed: int,
    where: tuple[str, int, float],
    out: Path,
    log: Path,
    extra: tuple[str, ...] = (),
) -> tuple[dict, float]:
    """``ragen eval`` of ``model`` (None: the recipe's own ``model.spec``) on ``where`` =
    (split, seeds, temperature), into ``out``, with the ``extra`` overrides after the
    recipe's: its summary and the wall seconds it took."""
    split, n, temperature = where
    chosen = ["--model", model] if model is not None else []
    command = [
        str(RAGEN), "eval", "--env", args.env_name, "--preset", args.preset, *chosen,
        "--split", split, "--n", str(n), "--temperature", f"{temperature:g}",
        "--out", str(out), *args.overrides, *extra,
        f"trainer.seed={seed}", f"trainer.threads={args.threads}",
    ]  # fmt: skip
    seconds = run(command, log)
    return evaluations(out)[-1], seconds


def one_seed(args: argparse.Namespace, seed: int, folder: Path) -> dict:
    """The recipe trained with training seed ``seed`` in ``folder``, then tested."""
    folder.mkdir(parents=True)
    log = folder / "speedrun.log"
    common = [*args.overrides, f"trainer.seed={seed}", f"trainer.threads={args.threads}"]
    dev = ["trainer.eval_split=dev", f"trainer.eval_episodes={args.dev_n}"]
    budget_s, stages, curve = 60 * args.budget, {}, []
    model = None  # the recipe's own model.spec until a stage saves one
    clock, since = time.perf_counter(), time.time()
    if args.warmup > 0:
        sft = folder / "sft"
        minutes = min(args.warmup, args.budget) - STARTUP_MINUTES - args.dev_eval_minutes
        minutes = max(minutes, 0.1)
        seconds = run(
            [str(RAGEN), "sft", args.preset, *common, *dev, f"trainer.max_minutes={minutes:g}",
             "sft.eval_every=0", "trainer.save_every=0", "--out", str(sft)],
            log,
        )  # fmt: skip
        ends = step_minutes(sft, since)
        stages["sft"] = {"minutes": seconds / 60, "steps": len(ends)}
        curve += dev_points("sft", sft, ends)
        model = str(last_checkpoint(sft))
    left = (budget_s - (time.perf_counter() - clock)) / 60
    minutes = left - STARTUP_MINUTES - args.dev_eval_minutes  # the RL stage's own budget
    if args.warmup < args.budget and minutes >= MIN_STAGE_MINUTES:
        rl = folder / "rl"
        every = args.dev_every or config.MAX_STEPS  # 0: only after the last step
        command = [
            str(RAGEN), "train", args.preset, *common, *dev, "sft.warm_start=false",
            *([f"model.spec={json.dumps(model)}"] if model else []),
            f"trainer.max_minutes={minutes:.3f}", f"trainer.eval_every={every}",
            "trainer.save_every=0", "--out", str(rl),
        ]  # fmt: skip
        seconds = run(command, log)
        ends = step_minutes(rl, since)
        stages["rl"] = {
            "minutes": seconds / 60,
            "steps": len(ends),
            "per_step": step_record.record(rl),  # for the collapse detector's calibration
        }
        curve += dev_points("rl", rl, ends)
        model = str(last_checkpoint(rl))
    trained = (time.perf_counter() - clock) / 60
    record = {
        "training_seed": seed,
        "minutes": trained,
        "within_budget": trained <= args.budget,
        "stages": stages,
        "dev_curve": curve,
        "final_model": model,
        "test": {},
        "test_minutes": {},
    }
    for name, temperature in TEST_TEMPERATURES.items():
        where = ("test", args.test_n, temperature)
        summary, seconds = evaluate(args, model, seed, where, folder / f"test-{name}", log)
        record["test"][name] = rate_and_error(summary)
        record["test_minutes"][name] = seconds / 60
    write_atomic(folder / RECORD, json.dumps(record, indent=2) + "\n")
    return record


# ------------------------------------------------------------------------------ floors


def lake_floors(options: dict, turns: int, per_turn: int, n: int) -> dict:
    """Success of state-blind and one-line policies on the ``n`` FrozenLake test lakes, each
    turn's ``per_turn`` actions chosen at the turn's start and played blind (exact); beside
    them the optimum for the recipe's turns and for ``turns × per_turn`` actions each seen."""
    env = envs.make("frozen-lake", **options)
    budget = turns * per_turn
    uniform = optimum = 0.0
    for seed in eval_seeds(n, "test"):
        env.reset(seed)
        table = transition_table(env.rows, env.slippery)
        every = [[1.0 / len(ACTIONS)] * len(ACTIONS)] * len(table)
        uniform += policy_success(table, every, budget)[budget][env.state] / n
        optimum += goal_probabilities(table, budget)[budget][env.state] / n
    play = lake_ceiling.expert_play("frozen-lake", n, turns, per_turn, options, "test")
    return {"uniform": uniform, **play, "optimal_per_action": optimum}


def bandit_floors(options: dict, n: int) -> dict:
    """Bandit's name-blind policies on the ``n`` test seeds: an arm drawn at random (half the
    pulls pay off best in expectation) and always the arm listed first (the order is seeded,
    so the share of seeds that list the risky arm first)."""
    env = envs.make("bandit", **options)
    first = sum(arm_order(s, env.actions)[0] == env.high_risk for s in eval_seeds(n, "test"))
    return {"uniform": 0.5, "first_listed": first / n}


def sokoban_floors(options: dict, turns: int, per_turn: int, budget: int, n: int) -> dict:
    """On the ``n`` Sokoban test rooms: the best state-blind sequence of ``turns`` turns of one
    move repeated ``per_turn`` times, and the two experts of ``ragen sft`` playing the recipe's
    turns within ``budget`` actions: the push rules (one box only) and the shortest solution
    (the ceiling)."""
    rooms = blind_play.levels(n, "test", options)
    _, best = blind_play.best_repeated(rooms, turns, per_turn)
    out = {"best_blind_sequence": best}
    env = envs.make("sokoban", **{**options, "max_actions": budget})
    experts = (*PUSH_EXPERTS, "optimal") if env.num_boxes == 1 else ("optimal",)
    for who in experts:
        won = 0
        for seed in eval_seeds(n, "test"):
            env.reset(seed)
            used = 0
            for _ in range(turns):
                for action in expert_move(env, per_turn, budget - used, sokoban=who).answer:
                    result, used = env.step(action), used + 1
                    if result.terminated or result.truncated:
                        break
                if result.terminated or result.truncated:
                    won += result.terminated
                    break
        out[who] = won / n
    return out


def floors(cfg: config.Config, n: int) -> dict:
    """The floors of the recipe's game on the test seeds: FrozenLake's one-line policies,
    Sokoban's best state-blind sequence of repeated-move turns and its experts, Bandit's
    name-blind picks; none for other games."""
    r = cfg.rollout
    if cfg.env.name == "bandit":
        return bandit_floors(dict(cfg.env.options), n)
    if cfg.env.name == "frozen-lake":
        return lake_floors(dict(cfg.env.options), r.max_turns, r.max_actions_per_turn, n)
    if cfg.env.name == "sokoban":
        return sokoban_floors(
            dict(cfg.env.options),
            r.max_turns,
            r.max_actions_per_turn,
            r.max_actions_per_episode,
            n,
        )
    return {}


def cached_floors(cfg: config.Config, args: argparse.Namespace) -> dict:
    """`floors` of the recipe, computed once per runs folder (``floors.json``): Sokoban's
    blind search over ten single moves takes minutes."""
    path = args.out / "floors.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    found = floors(cfg, args.test_n)
    write_atomic(path, json.dumps(found, indent=2) + "\n")
    return found


# ------------------------------------------------------------------------------ output


def machine() -> dict:
    """The machine, with a reference figure measured now: the best bf16 GFLOP/s of a
    2048³ matmul at the run's thread count."""
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "reference_bf16_gflops": gemm_gflops(torch.bfloat16, 2048, 2048, 2048, 4.0),
    }


def aggregate(records: list[dict], target: float | None) -> dict:
    """Mean and sd across seeds of each test figure, minutes, and whether the target fell."""
    out: dict = {"seeds": len(records)}
    for name in ("t0.5", "greedy"):
        values = [r["test"][name]["success"] for r in records]
        out[name] = {
            "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "per_seed": values,
            "per_seed_se": [r["test"][name]["se"] for r in records],
        }
    out["minutes_mean"] = statistics.fmean(r["minutes"] for r in records)
    if target is not None:
        out["target"] = target
        out["reached"] = out["t0.5"]["mean"] >= target
    return out


def plot(result: dict, path: Path) -> None:
    """Dev success against minutes per seed, the test figures at the end (and Sokoban's with
    the rooms swapped), floors, target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    before = result["before"]["dev"]
    swap_named = False
    for record in result["runs"]:
        xs = [0.0] + [p["minutes"] for p in record["dev_curve"]]
        ys = [before] + [p["success"] for p in record["dev_curve"]]
        line = ax.plot(xs, ys, marker="o", label=f"seed {record['training_seed']} (dev)")[0]
        test = record["test"]["t0.5"]
        ax.errorbar(
            record["minutes"], test["success"], yerr=test["se"], fmt="s",
            color=line.get_color(), capsize=3,
        )  # fmt: skip
        if "swap_view" in record:  # Sokoban's blind-play check: the same policy, rooms swapped
            swapped = (record["minutes"], record["swap_view"]["success"])
            ax.plot(*swapped, "x", color=line.get_color())
            if not swap_named:  # one label for the seeds' crosses, which lie close together
                ax.text(*swapped, "rooms swapped ", fontsize=7, ha="right", va="top")
                swap_named = True
    floors = result["floors"]
    for i, (name, value) in enumerate(floors.items()):  # labels staggered: floors may be close
        ax.axhline(value, linestyle=":", linewidth=1, color="grey")
        x = result["budget_minutes"] * i / (len(floors) + 1)
        ax.text(x, value, f" {name}", fontsize=7, va="bottom", color="grey")
    if result.get("target") is not None:
        ax.axhline(result["target"], linestyle="--", color="black", linewidth=1)
        ax.axvline(result["budget_minutes"], linestyle="--", color="black", linewidth=1)
    ax.set_xlabel("minutes (warm-up and RL, dev evaluations included)")
    ax.set_ylabel("success (dev: circles, test T=0.5: squares ± SE)")
    ax.set_title(f"speedrun {result['name']}")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def set_aside(folder: Path) -> Path:
    """Move a killed seed's folder aside (``seed-N.killed-K``) and return where it went."""
    k = 1
    while (aside := folder.with_name(f"{folder.name}.killed-{k}")).exists():
        k += 1
    folder.rename(aside)
    return aside


def killed_record(folder: Path) -> dict:
    """What a killed seed's folder shows: its stages' steps and how far it got."""
    stages = {}
    for stage in ("sft", "rl"):
        rows = read_jsonl(folder / stage / "metrics.jsonl").records
        if rows:
            stages[stage] = {"steps": len(rows), "last_step": rows[-1]["step"]}
    return {"folder": str(folder), "stages": stages}


def push_agreement(episodes_file: Path, options: dict) -> dict:
    """The share of a one-box Sokoban evaluation's moves that equal each push rule's
    (`experts.push_plan`, larger offset first and named offset first) from the room each was
    made in, and the share that keep a shortest solution (one move fewer left to solve the
    room after it): each episode replayed from its seed. ``push_when_behind``: the larger-
    offset rule's share among moves made from the cell behind the box, where it pushes;
    ``push_when_walking``: among the others."""
    env = envs.make("sokoban", **{**options, "swap_view": False})
    same = dict.fromkeys(PUSH_EXPERTS, 0)
    shortest = moves = 0
    behind = {True: [0, 0], False: [0, 0]}  # [push-rule moves, moves], by standing behind
    for episode in read_jsonl(episodes_file).records:
        env.reset(int(episode["seed"]))
        left = solve(env.room)  # a shortest solution from the room each move is made in
        for action in [a for turn in episode["turns"] for a in turn["actions"]]:
            room = env.room
            plan = push_plan(room)
            same["push"] += action == plan.move
            same["push_first"] += action == push_plan(room, first=True).move
            at = behind[not plan.kinds]
            at[0] += action == plan.move
            at[1] += 1
            moves += 1
            if env.step(action).terminated:
                shortest += left is not None and len(left) == 1
                break
            after = solve(env.room)
            shortest += left is not None and after is not None and len(after) < len(left)
            left = after
    shares: dict = {who: count / moves if moves else None for who, count in same.items()}
    shares["shortest"] = shortest / moves if moves else None
    for key, (hit, n) in (("push_when_behind", behind[True]), ("push_when_walking", behind[False])):
        shares[key] = hit / n if n else None
    shares["moves"] = moves
    return shares


def read_agreement(args: argparse.Namespace, records: list[dict]) -> None:
    """Each FrozenLake or one-box Sokoban record's ``same_move_as``, read from the test
    episodes its seed folder keeps, whenever they ran; a record written back into a folder
    without them (runs/ lost) keeps the reading it was written with."""
    agreement = lake_agreement if args.env_name == "frozen-lake" else push_agreement
    for record in records:
        for name in TEST_TEMPERATURES:
            folder = args.out / f"seed-{record['training_seed']}" / f"test-{name}"
            episodes = folder / "trajectories" / "eval.jsonl"
            if episodes.exists():
                record["test"][name]["same_move_as"] = agreement(episodes, args.env_options)


SWAP_VIEW = "env.options.swap_view=true"  # Sokoban's blind-play check (SokobanEnv)
LOOKS_AT_ROOM = 0.10  # issue 49: the policy loses this much with the rooms swapped


def check_swapped(args: argparse.Namespace, records: list[dict]) -> None:
    """Sokoban's blind-play check on each record that lacks it: the final policy on the same
    test seeds at T=0.5, each shown its paired room (`SokobanEnv` ``swap_view``), and the
    success it loses by that; written back into the seed's record."""
    for record in records:
        if "swap_view" in record:
            continue
        seed = record["training_seed"]
        folder = args.out / f"seed-{seed}"
        where = ("test", args.test_n, TEST_TEMPERATURES["t0.5"])
        shown = folder / "test-swapped"
        shutil.rmtree(shown, ignore_errors=True)  # a killed check's partial folder
        summary, seconds = evaluate(
            args, record["final_model"], seed, where, shown, folder / "speedrun.log", (SWAP_VIEW,)
        )
        swapped = rate_and_error(summary)
        swapped["loss"] = record["test"]["t0.5"]["success"] - swapped["success"]
        swapped["minutes"] = seconds / 60
        record["swap_view"] = swapped
        write_atomic(folder / RECORD, json.dumps(record, indent=2) + "\n")


def swap_summary(records: list[dict]) -> dict:
    """The seeds' mean success with the rooms swapped, the mean loss, and whether it reaches
    LOOKS_AT_ROOM."""
    loss = statistics.fmean(r["swap_view"]["loss"] for r in records)
    return {
        "success_mean": statistics.fmean(r["swap_view"]["success"] for r in records),
        "loss_mean": loss,
        "loss_per_seed": [r["swap_view"]["loss"] for r in records],
        "looks_at_room": loss >= LOOKS_AT_ROOM,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", help="the preset the recipe starts from (frozen-lake, sokoban, …)")
    p.add_argument("--budget", type=float, default=20.0, help="wall-clock minutes, fixed")
    p.add_argument(
        "--warmup", type=float, default=0.0, help="minutes of `ragen sft` first (all: no RL)"
    )
    p.add_argument("--seeds", type=int, default=3, help="training seeds 0..K-1")
    p.add_argument("--name", help="result name (default: the preset)")
    p.add_argument("--test-n", type=int, default=256, help="test seeds of the final figure")
    p.add_argument("--dev-n", type=int, default=64, help="dev seeds of the curve's points")
    p.add_argument("--dev-every", type=int, default=0, help="RL steps between dev points")
    p.add_argument("--threads", type=int, default=2, help="torch threads, pinned")
    p.add_argument("--out", help="runs folder (default: runs/speedrun-NAME)")
    p.add_argument("overrides", nargs="*", help="the recipe: dotted overrides of the preset")
    args = p.parse_intermixed_args(argv)  # options may follow the preset
    args.name = args.name or args.preset
    if not args.name.replace("-", "").replace("_", "").isalnum():
        p.error(f"--name {args.name!r}: letters, digits, - and _ only")
    if args.budget <= 0 or args.seeds < 1 or args.warmup < 0:
        p.error("--budget must be > 0, --seeds >= 1, --warmup >= 0")
    args.out = Path(args.out or f"runs/speedrun-{args.name}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:  # a bad recipe is refused before any run
        cfg = check_references(config.load(args.preset, args.overrides))
    except config.ConfigError as err:
        raise SystemExit(f"the recipe is refused: {err}") from None
    args.env_name, args.env_options = cfg.env.name, dict(cfg.env.options)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"speedrun {args.name}: {args.budget:g} min budget, {args.seeds} seeds -> {args.out}")
    info = machine()
    before_folder = args.out / "before"
    before_folder.mkdir(exist_ok=True)
    log = args.out / "speedrun.log"
    for split, n in (("test", args.test_n), ("dev", args.dev_n)):
        if not (before_folder / split / "eval.jsonl").exists():  # kept from an earlier start
            shutil.rmtree(before_folder / split, ignore_errors=True)
            evaluate(args, None, 0, (split, n, 0.5), before_folder / split, log)
    before_dev = evaluations(before_folder / "dev")[-1]
    before = {"test": rate_and_error(evaluations(before_folder / "test")[-1])}
    before["dev"] = before_dev["success"]
    # A stage's last dev evaluation runs after its budget check, so each stage leaves it time:
    # the starting model's, as if its episodes had lasted every turn (a model that cannot
    # write the format yet ends them at its first reply).
    turns = before_dev["turns_mean"] or 1.0
    args.dev_eval_minutes = before_dev["seconds"] / 60 * cfg.rollout.max_turns / turns
    records, killed = [], []
    for seed in range(args.seeds):
        folder = args.out / f"seed-{seed}"
        if (folder / RECORD).exists():
            records.append(json.loads((folder / RECORD).read_text(encoding="utf-8")))
            continue
        if folder.exists():
            killed.append(killed_record(set_aside(folder)))
        print(f"seed {seed}: training ({args.budget:g} min)")
        records.append(one_seed(args, seed, folder))
        test = records[-1]["test"]["t0.5"]
        print(f"seed {seed}: test {test['success']:.1%} ± {test['se']:.1%}")
    for aside in sorted(args.out.glob("seed-*.killed-*")):
        if str(aside) not in {k["folder"] for k in killed}:
            killed.append(killed_record(aside))
    one_box = args.env_name == "sokoban" and envs.make("sokoban", **args.env_options).num_boxes == 1
    if args.env_name == "frozen-lake" or one_box:
        read_agreement(args, records)
    if args.env_name == "sokoban":
        check_swapped(args, records)
    target = TARGETS.get(args.env_name)
    result = {
        "name": args.name,
        "command": " ".join(["python -m experiments.speedrun", *(argv or sys.argv[1:])]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "preset": args.preset,
        "recipe": args.overrides,
        "budget_minutes": args.budget,
        "warmup_minutes": args.warmup,
        "machine": info,
        "before": before,
        "floors": cached_floors(cfg, args),
        "target": target,
        "summary": aggregate(records, target),
        **({"swap_view": swap_summary(records)} if args.env_name == "sokoban" else {}),
        "runs": records,
        "killed": killed,
    }
    out = RESULTS / f"speedrun_{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(result, indent=2) + "\n")
    plot(result, DOCS / f"{args.name}.png")
    s = result["summary"]
    sd = f" (sd {s['t0.5']['sd']:.1%})" if s["t0.5"]["sd"] is not None else ""
    print(
        f"test T=0.5: {s['t0.5']['mean']:.1%}{sd} over {len(records)} seeds; greedy "
        f"{s['greedy']['mean']:.1%}; before {before['test']['success']:.1%}; "
        f"{s['minutes_mean']:.1f} min; floors "
        + ", ".join(f"{k} {v:.1%}" for k, v in result["floors"].items())
    )
    print(f"wrote {out} and {DOCS / (args.name + '.png')}")


if __name__ == "__main__":
    main()
