"""Lesson 18 exercises: where a training step's time and memory go.

Read course/lessons/18_time_and_memory.md (Chinese: course/lessons/zh/18_time_and_memory.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 18``. The model is the oracle,
``course/minimind/model.py``; every check compares your numbers with a measurement of it (FlopCounterMode,
saved_tensors_hooks, nbytes, the host-sync counter) or of a fake device (``course/runs/fake_device.py``).

Author C, style ``nanogpt_style``: terse, the way nanoGPT's estimate_mfu is written, one function per idea.
"""
from __future__ import annotations

import time
from collections import deque  # noqa: F401 - the last `window` steps
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel  # noqa: F401 - the optional §10.1


def num_matmul_params(cfg: MiniMindConfig) -> int:
    """params a token multiplies: no embedding gather, but lm_head always (tied or not); moe: router + k experts"""
    d, L = cfg.hidden_size, cfg.num_hidden_layers
    attn = 2 * d * cfg.num_attention_heads * cfg.head_dim + 2 * d * cfg.num_key_value_heads * cfg.head_dim
    mlp = (d * cfg.num_experts + cfg.num_experts_per_tok * 3 * d * cfg.moe_intermediate_size) if cfg.use_moe \
        else 3 * d * cfg.intermediate_size
    return L * (attn + mlp) + d * cfg.vocab_size


