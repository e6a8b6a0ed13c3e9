"""Lesson 18 exercises: where a training step's time and memory go.

Corpus solution by author A, style `formula_tables`: per-layer FLOP and byte terms in small named tables, summed at the end.

Read course/lessons/18_time_and_memory.md (Chinese: course/lessons/zh/18_time_and_memory.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 18``. The model is the oracle,
``course/minimind/model.py``; every check compares your numbers with a measurement of it (FlopCounterMode,
saved_tensors_hooks, nbytes, the host-sync counter) or of a fake device (``course/runs/fake_device.py``).
"""
from __future__ import annotations

import time
from collections import deque  # noqa: F401 - the last `window` steps
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel  # noqa: F401 - the optional §10.1


# ---------------------------------------------------------------------------------------------------------------
# The tables. Each cost of a step is one named term; a function fills the terms for a config and sums them.
# ---------------------------------------------------------------------------------------------------------------

# How many products a backward runs per forward product: a linear layer's (or a batched matmul's) backward
# computes the gradient of both operands, each a product of the forward's shape.
BACKWARD_PRODUCTS_PER_FORWARD = 2


def _layer_matmul_flops(config: MiniMindConfig, seq_len: int) -> dict[str, int]:
    """Forward FLOPs per token of one decoder layer, one entry per matrix product (2 FLOPs per multiply-add)."""
    d = config.hidden_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    terms = {
        "self_attn.q_proj": 2 * d * q,
        "self_attn.k_proj": 2 * d * kv,
        "self_attn.v_proj": 2 * d * kv,
        # the repeated key-value heads: every query head multiplies its T x T square (the mask removes nothing)
        "self_attn.scores (Q K^T)": 2 * seq_len * q,
        "self_attn.mix (P V)": 2 * seq_len * q,
        "self_attn.o_proj": 2 * q * d,
    }
    if config.use_moe:
        width, experts_paid = config.moe_intermediate_size, config.num_experts_per_tok
        terms["mlp.gate (router)"] = 2 * d * config.num_experts
    else:
        width, experts_paid = config.intermediate_size, 1
    terms["mlp.gate_proj"] = experts_paid * 2 * d * width
    terms["mlp.up_proj"] = experts_paid * 2 * d * width
    terms["mlp.down_proj"] = experts_paid * 2 * width * d
    return terms


def _head_matmul_flops(config: MiniMindConfig) -> dict[str, int]:
    """Forward FLOPs per token outside the layers: the embedding is a lookup (no product), the loss none."""
    return {"embed_tokens": 0, "lm_head": 2 * config.hidden_size * config.vocab_size}


def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    """The matmul FLOPs one token costs in a sequence of ``seq_len`` tokens: forward, or forward and backward."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    layer = _layer_matmul_flops(config, seq_len)
    forward = config.num_hidden_layers * sum(layer.values()) + sum(_head_matmul_flops(config).values())
    passes = {"forward": 1, "backward": BACKWARD_PRODUCTS_PER_FORWARD if training else 0}
    return int(forward * sum(passes.values()))


class ThroughputMeter:
    """Tokens/s over the last ``window`` measured steps: the window's tokens over the window's seconds.

    The measured steps are rows of a small table (``{"tokens": ..., "seconds": ...}``); the rate sums its two
    columns. Every clock read follows a ``synchronize()``, the constructor's included.
    """

    def __init__(self, *, warmup_steps: int, window: int, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Optional[Callable[[], None]] = None):
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must not be negative, got {warmup_steps}")
        self._clock = clock
        self._synchronize = synchronize
        self._warmup_left = warmup_steps
        self._rows: deque[dict[str, float]] = deque(maxlen=window)
        self._previous_read = self._read()

    def _read(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return self._clock()

    def step(self, tokens: int) -> None:
        if tokens < 0:
            raise ValueError(f"tokens must not be negative, got {tokens}")
        now = self._read()
        row = {"tokens": tokens, "seconds": now - self._previous_read}
        self._previous_read = now
        if self._warmup_left:
            self._warmup_left -= 1
        else:
            self._rows.append(row)

    def tokens_per_second(self) -> Optional[float]:
        if not self._rows:
            return None
        column = {key: sum(row[key] for row in self._rows) for key in ("tokens", "seconds")}
        if column["seconds"] == 0:
            return float("inf")
        return float(column["tokens"] / column["seconds"])


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Achieved FLOP/s over the peak: 0.36 for 36 %."""
    if not peak_flops_per_second > 0:
        raise ValueError(f"peak_flops_per_second must be above 0, got {peak_flops_per_second}")
    achieved = flops_per_token * tokens_per_second
    return float(achieved / peak_flops_per_second)


# What each optimizer keeps per trainable parameter tensor: "like" a tensor of the parameter's shape and dtype,
# "scalar" a 0-dim tensor of torch's scalar dtype (AdamW's step count, torch/optim/adam.py::_init_group).
OPTIMIZER_STATE: dict[str, dict[str, str]] = {
    "adamw": {"exp_avg": "like", "exp_avg_sq": "like", "step": "scalar"},
    "sgd": {},   # no momentum: no buffer
}


