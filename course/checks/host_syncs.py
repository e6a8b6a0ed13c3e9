"""Counting device-to-host syncs: the tensor -> Python conversions a training loop should not do per
micro-step (on CUDA each one waits for every queued kernel). Shared by lessons 14 and 16."""
from __future__ import annotations

import contextlib

import torch

SYNC_METHODS = ("item", "tolist", "__float__", "__int__", "__bool__")


@contextlib.contextmanager
def count_host_syncs(counter: list):
    """Append the method's name to ``counter`` at each tensor -> host conversion made inside the block."""
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}

    def counting(name):
        def wrapper(self, *args, **kwargs):
            counter.append(name)
            return saved[name](self, *args, **kwargs)
        return wrapper
    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, counting(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
