"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.
"""
from __future__ import annotations

import dataclasses  # noqa: F401 - model.config is a dataclass
import os  # noqa: F401 - os.replace, os.fsync
import tempfile  # noqa: F401 - a temporary file next to the target
from collections.abc import Sized  # noqa: F401 - what has a len()
from pathlib import Path  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - unwrapped before saving
from torch.utils.data import Sampler


class SkipBatchSampler(Sampler):
    """TODO (lesson 15 §5.1): a batch sampler for a resumed epoch: the epoch's batches without those already trained.

    Aligns with ``course/minimind/trainer_utils.py::SkipBatchSampler`` (same batches, same ``len``).
    Contract, for ``DataLoader(dataset, batch_sampler=SkipBatchSampler(indices, batch_size, skip_batches))``:
    - the epoch is ``indices`` cut, in order, into batches of ``batch_size`` (the last one may be shorter and
      is part of the epoch); the sampler yields that epoch's batches minus its first ``skip_batches``, and
      ``len(sampler)`` is how many it yields;
    - every pass reads ``indices`` anew (a ``DistributedSampler`` reshuffled by ``set_epoch`` gives its new
      order, an unchanged one the same batches), and each batch is a list of its own (``list(sampler)`` keeps
      them all intact).
    Arguments, checked in the order ``indices``, ``batch_size``, ``skip_batches``:
    ``indices`` any sized iterable (range, list, Sampler), else ``TypeError`` naming ``indices``;
    ``batch_size`` an int >= 1 and ``skip_batches`` (default 0) an int from 0 to the epoch's number of
    batches, else ``ValueError`` naming the argument (upstream silently yields nothing); a bool is not an
    int here. With several bad arguments, the first in that order is named.
    Examples: ``SkipBatchSampler(range(5), 2)`` -> ``[0, 1], [2, 3], [4]``, len 3;
    ``SkipBatchSampler(range(7), 3, 1)`` -> ``[3, 4, 5], [6]``, len 2.
    Graded against upstream's sampler for every allowed skip, on two passes.
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        raise NotImplementedError("SkipBatchSampler: TODO - see lesson 15 §5.1 (aligns with SkipBatchSampler)")


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """TODO (lesson 15 §5.2): write to ``path`` (a str or a Path) everything an exact resume needs.

    Aligns with the save half of ``course/minimind/trainer_utils.py::lm_checkpoint``, without its shortcuts
    (lesson 15 §8). The file is a dict that ``torch.load(path, weights_only=True)`` reads back, with keys
    ``model``     the state of the model itself: no wrapper (DistributedDataParallel, torch.compile, in any
                  combination) shows in its keys; every tensor keeps its dtype and value exactly (fp32 stays fp32)
    ``optimizer`` and ``scaler``   their ``state_dict()`` (``scaler`` None -> None)
    ``epoch``, ``step``            as given (``step``: micro-steps done in ``epoch``)
    ``world_size``                 the size of the current process group (1 without one)
    ``model_config``               ``dataclasses.asdict`` of the (unwrapped) model's ``config``
    and one entry per ``extra`` keyword, whatever its value (None too; an object with a ``state_dict()`` is
    stored as that dict).
    Guarantees:
    - atomic: whatever goes wrong during a save, any ``BaseException`` (a Ctrl-C's ``KeyboardInterrupt``,
      ``SystemExit``, ...), the error propagates, ``path`` still holds the previous checkpoint byte for byte
      (or nothing, if there was none), and no temporary file is left; after a save the directory holds
      ``path`` and no leftover;
    - durable: the new file's bytes are on disk before the name ``path`` refers to them, by ``os.replace``
      (``os.rename`` refuses an existing ``path`` on Windows);
    - read-only: everything given is left as it was (every module's train/eval mode, ``requires_grad``, the
      gradients, the states, the extras);
    - the parent directory is created if missing;
    - under torch.distributed only rank 0 writes; every rank validates, so a refusal happens on every rank.
    Refusals (``ValueError``, before anything is written): ``epoch``/``step`` not an int >= 0 (a bool is not;
    naming it); an ``extra`` keyword named like one of the keys above (naming it); a gradient still pending in
    the model, i.e. a ``grad`` with any non-zero entry (NaN and inf included) on any parameter (the message
    says ``accumulation``; a ``grad`` of None, a frozen parameter's, or of zeros is not pending).
    Example: after 4 micro-steps of epoch 0 with K = 2, ``save_checkpoint(p, model=m, optimizer=o,
    scaler=None, epoch=0, step=4, run={"lr": 5e-4})`` writes keys epoch, model, model_config, optimizer, run,
    scaler (None), step (4), world_size (1); the same call at step 3 (K = 2: micro-step 3's gradient is
    pending) raises and writes nothing.
    Graded: the file's entries against the trained objects (tensors bitwise); a save that fails halfway.
    """
    raise NotImplementedError("save_checkpoint: TODO - see lesson 15 §5.2 (aligns with lm_checkpoint)")


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """TODO (lesson 15 §5.3): restore a ``save_checkpoint`` file (``path``: a str or a Path) into ``model``,
    and into ``optimizer`` and ``scaler`` when given; return its dict.

    Aligns with the load half of ``lm_checkpoint`` plus upstream's ``load_state_dict`` calls in
    ``train_pretrain.py``, with validation upstream lacks.
    Contract:
    - all or nothing: either every given object holds the saved state bit for bit (the scaler all of its
      state: scale, growth tracker, ``growth_factor``, ``backoff_factor``, ``growth_interval``), or the call
      raises and ``model``, ``optimizer`` and ``scaler`` are exactly as before (a bad ``world_size`` too);
    - safe and portable: the file is read without running code from it (only tensors, containers and plain
      values are accepted), and a file written on any device (a GPU, an Apple mps) loads on a CPU-only machine;
    - returns the loaded dict itself: every saved key, extras included, ``step`` as int rescaled when the
      world size changed (below).
    Refusals: nothing at ``path`` -> ``FileNotFoundError`` whose message contains ``str(path)``; every other
    refusal -> ``ValueError`` whose message contains ``str(path)`` and names the offending key (a file with
    several problems may be refused for any one of them):
    - the path cannot be read, whatever ``torch.load`` raises (empty, truncated, garbage, a directory, an
      object that is not plain data), or holds no dict, or its ``model`` entry is not a dict;
    - a key of ``model``, ``optimizer``, ``scaler``, ``epoch``, ``step``, ``world_size`` is missing (a weights
      file): name it; ``epoch``/``step`` not an int >= 0 or ``world_size`` not an int >= 1 (a bool is not):
      name it;
    - ``model_config`` differs from ``dataclasses.asdict(model.config)`` in any field, also one no tensor shape
      shows (``rope_theta``), or has a field more or less: name the field;
    - the ``model`` entry lacks a key of ``model.state_dict()``, has one more, or holds a non-tensor or a
      tensor of another shape or dtype (fp16 weights are an export, not a resume checkpoint): name the
      parameter;
    - (``optimizer`` given) the entry is no optimizer state_dict, or fits another optimizer: another number of
      param groups or of parameters, other hyper-parameter keys (another type), state under a parameter id
      no group holds, a per-parameter state tensor of dim > 0 shaped unlike its parameter (as many elements
      is not enough): name ``optimizer``;
    - (``scaler`` given and enabled) the saved scaler state is empty or None (a run without a GradScaler):
      name ``scaler``. An empty state into a disabled or absent scaler restores nothing and is fine.
    ``world_size``: None means the current process group's size (1 without one); otherwise an int >= 1 (not a
    bool), else ``ValueError`` naming ``world_size``. When it differs from the saved one, the returned ``step`` is
    upstream's rescale floored to an int: the micro-steps of the new world size that cover at most the
    samples the saved ranks trained (lesson 15 §1.6). Examples: step 2 saved by 2 ranks -> 4 on 1 rank,
    1 on 3 ranks; step 5 saved by 1 rank -> 2 on 2 ranks; the same world size -> the saved step.
    Graded: fresh objects against the saved ones (bitwise), and refused files leave them untouched.
    """
    raise NotImplementedError("load_checkpoint: TODO - see lesson 15 §5.3 (aligns with lm_checkpoint)")


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """TODO (lesson 15 §5.4): where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)``,
    meaning ``start_step`` micro-batches of epoch ``start_epoch`` are already trained.

    Aligns with ``start_epoch = ckp['epoch']; start_step = ckp['step']`` in upstream's ``train_pretrain.py``,
    except that a checkpoint written at the end of an epoch (all ``iters`` micro-batches trained) continues
    at the start of the next epoch instead of running an empty one.
    Arguments, checked in this order: ``iters`` (micro-batches per epoch) an int >= 1 (not a bool), else
    ``ValueError`` naming ``iters``; the checkpoint's ``step`` within ``[0, iters]``, else ``ValueError`` naming
    ``step``. ``checkpoint`` is only read, never changed.
    Examples with ``iters=6``: ``{'epoch': 1, 'step': 2}`` -> ``(1, 2)``; ``{'epoch': 0, 'step': 7}`` -> ValueError.
    Graded, with your three other exercises, by resuming interrupted oracle runs: records, parameters,
    AdamW state and GradScaler scale must equal the uninterrupted run bitwise.
    """
    raise NotImplementedError("resume_position: TODO - see lesson 15 §5.4")
