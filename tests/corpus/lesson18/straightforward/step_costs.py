"""Lesson 18 exercises: where a training step's time and memory go.

Corpus solution by author A, style `straightforward`: plain functions and loops, the obvious way.

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


def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    """The matmul FLOPs one token costs in a sequence of ``seq_len`` tokens (lesson 18 §5.1).

    Only matrix products count: every ``nn.Linear`` (2 FLOPs per weight a token meets) and attention's two
    batched products over the whole T x T square (the causal mask removes no multiply). The embedding lookup,
    norms, RoPE, softmax, SiLU and the loss are in no matmul. A backward does two products of each forward
    product's shape (the input's gradient and the weight's, or both operands' for attention): 3x the forward.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    d = config.hidden_size
    head_dim = config.head_dim
    q_width = config.num_attention_heads * head_dim
    kv_width = config.num_key_value_heads * head_dim

    per_layer = 0
    # attention projections
    per_layer += 2 * d * q_width        # q_proj
    per_layer += 2 * d * kv_width       # k_proj
    per_layer += 2 * d * kv_width       # v_proj
    per_layer += 2 * q_width * d        # o_proj
    # Q @ K^T and P @ V: each key-value head is repeated for its group, so every query head does both
    per_layer += 2 * 2 * seq_len * q_width
    # the MLP
    if config.use_moe:
        per_layer += 2 * d * config.num_experts                       # the router
        per_layer += config.num_experts_per_tok * 3 * 2 * d * config.moe_intermediate_size
    else:
        per_layer += 3 * 2 * d * config.intermediate_size

    forward = config.num_hidden_layers * per_layer
    forward += 2 * d * config.vocab_size     # lm_head, tied or not
    if training:
        return 3 * forward
    return forward


