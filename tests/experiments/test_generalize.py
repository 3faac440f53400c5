"""experiments/generalize.py: the paper's Table 4, each evaluation measured once and kept."""

import json

import pytest

from experiments import generalize, learn
from ragen.run.jsonl import read_jsonl

TINY = ["--model", "tiny", "--base", "tiny", "--n", "3", "rollout.max_reply_tokens=6"]


def untimed(summary: dict) -> dict:
    """A summary without what the clock decides (seconds, and cost's seconds)."""
    cost = {k: v for k, v in summary["cost"].items() if not k.endswith("_s")}
    return {**{k: v for k, v in summary.items() if k != "seconds"}, "cost": cost}


@pytest.fixture
def written(tmp_path, monkeypatch):
    monkeypatch.setattr(generalize, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(generalize, "DOCS", tmp_path / "docs")
    return tmp_path


def test_each_model_is_measured_on_each_env_and_set_beside_the_paper(written, monkeypatch):
    out = written / "out"
    generalize.main(["bandit", *TINY, "--out", str(out)])
    result = json.loads((written / "results" / "generalize_bandit.json").read_text())
    assert list(result["envs"]) == ["bandit", "bandit-rev"]
    assert [row["paper"] for row in result["envs"].values()] == [100.0, 67.58]
    for env, row in result["envs"].items():
        for label in ("base", "trained"):
            episodes = read_jsonl(out / label / env / "trajectories" / "eval.jsonl").records
            assert [e["env"] for e in episodes] == [env] * 3
            assert row[label]["success"] == sum(e["success"] for e in episodes) / 3
        # The same model on the same seeds samples the same episodes: no change.
        assert untimed(row["base"]) == untimed(row["trained"])
        assert row["change"]["difference"] == 0.0
    assert (written / "docs" / "generalize-bandit.png").stat().st_size > 0

    def no_loading(*_, **__):
        raise AssertionError("every evaluation is kept: nothing to load")

    monkeypatch.setattr(generalize.models, "load_policy", no_loading)
    generalize.main(["bandit", *TINY, "--out", str(out)])  # reads all four back
    again = json.loads((written / "results" / "generalize_bandit.json").read_text())
    assert again["envs"] == result["envs"]
    with pytest.raises(SystemExit, match=r"other conditions \(differs in: eval_n\)"):
        generalize.main(["bandit", *TINY, "--n", "2", "--out", str(out)])


def test_an_evaluation_kept_by_other_code_is_read_back_with_its_digest(written, capsys):
    out = written / "out"
    generalize.main(["bandit", *TINY, "--out", str(out)])
    file = out / "base" / "bandit" / generalize.RESULT_FILE
    saved = json.loads(file.read_text())
    saved["fingerprint"]["source_sha256"] = "0" * 64
    file.write_text(json.dumps(saved))
    generalize.main(["bandit", *TINY, "--out", str(out)])
    rows = json.loads((written / "results" / "generalize_bandit.json").read_text())["envs"]
    assert rows["bandit"]["base"]["source_sha256"] == "0" * 64
    assert rows["bandit"]["trained"]["source_sha256"] == learn.source_digest()
    assert "note: measured with 2 versions of ragen's source" in capsys.readouterr().out


def test_one_model_or_env_can_be_measured_now_and_the_rest_later(written):
    out = written / "out"
    generalize.main(["bandit", *TINY, "--only", "trained", "--out", str(out)])
    rows = json.loads((written / "results" / "generalize_bandit.json").read_text())["envs"]
    assert all(r["base"] is None and r["change"] is None for r in rows.values())
    assert not (out / "base").exists() and (out / "trained" / "bandit-rev").is_dir()
    generalize.main(["bandit", *TINY, "--envs", "bandit-rev", "--out", str(out)])
    rows = json.loads((written / "results" / "generalize_bandit.json").read_text())["envs"]
    assert rows["bandit"]["base"] is None and rows["bandit"]["trained"] is not None
    assert rows["bandit-rev"]["change"] == {
        "difference": 0.0,
        "se": rows["bandit-rev"]["change"]["se"],
        "z": 0.0,
    }
    assert not (out / "base" / "bandit").exists()


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["sokoban"], "--model"),
        (["chess", "--model", "tiny"], "invalid choice: 'chess'"),
        (["bandit", "--model", "tiny", "--name", "a/b"], "letters, digits"),
        (["bandit", "--model", "tiny", "--envs", "sokoban"], "table has bandit, bandit-rev"),
        (["bandit", "--model", "tiny", "rollout.max_turns=0"], "rollout.max_turns"),
        (["bandit", "--model", "tiny", "env.eval_options.sokoban.spaced=true"], "not an env of"),
        (["sokoban", "--model", "tiny", "env.eval_options.frozen-lake=1"], "give one option"),
        (["sokoban", "--model", "tiny", "env.eval_options.sokoban-large.slippery=true"], "slip"),
    ],
)
def test_what_it_cannot_run_is_a_usage_error_before_any_model_loads(argv, why, capsys):
    with pytest.raises(SystemExit):
        generalize.parse_args(argv)
    assert why in capsys.readouterr().err


def test_an_eval_option_sets_that_env_alone():
    overrides = ["env.options.spaced=true", "env.eval_options.frozen-lake.random_ends=true"]
    assert generalize.env_overrides("frozen-lake", overrides) == [
        "env.options.spaced=true",
        "env.options.random_ends=true",
    ]
    assert generalize.env_overrides("sokoban-large", overrides) == ["env.options.spaced=true"]
    lake = generalize.env_config("frozen-lake", "tiny", overrides)
    assert lake.env.options == {"spaced": True, "random_ends": True}
    assert generalize.env_config("sokoban", "tiny", overrides).env.options == {"spaced": True}
