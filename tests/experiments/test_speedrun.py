"""experiments/speedrun.py end to end on the tiny model: warm-up, RL, test, floors, record."""

import json
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from benchmarks.measure import gemm_gflops
from experiments import blind_play, speedrun
from ragen import config, envs
from ragen.cli import main
from ragen.envs.experts import expert_move, goal_probabilities
from ragen.envs.frozen_lake import transition_table
from ragen.envs.sokoban_levels import solve
from ragen.run.jsonl import read_jsonl
from ragen.train.evaluator import eval_seeds

RECIPE = [
    "model.spec=tiny",
    "rollout.demos=0",
    "rollout.max_turns=2",
    "rollout.max_actions_per_turn=2",
    "rollout.max_reply_tokens=64",
    "rollout.groups=4",
    "rollout.group_size=2",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2",
    "sft.dialogues=2",
    "sft.micro_batch_size=2",
    "sft.steps=1",
    "trainer.steps=1",
    "env.options.random_ends=true",
]


def _in_process(command: list[str], log: Path) -> float:
    """``speedrun.run`` without the process boundary: the same ``ragen`` command line, run by
    the CLI's ``main`` in this process, its output appended to the stage's log. Six stages
    as subprocesses import torch and transformers six times (most of the test's time);
    ``test_a_stage_runs_the_console_script_and_logs_its_output`` runs the real one."""
    assert command[0] == str(speedrun.RAGEN)
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as out, redirect_stdout(out), redirect_stderr(out):
        code = main(command[1:])
    assert code == 0, log.read_text(encoding="utf-8")[-2000:]
    return time.perf_counter() - started


def test_a_stage_runs_the_console_script_and_logs_its_output(tmp_path):
    log = tmp_path / "speedrun.log"
    with pytest.raises(SystemExit) as stop:
        speedrun.run([str(speedrun.RAGEN), "config", "show", "chess"], log)
    head, tail = str(stop.value).split("\n", 1)
    assert head == f"{speedrun.RAGEN} config show chess exited with 2; the end of {log}:"
    assert tail == log.read_text()  # the whole log: the command, then what it printed
    assert tail.startswith(f"$ {speedrun.RAGEN} config show chess\nragen: config: unknown preset")