class ThroughputMeter:
    """Tokens per second over the last ``window`` measured steps, the first ``warmup_steps`` left out.

    Every clock read (the constructor's included) comes after ``synchronize()``, so a step's time is the time
    its work took on the device, not the time its launches took on the host.
    """

    def __init__(self, *, warmup_steps: int, window: int, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Optional[Callable[[], None]] = None):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.warmup_steps = warmup_steps
        self.window = window
        self.clock = clock
        self.synchronize = synchronize
        self.steps_seen = 0
        self.measured = deque(maxlen=window)   # (tokens, seconds) of the last `window` measured steps
        self.last_time = self._read_clock()

    def _read_clock(self) -> float:
        if self.synchronize is not None:
            self.synchronize()
        return self.clock()

    def step(self, tokens: int) -> None:
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens!r}")
        now = self._read_clock()
        seconds = now - self.last_time
        self.last_time = now
        self.steps_seen += 1
        if self.steps_seen <= self.warmup_steps:
            return
        self.measured.append((tokens, seconds))

    def tokens_per_second(self) -> Optional[float]:
        if len(self.measured) == 0:
            return None
        total_tokens = 0
        total_seconds = 0.0
        for tokens, seconds in self.measured:
            total_tokens += tokens
            total_seconds += seconds
        # the window's rate: all its tokens over all its time, not the mean of per-step rates
        if total_seconds <= 0:
            return float("inf") if total_tokens > 0 else 0.0
        return float(total_tokens / total_seconds)


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Achieved FLOP/s (a training step's FLOPs per token times tokens/s) as a fraction of the peak."""
    if peak_flops_per_second <= 0:
        raise ValueError(f"peak_flops_per_second must be > 0, got {peak_flops_per_second!r}")
    return float(flops_per_token * tokens_per_second / peak_flops_per_second)


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """Bytes of weights, gradients and optimizer state a run keeps between steps (lesson 18 §5.4).

    ``model.parameters()`` yields a tied tensor once. Every parameter is a weight; only those that require
    grad get a ``.grad`` (of the parameter's shape and dtype, autocast or not) and optimizer state. AdamW
    keeps ``exp_avg`` and ``exp_avg_sq`` like the parameter, plus a 0-dim ``step`` tensor per parameter
    (torch's scalar dtype: float32, float64 when that is the default dtype); SGD without momentum keeps none.
    """
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    step_bytes = 8 if torch.get_default_dtype() == torch.float64 else 4
    weights = 0
    gradients = 0
    state = 0
    for p in model.parameters():
        weights += p.nbytes
        if not p.requires_grad:
            continue
        gradients += p.nbytes
        if optimizer == "adamw":
            state += 2 * p.nbytes + step_bytes
    return {"weights": int(weights), "gradients": int(gradients), "optimizer": int(state)}


def _rmsnorm_saved_bytes(width: int, param_bytes: int) -> int:
    """What one RMSNorm saves per row of ``width``: its fp32 input (pow's and mul's), the fp32 rsqrt (one per
    row), and the normalized row cast back to the parameter dtype (the weight multiply's). For an fp32 model
    the fp32 input is the input itself; for bf16 it is the copy ``x.float()`` made."""
    return 4 * width + 4 + param_bytes * width


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """The bytes autograd saves for backward in one training forward, loss included (lesson 18 §5.4).

    Counted op by op on ``course/minimind/model.py`` with the CPU's default (fused flash) attention kernel,
    each storage once (a view, or the same tensor saved by two ops, counts once), parameters and buffers out.
    """
    if config.use_moe:
        raise ValueError("config: activation_bytes takes a dense config only (a MoE layer's saves depend on routing)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    s = torch.empty((), dtype=dtype).element_size()
    d = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads
    q_width = heads * config.head_dim
    kv_width = kv_heads * config.head_dim
    inter = config.intermediate_size
    tokens = batch_size * seq_len

    per_token = 0
    for _ in range(config.num_hidden_layers):
        per_token += _rmsnorm_saved_bytes(d, s)            # input_layernorm
        per_token += s * d                                 # its output: the input of q/k/v_proj (one storage)
        per_token += 4 * q_width + 4 * heads + s * q_width      # q_norm, per head
        per_token += 4 * kv_width + 4 * kv_heads + s * kv_width  # k_norm, per key-value head
        # RoPE multiplies by buffers: nothing of the activations saved there.
        # The flash kernel saves q, the repeated k and v, its output (o_proj's input is a view of it)
        # and a logsumexp per head, in the kernel's accumulation dtype (fp32 for fp32, bf16 and fp16).
        per_token += 4 * s * q_width + max(4, s) * heads
        per_token += _rmsnorm_saved_bytes(d, s)            # post_attention_layernorm
        per_token += s * d                                 # its output: gate/up_proj's input
        per_token += s * inter                             # gate output (SiLU's input)
        per_token += s * inter                             # SiLU output
        per_token += s * inter                             # up output
        per_token += s * inter                             # the product: down_proj's input
    per_token += _rmsnorm_saved_bytes(d, s)                # final norm
    per_token += s * d                                     # lm_head's input
    per_token += 8                                         # input_ids, for the embedding's backward

    total = tokens * per_token
    # The loss: log_softmax's fp32 output over the T-1 predicting positions, the int64 targets
    # and nll_loss's fp32 total weight.
    targets = batch_size * (seq_len - 1)
    total += targets * 4 * config.vocab_size
    total += targets * 8
    total += 4
    return int(total)


class RunningLoss:
    """The mean loss of a log interval, with one host sync per ``pop_mean`` and none per ``add``."""

    def __init__(self):
        self.total = None     # a 0-dim tensor on the losses' device, or None when the interval is empty
        self.count = 0        # a Python int: counting needs no sync

    def add(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("loss must be a 0-dim tensor")
        # detach: the sum must not keep each step's graph alive; at least float32, so bf16 losses add exactly
        value = loss.detach()
        wide = torch.promote_types(value.dtype, torch.float32)
        if value.dtype != wide:
            value = value.to(wide)
        if self.total is None:
            self.total = value.clone()
        else:
            if value.device != self.total.device:
                value = value.to(self.total.device, non_blocking=True)
            self.total = self.total + value
        self.count += 1

    def pop_mean(self) -> float:
        if self.count == 0:
            raise ValueError("pop_mean: no loss added since the last pop")
        mean = (self.total / self.count).item()   # the one host sync
        self.total = None
        self.count = 0
        return float(mean)


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
