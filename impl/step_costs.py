"""Lesson 18 exercises: where a training step's time and memory go.

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
    """TODO (lesson 18 §5.1): the matmul FLOPs one token costs in a sequence of ``seq_len`` tokens.

    ``config``: a MiniMind config, dense or MoE (``use_moe``). Returns an int: what torch's FlopCounterMode
    counts for the model's forward (``training=True``: its forward and backward) of a batch of such sequences,
    divided by the tokens, attention run as matmuls (lesson 18 §1.1 says what the counter counts and what not).
    Example: flops_per_token(MiniMindConfig(hidden_size=32, num_hidden_layers=1, vocab_size=64), 8) -> 34816
    + the attention term for 8 tokens (lesson 18 §5.1 asks you to predict it).
    """
    raise NotImplementedError("flops_per_token: TODO - see lesson 18 §5.1")


class ThroughputMeter:
    """TODO (lesson 18 §5.2): tokens per second of a training loop, measured right on an asynchronous device.

    Call ``step(tokens)`` after each training step with the tokens it trained on (not padding);
    ``tokens_per_second()`` is the rate over the last ``window`` steps after the first ``warmup_steps``, None
    until a step after the warm-up has been taken. A step's time runs from the previous clock read (the meter's
    creation for the first step). ``clock()`` returns seconds; ``synchronize()`` (None: nothing to wait for, a
    CPU) waits until the device has finished the work queued so far (§5.2 asks when the meter needs it).
    Example: warmup_steps=1, window=2, steps of (100 tokens, 2.0 s), (50, 1.0), (30, 0.5) -> None, 50.0, 53.33...
    """

    def __init__(self, *, warmup_steps: int, window: int, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Optional[Callable[[], None]] = None):
        raise NotImplementedError("ThroughputMeter: TODO - see lesson 18 §5.2")

    def step(self, tokens: int) -> None:
        raise NotImplementedError("ThroughputMeter.step: TODO - see lesson 18 §5.2")

    def tokens_per_second(self) -> Optional[float]:
        raise NotImplementedError("ThroughputMeter.tokens_per_second: TODO - see lesson 18 §5.2")


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """TODO (lesson 18 §5.3): model FLOPs utilization, the fraction of the device's peak a run achieves.

    ``flops_per_token``: the model's FLOPs per trained token (a training step's: forward and backward);
    ``tokens_per_second``: the measured rate; ``peak_flops_per_second``: the device's peak
    (``course/runs/peak_flops.py::PEAK_FLOPS`` for a known GPU, this machine's measured matmul peak on a CPU).
    Returns a float: 0.36 for 36 %.
    """
    raise NotImplementedError("mfu: TODO - see lesson 18 §5.3")


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    """TODO (lesson 18 §5.4): the bytes a training run keeps for ``model`` between steps.

    ``optimizer``: "adamw" (``torch.optim.AdamW``) or "sgd" (``torch.optim.SGD`` without momentum), built over
    the parameters that require grad. Returns {"weights": ..., "gradients": ..., "optimizer": ...}, ints: the
    ``nbytes`` of the parameters, of their ``.grad`` and of the optimizer's state tensors once a step has run
    (lesson 18 §1.4 lists what each holds, with and without autocast).
    Example: a model of one fp32 Linear(10, 10, bias=False), "sgd" -> {"weights": 400, "gradients": 400, ...}.
    """
    raise NotImplementedError("training_state_bytes: TODO - see lesson 18 §5.4")


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """TODO (lesson 18 §5.4): the bytes autograd saves for backward in one training forward.

    ``config``: a dense MiniMind config (a MoE one is refused); the model's parameters are ``dtype``; the forward
    is ``model(input_ids, labels=labels)`` on ``batch_size`` sequences of ``seq_len`` tokens, loss included,
    with torch's default attention kernel. Returns an int within 5 % of what
    ``torch.autograd.graph.saved_tensors_hooks`` records (each storage once; parameters and buffers left out).
    """
    raise NotImplementedError("activation_bytes: TODO - see lesson 18 §5.4")


class RunningLoss:
    """TODO (lesson 18 §5.5): the loss a training loop logs, without a host sync per step.

    ``add(loss)``: after each step, the step's loss (a 0-dim tensor, on the training device); ``pop_mean()``:
    at each log interval, the mean of the losses added since the last ``pop_mean``, as a Python float, after
    which the next interval starts empty. ``add`` must not wait for the device (no ``.item()``, ``float()``,
    ``.cpu()``); ``pop_mean`` copies one number to the host. Example: add(tensor(2.0)), add(tensor(3.0)),
    pop_mean() -> 2.5.
    """

    def __init__(self):
        raise NotImplementedError("RunningLoss: TODO - see lesson 18 §5.5")

    def add(self, loss: torch.Tensor) -> None:
        raise NotImplementedError("RunningLoss.add: TODO - see lesson 18 §5.5")

    def pop_mean(self) -> float:
        raise NotImplementedError("RunningLoss.pop_mean: TODO - see lesson 18 §5.5")


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
