"""Lesson 18 exercises by author B, style class_based: helper classes keep the FLOP/byte ledgers and the window.

The helpers: ``_Widths`` (the widths a config gives each layer), ``_MatmulLedger`` (multiply-adds of one token,
weight products and attention products), ``_SavedLedger`` (the bytes autograd keeps, per token, per row of
the loss and per batch), ``_Stopwatch`` (synchronize, then read the clock) and ``_RateWindow`` (the last W
measured steps). The exercise functions are thin wrappers around them.
"""
from __future__ import annotations

import time
from collections import deque  # noqa: F401 - the last `window` steps
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel  # noqa: F401 - the optional §10.1


@dataclass(frozen=True)
class _Widths:
    """The widths of a MiniMind built from a config (after ``__post_init__`` filled the defaults)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    use_moe: bool
    experts: int
    experts_per_token: int
    expert_width: int
    dropout: float

    @classmethod
    def of(cls, config: MiniMindConfig) -> "_Widths":
        return cls(hidden=config.hidden_size, layers=config.num_hidden_layers,
                   heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                   head_dim=config.head_dim, intermediate=config.intermediate_size, vocab=config.vocab_size,
                   use_moe=bool(config.use_moe), experts=config.num_experts,
                   experts_per_token=config.num_experts_per_tok, expert_width=config.moe_intermediate_size,
                   dropout=float(config.dropout))

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


class _MatmulLedger:
    """Multiply-adds one token pays, in the products FlopCounterMode sees (mm and bmm).

    A forward product of m x k by k x n is m*k*n multiply-adds, 2*m*k*n FLOPs; its backward is two products of
    the same size (the gradient of each operand, every operand here needs one). So a training step is three
    times the forward, term by term.
    """

    def __init__(self) -> None:
        self.macs = 0

    def linear(self, fan_in: int, fan_out: int, uses: int = 1) -> None:
        """A weight of fan_in x fan_out applied ``uses`` times to each token."""
        self.macs += fan_in * fan_out * uses

    def attention(self, seq_len: int, heads: int, head_dim: int) -> None:
        """Q K^T and P V for one query token against all ``seq_len`` keys (the math kernel runs the whole square;
        the causal mask is applied to the scores, it removes no product)."""
        self.macs += 2 * heads * seq_len * head_dim

    def flops(self, training: bool) -> int:
        passes = 3 if training else 1
        return 2 * self.macs * passes


def _matmul_ledger(widths: _Widths, seq_len: int) -> _MatmulLedger:
    ledger = _MatmulLedger()
    for _ in range(widths.layers):
        ledger.linear(widths.hidden, widths.q_width)        # q_proj
        ledger.linear(widths.hidden, widths.kv_width)       # k_proj
        ledger.linear(widths.hidden, widths.kv_width)       # v_proj
        ledger.linear(widths.q_width, widths.hidden)        # o_proj
        ledger.attention(seq_len, widths.heads, widths.head_dim)   # kv heads repeated to all query heads
        if widths.use_moe:
            ledger.linear(widths.hidden, widths.experts)    # the router
            for _ in range(3):                              # gate, up, down of each chosen expert
                ledger.linear(widths.hidden, widths.expert_width, uses=widths.experts_per_token)
        else:
            for _ in range(3):
                ledger.linear(widths.hidden, widths.intermediate)
    ledger.linear(widths.hidden, widths.vocab)              # lm_head (tied or not, it runs once per token)
    return ledger


def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    """The matmul FLOPs one token costs in a sequence of ``seq_len`` tokens (lesson 18 §5.1).

    ``config``: a MiniMind config, dense or MoE (``use_moe``). Returns an int: what torch's FlopCounterMode
    counts for the model's forward (``training=True``: its forward and backward) of a batch of such sequences,
    divided by the tokens, attention run as matmuls (lesson 18 §1.1 says what the counter counts and what not).
    Example: flops_per_token(MiniMindConfig(hidden_size=32, num_hidden_layers=1, vocab_size=64), 8) -> 34816
    + the attention term for 8 tokens (lesson 18 §5.1 asks you to predict it).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    return int(_matmul_ledger(_Widths.of(config), int(seq_len)).flops(bool(training)))


