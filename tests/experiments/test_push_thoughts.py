"""The push-thought reading: the expert's own play reads as the expert's in every part, and a
thought wrong in one part is counted wrong from that part on."""

import json

import pytest

from experiments.push_thoughts import main, parts, thought_shares
from ragen import envs
from ragen.envs.experts import expert_move
from ragen.run.jsonl import append_jsonl

OPTIONS = {"spaced": True, "offsets": True}
SEEDS = (3, 11)


def _expert_episodes(path, expert, spoil=None):
    """The expert's play of SEEDS as eval.jsonl records; ``spoil`` rewrites each thought."""
    env = envs.make("sokoban", **OPTIONS)
    records = []
    for seed in SEEDS:
        env.reset(seed)
        turns = []
        for _ in range(10):
            move = expert_move(env, 1, 1, sokoban=expert)
            think = spoil(move.thought) if spoil else move.thought
            turns.append({"think": think, "actions": list(move.answer)})
            if env.step(move.answer[0]).terminated:
                break
        records.append({"seed": seed, "turns": turns})
    append_jsonl(path, records)
    return sum(len(r["turns"]) for r in records)


def test_the_parts_of_a_push_thought():
    thought = (
        "The target O is 2 above the box X, so I push the box Up, from the cell below it, "
        "2 below me. Up back, Down box, Left aside, Right aside. I go Left."
    )
    assert parts(thought) == {
        "direction": "The target O is 2 above the box X, so I push the box Up",
        "sentence": "The target O is 2 above the box X, so I push the box Up, from the cell "
        "below it, 2 below me.",
        "whole": thought,
    }
    assert parts("I go Left.") == {"direction": None, "sentence": None, "whole": "I go Left."}


@pytest.mark.parametrize("expert", ["push", "push_first"])
def test_the_experts_own_play_is_its_thought_in_every_part(tmp_path, expert):
    turns = _expert_episodes(tmp_path / "eval.jsonl", expert)
    shares = thought_shares(tmp_path / "eval.jsonl", expert, OPTIONS)
    assert shares["turns"] == turns > len(SEEDS)
    assert {k: v for k, v in shares.items() if k != "turns"} == {
        "direction": 1.0,
        "sentence": 1.0,
        "whole": 1.0,
        "sentence_given_direction": 1.0,
        "whole_given_sentence": 1.0,
        "move": 1.0,
        "move_given_wrong_direction": None,
    }


def test_a_thought_wrong_after_its_direction_counts_from_there(tmp_path):
    kept = []

    def misplace(thought):  # where the cell behind the box lies: always "3 left of me"
        head, _, rest = thought.partition(" it, ")  # "..., from the cell below" | "2 below me."
        placed, _, after = rest.partition(". ")
        kept.append(placed == "3 left of me")
        return f"{head} it, 3 left of me. {after}"

    turns = _expert_episodes(tmp_path / "eval.jsonl", "push", spoil=misplace)
    shares = thought_shares(tmp_path / "eval.jsonl", "push", OPTIONS)
    assert shares["turns"] == turns == len(kept)
    assert shares["direction"] == 1.0 and shares["move"] == 1.0
    assert shares["sentence"] == shares["whole"] == sum(kept) / turns < 1.0
    assert shares["sentence_given_direction"] == shares["sentence"]


def test_the_record_keeps_each_files_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("experiments.push_thoughts.RESULTS", tmp_path)
    _expert_episodes(tmp_path / "a.jsonl", "push")
    _expert_episodes(tmp_path / "b.jsonl", "push_first")
    options = ["--option", "spaced=true", "--option", "offsets=true"]
    main([str(tmp_path / "a.jsonl"), "--expert", "push", *options, "--name", "t"])
    main([str(tmp_path / "b.jsonl"), "--expert", "push_first", *options, "--name", "t"])
    record = json.loads((tmp_path / "push_thoughts_t.json").read_text())
    assert [(r["expert"], r["whole"]) for r in record["runs"].values()] == [
        ("push", 1.0),
        ("push_first", 1.0),
    ]
    assert record["runs"][str(tmp_path / "a.jsonl")]["options"] == OPTIONS
    assert "| 100.0% |" in capsys.readouterr().out
