"""Lesson 18 exercises: where a training step's time and memory go.

Read course/lessons/18_time_and_memory.md (Chinese: course/lessons/zh/18_time_and_memory.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 18``. The model is the oracle,
``course/minimind/model.py``; every check compares your numbers with a measurement of it (FlopCounterMode,
saved_tensors_hooks, nbytes, the host-sync counter) or of a fake device (``course/runs/fake_device.py``).

Author C, style ``deque_window``: the meter's window is a collections.deque, the running loss a list of detached
tensors summed at pop; FLOPs read off the model's nn.Linear modules built on the meta device.
"""
from __future__ import annotations

import time
from collections import deque  # noqa: F401 - the last `window` steps
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel  # noqa: F401 - the optional §10.1


def _meta_model(config: MiniMindConfig) -> torch.nn.Module:
    """The real module tree (shapes only, no memory): the widths come from the model, not from my reading of it."""
    from course.minimind import MiniMindForCausalLM
    with torch.device("meta"):
        return MiniMindForCausalLM(config)


def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    """TODO (lesson 18 §5.1): the matmul FLOPs one token costs in a sequence of ``seq_len`` tokens.

    ``config``: a MiniMind config, dense or MoE (``use_moe``). Returns an int: what torch's FlopCounterMode
    counts for the model's forward (``training=True``: its forward and backward) of a batch of such sequences,
    divided by the tokens, attention run as matmuls (lesson 18 §1.1 says what the counter counts and what not).
    Example: flops_per_token(MiniMindConfig(hidden_size=32, num_hidden_layers=1, vocab_size=64), 8) -> 34816
    + the attention term for 8 tokens (lesson 18 §5.1 asks you to predict it).
    """
    model = _meta_model(config)
    shared = 0   # FLOPs of linears every token runs through (lm_head included, tied or not)
    expert = 0   # FLOPs of all experts' linears; a token runs through num_experts_per_tok of num_experts
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            cost = 2 * module.in_features * module.out_features
            if ".experts." in name:
                expert += cost
            else:
                shared += cost
    if expert:
        expert = expert * config.num_experts_per_tok // config.num_experts
    # attention's two products, QK^T and P V, on the math backend: the full T x T square per head
    scores = 0
    for layer in model.model.layers:
        attn = layer.self_attn
        scores += 2 * 2 * attn.num_heads * attn.head_dim * seq_len
    forward = shared + expert + scores
    return int(3 * forward if training else forward)


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
            raise ValueError("window must be at least 1")
        if warmup_steps < 0:
            raise ValueError("warmup_steps must not be negative")
        self.warmup_steps = warmup_steps
        self.window = window
        self.clock = clock
        self.synchronize = synchronize
        self.steps_seen = 0
        self.measured = deque(maxlen=window)   # (tokens, seconds) of the last `window` measured steps
        self.previous = self._now()

    def _now(self) -> float:
        if self.synchronize is not None:
            self.synchronize()
        return self.clock()

    def step(self, tokens: int) -> None:
        if tokens < 0:
            raise ValueError("tokens must not be negative")
        now = self._now()
        elapsed = now - self.previous
        self.previous = now
        self.steps_seen += 1
        if self.steps_seen <= self.warmup_steps:
            return
        self.measured.append((tokens, elapsed))

    def tokens_per_second(self) -> Optional[float]:
        if not self.measured:
            return None
        total_tokens = 0
        total_seconds = 0.0
        for tokens, seconds in self.measured:
            total_tokens += tokens
            total_seconds += seconds
        if total_seconds == 0:
            return float("inf")
        return total_tokens / total_seconds


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """TODO (lesson 18 §5.3): model FLOPs utilization, the fraction of the device's peak a run achieves.

    ``flops_per_token``: the model's FLOPs per trained token (a training step's: forward and backward);
    ``tokens_per_second``: the measured rate; ``peak_flops_per_second``: the device's peak
    (``course/runs/peak_flops.py::PEAK_FLOPS`` for a known GPU, this machine's measured matmul peak on a CPU).
    Returns a float: 0.36 for 36 %.
    """
    if peak_flops_per_second <= 0:
        raise ValueError("peak_flops_per_second must be above 0")
    achieved = flops_per_token * tokens_per_second
    return float(achieved / peak_flops_per_second)


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """TODO (lesson 18 §5.4): the bytes a training run keeps for ``model`` between steps.

    ``optimizer``: "adamw" (``torch.optim.AdamW``) or "sgd" (``torch.optim.SGD`` without momentum), built over
    the parameters that require grad. Returns {"weights": ..., "gradients": ..., "optimizer": ...}, ints: the
    ``nbytes`` of the parameters, of their ``.grad`` and of the optimizer's state tensors once a step has run
    (lesson 18 §1.4 lists what each holds, with and without autocast).
    Example: a model of one fp32 Linear(10, 10, bias=False), "sgd" -> {"weights": 400, "gradients": 400, ...}.
    """
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', not {optimizer!r}")
    # AdamW's step counter: torch.tensor(0.0, dtype=<scalar dtype>) per parameter tensor
    step_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    step_bytes = torch.tensor(0.0, dtype=step_dtype, device="meta").nbytes
    weights = gradients = state = 0
    seen = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        weights += p.nbytes
        if not p.requires_grad:
            continue        # frozen: no .grad, and the optimizer is built without it
        gradients += p.nbytes          # a gradient has its parameter's shape and dtype (autocast included)
        if optimizer == "adamw":
            state += 2 * p.nbytes + step_bytes     # exp_avg, exp_avg_sq, step
    return {"weights": weights, "gradients": gradients, "optimizer": state}


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """TODO (lesson 18 §5.4): the bytes autograd saves for backward in one training forward.

    ``config``: a dense MiniMind config (a MoE one is refused); the model's parameters are ``dtype``; the forward
    is ``model(input_ids, labels=labels)`` on ``batch_size`` sequences of ``seq_len`` tokens, loss included,
    with torch's default attention kernel. Returns an int within 5 % of what
    ``torch.autograd.graph.saved_tensors_hooks`` records (each storage once; parameters and buffers left out).
    """
    if config.use_moe:
        raise ValueError("config: activation_bytes takes a dense config (MoE saves what its routing decides)")
    if batch_size < 1 or seq_len < 1:
        raise ValueError("batch_size and seq_len must be at least 1")
    p = torch.tensor([], dtype=dtype).element_size()
    f32, i64 = 4, 8
    d, inter = config.hidden_size, config.intermediate_size
    heads, kv_heads, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    n = batch_size * seq_len                  # positions
    m = batch_size * (seq_len - 1)            # predicted positions

    # (what, elements per position, bytes per element), op by op through one block
    block = [
        ("input_layernorm: x.float() for pow", d, f32),
        ("input_layernorm: rsqrt", 1, f32),
        ("input_layernorm: normed for weight *", d, p),
        ("q/k/v_proj input (one storage)", d, p),
        ("q_norm: x.float()", heads * hd, f32),
        ("q_norm: rsqrt", heads, f32),
        ("q_norm: normed", heads * hd, p),
        ("k_norm: x.float()", kv_heads * hd, f32),
        ("k_norm: rsqrt", kv_heads, f32),
        ("k_norm: normed", kv_heads * hd, p),
        # apply_rope multiplies by cos/sin buffers that need no grad: it saves only them (buffers, left out)
        ("sdpa (CPU flash): query", heads * hd, p),
        ("sdpa: key repeated for GQA", heads * hd, p),
        ("sdpa: value repeated for GQA", heads * hd, p),
        ("sdpa: output = o_proj input", heads * hd, p),
        ("sdpa: logsumexp", heads, f32),
        ("post_attention_layernorm: x.float()", d, f32),
        ("post_attention_layernorm: rsqrt", 1, f32),
        ("post_attention_layernorm: normed", d, p),
        ("gate/up_proj input", d, p),
        ("silu input (gate output)", inter, p),
        ("silu output", inter, p),
        ("up output", inter, p),
        ("down_proj input", inter, p),
    ]
    head = [
        ("norm: x.float()", d, f32),
        ("norm: rsqrt", 1, f32),
        ("norm: normed", d, p),
        ("lm_head input", d, p),
        ("embedding ids", 1, i64),
    ]
    total = config.num_hidden_layers * n * sum(count * size for _, count, size in block)
    total += n * sum(count * size for _, count, size in head)
    total += m * config.vocab_size * f32                 # log_softmax's output, in fp32 (.float() before the loss)
    total += (n if batch_size == 1 else m) * i64         # the targets labels[:, 1:]: a copy unless one sequence
    total += f32                                         # nll_loss's total_weight
    return int(total)


class RunningLoss:
    """TODO (lesson 18 §5.5): the loss a training loop logs, without a host sync per step.

    ``add(loss)``: after each step, the step's loss (a 0-dim tensor, on the training device); ``pop_mean()``:
    at each log interval, the mean of the losses added since the last ``pop_mean``, as a Python float, after
    which the next interval starts empty. ``add`` must not wait for the device (no ``.item()``, ``float()``,
    ``.cpu()``); ``pop_mean`` copies one number to the host. Example: add(tensor(2.0)), add(tensor(3.0)),
    pop_mean() -> 2.5.
    """

    def __init__(self):
        self.losses: list[torch.Tensor] = []

    def add(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
            raise ValueError("loss must be a 0-dim tensor")
        self.losses.append(loss.detach())    # the value only: the graph is freed

    def pop_mean(self) -> float:
        if not self.losses:
            raise ValueError("pop_mean called with no loss added since the last pop_mean")
        losses, self.losses = self.losses, []
        acc_dtype = torch.promote_types(losses[0].dtype, torch.float32)     # never a bf16 sum
        stacked = torch.stack([loss.to(acc_dtype) for loss in losses])
        return stacked.sum().div(len(losses)).item()


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
