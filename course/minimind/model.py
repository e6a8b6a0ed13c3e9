"""A tiny, plain-PyTorch MiniMind causal LM (the course's oracle model).

Mirrors upstream ``model/model_minimind.py`` (``RMSNorm``, ``Attention``, ``FeedForward``,
``MOEFeedForward``, ``MiniMindBlock``, ``MiniMindModel``, ``MiniMindForCausalLM``) without the
``transformers`` dependency. Parameter names and shapes follow upstream, so a real MiniMind
``state_dict`` loads with ``strict=True``; ``tests/test_upstream_fixture.py`` compares outputs and
training runs with numbers produced by upstream's own code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .config import MiniMindConfig

IGNORE_INDEX = -100


@dataclass
class CausalLMOutput:
    """What ``MiniMindForCausalLM.forward`` returns (upstream: ``CausalLMOutputWithPast``)."""

    logits: torch.Tensor
    aux_loss: torch.Tensor
    loss: Optional[torch.Tensor] = None


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 and cast back (upstream ``RMSNorm``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_fp32 = x.float()
        normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.type_as(x)


def rope_cos_sin(head_dim: int, max_positions: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables in the half-rotation layout (upstream ``precompute_freqs_cis``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(max_positions).float(), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, S, heads, head_dim]; cos/sin: [S, head_dim]."""
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (x * cos + rotate_half(x) * sin).type_as(x)


class Attention(nn.Module):
    """Causal grouped-query attention with per-head q/k RMSNorm before RoPE."""

    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        groups = self.num_heads // self.num_kv_heads
        # [B, S, H, D] -> [B, H, S, D]; repeat each kv head for its query group (GQA).
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(groups, dim=1)
        v = v.transpose(1, 2).repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, config: MiniMindConfig, intermediate_size: Optional[int] = None):
        super().__init__()
        width = intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MOEFeedForward(nn.Module):
    """Top-k softmax router over SwiGLU experts, with upstream's load-balancing aux loss."""

    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.config = config
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(config, config.moe_intermediate_size)
                                     for _ in range(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        tokens = x.reshape(-1, x.shape[-1])
        scores = F.softmax(self.gate(tokens), dim=-1)
        topk_weight, topk_idx = torch.topk(scores, cfg.num_experts_per_tok, dim=-1, sorted=False)
        if cfg.norm_topk_prob:
            # For any k, top-1 included: one expert per token then gets weight exactly 1.0, so the LM
            # loss sends the router no gradient (up to rounding) and only the aux loss below trains it.
            topk_weight = topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)
        out = torch.zeros_like(tokens)
        for expert_id, expert in enumerate(self.experts):
            routed = topk_idx == expert_id
            if routed.any():
                token_pos = routed.any(dim=-1).nonzero().flatten()
                weight = topk_weight[routed].unsqueeze(-1)
                out.index_add_(0, token_pos, (expert(tokens[token_pos]) * weight).to(out.dtype))
            elif self.training:
                # An expert that got no token joins the graph with a zero-valued term: its parameters get
                # zero gradients, not None (DDP expects every parameter to take part in backward).
                out[0, 0] += 0 * sum(p.sum() for p in expert.parameters())
        if self.training and cfg.router_aux_loss_coef > 0:
            load = F.one_hot(topk_idx, cfg.num_experts).float().mean(0)
            aux_loss = (load * scores.mean(0)).sum() * cfg.num_experts * cfg.router_aux_loss_coef
        else:
            aux_loss = scores.new_zeros(())
        return out.view_as(x), aux_loss


class MiniMindBlock(nn.Module):
    """Pre-norm block: ``h = x + attn(norm1(x))``, ``out = h + mlp(norm2(h))``."""

    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MOEFeedForward(config) if config.use_moe else FeedForward(config)

    def forward(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        mlp_out = self.mlp(self.post_attention_layernorm(h))
        if isinstance(mlp_out, tuple):
            mlp_out, aux_loss = mlp_out
        else:
            aux_loss = h.new_zeros((), dtype=torch.float32)
        return h + mlp_out, aux_loss


class MiniMindModel(nn.Module):
    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(MiniMindBlock(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        cos, sin = rope_cos_sin(config.head_dim, config.max_position_embeddings, config.rope_theta)
        # Derived tables, not weights: kept out of the state_dict like upstream.
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seq = input_ids.shape[1]
        if seq > self.config.max_position_embeddings:
            raise ValueError(f"input_ids has sequence length {seq}, above "
                             f"max_position_embeddings={self.config.max_position_embeddings}")
        h = self.dropout(self.embed_tokens(input_ids))
        cos, sin = self.freqs_cos[:seq], self.freqs_sin[:seq]
        aux_loss = h.new_zeros((), dtype=torch.float32)
        for layer in self.layers:
            h, layer_aux = layer(h, cos, sin)
            aux_loss = aux_loss + layer_aux
        return self.norm(h), aux_loss


class MiniMindForCausalLM(nn.Module):
    """``model(input_ids, labels=labels)`` -> ``CausalLMOutput(loss, aux_loss, logits)``."""

    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.config = config
        self.model = MiniMindModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)

    def forward(self, input_ids: torch.Tensor, labels: Optional[torch.Tensor] = None) -> CausalLMOutput:
        hidden, aux_loss = self.model(input_ids)
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape "
                                 f"{tuple(input_ids.shape)}")
            # Position t predicts token t+1; -100 marks targets that do not count.
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)
        return CausalLMOutput(logits=logits, aux_loss=aux_loss, loss=loss)
