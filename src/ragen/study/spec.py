"""Study files: a finding of the paper as the runs that test it, read and judged strictly.

A study file is YAML; its first comment line is the summary ``ragen study list`` shows::

    # StarPO against StarPO-S on Bandit: which one collapses
    title: StarPO against StarPO-S
    finding: Multi-turn RL collapses; StarPO-S delays or removes the collapse.
    paper: Fig. 5 and 9 (GRPO collapsed near step 20 on Bandit, PPO held to 100)
    metric: rollout/success
    tail: 3
    scales:
      cpu: {seeds: 2, overrides: [trainer.steps=12]}
      paper: {preset_suffix: -gpu}
    runs:
      - {name: starpo, preset: bandit-starpo}
      - {name: starpo-s, preset: bandit}
    expect:
      - {higher: starpo-s, lower: starpo}

A run at scale S and seed k trains ``PRESET + S.preset_suffix`` (PRESET as the scale's
``presets`` maps it, if it does) with, in this order, the scale's overrides, the run's own,
the run's overrides at that scale, the overrides given on the command line (``ragen study
collapse --scale paper model.spec=/models/qwen``), and ``trainer.seed=k``.

A scale may name a warm start, a `ragen sft` run per seed that the seed's runs all start
from (``model.spec`` set to its last checkpoint when they launch)::

    scales:
      cpu:
        warm_start: {preset: frozen-lake, overrides: [sft.steps=4]}

It fine-tunes with its own overrides, then the command line's, then ``trainer.seed=k``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ragen import config
from ragen.config import ConfigError, to_dict
from ragen.config.schema import opt
from ragen.run.rundir import RunDir
from ragen.train.evaluator import HEADLINE
from ragen.train.preflight import check_references

STUDY_SUFFIX = ".yaml"
SCALES = ("cpu", "paper")
"""cpu: the embedded model on this machine's budget; paper: the paper's presets, on GPUs."""
DEFAULT_SCALE = "cpu"
WARM_START = "warm-start"
"""Folder of a scale's warm-start runs (OUT/warm-start/seed-K)."""
EVAL_BEFORE = "eval-before"
"""Folder of the evaluations before training the study's runs share (OUT/eval-before)."""
RESERVED_NAMES = frozenset({"report", WARM_START, EVAL_BEFORE})
"""Names a run may not take: the study's own output folders."""
TRAIN, SFT = "train", "sft"
"""The commands a study runs: its runs, and their warm start."""
_RUN_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_EVAL_METRIC = re.compile(r"eval/(.+)/([^/]+)")  # what a training run's evaluation logs
MAX_SEEDS = 100


@dataclass
class StudyRun:
    """One configuration of the study, trained once per seed."""

    name: str
    """Folder name of its runs (OUT/NAME/seed-K) and its row in the table."""
    preset: str
    """Preset trained (the scale's preset_suffix appended), or a .yaml path (a relative one
    is read from the study file's folder)."""
    overrides: list[str] = opt([])
    """Dotted overrides of this run at every scale."""
    scale_overrides: dict[str, list[str]] = opt({})
    """Dotted overrides of this run at one scale only, by scale name (applied last)."""
    paper: str | None = None
    """The paper's figure for this run, as text (e.g. "21.48%"), set beside ours."""
    at_scales: list[str] = opt([])
    """The scales this run is part of; empty: every scale (a CPU study can be a subset)."""


@dataclass
class WarmStart:
    """A `ragen sft` run per seed that every run of that seed starts from. At CPU scale a
    few steps of imitation give RL a policy that learns within a run's budget: on
    FrozenLake a 4-step warm-up on the toward expert, then 40 steps of StarPO-S, went from
    22% to 39% (docs/results/frozen-lake.md), where no run from the base model moved."""

    preset: str
    """Preset of the fine-tuning, or a .yaml path (a relative one is read from the study
    file's folder, as a run's); the expert imitated is its env's."""
    overrides: list[str] = opt([])
    """Dotted overrides of the fine-tuning (sft.steps, sft.lr, env options ...)."""


