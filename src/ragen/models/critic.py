"""Critics built from the policy: a value head on a copy of its decoder (:class:`ValueModel`)
or on the policy's own decoder (:class:`TrunkValueHead`)."""

from __future__ import annotations

import torch

from ragen.models.source import ModelError


class ValueModel(torch.nn.Module):
    """A critic: the policy LM's transformer body with a scalar head instead of the LM head.

    Initialised from the policy LM (as in the paper), so it starts from the same features.
    Values are read with `ragen.train.forward.state_values`, which runs ``body`` then ``head``.
    """

    detached_body = False
    """The value loss trains ``body`` too."""

    def __init__(self, lm, layers: int | None = None) -> None:
        """``lm``: a copy of the policy this critic owns (it is cut, not copied); ``layers``:
        keep only its first decoder layers (model.critic_layers), None keeps all."""
        super().__init__()
        self.body = lm.base_model  # the decoder without its LM head (LlamaModel, Qwen2Model...)
        self.config = lm.config
        if layers is not None:
            keep_first_layers(self.body, layers)
        self.head = torch.nn.Linear(lm.config.hidden_size, 1)
        # A zero head starts every value at 0: no arbitrary initial critic error.
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)


class TrunkValueHead(torch.nn.Module):
    """A critic that is only a scalar head on the policy's own decoder (model.critic_body=policy).

    ``body`` is the policy's decoder, read without gradient (``detached_body``): the value
    loss trains the head alone, and the policy's weights are the policy's, updated by its own
    loss only. The policy is held outside the module tree, so this module's parameters,
    state dict and optimiser are the head's alone, and nothing is counted, summed across
    processes or saved twice.
    """

    detached_body = True

    def __init__(self, policy) -> None:
        """``policy``: the policy LM the trainer updates (LoRA-wrapped or not), not a copy."""
        super().__init__()
        self.__dict__["policy"] = policy  # not registered: its weights belong to the policy
        self.config = policy.config
        self.head = torch.nn.Linear(policy.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @property
    def body(self):
        """The policy's decoder without its LM head, as it is now."""
        return self.__dict__["policy"].get_decoder()


def keep_first_layers(decoder, layers: int) -> None:
    """Cut a decoder body (LlamaModel, Qwen2Model..., its blocks in ``decoder.layers``) to its
    first ``layers`` blocks, in place, and its config with it: the KV caches and the attention
    masks size themselves from ``num_hidden_layers`` and ``layer_types``. The final norm
    stays. The config must be the caller's own copy (a deep-copied model's is)."""
    blocks = getattr(decoder, "layers", None)
    if not isinstance(blocks, torch.nn.ModuleList):
        raise ModelError(
            f"model.critic_layers: {type(decoder).__name__} keeps no decoder layers in .layers, "
            "so ragen cannot cut them; leave model.critic_layers null"
        )
    if layers > len(blocks):
        raise ModelError(
            f"model.critic_layers={layers}: the model has {len(blocks)} decoder layers; "
            f"pick 1 to {len(blocks)}, or null for all"
        )
    del blocks[layers:]
    config = decoder.config
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:layers]
