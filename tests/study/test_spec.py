"""Study files: every shipped one passes at both scales; bad ones are refused in one line
naming the file and the fix; plans put overrides and seeds where the docs say."""

from pathlib import Path

import pytest

from ragen import config
from ragen.cli import main
from ragen.config import ConfigError
from ragen.study import runner, spec


@pytest.mark.parametrize("name", spec.study_names())
def test_every_shipped_study_validates_at_both_scales(name):
    study = spec.load_study(name)  # judges every run's config at every declared scale
    assert set(study.scales) == {"cpu", "paper"}
    assert spec.summary_line(spec.study_path(name))  # `ragen study list` has a line for it
    for scale in spec.SCALES:
        planned = spec.plan(study, scale, 2, Path("out"))
        assert planned and all(p.overrides[-1] == f"trainer.seed={p.seed}" for p in planned)
        suffix = study.scales[scale].preset_suffix
        assert all(p.preset.endswith(suffix) for p in planned)
        for want in spec.expectations_at(study, scale):
            names = {p.name for p in planned}
            assert {want.higher.removesuffix("@start"), want.lower.removesuffix("@start")} <= names


def test_the_paper_studies_and_the_credit_study_are_shipped():
    assert spec.study_names() == [
        "collapse",
        "credit",  # GiGPO's per-turn credit (issue 50) on FrozenLake and on Sokoban,
        "credit-sokoban",  # the rest the paper's findings
        "diversity",
        "filter",
        "freshness",
        "generalization",
        "granularity",
        "indicators",
        "kl-clip",
        "reasoning",
        "template",
    ]


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return str(path)


BASE = """\
# mine: two runs
title: t
finding: f
paper: p
scales:
  cpu: {seeds: 2, overrides: [trainer.steps=3]}
  paper: {preset_suffix: -gpu, overrides: [trainer.steps=5]}
runs:
  - name: a
    preset: bandit
    overrides: [algo.filter_ratio=1.0]
    scale_overrides: {paper: [algo.kl_coef=0.001]}
  - {name: b, preset: bandit-starpo, at_scales: [cpu]}
expect:
  - {higher: a, lower: b}
  - {higher: a, lower: a@start}
"""


def test_a_plan_orders_overrides_and_seeds(tmp_path):
    study = spec.load_study(_write(tmp_path, BASE))
    planned = spec.plan(study, "cpu", 2, tmp_path / "out", ("model.spec=tiny",))
    assert [(p.name, p.seed) for p in planned] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert planned[2].overrides == (
        "trainer.steps=3",
        "algo.filter_ratio=1.0",
        "model.spec=tiny",
        "trainer.seed=1",
    )
    assert planned[2].root == tmp_path / "out" / "a" / "seed-1"
    (paper,) = spec.plan(study, "paper", 1, tmp_path / "out")  # b is a CPU-only run
    assert paper.preset == "bandit-gpu"
    assert paper.overrides == (
        "trainer.steps=5",
        "algo.filter_ratio=1.0",
        "algo.kl_coef=0.001",
        "trainer.seed=0",
    )
    # the a-versus-b comparison has no place at the paper scale; a against its start has
    assert [(w.higher, w.lower) for w in spec.expectations_at(study, "paper")] == [("a", "a@start")]
    cfg = config.load(paper.preset, list(paper.overrides))
    assert (cfg.trainer.steps, cfg.algo.kl_coef, cfg.trainer.seed) == (5, 0.001, 0)


def test_a_warm_start_fine_tunes_each_seed_before_its_runs_which_start_from_it(tmp_path):
    warm = "warm_start: {preset: frozen-lake, overrides: [sft.steps=4]}"
    text = BASE.replace("  cpu: {seeds: 2,", f"  cpu:\n    {warm}\n    seeds: 2\n   ").replace(
        "overrides: [trainer.steps=3]}", "overrides: [trainer.steps=3]"
    )
    study = spec.load_study(_write(tmp_path, text))
    out = tmp_path / "out"
    planned = spec.plan(study, "cpu", 2, out, ("model.spec=tiny",))
    assert [(p.name, p.seed, p.command) for p in planned] == [
        ("warm-start", 0, "sft"),
        ("a", 0, "train"),
        ("b", 0, "train"),
        ("warm-start", 1, "sft"),
        ("a", 1, "train"),
        ("b", 1, "train"),
    ]
    warm = planned[3]
    assert warm.overrides == ("sft.steps=4", "model.spec=tiny", "trainer.seed=1")
    assert runner.command_line(warm, resume=False) == [
        "sft", "frozen-lake", "--preset", "frozen-lake", *warm.overrides,
        "--out", str(out / "warm-start" / "seed-1"),
    ]  # fmt: skip
    # a run is judged with the model its warm start fine-tunes, and launched from its last step
    checkpoint = out / "warm-start" / "seed-1" / "checkpoints" / "step_000004"
    assert planned[4].warm_from == checkpoint and "model.spec=tiny" in planned[4].overrides
    # every run keeps its evaluation before training for the runs that start as it does
    assert runner.command_line(planned[4], resume=False)[-4:] == [
        f"model.spec={checkpoint}",
        f"trainer.eval_before_cache={out / 'eval-before'}",
        "--out",
        str(out / "a" / "seed-1"),
    ]
    assert {p.eval_cache for p in planned} == {None, out / "eval-before"}  # None: warm starts
    resumed = ["train", "--resume", str(planned[4].root)]
    assert runner.command_line(planned[4], resume=True) == resumed
    assert [p.name for p in spec.plan(study, "paper", 1, out)] == ["a"]  # the paper scale has none