@dataclass
class StudyScale:
    """What a scale changes in every run."""

    preset_suffix: str = ""
    """Appended to every run's preset (paper: -gpu, the paper's settings)."""
    presets: dict[str, str] = opt({})
    """A run's preset this scale trains instead, by the preset the run names ({frozen-lake:
    frozen-lake-rl}: the lake runs play RL alone here); the suffix is appended after."""
    overrides: list[str] = opt([])
    """Dotted overrides of every run at this scale, before the run's own."""
    seeds: int = opt(1, ge=1, le=MAX_SEEDS)
    """Seeds per run unless --seeds says otherwise."""
    warm_start: WarmStart | None = None
    """The fine-tuning the runs of each seed start from; none: they start from model.spec."""


START = "@start"
"""Suffix of a run name in an expectation that means the run's value before training."""


@dataclass
class Expectation:
    """The paper's claim as a comparison: run ``higher`` ends above run ``lower``; a name
    written ``RUN@start`` stands for that run before training (``{higher: ppo, lower:
    ppo@start}``: training raised it)."""

    higher: str
    lower: str


@dataclass
class Study:
    title: str
    """What is compared, in a few words."""
    finding: str
    """The paper's claim that the study tests."""
    paper: str
    """Where the paper shows it, and its numbers in words."""
    runs: list[StudyRun]
    """The configurations compared."""
    scales: dict[str, StudyScale]
    """cpu (required) and paper: what each scale changes."""
    metric: str = "rollout/success"
    """Metric of the table and the expectations: its value at the end of each run, averaged
    over the seeds."""
    columns: list[str] = opt([])
    """More metrics whose end values the table shows, one column each (e.g. the evaluation
    of every env of the paper's Table 4)."""
    tail: int = opt(1, ge=1, le=1000)
    """Last logged values of the metric averaged into a run's end value (the train rollouts
    of one step are a small sample: a tail of a few steps steadies them)."""
    expect: list[Expectation] = opt([])
    """The comparisons whose outcome says whether the finding reproduced."""
    align_on_collapse: bool = False
    """Also plot the warning signals against steps counted from each run's collapse."""


@dataclass(frozen=True)
class PlannedRun:
    """One ``ragen train`` of a study (a run of the file at one seed), or the ``ragen sft``
    of a warm start."""

    name: str
    seed: int
    preset: str
    overrides: tuple[str, ...]
    root: Path
    command: str = TRAIN
    env: str = ""
    """The env a warm start's ``ragen sft`` imitates the expert of (its preset's)."""
    warm_from: Path | None = None
    """The warm start's last checkpoint, the run's model.spec when it launches (it does not
    exist before then, so the run's settings are judged with the model it fine-tunes)."""
    eval_cache: Path | None = None
    """The study's folder of kept evaluations before training (trainer.eval_before_cache):
    the runs that start from the same weights with the same evaluation play it once."""

    @property
    def label(self) -> str:
        return f"{self.name} seed {self.seed}"

    def settings(self) -> dict[str, Any]:
        """Every setting of the run as the study plans it (its preset with its overrides,
        before launch adds the warm start's checkpoint), by dotted key: what the study
        records, so that a preset or a default changed since cannot slip into its table."""
        return flat_settings(to_dict(config.load(self.preset, list(self.overrides))))

    def launch_overrides(self) -> tuple[str, ...]:
        """The overrides the run launches with: its own, then its warm start's checkpoint
        and the study's evaluation cache."""
        launch = self.overrides
        if self.warm_from is not None:
            launch = (*launch, f"model.spec={self.warm_from}")
        if self.eval_cache is not None:
            launch = (*launch, f"trainer.eval_before_cache={self.eval_cache}")
        return launch


def study_dir() -> Path:
    """Folder of the study files shipped with the package."""
    return Path(str(resources.files("ragen") / "studies"))


def study_names() -> list[str]:
    return sorted(p.stem for p in study_dir().glob(f"*{STUDY_SUFFIX}"))


def study_path(name_or_path: str) -> Path:
    """The file a study name or a path stands for."""
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not config.file_exists(path):
            raise ConfigError(f"study: no such study file {name_or_path}")
        return path
    shipped = study_dir() / f"{name_or_path}{STUDY_SUFFIX}"
    if not config.file_exists(shipped):
        raise ConfigError(
            f"study: unknown study {name_or_path!r}: use one of {', '.join(study_names())} "
            "(`ragen study list`) or a path to a .yaml file"
        )
    return shipped


