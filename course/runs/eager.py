"""Optimizers without torch.compile's wrappers, for processes that never compile.

``torch.optim`` wraps ``step`` in a graph-break helper and ``add_param_group``, ``zero_grad``,
``state_dict`` and ``load_state_dict`` in ``torch._disable_dynamo``; both import ``torch._dynamo`` on
first use. Outside ``torch.compile`` they only call the method, but the import costs about as much
as importing torch itself (1.5 s of a 5 s ``python -m course check 14`` on a 2-core machine). The
tiny runs build their optimizers through ``eager``: the same class and the same arithmetic (a run
is bitwise the plain optimizer's, tests/test_oracle.py), without the import.
"""
from __future__ import annotations

import functools

import torch

_DISABLED_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _plain_step(wrapped_step):
    """``step`` as torch's wrapper runs it outside compilation: grad mode from ``differentiable``."""
    step = wrapped_step.__wrapped__

    @functools.wraps(step)
    def plain_step(self, closure=None):
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, closure)
    return plain_step


@functools.cache
def eager(optimizer_cls: type) -> type:
    """A subclass of ``optimizer_cls`` whose wrapped methods call the wrapped function directly.

    Falls back to ``optimizer_cls`` itself where a torch version wraps them differently.
    """
    methods = {name: getattr(torch.optim.Optimizer, name) for name in _DISABLED_METHODS}
    if not hasattr(optimizer_cls.step, "__wrapped__") or not all(hasattr(m, "__wrapped__") for m in methods.values()):
        return optimizer_cls
    namespace = {name: method.__wrapped__ for name, method in methods.items()}
    namespace.update(step=_plain_step(optimizer_cls.step), __doc__=f"{optimizer_cls.__name__} without compile wrappers.",
                     __module__=__name__)
    return type(optimizer_cls.__name__, (optimizer_cls,), namespace)
