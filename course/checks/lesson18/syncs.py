"""Lesson 18 checks of ``RunningLoss``: logging the loss without a host sync per step.

The host syncs are counted by the course's counter (``course/checks/host_syncs.py``): the losses are made before
the counted block, as a training step's loss is (a tensor that may live on the device), so converting one to a
Python number counts. Whether ``add`` lets go of the autograd graph is seen by a weak reference to a tensor the
graph saved. Means are compared with rtol 1e-6 (a float32 sum of a few values).
"""
from __future__ import annotations

import gc
import weakref

import torch

from ..framework import check, expect_close, expect_raises, expect_type, fail
from ..host_syncs import count_host_syncs
from ..lesson16.checks import rule

LOSSES = (2.5, 2.25, 3.0, 1.75, 2.0, 2.125)


def losses(values, dtype=torch.float32) -> list[torch.Tensor]:
    return [torch.tensor(value, dtype=dtype) for value in values]


@check("RunningLoss", objective="sync_free_logging")
def add_never_syncs_and_pop_mean_syncs_once(impl):
    """Six add() calls convert no tensor to Python (0 host syncs); pop_mean() converts once (1 host sync)."""
    running, batch = impl.RunningLoss(), losses(LOSSES)
    for loss in batch:
        calls = []
        with count_host_syncs(calls):
            running.add(loss)
        if calls:
            fail("RunningLoss.add(loss): host syncs", calls, [], "hint: the rule: add keeps the running sum on the "
                 "loss's device: no .item(), float() or .cpu() (each waits for the device), no host sync")
    calls = []
    with count_host_syncs(calls):
        running.pop_mean()
    if len(calls) != 1:
        fail("RunningLoss.pop_mean(): host syncs", calls, ["item"], "hint: the rule: pop_mean makes one host sync: "
             "the mean computed on the device, then copied to the host once")


@check("RunningLoss", objective="sync_free_logging")
def pop_mean_is_the_mean_since_the_last_pop(impl):
    """pop_mean() is the mean of the losses added since the previous pop_mean (intervals of 4, 1 and 3 losses)."""
    running = impl.RunningLoss()
    start = 0
    for interval in (4, 1, 3):
        values = [LOSSES[(start + i) % len(LOSSES)] for i in range(interval)]
        for loss in losses(values):
            running.add(loss)
        actual = running.pop_mean()
        if not abs(actual - sum(values) / interval) <= 1e-6 * sum(values) / interval:
            fail(f"RunningLoss: add({values}) after a pop_mean(), then pop_mean()", actual, sum(values) / interval,
                 "hint: the rule: the mean of the losses added since the last pop_mean (each pop starts the next "
                 "interval empty)")
        start += interval


@check("RunningLoss", objective="sync_free_logging")
def add_lets_go_of_the_graph(impl):
    """A loss that requires grad: after add(loss), nothing of its autograd graph is kept (the running sum holds
    a detached value), so each step's activations are freed; pop_mean() is that loss's value."""
    weight = torch.nn.Parameter(torch.ones(8))
    activations = torch.randn(8, generator=torch.Generator().manual_seed(0))
    kept, value = weakref.ref(activations), float(activations.sum())
    running = impl.RunningLoss()
    running.add((weight * activations).sum())   # the product saves activations for weight's gradient
    del activations
    gc.collect()
    if kept() is not None:
        fail("RunningLoss.add(a loss with an autograd graph): the tensors that graph saved are still alive",
             "kept", "freed", "hint: the rule: add detaches the loss: a running sum that requires grad keeps every "
             "step's graph (and its activations) alive")
    expect_close("RunningLoss: pop_mean() after that add", running.pop_mean(), value, rtol=1e-6)


@check("RunningLoss", objective="sync_free_logging", hidden=True)
def running_sum_of_bf16_losses_is_float32(impl):
    """200 bf16 losses: their mean as float32 sums them (a bf16 running sum rounds each addition to 8 bits)."""
    values = [2.0 + (i % 7) / 8 for i in range(200)]   # each exact in bf16
    running = impl.RunningLoss()
    for loss in losses(values, torch.bfloat16):
        running.add(loss)
    with rule("the running sum is float32 whatever the loss's dtype (loss.detach().float()): a bf16 sum rounds "
              "every addition"):
        expect_close("RunningLoss: pop_mean() of 200 bf16 losses", running.pop_mean(), sum(values) / len(values),
                     rtol=1e-6)


@check("RunningLoss")
def running_loss_conventions(impl):
    """pop_mean() is a Python float; pop_mean() with nothing added since the last pop is a ValueError naming
    pop_mean; add() of a loss that is not a 0-dim tensor is a ValueError naming loss."""
    running = impl.RunningLoss()
    running.add(torch.tensor(1.5))
    expect_type("RunningLoss.pop_mean()", running.pop_mean(), float)
    expect_raises("RunningLoss().pop_mean() with no loss added", lambda: impl.RunningLoss().pop_mean(), ValueError,
                  "pop_mean")
    expect_raises("RunningLoss().add(a loss of shape (4,))", lambda: impl.RunningLoss().add(torch.ones(4)),
                  ValueError, "loss")
