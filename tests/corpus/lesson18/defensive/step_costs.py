"""Lesson 18 exercises by author B, style defensive: every argument validated first, with its own messages.

A wrong type raises TypeError, a wrong value ValueError, each naming the argument.

The arithmetic itself is closed-form: the widths of ``course/minimind/model.py`` for a config, the products
FlopCounterMode counts, and the tensors autograd saves op by op (written down from ``saved_tensors_hooks``
runs of the model, see each function).
"""
from __future__ import annotations

import math
import numbers
import time
from collections import deque  # noqa: F401 - the last `window` steps
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel  # noqa: F401 - the optional §10.1


# ----------------------------------------------------------------------------------------------- validation
def _check_int(name: str, value, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_real(name: str, value, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (int or float), got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    if positive and not value > 0.0:
        raise ValueError(f"{name} must be above 0, got {value}")
    if not positive and value < 0.0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _check_config(config, *, dense_only: bool = False) -> MiniMindConfig:
    if not isinstance(config, MiniMindConfig):
        raise TypeError(f"config must be a MiniMindConfig, got {type(config).__name__}")
    if dense_only and config.use_moe:
        raise ValueError("config: a MoE config is refused (what a MoE layer saves depends on its routing)")
    return config


def _check_seq_len(seq_len, config: MiniMindConfig) -> int:
    seq_len = _check_int("seq_len", seq_len, minimum=1)
    if seq_len > config.max_position_embeddings:
        raise ValueError(f"seq_len {seq_len} is above the config's max_position_embeddings "
                         f"{config.max_position_embeddings}: the model refuses such a sequence")
    return seq_len


def _check_float_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__} {dtype!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype (the model's parameters), got {dtype}")
    return dtype


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ----------------------------------------------------------------------------------------------- 5.1 FLOPs
def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    """The matmul FLOPs one token costs in a sequence of ``seq_len`` tokens (lesson 18 §5.1).

    ``config``: a MiniMind config, dense or MoE (``use_moe``). Returns an int: what torch's FlopCounterMode
    counts for the model's forward (``training=True``: its forward and backward) of a batch of such sequences,
    divided by the tokens, attention run as matmuls (lesson 18 §1.1 says what the counter counts and what not).
    Example: flops_per_token(MiniMindConfig(hidden_size=32, num_hidden_layers=1, vocab_size=64), 8) -> 34816
    + the attention term for 8 tokens (lesson 18 §5.1 asks you to predict it).

    Per token and layer, in multiply-adds: the four projections d*(H*hd) + 2*d*(KV*hd) + (H*hd)*d; attention's
    two batched products over the whole T x T square, 2*T*H*hd (the kv heads are repeated to H before them);
    the SwiGLU's 3*d*I, or for a MoE layer the router's d*E plus k experts' 3*d*I_moe. Once per token the
    lm_head's d*V (the embedding is a lookup). Two FLOPs per multiply-add; a backward runs two products of each
    forward product's size, so a training step is three forwards.
    """
    config = _check_config(config)
    seq_len = _check_seq_len(seq_len, config)
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {type(training).__name__} {training!r}")

    d = config.hidden_size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    projections = d * q_width + 2 * d * kv_width + q_width * d
    attention = 2 * seq_len * config.num_attention_heads * config.head_dim
    if config.use_moe:
        mlp = d * config.num_experts + config.num_experts_per_tok * 3 * d * config.moe_intermediate_size
    else:
        mlp = 3 * d * config.intermediate_size
    macs = config.num_hidden_layers * (projections + attention + mlp) + d * config.vocab_size
    forward = 2 * macs
    return int(3 * forward if training else forward)


# ----------------------------------------------------------------------------------------------- 5.2 meter
class ThroughputMeter:
    """Tokens per second of a training loop, measured right on an asynchronous device (lesson 18 §5.2).

    Call ``step(tokens)`` after each training step with the tokens it trained on (not padding);
    ``tokens_per_second()`` is the rate over the last ``window`` steps after the first ``warmup_steps``, None
    until a step after the warm-up has been taken. A step's time runs from the previous clock read (the meter's
    creation for the first step). ``clock()`` returns seconds; ``synchronize()`` (None: nothing to wait for, a
    CPU) waits until the device has finished the work queued so far: call it before every clock read.
    Example: warmup_steps=1, window=2, steps of (100 tokens, 2.0 s), (50, 1.0), (30, 0.5) -> None, 50.0, 53.33...
    """

    def __init__(self, *, warmup_steps: int, window: int, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Optional[Callable[[], None]] = None):
        self._warmup_steps = _check_int("warmup_steps", warmup_steps, minimum=0)
        self._window = _check_int("window", window, minimum=1)
        if not callable(clock):
            raise TypeError(f"clock must be callable, got {type(clock).__name__}")
        if synchronize is not None and not callable(synchronize):
            raise TypeError(f"synchronize must be callable or None, got {type(synchronize).__name__}")
        self._clock = clock
        self._synchronize = synchronize
        self._steps_taken = 0
        self._tokens: deque[int] = deque(maxlen=self._window)
        self._seconds: deque[float] = deque(maxlen=self._window)
        self._last_read = self._read_clock()   # the first step starts here

    def _read_clock(self) -> float:
        if self._synchronize is not None:
            self._synchronize()                 # the device's queue has run: the clock shows the work
        now = self._clock()
        if isinstance(now, bool) or not isinstance(now, numbers.Real):
            raise TypeError(f"clock() must return seconds as a real number, got {type(now).__name__} {now!r}")
        return float(now)

    def step(self, tokens: int) -> None:
        tokens = _check_int("tokens", tokens, minimum=0)
        now = self._read_clock()
        elapsed = now - self._last_read
        if elapsed < 0.0:
            raise ValueError(f"clock went backwards: {self._last_read} then {now}")
        self._last_read = now
        self._steps_taken += 1
        if self._steps_taken <= self._warmup_steps:
            return
        self._tokens.append(tokens)
        self._seconds.append(elapsed)

    def tokens_per_second(self) -> Optional[float]:
        if not self._tokens:
            return None
        tokens = sum(self._tokens)
        seconds = math.fsum(self._seconds)
        if seconds == 0.0:
            return math.inf if tokens else 0.0
        return float(tokens / seconds)


# ----------------------------------------------------------------------------------------------- 5.3 MFU
def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization, the fraction of the device's peak a run achieves (lesson 18 §5.3).

    ``flops_per_token``: the model's FLOPs per trained token (a training step's: forward and backward);
    ``tokens_per_second``: the measured rate; ``peak_flops_per_second``: the device's peak
    (``course/runs/peak_flops.py::PEAK_FLOPS`` for a known GPU, this machine's measured matmul peak on a CPU).
    Returns a float: 0.36 for 36 %.
    """
    flops = _check_real("flops_per_token", flops_per_token)
    rate = _check_real("tokens_per_second", tokens_per_second)
    peak = _check_real("peak_flops_per_second", peak_flops_per_second, positive=True)
    return float(flops * rate / peak)


# ----------------------------------------------------------------------------------------------- 5.4 memory
_OPTIMIZERS = ("adamw", "sgd")


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """The bytes a training run keeps for ``model`` between steps (lesson 18 §5.4).

    ``optimizer``: "adamw" (``torch.optim.AdamW``) or "sgd" (``torch.optim.SGD`` without momentum), built over
    the parameters that require grad. Returns {"weights": ..., "gradients": ..., "optimizer": ...}, ints: the
    ``nbytes`` of the parameters, of their ``.grad`` and of the optimizer's state tensors once a step has run
    (lesson 18 §1.4 lists what each holds, with and without autocast).
    Example: a model of one fp32 Linear(10, 10, bias=False), "sgd" -> {"weights": 400, "gradients": 400, ...}.

    AdamW keeps ``exp_avg`` and ``exp_avg_sq`` like each trained parameter and a 0-dim ``step`` per tensor
    (float32; float64 when that is torch's default dtype); SGD without momentum keeps nothing.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, str):
        raise TypeError(f"optimizer must be a str, one of {_OPTIMIZERS}, got {type(optimizer).__name__}")
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {optimizer!r}")

    unique = {}
    for param in model.parameters():     # parameters() already yields a tied tensor once; keyed by id anyway
        unique.setdefault(id(param), param)
    params = list(unique.values())
    trained = [p for p in params if p.requires_grad]
    step_bytes = 8 if torch.get_default_dtype() == torch.float64 else 4
    weights = sum(p.numel() * p.element_size() for p in params)
    gradients = sum(p.numel() * p.element_size() for p in trained)
    if optimizer == "adamw":
        state = sum(2 * p.numel() * p.element_size() + step_bytes for p in trained)
    else:
        state = 0
    return {"weights": int(weights), "gradients": int(gradients), "optimizer": int(state)}


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """The bytes autograd saves for backward in one training forward (lesson 18 §5.4).

    ``config``: a dense MiniMind config (a MoE one is refused); the model's parameters are ``dtype``; the forward
    is ``model(input_ids, labels=labels)`` on ``batch_size`` sequences of ``seq_len`` tokens, loss included,
    with torch's default attention kernel. Returns an int within 5 % of what
    ``torch.autograd.graph.saved_tensors_hooks`` records (each storage once; parameters and buffers left out).

    With e the dtype's bytes and w those of the dtype promoted to float32, per token: the ids (8); per RMSNorm
    row of width n, its float32 input, its float32 rsqrt and its normalized output in the dtype (4n + 4 + e*n);
    per layer the input of q/k/v_proj and of gate/up_proj (e*d each), q_norm (H rows of hd) and k_norm (KV rows),
    the fused kernel's q, repeated k and v, and output (shared with o_proj's input), 4*e*d, and its logsumexp
    (w*H), and the SwiGLU's four tensors of width I (e*4I); after the layers the final norm and lm_head's input.
    Per target row the float32 log-probabilities (4V) and the int64 target; 4 bytes of total weight. Dropout
    above 0 moves attention to the math kernel, which keeps the T x T scores (see the code).
    """
    config = _check_config(config, dense_only=True)
    batch_size = _check_int("batch_size", batch_size, minimum=1)
    seq_len = _check_seq_len(seq_len, config)
    dtype = _check_float_dtype(dtype)

    e = _itemsize(dtype)
    w = _itemsize(torch.promote_types(dtype, torch.float32))
    d, inter, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    heads, kv_heads, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim

    def norm(rows: int, width: int) -> int:
        return 4 * rows * width + 4 * rows + e * rows * width

    if config.dropout > 0.0:
        # nn.Dropout's scaled mask after the embedding; SDPA's math kernel (the fused CPU kernel takes no dropout)
        # keeps q, k^T and v, the softmax, its mask and the dropped scores; o_proj's input is a copy
        embedding_extra = e * d
        attention = 3 * w * heads * hd + 3 * w * heads * seq_len + e * d
    else:
        embedding_extra = 0
        attention = 4 * e * heads * hd + w * heads
    layer = (norm(1, d) + e * d                       # input_layernorm, q/k/v_proj's input
             + norm(heads, hd) + norm(kv_heads, hd)   # q_norm, k_norm
             + attention
             + norm(1, d) + e * d                     # post_attention_layernorm, gate/up_proj's input
             + 4 * e * inter)                         # gate out, SiLU out, up out, down_proj's input
    per_token = 8 + embedding_extra + config.num_hidden_layers * layer + norm(1, d) + e * d
    rows = batch_size * (seq_len - 1)                 # the shifted targets
    targets = 8 * rows if batch_size > 1 else 8 * seq_len   # one sequence: a view of the whole labels tensor
    total = per_token * batch_size * seq_len + 4 * vocab * rows + targets + 4
    return int(total)


# ----------------------------------------------------------------------------------------------- 5.5 logging
class RunningLoss:
    """The loss a training loop logs, without a host sync per step (lesson 18 §5.5).

    ``add(loss)``: after each step, the step's loss (a 0-dim tensor, on the training device); ``pop_mean()``:
    at each log interval, the mean of the losses added since the last ``pop_mean``, as a Python float, after
    which the next interval starts empty. ``add`` must not wait for the device (no ``.item()``, ``float()``,
    ``.cpu()``); ``pop_mean`` copies one number to the host. Example: add(tensor(2.0)), add(tensor(3.0)),
    pop_mean() -> 2.5.
    """

    def __init__(self):
        self._sum: Optional[torch.Tensor] = None
        self._count = 0

    def add(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        if loss.dim() != 0:
            raise ValueError(f"loss must be a 0-dim tensor, got shape {tuple(loss.shape)}")
        if loss.dtype == torch.bool or loss.is_complex():
            raise TypeError(f"loss must be a real number tensor, got dtype {loss.dtype}")
        if self._sum is not None and loss.device != self._sum.device:
            raise ValueError(f"loss is on {loss.device}, the losses of this interval on {self._sum.device}: "
                             "moving it would wait for the device")
        accumulate = torch.float64 if loss.dtype == torch.float64 else torch.float32
        value = loss.detach().to(dtype=accumulate)
        if self._sum is None:
            self._sum = value.clone()        # our own storage: the in-place adds below never touch the loss
        else:
            self._sum.add_(value)
        self._count += 1

    def pop_mean(self) -> float:
        if self._count == 0 or self._sum is None:
            raise ValueError("pop_mean: nothing was added since the last pop_mean")
        total = self._sum.item()             # the one host sync
        count = self._count
        self._sum, self._count = None, 0
        return float(total / count)


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