@pytest.mark.usefixtures("keep_threads")  # speedrun.main pins the process's torch threads
def test_a_speedrun_trains_tests_and_records_each_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(speedrun, "run", _in_process)
    monkeypatch.setattr(speedrun, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(speedrun, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(speedrun, "MIN_STAGE_MINUTES", 0.0)  # the tiny budget still gets RL
    # the machine's reference GFLOP/s, measured on a small matmul for a moment: the 2048³ one
    # for 4 s is the record's figure, which no assertion reads
    monkeypatch.setattr(
        speedrun, "gemm_gflops", lambda dtype, *_: gemm_gflops(dtype, 256, 256, 256, 0.01)
    )
    out = tmp_path / "runs"
    (out / "seed-0" / "sft").mkdir(parents=True)  # a seed killed before it logged a step
    argv = ["frozen-lake", "--budget", "5", "--warmup", "2", "--seeds", "1", "--test-n", "3"]
    argv += ["--dev-n", "2", "--threads", "1", "--name", "tiny", "--out", str(out), *RECIPE]
    speedrun.main(argv)

    result = json.loads((tmp_path / "results" / "speedrun_tiny.json").read_text())
    (run,) = result["runs"]
    assert run["training_seed"] == 0 and run["within_budget"]
    assert run["stages"]["sft"]["steps"] == 1 and run["stages"]["rl"]["steps"] == 1
    per_step = run["stages"]["rl"]["per_step"]["columns"]  # for the detector's calibration
    assert per_step["step"] == [0] and per_step["rollout/episodes"] == [8.0]
    # the curve: the warm-up's dev evaluation, then the RL stage's after its last step
    assert [(p["stage"], p["step"]) for p in run["dev_curve"]] == [("sft", 0), ("rl", 0)]
    assert run["final_model"].endswith("rl/checkpoints/step_000001")
    # the driver's warm-up is the recipe's warm start: the preset's own is off in both stages
    assert not (out / "seed-0" / "rl" / "warm_start").exists()
    for stage in ("sft", "rl"):
        assert not config.load_run(out / "seed-0" / stage / "config.yaml").sft.warm_start
    for name in ("t0.5", "greedy"):
        test = run["test"][name]
        assert test["seeds"] == 3 and 0 <= test["success"] <= 1 and test["se"] is not None
        summary = json.loads((out / "seed-0" / f"test-{name}" / "eval.jsonl").read_text())
        assert (
            summary["split"] == "test"
            and summary["temperature"] == speedrun.TEST_TEMPERATURES[name]
        )
    assert result["killed"] == [{"folder": str(out / "seed-0.killed-1"), "stages": {}}]
    assert result["summary"]["t0.5"]["per_seed"] == [run["test"]["t0.5"]["success"]]
    assert result["target"] == 0.45 and (tmp_path / "docs" / "tiny.png").stat().st_size > 0

    # The floors are exact on the same three test lakes: the optimum with every action seen
    # bounds each policy played a turn at a time.
    env, best = envs.make("frozen-lake", random_ends=True), 0.0
    for seed in eval_seeds(3, "test"):
        env.reset(seed)
        best += goal_probabilities(transition_table(env.rows), 4)[4][env.state] / 3
    floors = result["floors"]
    assert floors["optimal_per_action"] == pytest.approx(best)
    assert all(floors[k] <= best + 1e-12 for k in ("uniform", "toward", "careful", "optimal"))

    # A rerun keeps the finished seed: nothing is trained or evaluated again.
    log = (out / "seed-0" / "speedrun.log").read_text()
    speedrun.main(argv)
    assert (out / "seed-0" / "speedrun.log").read_text() == log
    again = json.loads((tmp_path / "results" / "speedrun_tiny.json").read_text())
    assert again["runs"] == result["runs"]


@pytest.mark.usefixtures("keep_threads")
def test_a_warmup_of_the_whole_budget_is_the_whole_recipe(tmp_path, monkeypatch):
    monkeypatch.setattr(speedrun, "run", _in_process)
    monkeypatch.setattr(speedrun, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(speedrun, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(speedrun, "MIN_STAGE_MINUTES", 0.0)  # time left would start RL
    monkeypatch.setattr(speedrun, "gemm_gflops", lambda *_: 1.0)
    out = tmp_path / "runs"
    argv = ["frozen-lake", "--budget", "5", "--warmup", "5", "--seeds", "1", "--test-n", "1"]
    argv += ["--dev-n", "1", "--threads", "1", "--name", "sft", "--out", str(out), *RECIPE]
    speedrun.main(argv)  # sft.steps=1 ends the warm-up within seconds of its 5 minutes
    (run,) = json.loads((tmp_path / "results" / "speedrun_sft.json").read_text())["runs"]
    assert list(run["stages"]) == ["sft"] and not (out / "seed-0" / "rl").exists()
    assert run["final_model"].endswith("sft/checkpoints/step_000001")


def _expert_episodes(
    lake: str, options: dict, env_name: str = "frozen-lake", **expert
) -> list[dict]:
    """The 8 first test levels of ``env_name`` played by its expert (FrozenLake's ``lake``,
    or the ``expert_move`` keywords ``expert``), one move a turn for up to 10 turns, as an
    evaluation's episode records (seed, turns with thought and actions)."""
    env, played = envs.make(env_name, **options), []
    for seed in eval_seeds(8, "test"):
        env.reset(seed)
        turns = []
        for left in range(10, 0, -1):
            move = expert_move(env, 1, left, lake=lake, **expert)
            turns.append({"think": move.thought, "actions": list(move.answer)})
            result = env.step(move.answer[0])
            if result.terminated or result.truncated:
                break
        played.append({"seed": seed, "turns": turns})
    return played


def _write(file: Path, episodes: list[dict]) -> Path:
    file.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return file


def test_lake_agreement_replays_each_episode_through_its_slips(tmp_path):
    # Episodes played by the careful expert itself agree with it on every move; the same
    # moves reversed (Left for Right, Up for Down) on few: only where the reversed walk
    # reached a cell whose careful move happens to be the reversed one (21% here).
    options = {"random_ends": True}
    played = _expert_episodes("careful", options)
    file = _write(tmp_path / "eval.jsonl", played)
    agreement = speedrun.lake_agreement(file, options)
    assert agreement["careful"] == 1.0
    assert set(agreement["careful_by_holes_beside"].values()) <= {1.0, None}
    assert set(agreement["careful_by_worst_ties"].values()) <= {1.0, None}
    assert sum(agreement["moves_by_worst_ties"].values()) == sum(len(e["turns"]) for e in played)
    assert sum(agreement["moves_by_holes_beside"].values()) == sum(len(e["turns"]) for e in played)
    flip = {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"}
    for episode in played:
        episode["turns"] = [{"actions": [flip[t["actions"][0]]]} for t in episode["turns"]]
    _write(file, played)
    assert speedrun.lake_agreement(file, options)["careful"] == pytest.approx(9 / 43)


def test_a_record_written_back_without_its_episodes_keeps_its_reading(tmp_path):
    # seed 0 keeps its test episodes: read again from them; seed 1's folder lost them (a
    # record written back from the result JSON): its reading stays as recorded
    options = {"random_ends": True}
    out = tmp_path / "speedrun"
    for name in speedrun.TEST_TEMPERATURES:
        folder = out / "seed-0" / f"test-{name}" / "trajectories"
        folder.mkdir(parents=True)
        _write(folder / "eval.jsonl", _expert_episodes("careful", options))
    recorded = {"careful": 0.5, "toward": 0.25}
    records = [
        {
            "training_seed": seed,
            "test": {n: {"same_move_as": dict(recorded)} for n in ("t0.5", "greedy")},
        }
        for seed in (0, 1)
    ]
    args = speedrun.parse(["frozen-lake", "--out", str(out)])
    args.env_name, args.env_options = "frozen-lake", options
    speedrun.read_agreement(args, records)
    got = [records[s]["test"][n]["same_move_as"] for s in (0, 1) for n in ("t0.5", "greedy")]
    assert [g["careful"] for g in got[:2]] == [1.0, 1.0]  # the careful expert's own play
    assert got[2:] == [recorded, recorded]


def test_side_labels_judge_each_sides_thought_against_the_cell_it_was_made_on(tmp_path):
    # The sides expert's own thoughts label every side right; one thought whose "wall" is
    # written "away" is wrong on that side alone.
    options = {"random_ends": True}
    played = _expert_episodes("sides", options)
    file = _write(tmp_path / "eval.jsonl", played)
    labels = speedrun.lake_agreement(file, options)["side_labels"]
    turns = sum(len(e["turns"]) for e in played)
    assert labels["turns"] == turns and labels["all_right"] == 1.0
    assert set(labels["right_by_kind"].values()) == {1.0}
    first = played[0]["turns"][0]  # seed 3000000000 starts in a corner: two walls
    assert first["think"].count(" wall") == 2
    first["think"] = first["think"].replace(" wall", " away", 1)
    _write(file, played)
    labels = speedrun.lake_agreement(file, options)["side_labels"]
    assert labels["all_right"] == pytest.approx((turns - 1) / turns)
    walls = (
        sum(t["think"].count(" wall") for e in played for t in e["turns"]) + 1
    )  # the one relabelled
    assert labels["right_by_kind"]["wall"] == pytest.approx((walls - 1) / walls)
    assert labels["right_by_kind"]["away"] == 1.0  # a label said wrongly, judged by its truth
    # Thoughts that name no sides leave the figure out.
    for episode in played:
        for turn in episode["turns"]:
            turn["think"] = "I go."
    _write(file, played)
    assert speedrun.lake_agreement(file, options)["side_labels"] is None


@pytest.mark.parametrize("lake", ["ranked", "scan"])
def test_side_labels_read_the_ranked_and_scan_thoughts_in_their_order(tmp_path, lake):
    options = {"random_ends": True}
    played = _expert_episodes(lake, options)
    labels = speedrun.lake_agreement(_write(tmp_path / "eval.jsonl", played), options)
    assert labels["side_labels"]["turns"] == sum(len(e["turns"]) for e in played)
    assert labels["side_labels"]["all_right"] == 1.0


def test_said_kinds_needs_each_side_labelled_once():
    scan = "The goal G is 2 above me. Down wall, Up toward, Left away, Right away. Away: Left."
    assert speedrun.said_kinds(scan) == ("away", "wall", "away", "toward")
    assert speedrun.said_kinds("Down wall, Up toward, Left away.") is None
    assert speedrun.said_kinds("Down wall, Up toward, Left away, Left hole, Right away.") is None


def test_worst_kind_ties_counts_the_sides_holding_the_worst_kind():
    # goal straight above on the bottom row: Left and Right both a step away, Down the edge
    assert speedrun.worst_kind_ties(("FGF", "FFF", "FSF"), 7) == "2+"
    # a hole above: the one worst side
    assert speedrun.worst_kind_ties(("HFF", "SFF", "FFG"), 3) == "1"


def test_holes_beside_counts_the_four_neighbours_inside_the_lake():
    rows = ("SHFF", "HFHF", "FHFF", "FFFG")
    assert [speedrun.holes_beside_count(rows, c) for c in (0, 5, 3, 15)] == [2, 4, 0, 0]


def test_bandit_floors_count_the_seeds_that_list_the_risky_arm_first():
    # Test seeds 3000000000..7 list Phoenix, Phoenix, Phoenix, Dragon, Phoenix, Dragon,
    # Dragon, Phoenix first (arm_order, a seeded permutation).
    assert speedrun.bandit_floors({}, 8) == {"uniform": 0.5, "first_listed": 3 / 8}
    assert speedrun.bandit_floors({"high_risk": "Phoenix"}, 8)["first_listed"] == 5 / 8


def test_sokoban_floors_are_the_blind_search_and_the_experts_on_the_test_rooms():
    options = {"offsets": True}
    floors = speedrun.sokoban_floors(options, 5, 2, 10, 8)
    rooms = blind_play.levels(8, "test", options)
    assert floors["best_blind_sequence"] == blind_play.best_repeated(rooms, 5, 2)[1]
    # every one of these rooms has a solution of at most 10 moves, which the solver plays
    # two a turn; the push rules move once a turn, so their 5 moves solve 3 of them
    assert all(len(solve(room)) <= 10 for room in rooms) and floors["optimal"] == 1.0
    assert floors["push"] == floors["push_first"] == 3 / 8
    # rooms of two boxes have no push floor
    two = {"height": 8, "width": 8, "num_boxes": 2}
    assert set(speedrun.sokoban_floors(two, 1, 1, 1, 1)) == {"best_blind_sequence", "optimal"}


@pytest.mark.usefixtures("keep_threads")
def test_the_swap_check_tests_the_final_policy_on_paired_rooms(tmp_path, monkeypatch):
    monkeypatch.setattr(speedrun, "run", _in_process)
    recipe = ["model.spec=tiny", "rollout.demos=0", "rollout.max_turns=2"]
    recipe += ["rollout.max_reply_tokens=16", "env.options.offsets=true"]
    args = speedrun.parse(["sokoban", "--test-n", "2", "--threads", "1", *recipe])
    args.out, args.env_name = tmp_path, "sokoban"
    (tmp_path / "seed-0").mkdir()
    record = {"training_seed": 0, "final_model": "tiny", "test": {"t0.5": {"success": 0.5}}}
    speedrun.check_swapped(args, [record])
    swapped = record["swap_view"]
    assert swapped["seeds"] == 2 and swapped["loss"] == 0.5 - swapped["success"]
    assert json.loads((tmp_path / "seed-0" / speedrun.RECORD).read_text()) == record
    # each test seed's episode was shown the room of its pair
    episodes = tmp_path / "seed-0" / "test-swapped" / "trajectories" / "eval.jsonl"
    env = envs.make("sokoban", **config.load("sokoban", recipe).env.options)
    for episode in read_jsonl(episodes).records:
        assert episode["turns"][0]["observation"] == env.reset(episode["seed"] ^ 1)
    # a second call finds the check done and evaluates nothing
    log = (tmp_path / "seed-0" / "speedrun.log").read_text()
    speedrun.check_swapped(args, [record])
    assert (tmp_path / "seed-0" / "speedrun.log").read_text() == log
    summary = speedrun.swap_summary([record, {"swap_view": {"success": 0.1, "loss": 0.3}}])
    assert summary["loss_per_seed"] == [swapped["loss"], 0.3]
    assert summary["looks_at_room"] == (summary["loss_mean"] >= 0.10)


def _sokoban_episodes(expert: str, options: dict) -> list[dict]:
    """The 8 first one-box test rooms played by the Sokoban ``expert`` (`_expert_episodes`)."""
    return _expert_episodes("optimal", options, "sokoban", sokoban=expert)


def test_push_agreement_replays_each_episode_from_its_room(tmp_path):
    options = {"offsets": True, "spaced": True}
    pushed = _write(tmp_path / "push.jsonl", _sokoban_episodes("push", options))
    shares = speedrun.push_agreement(pushed, {**options, "swap_view": True})  # the own rooms
    assert shares["push"] == 1.0 and shares["push_when_behind"] == 1.0
    assert shares["push_when_walking"] == 1.0
    first = _write(tmp_path / "first.jsonl", _sokoban_episodes("push_first", options))
    assert speedrun.push_agreement(first, options)["push_first"] == 1.0
    solved = _write(tmp_path / "optimal.jsonl", _sokoban_episodes("optimal", options))
    shares = speedrun.push_agreement(solved, options)
    # every move of the solver keeps a shortest solution; it solves all 8 rooms, and the
    # moves are counted up to each room's solving move
    moves = sum(len(solve(room)) for room in blind_play.levels(8, "test", options))
    assert shares["shortest"] == 1.0 and shares["moves"] == moves
