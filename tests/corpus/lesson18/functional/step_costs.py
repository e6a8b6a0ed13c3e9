"""Lesson 18 exercises: where a training step's time and memory go.

Read course/lessons/18_time_and_memory.md (Chinese: course/lessons/zh/18_time_and_memory.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 18``. The model is the oracle,
``course/minimind/model.py``; every check compares your numbers with a measurement of it (FlopCounterMode,
saved_tensors_hooks, nbytes, the host-sync counter) or of a fake device (``course/runs/fake_device.py``).

Author C, style ``functional``: small pure helpers composed by each exercise, no classes beyond the two required.
"""
from __future__ import annotations

import time
from collections import deque  # noqa: F401 - the last `window` steps
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel  # noqa: F401 - the optional §10.1


# ----------------------------------------------------------------------------------------------------------
# FLOPs: pure helpers over the config
# ----------------------------------------------------------------------------------------------------------

def _attention_weights(config: MiniMindConfig) -> int:
    """Weights a token multiplies in one layer's q, k, v and o projections."""
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    return config.hidden_size * q_width * 2 + config.hidden_size * kv_width * 2


def _swiglu_weights(hidden: int, width: int) -> int:
    """gate, up and down of one SwiGLU of ``width``."""
    return 3 * hidden * width


def _mlp_weights(config: MiniMindConfig) -> int:
    """Weights a token multiplies in one layer's MLP: the router plus the k experts it is sent to (MoE)."""
    if not config.use_moe:
        return _swiglu_weights(config.hidden_size, config.intermediate_size)
    router = config.hidden_size * config.num_experts
    experts = config.num_experts_per_tok * _swiglu_weights(config.hidden_size, config.moe_intermediate_size)
    return router + experts


def _lm_head_weights(config: MiniMindConfig) -> int:
    """The lm_head product runs whether or not its weight is the embedding's: tying changes memory, not FLOPs."""
    return config.hidden_size * config.vocab_size


def _matmul_weights_per_token(config: MiniMindConfig) -> int:
    """Parameters a token meets in a matmul (the embedding lookup is a gather, not a matmul)."""
    per_layer = _attention_weights(config) + _mlp_weights(config)
    return config.num_hidden_layers * per_layer + _lm_head_weights(config)


def _attention_score_flops_per_token(config: MiniMindConfig, seq_len: int) -> int:
    """QK^T and scores @ V over the whole T x T square (the causal mask removes no matmul), per token."""
    q_width = config.num_attention_heads * config.head_dim
    return config.num_hidden_layers * 2 * (2 * q_width * seq_len)


def _forward_flops_per_token(config: MiniMindConfig, seq_len: int) -> int:
    return 2 * _matmul_weights_per_token(config) + _attention_score_flops_per_token(config, seq_len)


def _with_backward(forward_flops: int) -> int:
    """Every matmul's backward is two products of its own shape (the input's gradient and the other operand's)."""
    return 3 * forward_flops


def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    """TODO (lesson 18 §5.1): the matmul FLOPs one token costs in a sequence of ``seq_len`` tokens.

    ``config``: a MiniMind config, dense or MoE (``use_moe``). Returns an int: what torch's FlopCounterMode
    counts for the model's forward (``training=True``: its forward and backward) of a batch of such sequences,
    divided by the tokens, attention run as matmuls (lesson 18 §1.1 says what the counter counts and what not).
    Example: flops_per_token(MiniMindConfig(hidden_size=32, num_hidden_layers=1, vocab_size=64), 8) -> 34816
    + the attention term for 8 tokens (lesson 18 §5.1 asks you to predict it).
    """
    forward = _forward_flops_per_token(config, int(seq_len))
    return int(_with_backward(forward) if training else forward)


# ----------------------------------------------------------------------------------------------------------
# Throughput: the meter only stores; the rate is a pure function of the stored steps
# ----------------------------------------------------------------------------------------------------------

def _no_sync() -> None:
    return None


def _last(items: tuple, count: int) -> tuple:
    return items[-count:] if len(items) > count else items


def _rate(steps: tuple) -> Optional[float]:
    """Total tokens over total seconds of ``(tokens, seconds)`` steps (not the mean of per-step rates)."""
    if not steps:
        return None
    tokens = sum(t for t, _ in steps)
    seconds = sum(s for _, s in steps)
    if seconds <= 0:
        return float("inf") if tokens > 0 else 0.0
    return float(tokens) / float(seconds)