def _scalar_state_bytes() -> int:
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    return torch.empty((), dtype=dtype).element_size()


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """The bytes of weights, gradients and optimizer state kept between steps, one table row per parameter."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATE)}, got {optimizer!r}")
    state_entries = OPTIMIZER_STATE[optimizer]
    rows = []
    for parameter in model.parameters():          # a tied tensor appears once
        trainable = parameter.requires_grad
        entry_bytes = {"like": parameter.nbytes, "scalar": _scalar_state_bytes()}
        rows.append({
            "weights": parameter.nbytes,
            # a .grad has the parameter's dtype whatever autocast ran the matmuls in
            "gradients": parameter.nbytes if trainable else 0,
            "optimizer": sum(entry_bytes[kind] for kind in state_entries.values()) if trainable else 0,
        })
    return {key: int(sum(row[key] for row in rows)) for key in ("weights", "gradients", "optimizer")}


FP32 = 4      # RMSNorm's statistics and the loss's log-probabilities are fp32; the attention logsumexp at least
INT64 = 8     # token ids and targets


def _rmsnorm_saved(width: int, rows: int, param: int) -> dict[str, int]:
    """Per token: one RMSNorm over ``rows`` rows of ``width`` (rows > 1 for q_norm / k_norm, one per head)."""
    return {
        "input in fp32 (pow, mul)": FP32 * rows * width,     # the input itself for an fp32 model, else x.float()
        "rsqrt (mul)": FP32 * rows,
        "normalized, cast back (weight mul)": param * rows * width,
    }


def _layer_saved_bytes(config: MiniMindConfig, param: int) -> dict[str, int]:
    """Saved bytes per token of one dense decoder layer on the CPU's default (flash) attention kernel."""
    d, inter = config.hidden_size, config.intermediate_size
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    terms: dict[str, int] = {}
    for name, value in _rmsnorm_saved(d, 1, param).items():
        terms[f"input_layernorm: {name}"] = value
    terms["q/k/v_proj input (one storage for three)"] = param * d
    for name, value in _rmsnorm_saved(head_dim, heads, param).items():
        terms[f"q_norm: {name}"] = value
    for name, value in _rmsnorm_saved(head_dim, kv_heads, param).items():
        terms[f"k_norm: {name}"] = value
    # RoPE multiplies by its buffers, which need no gradient: it saves only the buffers.
    terms["sdpa: q"] = param * heads * head_dim
    terms["sdpa: k, kv heads repeated"] = param * heads * head_dim
    terms["sdpa: v, kv heads repeated"] = param * heads * head_dim
    terms["sdpa: output (o_proj's input is a view of it)"] = param * heads * head_dim
    terms["sdpa: logsumexp (accumulation dtype)"] = max(FP32, param) * heads
    for name, value in _rmsnorm_saved(d, 1, param).items():
        terms[f"post_attention_layernorm: {name}"] = value
    terms["gate/up_proj input (one storage for two)"] = param * d
    terms["silu input (gate_proj output)"] = param * inter
    terms["silu output"] = param * inter
    terms["up_proj output"] = param * inter
    terms["down_proj input"] = param * inter
    return terms


def _model_saved_bytes_per_token(config: MiniMindConfig, param: int) -> dict[str, int]:
    terms = {"embed_tokens: input_ids": INT64}
    for name, value in _rmsnorm_saved(config.hidden_size, 1, param).items():
        terms[f"norm: {name}"] = value
    terms["lm_head input"] = param * config.hidden_size
    return terms


def _loss_saved_bytes_per_target(config: MiniMindConfig) -> dict[str, int]:
    return {"log_softmax output (fp32 logits)": FP32 * config.vocab_size, "nll_loss target": INT64}


LOSS_SAVED_BYTES_PER_BATCH = {"nll_loss total_weight": FP32}


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """The bytes autograd saves for backward in one training forward, loss included (each storage once)."""
    if config.use_moe:
        raise ValueError("config: a MoE config's saved tensors depend on its routing; give a dense config")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    param = torch.empty((), dtype=dtype).element_size()
    per_token = (config.num_hidden_layers * sum(_layer_saved_bytes(config, param).values())
                 + sum(_model_saved_bytes_per_token(config, param).values()))
    per_target = sum(_loss_saved_bytes_per_target(config).values())
    counts = {"tokens": batch_size * seq_len, "targets": batch_size * (seq_len - 1)}   # position t predicts t+1
    total = (counts["tokens"] * per_token + counts["targets"] * per_target
             + sum(LOSS_SAVED_BYTES_PER_BATCH.values()))
    return int(total)


class RunningLoss:
    """The interval's losses, detached and widened to float32 at least, kept as a list summed at ``pop_mean``."""

    def __init__(self):
        self._losses: list[torch.Tensor] = []

    def add(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
            raise ValueError("loss must be a 0-dim tensor")
        wide = torch.promote_types(loss.dtype, torch.float32)
        # a copy: neither the graph nor a buffer the loop may overwrite stays behind
        self._losses.append(loss.detach().to(dtype=wide, copy=True))

    def pop_mean(self) -> float:
        if not self._losses:
            raise ValueError("pop_mean: nothing was added since the last pop_mean")
        losses, self._losses = self._losses, []
        device = losses[0].device
        total = torch.stack([loss if loss.device == device else loss.to(device) for loss in losses]).sum()
        return float((total / len(losses)).item())   # the one host sync


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
