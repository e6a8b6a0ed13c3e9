"""Counting device-to-host syncs: the tensor -> Python conversions and host copies a training loop should not do
per micro-step (on CUDA each one waits for every queued kernel). Shared by lessons 14 and 16.

Only a conversion that could wait for a device counts. The checks run on the CPU, where every tensor is on the
host, so a tensor is taken to live on the training device unless it was born on the host: made inside the
counted block by a factory that names no device (``torch.tensor(0.5, dtype=torch.float64)``), or computed from
such tensors alone. Converting one of those (a schedule computed with torch, then ``float(...)``) waits for
nothing on a GPU either. The model's parameters, outputs, losses and gradients, the batches, the GradScaler's
scale and anything computed from them count.
"""
from __future__ import annotations

import contextlib
import functools
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

# .cpu() and .numpy() count wherever the tensor is: graded on the CPU they copy nothing, on a GPU they copy
# to the host. A .to() counts only off an accelerator: .to(device) is how a batch reaches the training device.
SYNC_METHODS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")
# Methods whose result is on the device they name (a str or torch.device argument): never born on the host. By name:
# while counting, torch hands the mode the counting wrapper of ``to`` (which keeps the name).
MOVES = ("to", "cuda", "pin_memory")


class HostBorn(TorchFunctionMode):
    """Follows which tensors were born on the host (see the module's docstring) while it is active."""

    def __init__(self):
        super().__init__()
        self._born = {}   # id -> weakref of each host-born tensor (ids of dead tensors are reused: compared by identity)

    def __contains__(self, tensor) -> bool:
        ref = self._born.get(id(tensor))
        return ref is not None and ref() is tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        leaves = tree_leaves((args, kwargs))
        names_a_device = kwargs.get("device") is not None or (
            getattr(func, "__name__", None) in MOVES and any(isinstance(a, (str, torch.device)) for a in leaves))
        host_born = not names_a_device and all(t in self for t in leaves if isinstance(t, torch.Tensor))
        for output in tree_leaves(result):
            if isinstance(output, torch.Tensor):
                if host_born:
                    self._born[id(output)] = weakref.ref(output)
                else:   # an in-place op that mixed a device tensor in, say: no longer host-born
                    self._born.pop(id(output), None)
        return result


@contextlib.contextmanager
def count_host_syncs(counter: list):
    """Append the method's name to ``counter`` at each conversion to Python or copy to the host, made inside the
    block, of a tensor that may live on the training device (not one born on the host)."""
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS + ("to",)}
    host_born = HostBorn()
    converting = []   # the conversion under way: torch hands the mode this wrapper again for the same call

    def counting(name):
        def wrapper(self, *args, **kwargs):
            if converting:
                return saved[name](self, *args, **kwargs)
            if self not in host_born:
                counter.append(name)
            converting.append(name)
            try:
                return saved[name](self, *args, **kwargs)
            finally:
                converting.pop()
        return wrapper

    @functools.wraps(saved["to"])
    def counting_to(self, *args, **kwargs):
        moved = saved["to"](self, *args, **kwargs)
        if moved.device.type == "cpu" and self.device.type != "cpu":
            counter.append("to")
        return moved
    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, counting(name))
        torch.Tensor.to = counting_to
        with host_born:
            yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
