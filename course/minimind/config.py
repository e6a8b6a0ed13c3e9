"""Model configuration with MiniMind's upstream defaults.

Mirrors ``MiniMindConfig`` in upstream ``model/model_minimind.py``; only the fields the
course needs are kept, with the same names so a real MiniMind config maps one to one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

# The course's default tiny model (not upstream's): small enough that a resume checkpoint
# (fp32 weights + 2 AdamW moments = 12 bytes per parameter, 376,584 parameters) stays under 5 MB.
TINY_HIDDEN_SIZE = 48
TINY_NUM_HIDDEN_LAYERS = 2


@dataclass
class MiniMindConfig:
    hidden_size: int = 768
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    vocab_size: int = 6400
    intermediate_size: Optional[int] = None
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    dropout: float = 0.0
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    # Mixture of experts (upstream ``use_moe``): top-1 routing over 4 experts, each a SwiGLU of width
    # ``moe_intermediate_size`` (default: ``intermediate_size``, like upstream).
    use_moe: bool = False
    num_experts: int = 4
    num_experts_per_tok: int = 1
    moe_intermediate_size: Optional[int] = None
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 5e-4

    def __post_init__(self) -> None:
        positive = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "vocab_size", "max_position_embeddings", "num_experts", "num_experts_per_tok")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be <= "
                             f"num_experts ({self.num_experts})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for name in ("intermediate_size", "moe_intermediate_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive int or None (upstream's default), got {value!r}")
        if self.intermediate_size is None:
            # Upstream: round hidden * pi up to a multiple of 64 (768 -> 2432, 64 -> 256).
            self.intermediate_size = math.ceil(self.hidden_size * math.pi / 64) * 64
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads
