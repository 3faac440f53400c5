"""Expert dialogues: the rollout loop played by an expert instead of a model.

`ExpertGenerator` is a `Generator` whose reply to each request is the expert's move for the
episode's current state (`envs.experts.expert_move`), written as a worked reply and
tokenised. Played through `loop.rollout`, it yields trajectories in exactly the format the
model's rollouts have (system line, rules, worked examples, turn messages, reply prefix,
`||` separators, the `</answer>` stop), with ``loss_mask`` 1 on the reply tokens only: the
supervised loss of `ragen sft` covers exactly the tokens an RL update would train.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from ragen.agent.prompts import reply_prefix, worked_reply
from ragen.envs.experts import ExpertError, expert_move
from ragen.rollout.engines import FINISH_STOP, GenerationStats, Request, Sample
from ragen.rollout.loop import EVAL_SEED_BASE, RolloutSpec, rollout
from ragen.rollout.trajectory import Trajectory

# Salt of the seed stream of expert levels, apart from the RL steps' streams of one seed.
_SFT_STREAM = 7


class ExpertGenerator:
    """Replies with the expert's move; counts each episode's actions to know what is left.
    ``thought`` is how the grid games' thoughts place things (`config.EXPERT_THOUGHTS`),
    ``lake`` how FrozenLake is played (`config.LAKE_EXPERTS`), ``sokoban`` how Sokoban is
    (`config.SOKOBAN_EXPERTS`)."""

    def __init__(
        self,
        tokenizer,
        spec: RolloutSpec,
        thought: str = "relative",
        lake: str = "optimal",
        sokoban: str = "optimal",
    ) -> None:
        self.tokenizer, self.spec, self.thought = tokenizer, spec, thought
        self.lake, self.sokoban = lake, sokoban
        self.prefix = reply_prefix(spec.think)
        self.stats = GenerationStats()
        self._used: dict[Hashable, int] = {}

    def generate(
        self,
        requests: Sequence[Request],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[Sample]:
        """The expert's reply to every request, as token ids (log-probs 0: nothing was
        sampled). Raises ExpertError when a reply would not fit ``max_new_tokens``."""
        samples = []
        for request in requests:
            env = request.env
            if env is None:
                raise ValueError("an expert reply needs the episode's env (Request.env)")
            per_turn = self.spec.max_actions_per_turn if env.actions else 1
            used = self._used.get(request.key, 0)
            left = self.spec.max_actions_per_episode - used
            move = expert_move(env, per_turn, left, self.thought, self.lake, self.sokoban)
            self._used[request.key] = used + len(move.answer)
            text = worked_reply(move.thought, move.answer, think=self.spec.think)
            ids = self.tokenizer(text[len(self.prefix) :], add_special_tokens=False)["input_ids"]
            if len(ids) > max_new_tokens:
                raise ExpertError(
                    f"an expert reply takes {len(ids)} tokens, more than "
                    f"rollout.max_reply_tokens={max_new_tokens}: raise it"
                )
            samples.append(Sample(ids, [0.0] * len(ids), FINISH_STOP))
            self.stats.generated_tokens += len(ids)
        self.stats.calls += 1
        return samples

    def release(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._used.pop(key, None)


def expert_seeds(seed: int, step: int, count: int) -> list[int]:
    """Level seeds of expert dialogues for ``step``: a stream of their own, below the
    evaluation seeds (which start at EVAL_SEED_BASE), so no evaluated level is trained on."""
    rng = np.random.default_rng([seed, step, _SFT_STREAM])
    return [int(s) for s in rng.integers(0, EVAL_SEED_BASE, size=count)]


def expert_dialogues(
    tokenizer,
    env_name: str,
    seeds: Sequence[int],
    spec: RolloutSpec,
    *,
    env_options: dict | None = None,
    thought: str = "relative",
    lake: str = "optimal",
    sokoban: str = "optimal",
) -> list[Trajectory]:
    """One expert episode per seed, played through the rollout loop."""
    generator = ExpertGenerator(tokenizer, spec, thought, lake, sokoban)
    return rollout(generator, tokenizer, env_name, seeds, 1, spec, env_options=env_options)
