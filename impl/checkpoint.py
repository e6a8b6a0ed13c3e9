"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.
"""
from __future__ import annotations

import dataclasses  # noqa: F401 - model.config is a dataclass
import os  # noqa: F401
import tempfile  # noqa: F401
from collections.abc import Sized  # noqa: F401 - what has a len()
from pathlib import Path  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401
from torch.utils.data import Sampler


class SkipBatchSampler(Sampler):
    """TODO (lesson 15 §5.1): the batches of a resumed epoch, without the ``skip_batches`` already trained.

    Aligns with ``course/minimind/trainer_utils.py::SkipBatchSampler`` (lesson 15 answers §3 walks it, for after your
    first version). The epoch is ``indices`` (any sized iterable: a range, a list, a DistributedSampler) cut in
    order into batches of ``batch_size``, the last one possibly shorter; the sampler yields them without the
    first ``skip_batches``, and ``len()`` counts what it yields.
    Use: ``DataLoader(dataset, batch_sampler=SkipBatchSampler(order, batch_size, skip))``.
    Examples: (range(5), 2) -> [0, 1], [2, 3], [4]; (range(7), 3, 1) -> [3, 4, 5], [6], len 2.
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        raise NotImplementedError("SkipBatchSampler: TODO - see lesson 15 §5.1 (aligns with SkipBatchSampler)")


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """TODO (lesson 15 §5.2): write to ``path`` everything an exact resume needs (the save half of ``lm_checkpoint``).

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept), ``optimizer`` and ``scaler`` (their state_dicts; None without a scaler), ``epoch``,
    ``step``, ``world_size``, ``model_config`` (``dataclasses.asdict(model.config)``) and one entry per extra
    keyword. A save that fails halfway leaves the previous file as it was (lesson 15 §1.7); a save with
    gradients still pending (inside an accumulation window) is refused with a ValueError; under
    torch.distributed only rank 0 writes.
    Example: ``save_checkpoint("out/resume.pth", model=m, optimizer=o, scaler=None, epoch=0, step=4)``.
    """
    raise NotImplementedError("save_checkpoint: TODO - see lesson 15 §5.2 (aligns with lm_checkpoint)")


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """TODO (lesson 15 §5.3): restore a ``save_checkpoint`` file into ``model`` (and ``optimizer`` and ``scaler`` when
    given) bit for bit; return its dict.

    Refuse, with a ValueError naming the path and before changing anything, a file an exact resume cannot
    start from (which files: lesson 15 §5.3); a missing file raises FileNotFoundError. Loading runs no code
    from the file (lesson 15 §1.7) and puts every tensor on the CPU, whatever device wrote it. ``world_size``
    (default: the current one): when it differs from the saved one, the returned ``step`` is rescaled as
    upstream does (lesson 15 §1.6). Example: step 2 saved by 2 ranks -> step 4 on 1 rank.
    """
    raise NotImplementedError("load_checkpoint: TODO - see lesson 15 §5.3 (aligns with lm_checkpoint)")


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """TODO (lesson 15 §5.4): where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)``.

    ``iters`` is the number of micro-batches of an epoch. ``start_step`` counts the micro-batches of
    ``start_epoch`` already trained, as the checkpoint's ``step`` does for its epoch; ``0 <= start_step < iters``.
    Example with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2).
    """
    raise NotImplementedError("resume_position: TODO - see lesson 15 §5.4")