def summary_line(path: Path) -> str:
    """The file's first comment line: what ``ragen study list`` shows."""
    first = path.read_text(encoding="utf-8").splitlines()[:1]
    return first[0].lstrip("# ") if first and first[0].startswith("#") else ""


def load_study(name_or_path: str) -> Study:
    """Read and judge a study file: its schema, its names, and every run's config at every
    scale it declares (each must pass the strict config as `ragen train` would take it).
    Raises ConfigError in one line naming the file."""
    path = study_path(name_or_path)
    try:
        study = config.build_schema(Study, config.read_yaml(path))
        folder = path.parent
        for run in study.runs:
            run.preset = _from_folder(run.preset, folder)
        for scale in study.scales.values():
            # a key is matched against the runs' presets, so it is read as they are
            scale.presets = {
                _from_folder(k, folder): _from_folder(v, folder) for k, v in scale.presets.items()
            }
            if scale.warm_start is not None:
                scale.warm_start.preset = _from_folder(scale.warm_start.preset, folder)
        check_study(study)
    except ConfigError as err:
        raise ConfigError(
            f"study {path}: {str(err).removeprefix('config: ').removeprefix('study: ')}"
        ) from None
    return study


def _from_folder(preset: str, folder: Path) -> str:
    """A preset as the study file names it: a relative .yaml path is read from the study
    file's ``folder`` (not the current one), for a run and a warm start alike; a preset name
    or an absolute path as given."""
    if _is_path(preset) and not Path(preset).expanduser().is_absolute():
        return str(folder / preset)
    return preset


def check_study(study: Study) -> None:
    """Names, scales and expectations; then every run's config at every declared scale."""
    if "cpu" not in study.scales:
        raise ConfigError("scales must declare cpu (the scale this machine runs)")
    unknown = sorted(set(study.scales) - set(SCALES))
    if unknown:
        raise ConfigError(f"unknown scale {unknown[0]!r}: scales are {', '.join(SCALES)}")
    if not study.runs:
        raise ConfigError("runs is empty: a study compares at least one run")
    seen: set[str] = set()
    for run in study.runs:
        _check_run(run, seen, study.scales)
        seen.add(run.name)
    _check_expectations(study.expect, seen)
    for name in (study.metric, *study.columns):
        if not name or any(c in name for c in "|\n\r"):
            raise ConfigError(
                f"metric or column {name!r} cannot head a table column: name a metric "
                "without '|' or a line break"
            )
    for name, at in study.scales.items():
        if _sets(at.overrides, "trainer.seed"):
            raise ConfigError(f"scale {name}: drop trainer.seed, the study sets the seeds")
    _check_scale_presets(study)
    _check_warm_starts(study)
    evaluated: set[str] = set()
    for scale in study.scales:
        planned = plan(study, scale, 1, Path("."))
        if not planned:
            raise ConfigError(f"no run is at scale {scale}: drop the scale or add runs to it")
        at_scale = check_planned(planned, scale)
        check_logged(study.metric, at_scale, f"at scale {scale}")
        evaluated |= at_scale
    for column in study.columns:  # a column may hold runs of one scale alone
        check_logged(column, evaluated, "at any scale")


def _check_run(run: StudyRun, seen: set[str], scales: dict[str, StudyScale]) -> None:
    if not _RUN_NAME.fullmatch(run.name) or run.name in RESERVED_NAMES:
        raise ConfigError(
            f"run name {run.name!r} must be a folder name (a-z, 0-9, '.', '_', '-', at "
            f"most 64) other than {', '.join(sorted(RESERVED_NAMES))}"
        )
    if run.name in seen:
        raise ConfigError(f"two runs are named {run.name!r}: give each its own name")
    for key, named in (("scale_overrides", run.scale_overrides), ("at_scales", run.at_scales)):
        extra = sorted(set(named) - set(scales))
        if extra:
            raise ConfigError(f"run {run.name}: {key} names {extra[0]!r}, no scale here")
    scaled = [o for overrides in run.scale_overrides.values() for o in overrides]
    if _sets([*run.overrides, *scaled], "trainer.seed"):
        raise ConfigError(f"run {run.name}: drop trainer.seed, the study sets the seeds")


