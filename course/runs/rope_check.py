"""Recent upstream MiniMind's per-forward RoPE check, reproduced (lesson 18 §10.1, the "fix upstream" extension).

Upstream MiniMind, after commit d65ef2c that ``course/minimind`` is pinned to, added to ``MiniMindModel.forward``
(model/model_minimind.py, for transformers >= 5, which builds a model on the meta device and so loses its
non-persistent buffers)::

    # Recompute RoPE buffers lost during meta-device init (transformers>=5.x)
    if self.freqs_cos[0, 0] == 0:
        freqs_cos, freqs_sin = precompute_freqs_cis(...)
        self.freqs_cos, self.freqs_sin = freqs_cos.to(hidden_states.device), freqs_sin.to(hidden_states.device)

``if <tensor>`` converts a device tensor to a Python bool: on a GPU, one host sync in every forward.
``RecentUpstreamModel`` is course/minimind's ``MiniMindModel`` with exactly that check first in its forward (the
oracle itself stays as pinned); ``recent_upstream_model`` builds a ``MiniMindForCausalLM`` around it.
"""
from __future__ import annotations

import torch

from course.minimind import MiniMindConfig, MiniMindForCausalLM
from course.minimind.model import MiniMindModel, rope_cos_sin


class RecentUpstreamModel(MiniMindModel):
    """``MiniMindModel`` whose forward first runs recent upstream's check (it adds nothing else)."""

    def recompute_rope_tables(self, device) -> None:
        cos, sin = rope_cos_sin(self.config.head_dim, self.config.max_position_embeddings, self.config.rope_theta)
        self.freqs_cos, self.freqs_sin = cos.to(device), sin.to(device)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.freqs_cos[0, 0] == 0:   # upstream's check: a host sync per forward on a GPU
            self.recompute_rope_tables(input_ids.device)
        return super().forward(input_ids)


def recent_upstream_model(config: MiniMindConfig) -> MiniMindForCausalLM:
    """``MiniMindForCausalLM(config)`` (the same weights for the same seed) whose ``.model`` runs upstream's check:
    the class changes, no module or tensor does."""
    model = MiniMindForCausalLM(config)
    model.model.__class__ = RecentUpstreamModel
    return model


def lose_rope_tables(model: MiniMindForCausalLM) -> None:
    """What a meta-device init leaves in the RoPE tables upstream's check looks for: zeros."""
    with torch.no_grad():
        model.model.freqs_cos.zero_()
        model.model.freqs_sin.zero_()
