"""Counting device-to-host syncs: the tensor -> Python conversions and host copies a training loop should not do
per micro-step (on CUDA each one waits for every queued kernel). Shared by lessons 14 and 16."""
from __future__ import annotations

import contextlib

import torch

# .cpu() and .numpy() count wherever the tensor is: graded on the CPU they copy nothing, on a GPU they copy
# to the host. A .to() counts only off an accelerator: .to(device) is how a batch reaches the training device.
SYNC_METHODS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")


@contextlib.contextmanager
def count_host_syncs(counter: list):
    """Append the method's name to ``counter`` at each tensor -> host conversion or copy made inside the block."""
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS + ("to",)}

    def counting(name):
        def wrapper(self, *args, **kwargs):
            counter.append(name)
            return saved[name](self, *args, **kwargs)
        return wrapper

    def counting_to(self, *args, **kwargs):
        moved = saved["to"](self, *args, **kwargs)
        if moved.device.type == "cpu" and self.device.type != "cpu":
            counter.append("to")
        return moved
    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, counting(name))
        torch.Tensor.to = counting_to
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