def _check_scale_presets(study: Study) -> None:
    """A scale's ``presets`` maps presets its runs name: any other key is a typo."""
    for name, scale in study.scales.items():
        named = {r.preset for r in runs_at(study, name)}
        unused = sorted(set(scale.presets) - named)
        if unused:
            raise ConfigError(
                f"scale {name}: presets maps {unused[0]!r}, which no run at this scale "
                f"names (its runs name {', '.join(sorted(named))})"
            )


def _check_warm_starts(study: Study) -> None:
    """A warm start's runs take its checkpoint: none of them may name another model."""
    for name, scale in study.scales.items():
        if scale.warm_start is None:
            continue
        settings = [*scale.overrides, *(o for r in runs_at(study, name) for o in r.overrides)]
        settings += [o for r in study.runs for o in r.scale_overrides.get(name, [])]
        if _sets(settings, "model.spec"):
            raise ConfigError(
                f"scale {name}: its runs start from the warm start's checkpoint; set model.spec "
                "in warm_start.overrides (the model it fine-tunes), not in the runs"
            )


def _sets(overrides: list[str], key: str) -> bool:
    """Whether any of the dotted ``overrides`` sets ``key``."""
    return any(o.partition("=")[0].strip() == key for o in overrides)


def _check_expectations(expect: list[Expectation], runs: set[str]) -> None:
    """Every name an expectation compares is a run of the study (or its @start); at a
    scale without one of its runs, an expectation is left out of that scale's table."""
    for want in expect:
        for name in (want.higher, want.lower):
            if name.removesuffix(START) not in runs:
                raise ConfigError(f"expect names {name!r}, which is no run of the study")
        if want.higher == want.lower:
            raise ConfigError(f"expect compares {want.higher!r} with itself: name two sides")


BOOKKEEPING = frozenset(
    {
        "trainer.save_every",
        "trainer.keep_checkpoints",
        "logging.progress",
        "logging.tensorboard",
        "logging.wandb",
        "logging.wandb_project",
    }
)
"""Settings that change what a run writes beside its results, not the results: a run resumes
exactly from any of its checkpoints, so one checkpointed every step ends as one checkpointed
at its end. A study may change them between its runs (more checkpoints once it outlasts a
working session); the check that its runs still get the settings they were recorded with
leaves them out."""


def compared(overrides: Sequence[object]) -> list[object]:
    """``overrides`` (``key=value`` texts) without those of BOOKKEEPING settings; anything
    else (a hand-edited study.json's) is kept, for the comparison to refuse."""
    return [
        o
        for o in overrides
        if not (isinstance(o, str) and o.partition("=")[0].strip() in BOOKKEEPING)
    ]


def changed_settings(
    before: dict[str, Any], now: dict[str, Any], skip: frozenset[str] = frozenset()
) -> list[str]:
    """The keys of ``now`` whose value ``before`` gives otherwise: not a key one side lacks
    (added or removed by a later ragen), nor one of BOOKKEEPING or ``skip``."""
    return [
        key
        for key in now
        if key in before and key not in BOOKKEEPING and key not in skip and before[key] != now[key]
    ]


