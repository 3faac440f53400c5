"""Read the raw metric values of real runs back from their committed report plots.

These RL runs kept only their `ragen report` PNGs (plots/NAME/), not metrics.jsonl. Each plot
draws a run's raw values as a faint line (alpha 0.25) under its EMA: this script finds the
axes, maps the tick marks to the tick labels (read by eye from the images, written below),
fits a straight line to the faint pixels of every segment between two steps and takes the
value where the fits of the two segments meeting at a step cross it (at step 0 the EMA
equals the raw value, so the solid line is read there; where the faint line is hidden under
the solid one, the solid one). Success counts 32 episodes a step and Bandit's
distinct-reply share is a mean of k/4 over 8 groups, so both are snapped to k/32. A metric
logged every k steps (the MI estimate) is read at its logged steps only.

Three FrozenLake runs that learned (22% -> 39% on 256 lakes) kept their report PNGs only in
git history: ``report`` names them as ``git:COMMIT:FOLDER`` and they are read from there
(``git show``), not copied into the tree again. Their values are checked against what their
summaries quote from the exact series (tests/monitor/test_collapse.py): the success EMA at
the first collapse call, and the docs' 10-step means of the rollout success.

Checked against the two runs whose metrics.jsonl are committed (bandit_ppo_lr1e-4.jsonl is
plots/learn-bandit, bandit_starpo_s_grpo_lr3e-4.jsonl the orange run of plots/collapse-bandit):
every snapped value exact (3.1 pixels off at most before snapping), every other value
within 2.1 pixels. ``read_error`` is, per metric, the larger of 3 pixels and the two segment
fits' disagreement, in data units (in decades for the log-scaled gradient norm).

    .venv/bin/python tests/monitor/data/digitise.py    # rewrites digitised_runs.json
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(__file__).with_name("digitised_runs.json")
COLORS = {"C0": (31, 119, 180), "C1": (255, 127, 14)}  # matplotlib's first two colours
PANELS = {  # plot file: (panel index, metric)
    "success": [(0, "rollout/success")],
    "reward": [(0, "rollout/reward_mean"), (1, "rollout/reward_std")],
    "entropy": [(0, "actor/entropy")],
    "grad_norm": [(0, "actor/grad_norm")],
    "diversity": [(0, "diversity/distinct_reply"), (1, "diversity/distinct_2gram_think")],
}
LOG = {"actor/grad_norm"}
RATIOS = {
    "diversity/distinct_reply",
    "diversity/distinct_2gram_think",
    "diversity/action_template_share",
}
# `make demo`'s reports: the success plot has the evaluation beside the rollouts, the
# diversity plot the (empty) template panels beside the two diversity ones.
PANELS_DEMO = PANELS | {
    "diversity": [(0, "diversity/distinct_reply"), (1, "diversity/distinct_2gram_think")]
}
# The template probe's first reports: MI and retrieval accuracy beside the diversity panels.
PANELS_MI = PANELS | {
    "diversity": [
        (0, "diversity/distinct_reply"),
        (1, "diversity/distinct_2gram_think"),
        (2, "collapse/mi_estimate"),
    ]
}
# Reports from after the template probe: the diversity plot has five panels, and the MI
# estimate is logged every 10 steps (steps 9, 19, ...).
PANELS_TEMPLATE = PANELS | {
    "diversity": [
        (0, "diversity/distinct_reply"),
        (1, "diversity/distinct_2gram_think"),
        (2, "diversity/action_template_share"),
        (3, "collapse/mi_estimate"),
    ]
}
# A run too short for a second MI measurement: its MI panel holds one point, no line.
PANELS_ACTIONS = PANELS | {
    "diversity": [
        (0, "diversity/distinct_reply"),
        (1, "diversity/distinct_2gram_think"),
        (2, "diversity/action_template_share"),
    ]
}
MI_EVERY_10 = ([9, 19, 29, 39], 10, 5)  # MI steps, its panel's first x tick, tick spacing


def ticks(*values, minor=False):
    """Tick labels from the top of the axis down; ``minor``: labelled minor log ticks."""
    return list(values), minor


BANDIT_LR1E4 = {
    "rollout/success": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2),
    "rollout/reward_mean": ticks(0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0),
    "rollout/reward_std": ticks(0.2, 0.15, 0.1, 0.05, 0.0),
    "actor/entropy": ticks(1.4, 1.2, 1.0, 0.8, 0.6, 0.4, 0.2),
    "actor/grad_norm": ticks(1, 0.1, 0.01),
    "diversity/distinct_reply": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4),
    "diversity/distinct_2gram_think": ticks(0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25),
}
COLLAPSE_BANDIT = {
    "rollout/success": ticks(0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0),
    "rollout/reward_mean": ticks(0.2, 0.15, 0.1, 0.05, 0.0, -0.05, -0.1),
    "rollout/reward_std": ticks(0.2, 0.175, 0.15, 0.125, 0.1, 0.075, 0.05, 0.025, 0.0),
    "actor/entropy": ticks(4, 3, 2, 1, 0),
    "actor/grad_norm": ticks(1, 0.1, 0.01),
    "diversity/distinct_reply": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4),
    "diversity/distinct_2gram_think": ticks(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2),
}

WARM4 = "git:6382eb4^:docs/learn-frozen-lake-warm4-from-sft"
WARM4_COMMAND = (
    "python -m experiments.learn frozen-lake model.spec=runs/sft-frozen-lake-toward-warm4/"
    "checkpoints/step_000004 env.options.random_ends=true env.options.spaced=true "
    "env.options.offsets=true 'env.eval_names=[frozen-lake]' trainer.eval_every=0 "
    "trainer.save_every=5 trainer.threads=2"
)


def warm4(suffix, extra, what, tick_labels):
    """One of the three FrozenLake runs from the 4-step SFT warm-up (40 steps each)."""
    return {
        "report": WARM4 + suffix,
        "run": "frozen-lake-warm4-from-sft" + suffix,
        "preset": "frozen-lake",
        "command": f"{WARM4_COMMAND} {extra}".strip(),
        "what": what,
        "color": "C0",
        "steps": 40,
        "x_every": 5,
        "panels": PANELS_TEMPLATE,
        "sparse": {"collapse/mi_estimate": ([9, 19, 29, 39], 10, 5)},
        "ticks": tick_labels,
    }


def demo(key, folder, what, steps, x_every, tick_labels):
    """One of the two `make demo` runs of docs/results/bandit.md (the bandit preset, 32
    episodes a step, raw or whitened advantages). experiments/results/demo.json keeps their
    exact rollout success and entropy per step: those are used over the reading (main()
    prints how far the reading was from them)."""
    exact = json.loads((ROOT / "experiments/results/demo.json").read_text())[key]
    known = {(s, "rollout/success"): v for s, v in enumerate(exact["rollout_success"])}
    known |= {(s, "actor/entropy"): v for s, v in enumerate(exact["entropy"])}
    return {
        "report": f"git:6382eb4^:docs/{folder}",
        "run": exact["run_dir"].removeprefix("runs/"),
        "preset": "bandit",
        "command": "make demo (ragen train bandit trainer.steps=20 trainer.max_minutes=10 "
        "trainer.eval_every=1000 trainer.eval_before=true trainer.eval_episodes=128 "
        f"'env.eval_names=[bandit]'), {exact['preset']}",
        "what": what,
        "color": "C0",
        "steps": steps,
        "x_every": x_every,
        "panels": PANELS_DEMO,
        "known": known,
        "ticks": tick_labels,
    }


def learned(name, what, x_every, panels, tick_labels, mi=None, **extra):
    """A `python -m experiments.learn` run whose report PNGs git history keeps (at the commit
    before docs/ kept only the figures its pages show), its command and step count from
    experiments/results/learn_NAME.json. ``extra``: ``known`` values, ``fill`` values, and
    ``success_error``, the success's read error where a check left one (else 0)."""
    result = json.loads((ROOT / f"experiments/results/learn_{name}.json").read_text())
    return {
        "report": f"git:6382eb4^:{result['report']}",
        "run": result["run_dir"].removeprefix("runs/"),
        "preset": result["preset"],
        "command": result["command"],
        "what": what,
        "color": "C0",
        "steps": result["steps"],
        "x_every": x_every,
        "panels": panels,
        "sparse": {"collapse/mi_estimate": mi} if mi else {},
        "ticks": tick_labels,
        **extra,
    }


