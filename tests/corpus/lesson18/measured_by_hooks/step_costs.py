"""Lesson 18 exercises by author B, style measured_by_hooks: counts read off the model's own modules and tensors.

A module walk, a fake-tensor forward under saved_tensors_hooks and a real optimizer stepped on meta shadows
replace closed-form formulas:

* ``flops_per_token`` builds the model on the meta device (no memory) and walks its modules: every
  ``nn.Linear`` is a product of its own fan-in and fan-out, every ``Attention`` two products over the sequence,
  each scaled by the share of tokens that reach the module (a MoE expert: k of E).
* ``activation_bytes`` runs the real forward on fake CPU tensors (``FakeTensorMode``: shapes, dtypes and the CPU
  kernels' choices, no data) and records what ``saved_tensors_hooks`` packs, each storage once.
* ``training_state_bytes`` gives each trained parameter a meta-device shadow with a gradient, steps a real
  ``torch.optim`` optimizer over the shadows and sums the state it created.
"""
from __future__ import annotations

import time
from collections import deque  # noqa: F401 - the last `window` steps
from fractions import Fraction
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel  # noqa: F401 - the optional §10.1
from course.minimind import MiniMindForCausalLM
from course.minimind.model import Attention, MOEFeedForward


def _meta_model(config: MiniMindConfig) -> MiniMindForCausalLM:
    """The model's structure, every tensor on the meta device: widths without memory."""
    with torch.device("meta"):
        return MiniMindForCausalLM(config)


def _token_shares(model: torch.nn.Module) -> dict[int, Fraction]:
    """The fraction of the batch's tokens each module sees: 1, except inside a MoE layer's experts, where each
    token visits ``num_experts_per_tok`` of ``num_experts`` (topk picks distinct experts)."""
    shares: dict[int, Fraction] = {}
    for module in model.modules():
        if isinstance(module, MOEFeedForward):
            share = Fraction(module.config.num_experts_per_tok, len(module.experts))
            for expert in module.experts:
                for inner in expert.modules():
                    shares[id(inner)] = share
    return shares


def _input_needs_grad(model: torch.nn.Module) -> bool:
    """Whether the hidden states carry a gradient: they do as soon as the embedding table trains (every
    activation after it depends on it), so each product's backward computes its input's gradient."""
    return any(p.requires_grad for p in model.parameters())


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
    model = _meta_model(config)
    shares = _token_shares(model)
    input_grad = _input_needs_grad(model)
    forward = Fraction(0)
    backward = Fraction(0)
    for module in model.modules():
        share = shares.get(id(module), Fraction(1))
        if isinstance(module, torch.nn.Linear):
            # x @ W^T for one token: fan_in * fan_out multiply-adds; backward: the same product for the
            # input's gradient and for the weight's
            product = 2 * module.in_features * module.out_features * share
            forward += product
            backward += product * (int(input_grad) + int(module.weight.requires_grad))
        elif isinstance(module, Attention):
            # q k^T and p v, batched over the query heads (kv heads are repeated first), each query token
            # against all seq_len keys: the math kernel runs the full square; the mask only edits the scores.
            # Backward: two products per product (q, k, v all carry a gradient).
            product = 2 * seq_len * module.num_heads * module.head_dim * share
            forward += 2 * product
            backward += 2 * 2 * product
        # nn.Embedding is a row lookup, RMSNorm / RoPE / SiLU / softmax / loss are elementwise: no matmul
    total = forward + backward if training else forward
    if total.denominator != 1:
        raise ValueError("the experts of this config differ in width: their FLOPs depend on the routing")
    return int(total.numerator)