def flat_settings(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config mapping as ``{"algo.kl_coef": 0.0, "env.options.spaced": True, …}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_planned(planned: list[PlannedRun], scale: str) -> set[str]:
    """Every planned run's config passes the strict config, as `ragen train` will take it.
    Returns the envs the training runs evaluate (their ``eval/ENV/…`` metrics)."""
    evaluated: set[str] = set()
    for run in planned:
        try:
            settings = check_references(config.load(run.preset, list(run.overrides)))
        except ConfigError as err:
            raise ConfigError(
                f"study: run {run.name} at scale {scale}: {str(err).removeprefix('config: ')}"
            ) from None
        if run.command == TRAIN:
            evaluated.update(settings.env.eval_names or [settings.env.name])
    return evaluated


def check_logged(metric: str, evaluated: set[str], where: str) -> None:
    """Refuse an evaluation metric (``eval/ENV/FIGURE``) that no run logs, the runs
    evaluating the envs ``evaluated`` (``where``: which runs, e.g. "at scale cpu"): a
    misspelt one would leave its cells empty. Other metric names are open (reward terms, a
    user env's metrics) and not judged."""
    match = _EVAL_METRIC.fullmatch(metric)
    if match and (match[1] not in evaluated or match[2] not in HEADLINE):
        raise ConfigError(
            f"study: no run {where} logs {metric!r}: they evaluate "
            f"{', '.join(sorted(evaluated))}, logged as eval/ENV/FIGURE with FIGURE one of "
            f"{', '.join(HEADLINE)}"
        )


def _is_path(preset: str) -> bool:
    return Path(preset).suffix in (".yaml", ".yml") or "/" in preset


def with_suffix(preset: str, suffix: str) -> str:
    """A preset name with the scale's suffix (sokoban → sokoban-gpu); for a file, the suffix
    goes before its extension (mine.yaml → mine-gpu.yaml)."""
    if not suffix or not _is_path(preset):
        return f"{preset}{suffix}"
    path = Path(preset)
    return str(path.with_name(f"{path.stem}{suffix}{path.suffix}"))


def runs_at(study: Study, scale: str) -> list[StudyRun]:
    """The study's runs that are part of ``scale``."""
    return [r for r in study.runs if not r.at_scales or scale in r.at_scales]


def expectations_at(study: Study, scale: str) -> list[Expectation]:
    """The expectations whose runs are all part of ``scale``."""
    names = {r.name for r in runs_at(study, scale)}
    compared = [
        (w, {w.higher.removesuffix(START), w.lower.removesuffix(START)}) for w in study.expect
    ]
    return [want for want, runs in compared if runs <= names]


def scale_of(study: Study, scale: str) -> StudyScale:
    """The study's settings at ``scale``; ConfigError naming those it has when it lacks it."""
    if scale not in study.scales:
        raise ConfigError(
            f"study {study.title!r} has no {scale} scale: use {', '.join(study.scales)}"
        )
    return study.scales[scale]


def plan(
    study: Study, scale: str, seeds: int, out: Path, overrides: tuple[str, ...] = ()
) -> list[PlannedRun]:
    """Every ``ragen train`` of the study at ``scale`` with ``seeds`` seeds, seed by seed
    (all runs once before any twice, so a study cut short still compares every run), each
    seed's warm start (``ragen sft``) first where the scale has one; ``overrides`` (the
    user's, e.g. model.spec) come after the study's own."""
    at = scale_of(study, scale)
    planned = []
    for seed in range(seeds):
        warm, warm_from = _warm_start(at.warm_start, seed, out, overrides)
        if warm is not None:
            planned.append(warm)
        for run in runs_at(study, scale):
            settings = (
                *at.overrides,
                *run.overrides,
                *run.scale_overrides.get(scale, []),
                *overrides,
                f"trainer.seed={seed}",
            )
            planned.append(
                PlannedRun(
                    name=run.name,
                    seed=seed,
                    preset=with_suffix(at.presets.get(run.preset, run.preset), at.preset_suffix),
                    overrides=settings,
                    root=out / run.name / f"seed-{seed}",
                    warm_from=warm_from,
                    eval_cache=out / EVAL_BEFORE,
                )
            )
    return planned


def _warm_start(
    warm: WarmStart | None, seed: int, out: Path, overrides: tuple[str, ...]
) -> tuple[PlannedRun | None, Path | None]:
    """The ``ragen sft`` of ``warm`` at ``seed`` and where it saves its last step (a run
    always saves its last step); (None, None) without a warm start."""
    if warm is None:
        return None, None
    settings = (*warm.overrides, *overrides, f"trainer.seed={seed}")
    cfg = config.load(warm.preset, list(settings))
    root = out / WARM_START / f"seed-{seed}"
    run = PlannedRun(
        name=WARM_START,
        seed=seed,
        preset=warm.preset,
        overrides=settings,
        root=root,
        command=SFT,
        env=cfg.env.name,
    )
    return run, RunDir(root).checkpoint(cfg.sft.steps)