class ThroughputMeter:
    """TODO (lesson 18 §5.2): tokens per second of a training loop, measured right on an asynchronous device.

    Call ``step(tokens)`` after each training step with the tokens it trained on (not padding);
    ``tokens_per_second()`` is the rate over the last ``window`` steps after the first ``warmup_steps``, None
    until a step after the warm-up has been taken. A step's time runs from the previous clock read (the meter's
    creation for the first step). ``clock()`` returns seconds; ``synchronize()`` (None: nothing to wait for, a
    CPU) waits until the device has finished the work queued so far: call it before every clock read.
    Example: warmup_steps=1, window=2, steps of (100 tokens, 2.0 s), (50, 1.0), (30, 0.5) -> None, 50.0, 53.33...
    """

    def __init__(self, *, warmup_steps: int, window: int, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Optional[Callable[[], None]] = None):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self._warmup = warmup_steps
        self._window = window
        self._clock = clock
        self._sync = synchronize or _no_sync
        self._taken = 0
        self._steps: tuple = ()
        self._last_read = self._read()

    def _read(self) -> float:
        self._sync()
        return self._clock()

    def step(self, tokens: int) -> None:
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        now = self._read()
        seconds, self._last_read = now - self._last_read, now
        self._taken += 1
        if self._taken > self._warmup:
            self._steps = _last(self._steps + ((tokens, seconds),), self._window)

    def tokens_per_second(self) -> Optional[float]:
        return _rate(self._steps)


# ----------------------------------------------------------------------------------------------------------
# MFU
# ----------------------------------------------------------------------------------------------------------

def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """TODO (lesson 18 §5.3): model FLOPs utilization, the fraction of the device's peak a run achieves.

    ``flops_per_token``: the model's FLOPs per trained token (a training step's: forward and backward);
    ``tokens_per_second``: the measured rate; ``peak_flops_per_second``: the device's peak
    (``course/runs/peak_flops.py::PEAK_FLOPS`` for a known GPU, this machine's measured matmul peak on a CPU).
    Returns a float: 0.36 for 36 %.
    """
    if not peak_flops_per_second > 0:
        raise ValueError(f"peak_flops_per_second must be > 0, got {peak_flops_per_second}")
    return float(flops_per_token) * float(tokens_per_second) / float(peak_flops_per_second)


# ----------------------------------------------------------------------------------------------------------
# Memory: the training state
# ----------------------------------------------------------------------------------------------------------

def _trainable(params: list) -> list:
    return [p for p in params if p.requires_grad]


def _nbytes(params: list) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _step_count_bytes() -> int:
    """AdamW's per-tensor ``step`` is a 0-dim tensor of torch's scalar dtype (float64 only under that default)."""
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    return torch.empty((), dtype=dtype).element_size()


def _optimizer_bytes(trainable: list, optimizer: str) -> int:
    if optimizer == "sgd":
        return 0                                              # no momentum: no state at all
    moments = 2 * _nbytes(trainable)                          # exp_avg, exp_avg_sq: the parameter's shape and dtype
    return moments + len(trainable) * _step_count_bytes()


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """TODO (lesson 18 §5.4): the bytes a training run keeps for ``model`` between steps.

    ``optimizer``: "adamw" (``torch.optim.AdamW``) or "sgd" (``torch.optim.SGD`` without momentum), built over
    the parameters that require grad. Returns {"weights": ..., "gradients": ..., "optimizer": ...}, ints: the
    ``nbytes`` of the parameters, of their ``.grad`` and of the optimizer's state tensors once a step has run
    (lesson 18 §1.4 lists what each holds, with and without autocast).
    Example: a model of one fp32 Linear(10, 10, bias=False), "sgd" -> {"weights": 400, "gradients": 400, ...}.
    """
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    params = list(model.parameters())          # a tied weight is one Parameter: listed once
    trainable = _trainable(params)
    return {"weights": int(_nbytes(params)),
            "gradients": int(_nbytes(trainable)),    # .grad takes the parameter's dtype, autocast or not
            "optimizer": int(_optimizer_bytes(trainable, optimizer))}


# ----------------------------------------------------------------------------------------------------------
# Memory: what autograd saves (CPU default kernels: SDPA's flash attention for CPU)
# ----------------------------------------------------------------------------------------------------------

_FP32 = 4
_INT64 = 8