class _Stopwatch:
    """Reads the clock only after the device has run what was queued; ``lap`` is the time since the last read."""

    def __init__(self, clock: Callable[[], float], synchronize: Optional[Callable[[], None]]):
        self._clock = clock
        self._synchronize = synchronize
        self._last = self._read()

    def _read(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return float(self._clock())

    def lap(self) -> float:
        now = self._read()
        seconds, self._last = now - self._last, now
        return seconds


class _RateWindow:
    """The last ``size`` measured steps; the rate is their tokens over their seconds (not a mean of rates)."""

    def __init__(self, size: int):
        self._steps: deque[tuple[int, float]] = deque(maxlen=size)

    def add(self, tokens: int, seconds: float) -> None:
        self._steps.append((tokens, seconds))

    def rate(self) -> Optional[float]:
        if not self._steps:
            return None
        tokens = sum(t for t, _ in self._steps)
        seconds = sum(s for _, s in self._steps)
        if seconds <= 0.0:
            return float("inf") if tokens else 0.0
        return float(tokens / seconds)


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
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._warmup_left = int(warmup_steps)
        self._window = _RateWindow(int(window))
        self._stopwatch = _Stopwatch(clock, synchronize)

    def step(self, tokens: int) -> None:
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        seconds = self._stopwatch.lap()
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return
        self._window.add(int(tokens), seconds)

    def tokens_per_second(self) -> Optional[float]:
        return self._window.rate()


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization, the fraction of the device's peak a run achieves (lesson 18 §5.3).

    ``flops_per_token``: the model's FLOPs per trained token (a training step's: forward and backward);
    ``tokens_per_second``: the measured rate; ``peak_flops_per_second``: the device's peak
    (``course/runs/peak_flops.py::PEAK_FLOPS`` for a known GPU, this machine's measured matmul peak on a CPU).
    Returns a float: 0.36 for 36 %.
    """
    if not peak_flops_per_second > 0:
        raise ValueError(f"peak_flops_per_second must be above 0, got {peak_flops_per_second}")
    return float(flops_per_token) * float(tokens_per_second) / float(peak_flops_per_second)


@dataclass
class _StateBytes:
    """The three entries of a training state, summed tensor by tensor."""

    weights: int = 0
    gradients: int = 0
    optimizer: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"weights": int(self.weights), "gradients": int(self.gradients), "optimizer": int(self.optimizer)}


class _OptimizerState:
    """What one optimizer keeps per trainable parameter tensor once it has stepped."""

    # AdamW: exp_avg and exp_avg_sq, each like the parameter, and a 0-dim float ``step`` tensor
    _MOMENTS = {"adamw": 2, "sgd": 0}
    _STEP_COUNTER = {"adamw": True, "sgd": False}

    def __init__(self, name: str):
        if name not in self._MOMENTS:
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {name!r}")
        self.name = name

    def bytes_for(self, param: torch.Tensor) -> int:
        total = self._MOMENTS[self.name] * param.nbytes
        if self._STEP_COUNTER[self.name]:
            # torch.optim keeps ``step`` as a float32 scalar (float64 when that is the default dtype)
            step_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            total += torch.empty((), dtype=step_dtype).element_size()
        return total


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """The bytes a training run keeps for ``model`` between steps (lesson 18 §5.4).

    ``optimizer``: "adamw" (``torch.optim.AdamW``) or "sgd" (``torch.optim.SGD`` without momentum), built over
    the parameters that require grad. Returns {"weights": ..., "gradients": ..., "optimizer": ...}, ints: the
    ``nbytes`` of the parameters, of their ``.grad`` and of the optimizer's state tensors once a step has run
    (lesson 18 §1.4 lists what each holds, with and without autocast).
    Example: a model of one fp32 Linear(10, 10, bias=False), "sgd" -> {"weights": 400, "gradients": 400, ...}.
    """
    state = _OptimizerState(optimizer)
    totals = _StateBytes()
    for param in model.parameters():          # each tensor once: a tied weight is one parameter
        totals.weights += param.nbytes
        if param.requires_grad:
            totals.gradients += param.nbytes  # .grad has the parameter's dtype, autocast or not
            totals.optimizer += state.bytes_for(param)
    return totals.as_dict()


class _SavedLedger:
    """Bytes autograd keeps for backward, by how they scale: per token, per loss row, once per batch."""

    def __init__(self) -> None:
        self.per_token = 0
        self.per_loss_row = 0
        self.once = 0

    def token(self, elements: int, itemsize: int) -> None:
        self.per_token += elements * itemsize

    def loss_row(self, elements: int, itemsize: int) -> None:
        self.per_loss_row += elements * itemsize

    def single(self, nbytes: int) -> None:
        self.once += nbytes

    def total(self, tokens: int, loss_rows: int) -> int:
        return self.per_token * tokens + self.per_loss_row * loss_rows + self.once


_FP32 = 4
_INDEX = 8   # int64 ids and targets


def _rms_norm(ledger: _SavedLedger, rows: int, width: int, itemsize: int) -> None:
    """RMSNorm of ``rows`` rows of ``width`` per token: the fp32 input (``x.float()``, x itself in fp32), the
    fp32 rsqrt per row, and the normalized tensor in the model's dtype (which the weight multiplies)."""
    ledger.token(rows * width, _FP32)
    ledger.token(rows, _FP32)
    ledger.token(rows * width, itemsize)


def _saved_ledger(widths: _Widths, batch_size: int, seq_len: int, itemsize: int, wide: int) -> _SavedLedger:
    """``itemsize``: the model dtype's bytes; ``wide``: those of that dtype promoted to at least float32, what
    the attention kernels keep their statistics in (and, on a CPU, the math kernel its operands)."""
    ledger = _SavedLedger()
    d = widths.hidden
    dropout = widths.dropout > 0.0
    ledger.token(1, _INDEX)                                     # the embedding keeps the ids
    if dropout:
        ledger.token(d, itemsize)                               # the embedding dropout's scaled mask
    for _ in range(widths.layers):
        _rms_norm(ledger, 1, d, itemsize)                       # input_layernorm
        ledger.token(d, itemsize)                               # its output times the weight: q/k/v_proj's input
        _rms_norm(ledger, widths.heads, widths.head_dim, itemsize)      # q_norm
        _rms_norm(ledger, widths.kv_heads, widths.head_dim, itemsize)   # k_norm
        if not dropout:
            # the fused CPU kernel: q, the repeated k and v, the output (o_proj's input is a view of it) and
            # one logsumexp per head (float32 for a reduced-precision model)
            ledger.token(4 * widths.q_width, itemsize)
            ledger.token(widths.heads, wide)
        else:
            # dropout leaves the fused kernel: the math kernel keeps q, k, v (at least float32 on a CPU), the
            # softmax, its dropout mask and the dropped scores: T per head and token
            ledger.token(3 * widths.q_width, wide)
            ledger.token(3 * widths.heads * seq_len, wide)
            ledger.token(widths.q_width, itemsize)              # o_proj's input, a copy
        _rms_norm(ledger, 1, d, itemsize)                       # post_attention_layernorm
        ledger.token(d, itemsize)                               # gate/up_proj's input
        ledger.token(4 * widths.intermediate, itemsize)         # gate out (SiLU), SiLU out, up out, down's input
    _rms_norm(ledger, 1, d, itemsize)                           # the final norm
    ledger.token(d, itemsize)                                   # lm_head's input
    ledger.loss_row(widths.vocab, _FP32)                        # log_softmax of the fp32 logits
    if batch_size > 1:
        ledger.loss_row(1, _INDEX)                              # the shifted targets, a copy
    else:
        ledger.single(seq_len * _INDEX)                         # ... a view of the labels' whole storage
    ledger.single(_FP32)                                        # cross_entropy's total weight
    return ledger


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """The bytes autograd saves for backward in one training forward (lesson 18 §5.4).

    ``config``: a dense MiniMind config (a MoE one is refused); the model's parameters are ``dtype``; the forward
    is ``model(input_ids, labels=labels)`` on ``batch_size`` sequences of ``seq_len`` tokens, loss included,
    with torch's default attention kernel. Returns an int within 5 % of what
    ``torch.autograd.graph.saved_tensors_hooks`` records (each storage once; parameters and buffers left out).
    """
    if config.use_moe:
        raise ValueError("config: a MoE layer saves what its routing decides; activation_bytes takes dense configs")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    wide = torch.empty((), dtype=torch.promote_types(dtype, torch.float32)).element_size()
    ledger = _saved_ledger(_Widths.of(config), batch_size, seq_len, itemsize, wide)
    return int(ledger.total(tokens=batch_size * seq_len, loss_rows=batch_size * (seq_len - 1)))


class RunningLoss:
    """The loss a training loop logs, without a host sync per step (lesson 18 §5.5).

    ``add(loss)``: after each step, the step's loss (a 0-dim tensor, on the training device); ``pop_mean()``:
    at each log interval, the mean of the losses added since the last ``pop_mean``, as a Python float, after
    which the next interval starts empty. ``add`` must not wait for the device (no ``.item()``, ``float()``,
    ``.cpu()``); ``pop_mean`` copies one number to the host. Example: add(tensor(2.0)), add(tensor(3.0)),
    pop_mean() -> 2.5.
    """

    def __init__(self):
        self._total: Optional[torch.Tensor] = None   # lives on the losses' device, at least float32
        self._count = 0

    def add(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("loss must be a 0-dim tensor")
        value = loss.detach()
        value = value.to(dtype=torch.promote_types(value.dtype, torch.float32))
        # out of place: never writes into the caller's tensor (a float32 loss's detach() shares its storage)
        self._total = value if self._total is None else self._total + value
        self._count += 1

    def pop_mean(self) -> float:
        if self._total is None:
            raise ValueError("pop_mean: no loss was added since the last pop_mean")
        mean = (self._total / self._count).item()    # the one host sync
        self._total, self._count = None, 0
        return float(mean)


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