def test_a_preset_file_is_read_from_the_study_files_folder(tmp_path):
    (tmp_path / "presets").mkdir()
    for name in ("p.yaml", "p-gpu.yaml"):
        (tmp_path / "presets" / name).write_text("extends: bandit\ntrainer: {steps: 7}\n")
    text = BASE.replace("preset: bandit\n", "preset: presets/p.yaml\n")
    study = spec.load_study(_write(tmp_path, text))
    planned = spec.plan(study, "paper", 1, Path("o"))
    assert planned[0].preset == str(tmp_path / "presets" / "p-gpu.yaml")
    assert spec.with_suffix("sokoban", "-gpu") == "sokoban-gpu"


def test_a_scales_presets_map_a_runs_preset_before_the_suffix(tmp_path):
    (tmp_path / "presets").mkdir()
    for name in ("q.yaml", "q-gpu.yaml"):
        (tmp_path / "presets" / name).write_text("extends: bandit\ntrainer: {steps: 9}\n")
    text = BASE.replace("  cpu: {seeds: 2,", "  cpu: {presets: {bandit: bandit-starpo}, seeds: 2,")
    mapped = "  paper: {presets: {bandit: presets/q.yaml}, preset_suffix"
    text = text.replace("  paper: {preset_suffix", mapped)
    study = spec.load_study(_write(tmp_path, text))
    a, b = spec.plan(study, "cpu", 1, Path("o"))
    assert (a.name, a.preset, b.preset) == ("a", "bandit-starpo", "bandit-starpo")
    (paper,) = spec.plan(study, "paper", 1, Path("o"))  # mapped, then the suffix, from the folder
    assert paper.preset == str(tmp_path / "presets" / "q-gpu.yaml")
    assert config.load(paper.preset, list(paper.overrides)).trainer.steps == 5  # the scale's
    # a key given as a relative path names the run's preset file, read from the same folder
    keyed = BASE.replace("preset: bandit\n", "preset: presets/q.yaml\n")
    mapped = "  cpu: {presets: {presets/q.yaml: bandit}, seeds: 2,"
    keyed = keyed.replace("  cpu: {seeds: 2,", mapped)
    a, _ = spec.plan(spec.load_study(_write(tmp_path, keyed)), "cpu", 1, Path("o"))
    assert a.preset == "bandit"