def _rmsnorm_saved(width: int, groups: int, elem: int) -> int:
    """One token's RMSNorm over ``groups`` vectors of ``width``: x in fp32 (pow), rsqrt's fp32 output (one per
    vector) and the normalized x at the model's dtype (the weight's mul)."""
    return groups * (width * _FP32 + _FP32 + width * elem)


def _attention_saved(config: MiniMindConfig, elem: int) -> int:
    """One token's attention: the shared input of q/k/v, q_norm and k_norm, and what the fused kernel keeps
    (query, the repeated key and value, its output, fp32 logsumexp per head). RoPE saves only its tables."""
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    projections_input = config.hidden_size * elem
    norms = _rmsnorm_saved(head_dim, heads, elem) + _rmsnorm_saved(head_dim, kv_heads, elem)
    fused_kernel = 4 * heads * head_dim * elem + heads * _FP32
    return projections_input + norms + fused_kernel


def _mlp_saved(config: MiniMindConfig, elem: int) -> int:
    """One token's SwiGLU: its input (gate and up), silu's input, both mul operands, down's input."""
    return config.hidden_size * elem + 4 * config.intermediate_size * elem


def _layer_saved(config: MiniMindConfig, elem: int) -> int:
    norms = 2 * _rmsnorm_saved(config.hidden_size, 1, elem)
    return norms + _attention_saved(config, elem) + _mlp_saved(config, elem)


def _head_and_loss_saved(config: MiniMindConfig, batch_size: int, seq_len: int, elem: int) -> int:
    """The final norm and lm_head's input for every position; log_softmax's fp32 output and the int64 targets
    for the T - 1 predicted positions (a copy, except for one sequence where it is a view of the labels);
    nll_loss's 0-dim total weight; the embedding's int64 ids."""
    positions = batch_size * seq_len
    predicted = batch_size * (seq_len - 1)
    final = positions * (_rmsnorm_saved(config.hidden_size, 1, elem) + config.hidden_size * elem)
    targets = (positions if batch_size == 1 else predicted) * _INT64
    return final + predicted * config.vocab_size * _FP32 + targets + _FP32 + positions * _INT64


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """TODO (lesson 18 §5.4): the bytes autograd saves for backward in one training forward.

    ``config``: a dense MiniMind config (a MoE one is refused); the model's parameters are ``dtype``; the forward
    is ``model(input_ids, labels=labels)`` on ``batch_size`` sequences of ``seq_len`` tokens, loss included,
    with torch's default attention kernel. Returns an int within 5 % of what
    ``torch.autograd.graph.saved_tensors_hooks`` records (each storage once; parameters and buffers left out).
    """
    if config.use_moe:
        raise ValueError("config: a MoE config's saved tensors depend on its routing")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    elem = torch.empty((), dtype=dtype).element_size()
    layers = config.num_hidden_layers * batch_size * seq_len * _layer_saved(config, elem)
    return int(layers + _head_and_loss_saved(config, batch_size, seq_len, elem))


# ----------------------------------------------------------------------------------------------------------
# Logging: a running sum on the device
# ----------------------------------------------------------------------------------------------------------

def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32: a bf16 or fp16 running sum rounds every addition."""
    return torch.promote_types(dtype, torch.float32)


def _accumulate(total: Optional[torch.Tensor], loss: torch.Tensor) -> torch.Tensor:
    value = loss.detach()
    if total is None:
        return value.to(_accumulation_dtype(value.dtype))
    return total + value     # type promotion keeps the sum at least float32; no device move, no sync


class RunningLoss:
    """TODO (lesson 18 §5.5): the loss a training loop logs, without a host sync per step.

    ``add(loss)``: after each step, the step's loss (a 0-dim tensor, on the training device); ``pop_mean()``:
    at each log interval, the mean of the losses added since the last ``pop_mean``, as a Python float, after
    which the next interval starts empty. ``add`` must not wait for the device (no ``.item()``, ``float()``,
    ``.cpu()``); ``pop_mean`` copies one number to the host. Example: add(tensor(2.0)), add(tensor(3.0)),
    pop_mean() -> 2.5.
    """

    def __init__(self):
        self._total: Optional[torch.Tensor] = None
        self._count = 0

    def add(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("loss must be a 0-dim tensor")
        self._total = _accumulate(self._total, loss)
        self._count += 1

    def pop_mean(self) -> float:
        if self._count == 0:
            raise ValueError("pop_mean: no loss was added since the last pop_mean")
        total, count = self._total, self._count
        self._total, self._count = None, 0
        return (total / count).item()      # the one host sync


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
