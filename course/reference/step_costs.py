"""Reference solutions for lesson 18 (``impl/step_costs.py`` is the student's copy): where a training step's time
and memory go.

``flops_per_token`` counts the matmuls of one token as torch's FlopCounterMode counts the real model;
``ThroughputMeter`` measures tokens/s with the device synchronized before each clock read, the warm-up left out;
``mfu`` divides the FLOP/s achieved by a peak; ``training_state_bytes`` and ``activation_bytes`` account for the
bytes of the training state and of what autograd saves for backward; ``RunningLoss`` logs without a host sync per
step. The optional ``without_rope_sync`` moves recent upstream's per-forward RoPE check out of the forward.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel

FLOAT32_BYTES = 4
INT64_BYTES = 8


def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    """The matmul FLOPs of one token of a ``seq_len``-token sequence: 2 per weight of every linear layer it passes
    (the active experts and the router of a MoE layer; the lm_head, tied or not; no embedding lookup), plus
    attention's QK^T and PV over the whole sequence; ``training``: forward and backward, 3x the forward."""
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    hidden = config.hidden_size
    kv_width = config.num_key_value_heads * config.head_dim
    attention = 2 * hidden * hidden + 2 * hidden * kv_width            # q and o; k and v
    if config.use_moe:
        mlp = hidden * config.num_experts + config.num_experts_per_tok * 3 * hidden * config.moe_intermediate_size
    else:
        mlp = 3 * hidden * config.intermediate_size
    weights = config.num_hidden_layers * (attention + mlp) + hidden * config.vocab_size
    forward = 2 * weights + 4 * config.num_hidden_layers * seq_len * hidden
    return 3 * forward if training else forward


class ThroughputMeter:
    """Tokens per second over the last ``window`` steps after ``warmup_steps``: a step's time runs from the
    previous clock read (the meter's creation for the first), each read after ``synchronize()``."""

    def __init__(self, *, warmup_steps: int, window: int, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Optional[Callable[[], None]] = None):
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self._clock = clock
        self._synchronize = synchronize
        self._warmup_left = warmup_steps
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)   # (tokens, seconds) of measured steps
        self._last_read = self._now()

    def _now(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return self._clock()

    def step(self, tokens: int) -> None:
        if not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"tokens must be an int >= 0 (the tokens trained on), got {tokens!r}")
        now = self._now()
        if self._warmup_left:
            self._warmup_left -= 1
        else:
            self._steps.append((tokens, now - self._last_read))
        self._last_read = now

    def tokens_per_second(self) -> Optional[float]:
        if not self._steps:
            return None
        return sum(tokens for tokens, _ in self._steps) / sum(seconds for _, seconds in self._steps)


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization: the FLOP/s achieved as a fraction of the peak (0.36 for 36 %)."""
    if not peak_flops_per_second > 0:
        raise ValueError(f"peak_flops_per_second must be > 0, got {peak_flops_per_second!r}")
    return flops_per_token * tokens_per_second / peak_flops_per_second


# Per-parameter state tensors of the parameter's shape and dtype: AdamW's two moments; plain SGD keeps none.
MOMENTS = {"adamw": 2, "sgd": 0}


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """Bytes of the weights (each parameter tensor once, at its own dtype), their gradients and the optimizer's
    state once a step has run; a frozen parameter has neither gradient nor state."""
    if optimizer not in MOMENTS:
        raise ValueError(f"optimizer must be one of {sorted(MOMENTS)}, got {optimizer!r}")
    params = list(model.parameters())   # a tied weight is one parameter
    trained = [p for p in params if p.requires_grad]
    gradients = sum(p.nbytes for p in trained)
    state = MOMENTS[optimizer] * gradients
    if optimizer == "adamw":
        state += FLOAT32_BYTES * len(trained)   # its step count: a float32 scalar tensor per parameter
    return {"weights": sum(p.nbytes for p in params), "gradients": gradients, "optimizer": state}


def _validate_positive_ints(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _norm_bytes(width: int, rows: int, size: int) -> int:
    """An RMSNorm of ``width`` values in ``rows`` rows, per token: its input in float32, one float32 1/rms per row,
    its normalized values at the model's dtype."""
    return FLOAT32_BYTES * (width + rows) + size * width


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes autograd saves for backward in one training forward (loss included) of a dense model whose parameters
    are ``dtype``, with fused attention (no T x T matrix is kept): linear in batch_size * seq_len."""
    if config.use_moe:
        raise ValueError("config must be a dense model (use_moe=False): a MoE layer saves what its routing decides")
    _validate_positive_ints(batch_size=batch_size, seq_len=seq_len)
    size = dtype.itemsize
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    norm = _norm_bytes(hidden, 1, size) + size * hidden           # and its output, the next matmul's input
    layer = (2 * norm                                             # before attention and before the MLP
             + _norm_bytes(hidden, heads, size) + size * hidden   # q: its norm, its rotated values
             + _norm_bytes(kv_heads * config.head_dim, kv_heads, size)
             + 3 * size * hidden + FLOAT32_BYTES * heads          # k, v repeated to every head, the output, logsumexp
             + 4 * size * config.intermediate_size)               # SwiGLU: gate, silu(gate), up, their product
    per_token = INT64_BYTES + config.num_hidden_layers * layer + norm   # the ids; the final norm
    targets = batch_size * (seq_len - 1)                          # the loss's rows: float32 log-probs, int64 targets
    return batch_size * seq_len * per_token + targets * (FLOAT32_BYTES * config.vocab_size + INT64_BYTES) + \
        FLOAT32_BYTES


class RunningLoss:
    """The loss logged over an interval: ``add`` keeps a float32 sum on the loss's device, ``pop_mean`` copies the
    mean to the host (one sync) and starts over."""

    def __init__(self):
        self._total: Optional[torch.Tensor] = None
        self._count = 0

    def add(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError(f"loss must be a 0-dim tensor, got {loss!r}")
        value = loss.detach().float()
        self._total = value if self._total is None else self._total + value
        self._count += 1

    def pop_mean(self) -> float:
        if not self._count:
            raise ValueError("pop_mean: no loss was added since the last pop_mean")
        mean = (self._total / self._count).item()   # the one host sync
        self._total, self._count = None, 0
        return mean


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (from ``course.runs.rope_check.recent_upstream_model``), changed in place: upstream's RoPE check
    runs once, here, instead of in every forward."""
    inner = model.model
    if inner.freqs_cos[0, 0] == 0:   # tables lost at init: recomputed now, with the only sync
        inner.recompute_rope_tables(inner.freqs_cos.device)
    inner.__class__ = MiniMindModel   # the check is all RecentUpstreamModel adds to the forward
    return model