RUNS = {
    "bandit-starpo-grpo-lr1e-4": {
        "report": "tests/monitor/data/plots/bandit-grpo-lr1e-4",
        "run": "collapse-grpo",
        "preset": "bandit-starpo",
        "command": "ragen train bandit-starpo algo.estimator=grpo (stopped after 11 steps)",
        "what": "StarPO, GRPO at lr 1e-4: rollout success 19% -> 97-100% from step 7 with a "
        "one-step dip to 56% at step 6, evaluation 100% at step 6; distinct replies in a "
        "group 0.97 -> 0.34 at step 9 (docs/results/bandit.md)",
        "color": "C0",
        "steps": 11,
        "x_every": 2,
        "ticks": BANDIT_LR1E4,
    },
    "bandit-starpo-grpo-lr3e-4": {
        "report": "tests/monitor/data/plots/collapse-bandit",
        "run": "bandit-starpo-grpo-3e-4",
        "preset": "bandit-starpo",
        "command": "ragen train bandit-starpo algo.estimator=grpo trainer.actor_lr=3e-4 "
        "(as docs/results/bandit.md describes it; stopped after 6 steps)",
        "what": "StarPO, GRPO at lr 3e-4: broke in its first update, rollout success 19% -> "
        "0% from step 1 on, no reply well-formed, entropy up to 4.4 nats, evaluation 0% "
        "at step 3 (docs/results/bandit.md)",
        "color": "C0",
        "steps": 6,
        "x_every": 1,
        "ticks": COLLAPSE_BANDIT,
        # Hidden under the StarPO-S curve drawn over it; step 0's rollouts are the same in
        # both runs (same seed and model: their success, reward and bigram readings agree),
        # so the StarPO-S recording's value is used.
        "fill": {(0, "diversity/distinct_reply"): 0.96875},
    },
    "learn-sokoban": {
        "report": "tests/monitor/data/plots/learn-sokoban",
        "run": "learn-sokoban-s16",
        "preset": "sokoban",
        "command": "python -m experiments.learn sokoban env.eval_names=[sokoban] "
        "trainer.eval_every=0 trainer.save_every=0 --minutes 50 --eval-n 256 --temperature 0.5",
        "what": "StarPO-S, PPO with a critic at lr 1e-5: rollout success 3%, 3%, 9%, 0%, 9%, "
        "12.5% (noise), format kept, 256-seed evaluation 11.7% -> 8.6% (within 1.2 standard "
        "errors) (docs/results/sokoban.md)",
        "color": "C0",
        "steps": 6,
        "x_every": 1,
        "ticks": {
            "rollout/success": ticks(0.12, 0.1, 0.08, 0.06, 0.04, 0.02, 0.0),
            "rollout/reward_mean": ticks(0.8, 0.6, 0.4, 0.2, 0.0, -0.2, -0.4),
            "rollout/reward_std": ticks(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2),
            "actor/entropy": ticks(1.6, 1.5, 1.4, 1.3, 1.2, 1.1, 1.0),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, minor=True),
            "diversity/distinct_reply": ticks(0.98, 0.96, 0.94, 0.92, 0.9, 0.88),
            "diversity/distinct_2gram_think": ticks(0.5, 0.45, 0.4, 0.35, 0.3),
        },
    },
    "learn-frozen-lake": {
        "report": "tests/monitor/data/plots/learn-frozen-lake",
        "run": "learn-frozen-lake-s17b",
        "preset": "frozen-lake",
        "command": "python -m experiments.learn frozen-lake env.eval_names=[frozen-lake] "
        "trainer.eval_every=0 trainer.save_every=0 --minutes 40 --eval-n 256 --temperature 0.5",
        "what": "StarPO-S, PPO with a critic at lr 1e-5: rollouts at T=1 never reached the "
        "goal (0 of 32 at every step), entropy 2.0 -> 2.9, 256-seed evaluation 5.08% -> "
        "5.47% (docs/results/frozen-lake.md)",
        "color": "C0",
        "steps": 6,
        "x_every": 1,
        "ticks": {
            "rollout/success": ticks(0.04, 0.02, 0.0, -0.02, -0.04),
            "rollout/reward_mean": ticks(-0.14, -0.145, -0.15, -0.155, -0.16),
            "rollout/reward_std": ticks(0.1, 0.09, 0.08, 0.07, 0.06, 0.05),
            "actor/entropy": ticks(2.8, 2.6, 2.4, 2.2, 2.0),
            "actor/grad_norm": ticks(0.3, 0.2, minor=True),
            "diversity/distinct_reply": ticks(1.0, 0.99, 0.98, 0.97, 0.96),
            "diversity/distinct_2gram_think": ticks(0.8, 0.78, 0.76, 0.74, 0.72, 0.7, 0.68, 0.66),
        },
    },
    "learn-frozen-lake-warm4-from-sft": warm4(
        "",
        "--minutes 75 --name frozen-lake-warm4-from-sft --eval-n 256 --temperature 0.5",
        "StarPO-S from a 4-step SFT warm-up, the preset's settings (PPO with a critic at lr "
        "1e-5, 8 groups of 4 at T=1): 256-lake evaluation 22.27% -> 39.06% (z +4.19), rollout "
        "success 19.7% over steps 0-9 -> 29.4% over steps 30-39, token entropy 0.70 -> 0.16; "
        "the monitor called two collapses (steps 10 and 21) (docs/results/frozen-lake.md)",
        {
            "rollout/success": ticks(0.5, 0.4, 0.3, 0.2, 0.1),
            "rollout/reward_mean": ticks(0.5, 0.4, 0.3, 0.2, 0.1, 0.0),
            "rollout/reward_std": ticks(0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "actor/entropy": ticks(1.2, 1.0, 0.8, 0.6, 0.4, 0.2),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, minor=True),
            "diversity/distinct_reply": ticks(0.95, 0.9, 0.85, 0.8, 0.75, 0.7),
            "diversity/distinct_2gram_think": ticks(0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15),
            "diversity/action_template_share": ticks(0.5, 0.4, 0.3, 0.2, 0.1),
            "collapse/mi_estimate": ticks(2.075, 2.05, 2.025, 2.0, 1.975, 1.95, 1.925, 1.9),
        },
    ),
    "learn-frozen-lake-warm4-from-sft-critic4": warm4(
        "-critic4",
        "model.critic_layers=4 --minutes 45 --name frozen-lake-warm4-from-sft-critic4 "
        "--eval-n 256 --temperature 0.5",
        "the same with a critic of 4 layers: 256-lake evaluation 22.27% -> 39.45% (z +4.28), "
        "rollout success 19.4% over steps 0-9 -> 26.9% over steps 30-39, token entropy "
        "ended at 0.33 (docs/results/frozen-lake.md)",
        {
            "rollout/success": ticks(0.5, 0.4, 0.3, 0.2, 0.1),
            "rollout/reward_mean": ticks(0.4, 0.3, 0.2, 0.1, 0.0),
            "rollout/reward_std": ticks(0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1),
            "actor/entropy": ticks(1.2, 1.0, 0.8, 0.6, 0.4, 0.2),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, minor=True),
            "diversity/distinct_reply": ticks(0.95, 0.9, 0.85, 0.8, 0.75, 0.7),
            "diversity/distinct_2gram_think": ticks(0.45, 0.4, 0.35, 0.3, 0.25, 0.2),
            "diversity/action_template_share": ticks(0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1),
            "collapse/mi_estimate": ticks(2.05, 2.0, 1.95, 1.9, 1.85, 1.8, 1.75),
        },
    ),
    "learn-frozen-lake-warm4-from-sft-trunk": warm4(
        "-trunk",
        "model.critic_body=policy --minutes 60 --name frozen-lake-warm4-from-sft-trunk "
        "--eval-n 256 --temperature 0.5",
        "the same with the critic a head on the policy's trunk: 256-lake evaluation 23.83% -> "
        "32.03% (z +2.08), rollout success 19.1% over steps 0-9 -> 29.1% over steps 30-39, "
        "one move sequence in 57.8% of evaluation episodes (docs/results/frozen-lake.md)",
        {
            "rollout/success": ticks(0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
            "rollout/reward_mean": ticks(0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0),
            "rollout/reward_std": ticks(0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05),
            "actor/entropy": ticks(1.2, 1.0, 0.8, 0.6, 0.4, 0.2),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, minor=True),
            "diversity/distinct_reply": ticks(0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6),
            "diversity/distinct_2gram_think": ticks(0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15),
            "diversity/action_template_share": ticks(0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1),
            "collapse/mi_estimate": ticks(2.05, 2.0, 1.95, 1.9, 1.85, 1.8, 1.75, 1.7),
        },
    )
    | {
        # The last point ends a steep segment and reads 19.5 of 32; the run's summary.md
        # (beside the plots) quotes it: "59.4% at the end".
        "known": {(39, "rollout/success"): 19 / 32},
    },
    "demo-raw-advantages": demo(
        "raw_advantages",
        "demo",
        "the bandit preset with raw advantages: 128-seed evaluation 55.47% -> 100.00% after 13 "
        "steps, rollout success 12.5% -> 100% from step 9 on; one warning (reward std, "
        "step 5), no collapse (docs/results/bandit.md)",
        13,
        2,
        {
            "rollout/success": ticks(1.0, 0.8, 0.6, 0.4, 0.2),
            "rollout/reward_mean": ticks(0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "rollout/reward_std": ticks(0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "actor/entropy": ticks(1.0, 0.8, 0.6, 0.4, 0.2),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, minor=True),
            "diversity/distinct_reply": ticks(1.0, 0.9, 0.8, 0.7, 0.6),
            "diversity/distinct_2gram_think": ticks(0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
        },
    ),
    "demo-whitened-advantages": demo(
        "whitened_advantages",
        "demo-whitened",
        "the bandit preset with whitened advantages: rollout success 94% at steps 4-5, then "
        "41%, 75%, 44% as the replies lost their format; 128-seed evaluation 55.47% -> 27.34% "
        "after step 8 (-4.8 SE), format-ok 35%; warned at step 5, collapse called at step 8 "
        "(docs/results/bandit.md)",
        9,
        1,
        {
            "rollout/success": ticks(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
            "rollout/reward_mean": ticks(0.4, 0.3, 0.2, 0.1, 0.0),
            "rollout/reward_std": ticks(0.14, 0.12, 0.1, 0.08, 0.06, 0.04, 0.02),
            "actor/entropy": ticks(1.0, 0.8, 0.6, 0.4, 0.2),
            "actor/grad_norm": ticks(5.0, 4.0, 3.0, 2.0, 1.0, minor=True),
            "diversity/distinct_reply": ticks(1.0, 0.9, 0.8, 0.7, 0.6),
            "diversity/distinct_2gram_think": ticks(0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25),
        },
    ),
    "frozen-lake-ends": learned(
        "frozen-lake-ends",
        "StarPO-S from the base model on RAGEN's lakes (random ends, spaced), T=0.7: 256-lake "
        "evaluation 24.61% -> 23.44% (z -0.31); rollout success 18-24% in 10-step blocks; "
        "7 of 8 groups without reward spread from step 10, entropy 0.19 -> 0.07; the monitor "
        "warned on the narrowing (step 13) and called two collapses (steps 9 and 19) "
        "(docs/results/frozen-lake.md)",
        5,
        PANELS_MI,
        {
            "rollout/success": ticks(0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "rollout/reward_mean": ticks(0.4, 0.3, 0.2, 0.1, 0.0),
            "rollout/reward_std": ticks(0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "actor/entropy": ticks(0.3, 0.25, 0.2, 0.15, 0.1, 0.05),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, minor=True),
            "diversity/distinct_reply": ticks(0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45),
            "diversity/distinct_2gram_think": ticks(0.35, 0.3, 0.25, 0.2, 0.15, 0.1),
            "collapse/mi_estimate": ticks(0.04, 0.02, 0.0, -0.02, -0.04, -0.06, -0.08),
        },
        MI_EVERY_10,
    ),
    "frozen-lake-ends-from-sft": learned(
        "frozen-lake-ends-from-sft",
        "StarPO-S on RAGEN's lakes from an SFT checkpoint, T=1: 256-lake evaluation 25.78% "
        "-> 26.17% (z +0.10) (docs/results/frozen-lake.md)",
        5,
        PANELS_MI,
        {
            "rollout/success": ticks(0.5, 0.4, 0.3, 0.2, 0.1),
            "rollout/reward_mean": ticks(0.5, 0.4, 0.3, 0.2, 0.1),
            "rollout/reward_std": ticks(0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "actor/entropy": ticks(0.205, 0.2, 0.195, 0.19, 0.185, 0.18, 0.175, 0.17, 0.165),
            "actor/grad_norm": ticks(0.6, 0.5, 0.4, 0.3, minor=True),
            "diversity/distinct_reply": ticks(1.04, 1.02, 1.0, 0.98, 0.96),
            "diversity/distinct_2gram_think": ticks(0.3, 0.28, 0.26, 0.24, 0.22, 0.2, 0.18),
            "collapse/mi_estimate": ticks(0.06, 0.04, 0.02, 0.0, -0.02, -0.04, -0.06),
        },
        ([9, 19, 29], 10, 2.5),
        # Every reply in every group distinct: the EMA lies flat on 1.0 and hides the raw
        # line, which the alerts' vertical lines cut at these steps.
        fill={(s, "diversity/distinct_reply"): 1.0 for s in (9, 11, 19, 20, 29)},
    ),
    "frozen-lake-offsets-from-base": learned(
        "frozen-lake-offsets-from-base-2",
        "StarPO-S from the base model, the goal's offsets written out, T=0.7: 256-lake "
        "evaluation 11.72% -> 24.22% (z +3.73) by one fixed move sequence (95.3% of "
        "episodes), the Echo Trap: template share of the rollouts 75-94% from step 11, "
        "entropy 0.02-0.05 (docs/results/frozen-lake.md)",
        2,
        PANELS_ACTIONS,
        {
            "rollout/success": ticks(0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "rollout/reward_mean": ticks(0.4, 0.3, 0.2, 0.1, 0.0, -0.1),
            "rollout/reward_std": ticks(0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "actor/entropy": ticks(0.2, 0.175, 0.15, 0.125, 0.1, 0.075, 0.05, 0.025),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, minor=True),
            "diversity/distinct_reply": ticks(0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
            "diversity/distinct_2gram_think": ticks(
                0.325, 0.3, 0.275, 0.25, 0.225, 0.2, 0.175, 0.15, 0.125
            ),
            "diversity/action_template_share": ticks(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2),
        },
    ),
    "frozen-lake-offsets-from-sft": learned(
        "frozen-lake-offsets-from-sft",
        "StarPO-S from an SFT checkpoint, the goal's offsets written out: 256-lake evaluation "
        "24.61% -> 26.95% (z +0.61), first moves still a template (docs/results/frozen-lake.md)",
        5,
        PANELS_MI,
        {
            "rollout/success": ticks(0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1),
            "rollout/reward_mean": ticks(0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1),
            "rollout/reward_std": ticks(0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05),
            "actor/entropy": ticks(0.135, 0.13, 0.125, 0.12, 0.115),
            "actor/grad_norm": ticks(0.5, 0.4, 0.3, minor=True),
            "diversity/distinct_reply": ticks(1.0, 0.995, 0.99, 0.985, 0.98, 0.975, 0.97, 0.965),
            "diversity/distinct_2gram_think": ticks(0.25, 0.24, 0.23, 0.22, 0.21, 0.2, 0.19, 0.18),
            "collapse/mi_estimate": ticks(2.075, 2.05, 2.025, 2.0, 1.975, 1.95, 1.925, 1.9),
        },
        MI_EVERY_10,
    ),
    "frozen-lake-toward-from-sft-t15": learned(
        "frozen-lake-toward-from-sft-t15-2",
        "StarPO-S from the toward SFT checkpoint, rollouts at T=1.5: 256-lake evaluation "
        "36.72% -> 36.72% (z 0.00), 240 of 256 episodes play as before "
        "(docs/results/frozen-lake.md)",
        5,
        PANELS_TEMPLATE,
        {
            "rollout/success": ticks(0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
            "rollout/reward_mean": ticks(0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
            "rollout/reward_std": ticks(0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "actor/entropy": ticks(1.2, 1.0, 0.8, 0.6, 0.4, 0.2),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, minor=True),
            "diversity/distinct_reply": ticks(0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4),
            "diversity/distinct_2gram_think": ticks(0.3, 0.28, 0.26, 0.24, 0.22, 0.2, 0.18, 0.16),
            "diversity/action_template_share": ticks(0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1),
            "collapse/mi_estimate": ticks(2.1, 2.0, 1.9, 1.8, 1.7, 1.6, 1.5),
        },
        ([9, 19, 29, 39], 10, 10),
        # The spike at steps 2-3 reads 6.5 and 18.5 of 32; of the four roundings only 6 and
        # 19 replay to summary.md's first collapse (step 7, start and peak 0.4313).
        known={(2, "rollout/success"): 6 / 32, (3, "rollout/success"): 19 / 32},
    ),
    "sokoban-spaced-from-base": learned(
        "sokoban-spaced-from-base-2",
        "StarPO-S from the base model on spaced rooms, T=0.7, idle turns and cut replies "
        "priced: 256-room evaluation 7.81% -> 27.34% (z +6.01) by a template that ignores "
        "the room (96.5% of episodes play one sequence); entropy ~0.14 -> 0.03-0.09 by step "
        "20 (docs/results/sokoban.md)",
        10,
        PANELS_MI,
        {
            "rollout/success": ticks(0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0),
            "rollout/reward_mean": ticks(6, 4, 2, 0),
            "rollout/reward_std": ticks(3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0),
            "actor/entropy": ticks(0.16, 0.14, 0.12, 0.1, 0.08, 0.06, 0.04, 0.02),
            "actor/grad_norm": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, minor=True),
            "diversity/distinct_reply": ticks(0.7, 0.6, 0.5, 0.4, 0.3),
            "diversity/distinct_2gram_think": ticks(0.12, 0.11, 0.1, 0.09, 0.08, 0.07, 0.06),
            "collapse/mi_estimate": ticks(
                0.0, -0.005, -0.01, -0.015, -0.02, -0.025, -0.03, -0.035, -0.04
            ),
        },
        MI_EVERY_10,
        # The last point ends a steep segment (reads 4.3 of 32); summary.md: "15.6% at the end".
        known={(44, "rollout/success"): 5 / 32},
    ),
    "sokoban-spaced-from-sft": learned(
        "sokoban-spaced-from-sft-long",
        "StarPO-S from a spaced SFT checkpoint, T=0.7, priced: 256-room evaluation 16.02% -> "
        "25.39% after 43 steps (z +2.64); the monitor called three collapses (steps 16, 26, "
        "39) on drops from single-step peaks while the evaluation rose "
        "(docs/results/sokoban.md)",
        10,
        PANELS_MI,
        {
            "rollout/success": ticks(0.5, 0.4, 0.3, 0.2, 0.1, 0.0),
            "rollout/reward_mean": ticks(5, 4, 3, 2, 1, 0, -1),
            "rollout/reward_std": ticks(5, 4, 3, 2, 1, 0),
            "actor/entropy": ticks(0.11, 0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03),
            "actor/grad_norm": ticks(0.6, 0.5, 0.4, 0.3, 0.2, minor=True),
            "diversity/distinct_reply": ticks(0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6),
            "diversity/distinct_2gram_think": ticks(0.16, 0.14, 0.12, 0.1, 0.08),
            "collapse/mi_estimate": ticks(0.04, 0.03, 0.02, 0.01, 0.0),
        },
        MI_EVERY_10,
    ),
    "sokoban-spaced-from-sft-critic4": learned(
        "sokoban-spaced-from-sft-critic4",
        "the same from a new SFT checkpoint with a critic of 4 layers: 256-room evaluation "
        "14.45% -> 10.16% (z -1.48); rollout success 14.4%, 15.6%, 21.6%, 18.5% over steps "
        "0-9, 10-19, 20-29, 30-42; warned at step 9, collapse called at step 10 "
        "(docs/results/sokoban.md)",
        10,
        PANELS_TEMPLATE,
        {
            "rollout/success": ticks(0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
            "rollout/reward_mean": ticks(3, 2, 1, 0, -1),
            "rollout/reward_std": ticks(2.0, 1.5, 1.0, 0.5, 0.0),
            "actor/entropy": ticks(0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04),
            "actor/grad_norm": ticks(0.8, 0.7, 0.6, 0.5, 0.4, 0.3, minor=True),
            "diversity/distinct_reply": ticks(0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6),
            "diversity/distinct_2gram_think": ticks(0.14, 0.13, 0.12, 0.11, 0.1, 0.09, 0.08),
            "diversity/action_template_share": ticks(0.5, 0.4, 0.3, 0.2, 0.1),
            "collapse/mi_estimate": ticks(-0.01, -0.02, -0.03, -0.04, -0.05, -0.06, -0.07, -0.08),
        },
        MI_EVERY_10,
        # summary.md: "6.2% at the end" (the steep last segment reads 1.1 of 32). The 10-step
        # sums of docs/results/sokoban.md (46, 50, 69, 77 of 32) differ from the reading's
        # by one episode in three blocks: some steps are one episode off.
        known={(42, "rollout/success"): 2 / 32},
        success_error=1 / 32,
        fill={(21, "diversity/distinct_2gram_think"): None},  # under two alert lines
    ),
    "sokoban-spaced-from-sft-whole": learned(
        "sokoban-spaced-from-sft-whole",
        "the same checkpoint with the whole critic: 256-room evaluation 14.84% -> 15.62% (z "
        "+0.25); rollout success 15.0%, 21.2%, 21.9%, 21.4% over steps 0-9, 10-19, 20-29, "
        "30-42; five collapses called (steps 11-42) (docs/results/sokoban.md)",
        10,
        PANELS_TEMPLATE,
        {
            "rollout/success": ticks(0.4, 0.3, 0.2, 0.1, 0.0),
            "rollout/reward_mean": ticks(4, 3, 2, 1, 0, -1),
            "rollout/reward_std": ticks(3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0),
            "actor/entropy": ticks(0.105, 0.1, 0.095, 0.09, 0.085, 0.08, 0.075),
            "actor/grad_norm": ticks(0.6, 0.5, 0.4, 0.3, minor=True),
            "diversity/distinct_reply": ticks(0.95, 0.9, 0.85, 0.8, 0.75),
            "diversity/distinct_2gram_think": ticks(0.13, 0.12, 0.11, 0.1, 0.09, 0.08, 0.07),
            "diversity/action_template_share": ticks(0.25, 0.2, 0.15, 0.1, 0.05),
            "collapse/mi_estimate": ticks(0.03, 0.02, 0.01, 0.0, -0.01),
        },
        MI_EVERY_10,
        # The 13-step sum over steps 30-42 of docs/results/sokoban.md (21.4%: 89 of 32) is
        # one episode under the reading's: a step there is one episode off.
        success_error=1 / 32,
        fill={(9, "collapse/mi_estimate"): None},  # the first point, under the legend's line
    ),
    "sokoban-spaced-starpo": learned(
        "sokoban-spaced-starpo",
        "StarPO (the sokoban-starpo preset) from a spaced SFT checkpoint: 256-room evaluation "
        "13.28% -> 13.67% (z +0.13); rollout success 0.19, 0.09, 0.09, 0.03, 0.09; no alert "
        "(docs/results/sokoban.md)",
        0.5,
        PANELS,
        {
            "rollout/success": ticks(0.18, 0.16, 0.14, 0.12, 0.1, 0.08, 0.06, 0.04),
            "rollout/reward_mean": ticks(1.5, 1.25, 1.0, 0.75, 0.5, 0.25, 0.0, -0.25),
            "rollout/reward_std": ticks(1.4, 1.3, 1.2, 1.1, 1.0, 0.9, 0.8, 0.7),
            "actor/entropy": ticks(0.074, 0.072, 0.07, 0.068, 0.066, 0.064, 0.062, 0.06),
            "actor/grad_norm": ticks(0.7, 0.6, 0.5, minor=True),
            "diversity/distinct_reply": ticks(0.72, 0.7, 0.68, 0.66, 0.64, 0.62),
            "diversity/distinct_2gram_think": ticks(0.15, 0.14, 0.13, 0.12, 0.11),
        },
    ),
    "sokoban-spaced-starpo-s": learned(
        "sokoban-spaced-starpo-s",
        "StarPO-S from the same checkpoint: 256-room evaluation 13.28% -> 16.02% (z +0.88); "
        "rollout success 0.19, 0.09, 0.12, 0.03, 0.03, 0.09, 0.12, 0.28; no alert "
        "(docs/results/sokoban.md)",
        1,
        PANELS,
        {
            "rollout/success": ticks(0.25, 0.2, 0.15, 0.1, 0.05),
            "rollout/reward_mean": ticks(2.5, 2.0, 1.5, 1.0, 0.5, 0.0, -0.5),
            "rollout/reward_std": ticks(2.0, 1.8, 1.6, 1.4, 1.2, 1.0, 0.8, 0.6),
            "actor/entropy": ticks(0.075, 0.07, 0.065, 0.06, 0.055, 0.05),
            "actor/grad_norm": ticks(0.6, 0.5, 0.4, 0.3, minor=True),
            "diversity/distinct_reply": ticks(0.8, 0.78, 0.76, 0.74, 0.72, 0.7, 0.68, 0.66, 0.64),
            "diversity/distinct_2gram_think": ticks(0.15, 0.14, 0.13, 0.12, 0.11, 0.1, 0.09),
        },
    ),
}
CHECKS = {  # runs with an exact recording, to measure the reading error against
    "bandit_ppo_lr1e-4.jsonl": (
        "tests/monitor/data/plots/learn-bandit",
        "C0",
        11,
        2,
        BANDIT_LR1E4
        | {
            "rollout/reward_std": ticks(0.2, 0.175, 0.15, 0.125, 0.1, 0.075, 0.05, 0.025, 0.0),
            "actor/entropy": ticks(0.8, 0.6, 0.4, 0.2, 0.0),
            "diversity/distinct_reply": ticks(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3),
        },
    ),
    "bandit_starpo_s_grpo_lr3e-4.jsonl": (
        "tests/monitor/data/plots/collapse-bandit",
        "C1",
        8,
        1,
        COLLAPSE_BANDIT,
    ),
}


def _runs(indices) -> list[tuple[int, int]]:
    """Sorted ints grouped into (first, last) runs of consecutive values."""
    out: list[list[int]] = []
    for i in indices:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return [(a, b) for a, b in out]


def _bridged(runs: list[tuple[int, int]], gap: int = 2) -> list[tuple[int, int]]:
    """Runs of pixels joined across gaps of up to ``gap`` pixels: a grid line crossing a steep
    segment of the faint line cuts its column in two."""
    out: list[list[int]] = []
    for a, b in runs:
        if out and a - out[-1][1] - 1 <= gap:
            out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _axes(im: np.ndarray) -> tuple[list[tuple[int, int, int, int]], np.ndarray]:
    """Axes boxes (x0, x1, y0, y1) from the black spines, and the dark-pixel mask."""
    dark = im.sum(2) < 3 * 80

    def long_lines(mask):
        hits = [
            i
            for i in range(mask.shape[0])
            if max((b - a for a, b in _runs(np.nonzero(mask[i])[0])), default=0) > 150
        ]
        return [a for a, _ in _runs(hits)]

    cols, rows = long_lines(dark.T), long_lines(dark)
    return [(cols[i], cols[i + 1], rows[0], rows[-1]) for i in range(0, len(cols), 2)], dark


def _tick_pixels(dark, box, minor):
    """Centres of the tick marks left of the y axis (major ones reach 4 px out) and under
    the x axis."""
    x0, x1, y0, y1 = box
    column = dark[:, x0 - (2 if minor else 4)]
    left = [(a + b) / 2 for a, b in _runs(np.nonzero(column)[0]) if y0 - 3 <= a <= y1 + 3]
    under = [(a + b) / 2 for a, b in _runs(np.nonzero(dark[y1 + 4])[0]) if x0 - 3 <= a <= x1 + 3]
    return left, under


def _legend(im, box):
    """The legend's frame (light grey, inside the axes), to leave out, or None."""
    x0, x1, y0, y1 = box
    sub = im[y0 + 2 : y1 - 1, x0 + 2 : x1 - 1]
    grey = (sub.max(2) - sub.min(2) < 8) & (sub.mean(2) > 195) & (sub.mean(2) < 226)
    found = [
        (y, a, b)
        for y in range(grey.shape[0])
        for a, b in _runs(np.nonzero(grey[y])[0])
        if b - a >= 40
    ]
    if not found:
        return None
    xa, xb = min(f[1] for f in found), max(f[2] for f in found)
    ya, yb = min(f[0] for f in found), max(f[0] for f in found)
    return x0 + xa - 1, x0 + xb + 6, y0 + ya - 1, y0 + yb + 6


def _coverage(im, color):
    """Alpha of ``color`` over white per pixel (least squares over the channels), and how
    far the pixel is from that blend (largest channel residual, in grey levels)."""
    c = 255 - np.array(color, float)
    d = 255 - im
    a = (d * c).sum(-1) / (c * c).sum()
    return a, np.abs(d - a[..., None] * c).max(-1)


def _read_panel(im, box, color, xpix):
    """(y pixel, disagreement in px, how read) of the raw value at each x in ``xpix``."""
    _, _, y0, y1 = box
    a, residual = _coverage(im, color)
    solid = (a > 0.45) & (residual < 8.5)
    near_solid = solid.copy()
    for shift in (-2, -1, 1, 2):
        near_solid |= np.roll(solid, shift, 0) | np.roll(solid, shift, 1)
    faint = (a > 0.04) & (a < 0.3) & (residual < 3.4) & ~near_solid
    legend = _legend(im, box)
    if legend:
        lx0, lx1, ly0, ly1 = legend
        faint[ly0:ly1, lx0:lx1] = solid[ly0:ly1, lx0:lx1] = False
    ends: list[list[float]] = [[] for _ in xpix]
    for i in range(len(xpix) - 1):
        xs, ys = [], []
        for x in range(int(np.ceil(xpix[i] + 3)), int(np.floor(xpix[i + 1] - 3)) + 1):
            runs = _bridged(_runs(np.nonzero(faint[y0 + 2 : y1 - 1, x])[0] + y0 + 2))
            if len(runs) == 1:
                rows = np.arange(runs[0][0], runs[0][1] + 1)
                xs.append(x)
                ys.append(float((rows * a[rows, x]).sum() / a[rows, x].sum()))
        if len(xs) < 4:
            continue
        xs_, ys_ = np.array(xs), np.array(ys)
        keep = np.ones(len(xs_), bool)
        for _ in range(3):  # drop columns where another line crosses
            slope, icept = np.polyfit(xs_[keep], ys_[keep], 1)
            res = np.abs(ys_ - (slope * xs_ + icept))
            keep = res < max(1.5, 3 * np.median(res[keep]))
        ends[i].append(slope * xpix[i] + icept)
        ends[i + 1].append(slope * xpix[i + 1] + icept)
    out = []
    for i, x in enumerate(xpix):
        column = np.nonzero(solid[y0 + 2 : y1 - 1, int(x + 0.5)])[0] + y0 + 2
        runs = _runs(column)
        on_solid = [(runs[0][0] + runs[0][1]) / 2] if len(runs) == 1 else []
        if i == 0 and on_solid:
            out.append((on_solid[0], 0.0, "solid"))
        elif ends[i]:
            out.append((float(np.mean(ends[i])), float(np.ptp(ends[i])), "faint"))
        elif on_solid:
            out.append((on_solid[0], 0.0, "under the solid line"))
        else:
            out.append((None, None, "not found"))
    return out


def image(report, plot):
    """One report PNG as an RGB float array: from the tree, or ``git:COMMIT:FOLDER`` from
    git history."""
    if report.startswith("git:"):
        _, commit, folder = report.split(":", 2)
        data = subprocess.run(
            ["git", "show", f"{commit}:{folder}/{plot}.png"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        source = Image.open(io.BytesIO(data))
    else:
        source = Image.open(ROOT / report / f"{plot}.png")
    return np.asarray(source.convert("RGB")).astype(float)


def read_run(report, color, steps, x_every, tick_labels, panels=None, sparse=None):
    """{metric: {step: (value, read error, how read)}} of one run's curves. ``sparse``:
    {metric: (logged steps, its panel's first x tick, the x ticks' spacing)} for a metric
    logged every k steps, whose panel has an x axis of its own."""
    out = {}
    for plot, plot_panels in (panels or PANELS).items():
        im = image(report, plot)
        boxes, dark = _axes(im)
        for index, metric in plot_panels:
            labels, minor = tick_labels[metric]
            left, under = _tick_pixels(dark, boxes[index], minor)
            assert len(left) == len(labels), (report, metric, left, labels)
            scale = np.log10(labels) if metric in LOG else np.array(labels, float)
            per_px, at0 = np.polyfit(left, scale, 1)  # data (or decades) per pixel
            logged, first, every = (sparse or {}).get(metric, (range(steps), 0, x_every))
            tick_steps = [first + every * i for i in range(len(under))]
            x_per_step, x_at0 = np.polyfit(tick_steps, under, 1)
            xpix = [x_per_step * s + x_at0 for s in logged]
            rows = {}
            for step, (y, spread, how) in zip(
                logged, _read_panel(im, boxes[index], COLORS[color], xpix), strict=True
            ):
                if y is None:
                    rows[step] = (None, None, how)
                    continue
                value = per_px * y + at0
                value = 10**value if metric in LOG else value
                rows[step] = (float(value), max(3.0, spread) * abs(per_px), how)
            out[metric] = rows
    return out


def records(readings, steps, snap_ratio, fill=None, known=None, success_error=0.0):
    """metrics.jsonl-like records, and the read error of each metric. ``fill``: values for
    points not found; ``known``: values known from elsewhere, used over the reading."""
    recs, error = [], {}
    for step in range(steps):
        record = {"step": step}
        for metric, rows in readings.items():
            if step not in rows:  # a sparse metric, not logged at this step
                continue
            value, err, _ = rows[step]
            if value is None or (step, metric) in (known or {}):
                value, err = ({**(fill or {}), **(known or {})})[(step, metric)], 0.0
            if value is None:  # not readable: the record leaves the metric out
                continue
            if metric == "rollout/success":
                value, err = round(value * 32) / 32, success_error
            elif snap_ratio and metric == "diversity/distinct_reply":
                value, err = round(value * 32) / 32, 0.0
            elif metric in LOG:
                value = float(f"{value:.4g}")
            else:
                value = (
                    round(value, 4)
                    if metric in ("rollout/reward_mean", "collapse/mi_estimate")
                    else max(round(value, 4), 0.0)
                )
                value = min(value, 1.0) if metric in RATIOS else value
            record[metric] = value
            error[metric] = max(error.get(metric, 0.0), err)
        recs.append(record)
    return recs, {k: float(f"{v:.2g}") for k, v in error.items()}


def main() -> None:
    for name, (report, color, steps, x_every, labels) in CHECKS.items():
        got, _ = records(read_run(report, color, steps, x_every, labels), steps, True)
        exact = [
            json.loads(line) for line in Path(__file__).with_name(name).read_text().splitlines()
        ]
        worst = {}
        for mine, true in zip(got, exact, strict=True):
            for k, v in mine.items():
                diff = abs(np.log10(v / true[k])) if k in LOG else abs(v - true[k])
                worst[k] = max(worst.get(k, 0.0), float(diff))
        print(f"{report} against {name}: largest difference per metric {worst}")
    runs = {}
    for name, run in RUNS.items():
        readings = read_run(
            run["report"],
            run["color"],
            run["steps"],
            run["x_every"],
            run["ticks"],
            run.get("panels"),
            run.get("sparse"),
        )
        recs, error = records(
            readings,
            run["steps"],
            run["preset"].startswith("bandit"),
            run.get("fill"),
            run.get("known"),
            run.get("success_error", 0.0),
        )
        known = run.get("known", {})
        if known:
            worst = {}
            for (step, metric), value in known.items():
                diff = abs(readings[metric][step][0] - value)
                worst[metric] = max(worst.get(metric, 0.0), round(diff, 4))
            print(f"{name}: reading against the known values, largest difference {worst}")
        keep = ("report", "run", "preset", "command", "what")
        runs[name] = {**{k: run[k] for k in keep}, "read_error": error, "records": recs}
    lines = ["{", '  "runs": {']
    for i, (name, run) in enumerate(runs.items()):
        head = {k: v for k, v in run.items() if k != "records"}
        lines.append(f"    {json.dumps(name)}: {{")
        lines += [f"      {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        lines.append('      "records": [')
        lines += [f"        {json.dumps(r)}," for r in run["records"]]
        lines[-1] = lines[-1].rstrip(",")
        lines.append("      ]")
        lines.append("    }" + ("," if i < len(runs) - 1 else ""))
    lines += ["  }", "}"]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
