"""What the prompt costs: the tokens of the CPU presets' expert dialogues, with the reply
format rule closing every user message and stated once (``rollout.format_rule``).

    python -m experiments.prompt_tokens [--n 64] [--presets frozen-lake sokoban]

Each preset's expert (its ``sft`` section) plays ``--n`` levels of the ``dev`` split through
the rollout loop, as ``ragen sft`` does, once under each setting; the table gives the mean
dialogue length in tokens (the embedded model's tokenizer), the mean turns, and the share
the once-stated rule saves. A dialogue's tokens are what an SFT step and an RL update read,
and what a rollout prefills turn by turn. Writes ``experiments/results/prompt_tokens.json``.
Exact counts: the same on every run and machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ragen import config
from ragen.config import FORMAT_RULES
from ragen.models.loading import load_tokenizer
from ragen.rollout.expert import expert_dialogues
from ragen.rollout.loop import RolloutSpec
from ragen.train.evaluator import eval_seeds

OUT = Path(__file__).resolve().parent / "results" / "prompt_tokens.json"


def dialogue_tokens(tokenizer, preset: str, format_rule: str, n: int) -> dict:
    """Mean tokens and turns of the preset's expert dialogues on ``n`` dev levels."""
    c = config.load(preset, [f"rollout.format_rule={format_rule}"])
    dialogues = expert_dialogues(
        tokenizer,
        c.env.name,
        eval_seeds(n, "dev"),
        RolloutSpec.from_config(c.rollout),
        env_options=c.env.options,
        thought=c.sft.thought,
        lake=c.sft.lake_expert,
        sokoban=c.sft.sokoban_expert,
    )
    return {
        "tokens_mean": statistics.mean(len(d.token_ids) for d in dialogues),
        "turns_mean": statistics.mean(len(d.turns) for d in dialogues),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64, help="dev levels a preset's expert plays")
    p.add_argument("--presets", nargs="+", default=["frozen-lake", "sokoban"])
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be >= 1")
    tokenizer = load_tokenizer()
    rows = {}
    print(f"{'preset':<12} {'format_rule':<11} {'tokens':>8} {'turns':>6} {'saved':>6}")
    for preset in args.presets:
        rows[preset] = {
            rule: dialogue_tokens(tokenizer, preset, rule, args.n) for rule in FORMAT_RULES
        }
        every = rows[preset]["every_turn"]["tokens_mean"]
        for rule, row in rows[preset].items():
            row["saved_share"] = 1 - row["tokens_mean"] / every
            print(
                f"{preset:<12} {rule:<11} {row['tokens_mean']:>8.1f} {row['turns_mean']:>6.2f} "
                f"{row['saved_share']:>6.1%}"
            )
    command = " ".join(
        ["python -m experiments.prompt_tokens", *(sys.argv[1:] if argv is None else argv)]
    )
    OUT.write_text(
        json.dumps({"command": command, "n": args.n, "split": "dev", "presets": rows}, indent=2)
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