def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    """TODO (lesson 18 §5.1): the matmul FLOPs one token costs in a sequence of ``seq_len`` tokens.

    ``config``: a MiniMind config, dense or MoE (``use_moe``). Returns an int: what torch's FlopCounterMode
    counts for the model's forward (``training=True``: its forward and backward) of a batch of such sequences,
    divided by the tokens, attention run as matmuls (lesson 18 §1.1 says what the counter counts and what not).
    Example: flops_per_token(MiniMindConfig(hidden_size=32, num_hidden_layers=1, vocab_size=64), 8) -> 34816
    + the attention term for 8 tokens (lesson 18 §5.1 asks you to predict it).
    """
    # like estimate_mfu: 6N + 12LHQT for fwd+bwd, i.e. 2N + 4LHQT for the forward (full T x T, mask or not)
    N = num_matmul_params(config)
    L, H, Q, T = config.num_hidden_layers, config.num_attention_heads, config.head_dim, seq_len
    fwd = 2 * N + 4 * L * H * Q * T
    return 3 * fwd if training else fwd


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
        assert window >= 1 and warmup_steps >= 0
        self.warmup_steps, self.clock, self.sync = warmup_steps, clock, synchronize or (lambda: None)
        self.iter_num = 0
        self.toks = deque(maxlen=window)     # tokens of the last `window` measured iters
        self.t = deque(maxlen=window + 1)    # clock reads bounding them
        self.t.append(self.now())

    def now(self) -> float:
        self.sync()  # else we'd time the kernel launches, not the kernels
        return self.clock()

    def step(self, tokens: int) -> None:
        self.t.append(self.now())
        self.iter_num += 1
        if self.iter_num > self.warmup_steps:
            self.toks.append(tokens)

    def tokens_per_second(self) -> Optional[float]:
        if not self.toks:
            return None
        dt = self.t[-1] - self.t[-1 - len(self.toks)]
        return sum(self.toks) / dt if dt > 0 else float("inf")


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """TODO (lesson 18 §5.3): model FLOPs utilization, the fraction of the device's peak a run achieves.

    ``flops_per_token``: the model's FLOPs per trained token (a training step's: forward and backward);
    ``tokens_per_second``: the measured rate; ``peak_flops_per_second``: the device's peak
    (``course/runs/peak_flops.py::PEAK_FLOPS`` for a known GPU, this machine's measured matmul peak on a CPU).
    Returns a float: 0.36 for 36 %.
    """
    assert peak_flops_per_second > 0
    flops_achieved = flops_per_token * tokens_per_second
    return float(flops_achieved / peak_flops_per_second)


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """TODO (lesson 18 §5.4): the bytes a training run keeps for ``model`` between steps.

    ``optimizer``: "adamw" (``torch.optim.AdamW``) or "sgd" (``torch.optim.SGD`` without momentum), built over
    the parameters that require grad. Returns {"weights": ..., "gradients": ..., "optimizer": ...}, ints: the
    ``nbytes`` of the parameters, of their ``.grad`` and of the optimizer's state tensors once a step has run
    (lesson 18 §1.4 lists what each holds, with and without autocast).
    Example: a model of one fp32 Linear(10, 10, bias=False), "sgd" -> {"weights": 400, "gradients": 400, ...}.
    """
    assert optimizer in ("adamw", "sgd"), optimizer
    params = list(model.parameters())  # unique: a tied weight once
    trained = [p for p in params if p.requires_grad]
    nbytes = lambda ps: sum(p.numel() * p.element_size() for p in ps)
    # adamw: exp_avg + exp_avg_sq like the param, plus a 0-dim fp32 `step` per param tensor; sgd (no momentum): none
    opt = 2 * nbytes(trained) + 4 * len(trained) if optimizer == "adamw" else 0
    return {"weights": nbytes(params), "gradients": nbytes(trained), "optimizer": opt}


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """TODO (lesson 18 §5.4): the bytes autograd saves for backward in one training forward.

    ``config``: a dense MiniMind config (a MoE one is refused); the model's parameters are ``dtype``; the forward
    is ``model(input_ids, labels=labels)`` on ``batch_size`` sequences of ``seq_len`` tokens, loss included,
    with torch's default attention kernel. Returns an int within 5 % of what
    ``torch.autograd.graph.saved_tensors_hooks`` records (each storage once; parameters and buffers left out).
    """
    assert not config.use_moe, "moe: saved tensors depend on the routing"
    B, T, L = batch_size, seq_len, config.num_hidden_layers
    d, I, V = config.hidden_size, config.intermediate_size, config.vocab_size
    H, Hkv, Q = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    e = torch.finfo(dtype).bits // 8
    norm = lambda w, n: n * (4 * w + 4 + e * w)  # rmsnorm of n vectors of width w: fp32 x, fp32 rsqrt, normed x
    attn = e * d + norm(Q, H) + norm(Q, Hkv) + 4 * e * H * Q + 4 * H  # qkv input, q/k norms, sdpa q,k,v,out + lse
    mlp = e * d + 4 * e * I  # gate/up input, silu in, silu out, up out, down input
    block = 2 * norm(d, 1) + attn + mlp
    per_tok = L * block + norm(d, 1) + e * d + 8  # + final norm, lm_head input, int64 ids
    loss = B * (T - 1) * 4 * V + (B * T if B == 1 else B * (T - 1)) * 8 + 4  # fp32 log_softmax, targets, total_weight
    return B * T * per_tok + loss


class RunningLoss:
    """TODO (lesson 18 §5.5): the loss a training loop logs, without a host sync per step.

    ``add(loss)``: after each step, the step's loss (a 0-dim tensor, on the training device); ``pop_mean()``:
    at each log interval, the mean of the losses added since the last ``pop_mean``, as a Python float, after
    which the next interval starts empty. ``add`` must not wait for the device (no ``.item()``, ``float()``,
    ``.cpu()``); ``pop_mean`` copies one number to the host. Example: add(tensor(2.0)), add(tensor(3.0)),
    pop_mean() -> 2.5.
    """

    def __init__(self):
        self.sum, self.n = None, 0

    def add(self, loss: torch.Tensor) -> None:
        l = loss.detach().float()  # no graph kept alive, and no bf16 running sum
        self.sum = l if self.sum is None else self.sum + l
        self.n += 1

    def pop_mean(self) -> float:
        assert self.n > 0, "nothing to pop"
        mean = (self.sum / self.n).item()  # the one host sync per log line
        self.sum, self.n = None, 0
        return mean


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