def test_a_warm_starts_preset_file_is_read_from_the_study_files_folder(tmp_path, monkeypatch):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "w.yaml").write_text("extends: frozen-lake\nsft: {steps: 3}\n")
    warm = "warm_start: {preset: presets/w.yaml, overrides: [sft.dialogues=4]}"
    path = _write(tmp_path, BASE.replace("  cpu: {seeds: 2,", f"  cpu: {{{warm}, seeds: 2,"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no presets/ here: the study file's folder is the one read
    warm_run, run = spec.plan(spec.load_study(path), "cpu", 1, Path("o"))[:2]
    assert warm_run.preset == str(tmp_path / "presets" / "w.yaml")
    assert warm_run.env == "frozen-lake"  # the preset file's env, and its sft.steps below
    assert run.warm_from == Path("o/warm-start/seed-0/checkpoints/step_000003")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("title: t\n", "titel: t\n"), "unknown key 'titel' (did you mean title?)"),
        (("{name: b,", "{name: a,"), "two runs are named 'a'"),
        (("{name: b,", "{name: report,"), "run name 'report' must be a folder name"),
        (("lower: b}", "lower: c}"), "expect names 'c', which is no run of the study"),
        (("[algo.filter_ratio=1.0]", "[trainer.seed=3]"), "run a: drop trainer.seed"),
        (("[algo.kl_coef=0.001]", "[trainer.seed=3]"), "run a: drop trainer.seed"),
        (("[trainer.steps=3]", "[trainer.steps=3, trainer.seed=1]"), "scale cpu: drop trainer"),
        (("lower: b}", "lower: a}"), "expect compares 'a' with itself"),
        (("title: t\n", "title: t\nmetric: 'eval/x|y/success'\n"), "cannot head a table"),
        (("title: t\n", 'title: t\ncolumns: ["a\\nb"]\n'), "cannot head a table"),
        (
            ("title: t\n", "title: t\nmetric: eval/bandt/success\n"),
            "no run at scale cpu logs 'eval/bandt/success': they evaluate bandit, bandit-rev, "
            "bandit-test, logged as eval/ENV/FIGURE with FIGURE one of success, pass_at_k,",
        ),
        (
            ("title: t\n", "title: t\ncolumns: [eval/bandit/sucess]\n"),
            "no run at any scale logs 'eval/bandit/sucess'",
        ),
        (("[algo.filter_ratio=1.0]", "[algo.filter_ratio=2]"), "run a at scale cpu: "),
        (("  cpu: {seeds: 2,", "  gpu: {seeds: 2,"), "scales must declare cpu"),
        (("seeds: 2", "seeds: 0"), "scales.cpu.seeds=0 is out of range"),
        (("at_scales: [cpu]", "at_scales: [gpu]"), "run b: at_scales names 'gpu'"),
        (("runs:\n", "runs: []\nold_runs:\n"), "unknown key 'old_runs'"),
        (("{name: b,", "{name: warm-start,"), "run name 'warm-start' must be a folder name"),
        (("{name: b,", "{name: eval-before,"), "run name 'eval-before' must be a folder name"),
        (
            ("  cpu: {seeds: 2,", "  cpu: {presets: {sokoban: sokoban-rl}, seeds: 2,"),
            "scale cpu: presets maps 'sokoban', which no run at this scale names (its runs name "
            "bandit, bandit-starpo)",
        ),
        (
            ("seeds: 2,", "seeds: 2, warm_start: {preset: bandit, overrides: [sft.stps=1]},"),
            "unknown key 'sft.stps'",
        ),
        (
            ("steps=3]}", "steps=3, model.spec=tiny], warm_start: {preset: bandit}}"),
            "scale cpu: its runs start from the warm start's checkpoint; set model.spec in warm",
        ),
    ],
)
def test_a_bad_study_file_is_refused_naming_the_file(tmp_path, change, message):
    path = _write(tmp_path, BASE.replace(*change))
    with pytest.raises(ConfigError) as err:
        spec.load_study(path)
    assert str(err.value).startswith(f"study {path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_command_refuses_unknown_studies_and_bad_overrides(tmp_path, capsys):
    assert main(["study", "colapse"]) == 2
    assert "unknown study 'colapse': use one of collapse, " in capsys.readouterr().err
    path = _write(tmp_path, BASE)
    assert main(["study", path, "--plan", "algo.clip_high=-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragen: study: run a at scale cpu: algo.clip_high=-1.0 is out of range")
    cpu_only = tmp_path / "cpu-only.yaml"
    paper = "  paper: {preset_suffix: -gpu, overrides: [trainer.steps=5]}\n"
    overrides = "    scale_overrides: {paper: [algo.kl_coef=0.001]}\n"
    cpu_only.write_text(BASE.replace(paper, "").replace(overrides, ""))
    for how in ("--plan", "--status"):  # the scale's seeds are read before the plan
        assert main(["study", str(cpu_only), "--scale", "paper", how]) == 2
        assert "has no paper scale: use cpu" in capsys.readouterr().err
    assert main(["study", path, "--plan", "--seeds", "1", "model.spec=tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "ragen train bandit trainer.steps=3 algo.filter_ratio=1.0 model.spec=tiny "
        "trainer.seed=0 trainer.eval_before_cache=runs/study-mine-cpu/eval-before "
        "--out runs/study-mine-cpu/a/seed-0"
    )
    assert out[-1] == "2 runs of mine at scale cpu in runs/study-mine-cpu"
    assert not Path("runs/study-mine-cpu").exists()  # --plan runs and writes nothing


def test_an_evaluation_metric_must_be_one_some_run_logs(tmp_path, capsys):
    # a column that one scale's runs log is kept (its cells at the other scale read "—")
    paper_only = (
        "scale_overrides: {paper: [algo.kl_coef=0.001, 'env.eval_names=[bandit, sokoban]']}"
    )
    text = BASE.replace("scale_overrides: {paper: [algo.kl_coef=0.001]}", paper_only)
    text = text.replace("title: t\n", "title: t\nmetric: eval/bandit/success\n")
    path = _write(tmp_path, text.replace("runs:", "columns: [eval/sokoban/success]\nruns:"))
    assert spec.load_study(path).columns == ["eval/sokoban/success"]
    # the study's metric must be logged at the scale it runs, its overrides included
    assert main(["study", path, "--plan", "env.eval_names=[bandit-rev]"]) == 2
    assert capsys.readouterr().err.startswith(
        "ragen: study: no run at scale cpu with these overrides logs 'eval/bandit/success': "
        "they evaluate bandit-rev,"
    )
    assert main(["study", path, "--plan", "env.eval_names=[bandit, bandit-rev]"]) == 0


@pytest.mark.parametrize("name", ["x" * 5000, "bad\0name", "dir/" + "x" * 5000 + ".yaml"])
def test_a_name_no_file_can_have_is_refused_as_unknown(name, capsys):
    assert main(["study", name]) == 2
    assert "study: " in capsys.readouterr().err


def test_the_shipped_studies_cpu_game_runs_play_the_rl_presets(tmp_path):
    # The frozen-lake and sokoban presets warm up on an expert and write offsets out; a
    # study's CPU runs with no warm start of the study's compare RL from the embedded model,
    # so the scale maps each such run to its -rl preset, and it plays exactly that game.
    checked = []
    for name in spec.study_names():
        study = spec.load_study(name)
        if study.scales["cpu"].warm_start is not None:
            continue
        for run in spec.plan(study, "cpu", 1, tmp_path):
            cfg = config.load(run.preset, list(run.overrides))
            if cfg.env.name in ("frozen-lake", "sokoban"):
                assert run.preset == f"{cfg.env.name}-rl", f"{name}/{run.name}"
                assert not cfg.sft.warm_start and cfg.rollout.demos == 2
                checked.append(f"{name}/{run.name}")
    assert len(checked) == 9  # diversity's four lake runs, granularity's three, template's two


def test_study_list_names_every_shipped_study(capsys):
    assert main(["study", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == spec.study_names()
    assert "(Table 3)" in next(line for line in lines if line.startswith("granularity"))


def test_the_guides_example_study_file_is_valid(tmp_path):
    guide = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
    section = guide.read_text().split("## Studies: `ragen study`", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    study = spec.load_study(_write(tmp_path, example))
    assert [r.name for r in study.runs] == ["keep-1.0", "keep-0.25"]
    assert len(spec.plan(study, "cpu", study.scales["cpu"].seeds, tmp_path)) == 4


def test_the_guides_warm_start_example_is_valid(tmp_path):
    guide = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
    section = guide.read_text().split("**A warm start.**", 1)[1]
    scales = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    text = f"title: t\nfinding: f\npaper: p\n{scales}runs:\n  - {{name: a, preset: frozen-lake}}\n"
    study = spec.load_study(_write(tmp_path, text))
    warm, run = spec.plan(study, "cpu", 1, tmp_path)[:2]
    cfg = config.load(warm.preset, list(warm.overrides))
    assert (warm.env, cfg.sft.lake_expert, cfg.sft.steps) == ("frozen-lake", "toward", 4)
    assert run.warm_from == tmp_path / "warm-start" / "seed-0" / "checkpoints" / "step_000004"


def test_the_plan_of_a_warm_started_study_counts_its_warm_starts_apart(tmp_path, capsys):
    warm = "warm_start: {preset: frozen-lake, overrides: [sft.steps=4]}"
    path = _write(tmp_path, BASE.replace("  cpu: {seeds: 2,", f"  cpu: {{{warm}, seeds: 2,"))
    assert main(["study", path, "--plan", "--out", str(tmp_path / "o")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ragen sft frozen-lake --preset frozen-lake sft.steps=4 ")
    assert lines[-1] == f"4 runs of mine after 2 warm starts at scale cpu in {tmp_path / 'o'}"


def test_bookkeeping_overrides_are_left_out_of_the_comparison():
    overrides = ["trainer.save_every=1", " logging.progress =false", "algo.kl_coef=0.0", 3]
    # a hand-edited record's odd entry stays, for the comparison to refuse
    assert spec.compared(overrides) == ["algo.kl_coef=0.0", 3]
