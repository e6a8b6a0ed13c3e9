"""What a MiniMind training step costs, measured on the real model (lesson 18): the FLOPs torch counts, the bytes
autograd saves for backward, the bytes of the training state. The lesson-18 checks grade a student's formulas
against these measurements; labs and notebooks show them.

* ``counted_flops``: ``torch.utils.flop_counter.FlopCounterMode``'s totals for one forward and backward, with
  attention run by SDPA's math backend. On the CPU the default fused attention kernel
  (``_scaled_dot_product_flash_attention_for_cpu``) has no entry in FlopCounterMode's registry, so the counter
  would see no attention FLOPs at all; the math backend runs attention as two batched matmuls it counts, over the
  whole T x T square (a causal mask is applied to the scores, it removes no matmul).
* ``saved_activation_bytes``: every storage a ``torch.autograd.graph.saved_tensors_hooks`` pack hook sees during one
  training forward, each storage once (several ops save the same tensor; views share their base's storage),
  parameters and buffers left out (they exist without the step): by dtype name.
* ``training_state_nbytes``: after one real optimizer step, the ``nbytes`` of the unique parameters, of their
  ``.grad`` and of the optimizer's state tensors.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from course.minimind import MiniMindConfig, MiniMindForCausalLM


def measured_model(config: MiniMindConfig, dtype: torch.dtype = torch.float32, seed: int = 0) -> MiniMindForCausalLM:
    """The model a measurement runs on, in training mode, its parameters at ``dtype``."""
    torch.manual_seed(seed)
    return MiniMindForCausalLM(config).to(dtype).train()


def random_batch(config: MiniMindConfig, batch_size: int, seq_len: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """``(input_ids, labels)`` of random ids; labels a tensor of their own (the pretraining dataset's shape)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    return input_ids, input_ids.clone()


def _eager_dispatch_mode() -> Optional[type]:
    """FlopCounterMode's dispatch mode without torch.compile's wrapper around its ``__torch_dispatch__``: like the
    optimizers of ``course/runs/eager.py``, the wrapper only imports torch._dynamo (about as costly as importing
    torch) to call the same method outside compilation. None where a torch version is built otherwise."""
    mode = getattr(flop_counter, "_FlopCounterMode", None)
    method = getattr(mode, "__dict__", {}).get("__torch_dispatch__")
    if not hasattr(method, "__wrapped__"):
        return None
    # _should_skip_dynamo False keeps TorchDispatchMode.__init_subclass__ from wrapping the method again
    return type("EagerFlopCounterMode", (mode,), {"__torch_dispatch__": method.__wrapped__, "__module__": __name__,
                                                  "_should_skip_dynamo": classmethod(lambda cls: False)})


EAGER_DISPATCH_MODE = _eager_dispatch_mode()


class _FlopCounter(FlopCounterMode):
    """FlopCounterMode counting through ``EAGER_DISPATCH_MODE`` (FlopCounterMode itself where there is none)."""

    def __enter__(self):
        original = flop_counter._FlopCounterMode
        flop_counter._FlopCounterMode = EAGER_DISPATCH_MODE or original
        try:
            return super().__enter__()
        finally:
            flop_counter._FlopCounterMode = original


def counted_flops(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    """FlopCounterMode's totals for ``model(input_ids, labels=labels)``: (its forward, its forward and the
    backward of its loss plus the MoE aux loss), attention through SDPA's math backend."""
    with sdpa_kernel(SDPBackend.MATH), _FlopCounter(display=False) as counter:
        output = model(input_ids, labels=labels)
        forward = counter.get_total_flops()
        (output.loss + output.aux_loss).backward()
    return forward, counter.get_total_flops()


def saved_activation_bytes(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, int]:
    """Bytes of the distinct storages autograd saves for backward in one forward of ``model(input_ids,
    labels=labels)`` with its default kernels, parameters and buffers left out, summed per dtype name."""
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, tuple[str, int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in owned:
            saved[storage.data_ptr()] = (str(tensor.dtype).removeprefix("torch."), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(input_ids, labels=labels)
    del output   # the graph goes, the record stays
    by_dtype: dict[str, int] = {}
    for dtype, nbytes in saved.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    return by_dtype


def training_state_nbytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, input_ids: torch.Tensor,
                          labels: torch.Tensor, *, autocast_dtype: torch.dtype | None = None) -> dict[str, int]:
    """One training step of ``model`` (under CPU autocast at ``autocast_dtype`` when given), then the ``nbytes``
    of what it keeps: "weights" (each parameter tensor once), "gradients" (their ``.grad``), "optimizer" (every
    tensor of the optimizer's state)."""
    autocast = (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None else nullcontext())
    with autocast:
        output = model(input_ids, labels=labels)
    (output.loss + output.aux_loss).backward()
    optimizer.step()
    params = list(model.parameters())
    return {"weights": sum(p.nbytes for p in params),
            "gradients": sum(p.grad.nbytes for p in params if p.grad is not None),
            "optimizer": sum(t.nbytes for state in optimizer.state.values() for t in state.values()
                             if isinstance(t, torch.Tensor))}