class ThroughputMeter:
    """Tokens per second of a training loop, measured right on an asynchronous device (lesson 18 §5.2).

    Call ``step(tokens)`` after each training step with the tokens it trained on (not padding);
    ``tokens_per_second()`` is the rate over the last ``window`` steps after the first ``warmup_steps``, None
    until a step after the warm-up has been taken. A step's time runs from the previous clock read (the meter's
    creation for the first step). ``clock()`` returns seconds; ``synchronize()`` (None: nothing to wait for, a
    CPU) waits until the device has finished the work queued so far: call it before every clock read.
    Example: warmup_steps=1, window=2, steps of (100 tokens, 2.0 s), (50, 1.0), (30, 0.5) -> None, 50.0, 53.33...

    Kept as clock reads: the window's seconds are its last read minus the read that opened its first step.
    """

    def __init__(self, *, warmup_steps: int, window: int, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Optional[Callable[[], None]] = None):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._clock = clock
        self._synchronize = synchronize
        self._warmup_steps = warmup_steps
        self._steps = 0
        self._reads: deque[float] = deque(maxlen=window + 1)   # the read before each measured step, and the last
        self._tokens: deque[int] = deque(maxlen=window)
        self._reads.append(self._now())

    def _now(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return float(self._clock())

    def step(self, tokens: int) -> None:
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        now = self._now()
        self._steps += 1
        if self._steps <= self._warmup_steps:
            self._reads.clear()            # a warm-up step: the measured ones start at its end
            self._reads.append(now)
            return
        self._reads.append(now)
        self._tokens.append(int(tokens))

    def tokens_per_second(self) -> Optional[float]:
        if not self._tokens:
            return None
        seconds = self._reads[-1] - self._reads[0]
        tokens = sum(self._tokens)
        if seconds <= 0.0:
            return float("inf") if tokens else 0.0
        return float(tokens) / seconds


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization, the fraction of the device's peak a run achieves (lesson 18 §5.3).

    ``flops_per_token``: the model's FLOPs per trained token (a training step's: forward and backward);
    ``tokens_per_second``: the measured rate; ``peak_flops_per_second``: the device's peak
    (``course/runs/peak_flops.py::PEAK_FLOPS`` for a known GPU, this machine's measured matmul peak on a CPU).
    Returns a float: 0.36 for 36 %.
    """
    if not peak_flops_per_second > 0:
        raise ValueError(f"peak_flops_per_second must be above 0, got {peak_flops_per_second}")
    achieved = float(flops_per_token) * float(tokens_per_second)
    return achieved / float(peak_flops_per_second)


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """The bytes a training run keeps for ``model`` between steps (lesson 18 §5.4).

    ``optimizer``: "adamw" (``torch.optim.AdamW``) or "sgd" (``torch.optim.SGD`` without momentum), built over
    the parameters that require grad. Returns {"weights": ..., "gradients": ..., "optimizer": ...}, ints: the
    ``nbytes`` of the parameters, of their ``.grad`` and of the optimizer's state tensors once a step has run
    (lesson 18 §1.4 lists what each holds, with and without autocast).
    Example: a model of one fp32 Linear(10, 10, bias=False), "sgd" -> {"weights": 400, "gradients": 400, ...}.
    """
    builders = {"adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
                "sgd": lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.0)}
    if optimizer not in builders:
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    params = list(model.parameters())          # a tied weight is one tensor: listed once
    weights = sum(p.nbytes for p in params)
    # Shadows on the meta device, one per trained parameter, with the gradient backward would give it (the
    # parameter's shape and dtype, autocast or not); the model itself is not touched.
    shadows = []
    for param in params:
        if param.requires_grad:
            shadow = torch.empty_like(param, device="meta").requires_grad_(True)
            shadow.grad = torch.empty_like(shadow)
            shadows.append(shadow)
    gradients = sum(s.grad.nbytes for s in shadows)
    state_bytes = 0
    if shadows:
        opt = builders[optimizer](shadows)
        with torch.no_grad():
            opt.step()
        state_bytes = sum(t.nbytes for state in opt.state.values() for t in state.values()
                          if isinstance(t, torch.Tensor))
    return {"weights": int(weights), "gradients": int(gradients), "optimizer": int(state_bytes)}


def _with_dtype(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model.to(dtype)`` for fake tensors (``Module.to`` swaps them, which fake tensors refuse): each floating
    parameter and buffer replaced by a converted one, a tied tensor converted once and still shared."""
    if dtype == torch.float32:
        return model
    converted: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in converted:
                data = param.detach().to(dtype) if param.is_floating_point() else param.detach()
                converted[id(param)] = torch.nn.Parameter(data, requires_grad=param.requires_grad)
            module._parameters[name] = converted[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in converted:
                converted[id(buffer)] = buffer.to(dtype) if buffer.is_floating_point() else buffer
            module._buffers[name] = converted[id(buffer)]
    return model


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """The bytes autograd saves for backward in one training forward (lesson 18 §5.4).

    ``config``: a dense MiniMind config (a MoE one is refused); the model's parameters are ``dtype``; the forward
    is ``model(input_ids, labels=labels)`` on ``batch_size`` sequences of ``seq_len`` tokens, loss included,
    with torch's default attention kernel. Returns an int within 5 % of what
    ``torch.autograd.graph.saved_tensors_hooks`` records (each storage once; parameters and buffers left out).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    if config.use_moe:
        raise ValueError("config: use_moe is refused, a MoE layer saves what its routing decides")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    saved: dict[int, int] = {}
    with FakeTensorMode():
        model = _with_dtype(MiniMindForCausalLM(config), dtype).train()
        input_ids = torch.zeros((batch_size, seq_len), dtype=torch.long)
        labels = input_ids.clone()            # a tensor of its own, as a dataset gives it
        owned = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage._cdata not in owned:   # a view counts its whole storage, a storage counts once
                saved[storage._cdata] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = model(input_ids, labels=labels)
        del output
    return int(sum(saved.values()))


class RunningLoss:
    """The loss a training loop logs, without a host sync per step (lesson 18 §5.5).

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
        if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
            raise ValueError("loss must be a 0-dim tensor")
        # detached (no graph kept alive), widened to float32 at least (a bf16 sum stalls), on the loss's device
        value = loss.detach().to(torch.promote_types(loss.dtype, torch.float32))
        self._total = value if self._total is None else torch.add(self._total, value)
        self._count += 1

    def pop_mean(self) -> float:
        if self._count == 0:
            raise ValueError("pop_mean: no loss added since the last pop_mean")
        mean = self._total.div(self._count)
        self._total, self._count = None, 0
        return mean.item()                    # the one host sync


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
