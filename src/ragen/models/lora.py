"""LoRA adapters (peft) on a policy or a critic's decoder."""

from __future__ import annotations

import copy
from collections.abc import Sequence

# peft is imported inside apply_lora: importing it takes seconds, paid only by runs that use
# LoRA.


def apply_lora(model, rank: int, alpha: int, targets: Sequence[str]):
    """Wrap ``model`` with LoRA adapters (peft); only the adapters (and any module named
    in ``modules_to_save``) train. ``targets`` = ["all-linear"] adapts every linear layer but
    the output head."""
    from peft import LoraConfig, get_peft_model

    target = "all-linear" if list(targets) == ["all-linear"] else list(targets)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target, lora_dropout=0.0)
    return get_peft_model(model, config)


def is_lora(model) -> bool:
    """Whether ``model`` carries LoRA adapters (a peft model)."""
    return hasattr(model, "peft_config")


def merged_copy(model):
    """A copy of a LoRA ``model`` with its adapters merged into its weights: a plain
    transformers model. The model itself keeps its adapters, unmerged and untouched."""
    return copy.deepcopy(model).merge_and_unload()
