"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.
"""
from __future__ import annotations

import dataclasses  # noqa: F401 - model.config is a dataclass
import os  # noqa: F401 - os.replace, os.fsync
import tempfile  # noqa: F401 - a temporary file next to the target
from pathlib import Path  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - unwrapped before saving
from torch.utils.data import Sampler


class SkipBatchSampler(Sampler):
    """TODO (lesson 15 §5.1): a batch sampler that skips the batches a resumed epoch already trained.

    Aligns with ``course/minimind/trainer_utils.py::SkipBatchSampler`` (upstream ``trainer_utils.py``):
    iterate ``indices`` in order, group them into lists of ``batch_size``, drop the first
    ``skip_batches`` full batches, keep the final partial batch; ``len = ceil(N / batch_size) - skip_batches``.
    Example: ``SkipBatchSampler(range(10), 3, 2)`` yields ``[6, 7, 8]`` then ``[9]``.
    It is passed to ``DataLoader(dataset, batch_sampler=...)``: implement ``__iter__`` (yield each batch
    as a new list of indices, in the order of ``indices``) and ``__len__``. ``indices`` is any sized iterable
    (a range, a list, a ``DistributedSampler``): read it afresh on every pass, so a sampler reshuffled by
    ``set_epoch`` yields its new order, and an unchanged one the same batches again.
    Raise ``TypeError`` naming ``indices`` when it has no ``len()`` (a generator or iterator: neither the
    number of batches nor a second pass exists). Raise ``ValueError`` naming the argument when
    ``batch_size`` is not an int >= 1 or ``skip_batches`` not an int in ``[0, ceil(N / batch_size)]``
    (upstream silently yields nothing).
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        raise NotImplementedError("SkipBatchSampler: TODO - see lesson 15 §5.1 (aligns with SkipBatchSampler)")


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """TODO (lesson 15 §5.2): write a resume checkpoint to ``path`` (a str or a Path), atomically and in full
    precision.

    Aligns with the save half of ``course/minimind/trainer_utils.py::lm_checkpoint``, without its fp16
    quirk. Store a dict with ``model`` (the fp32 ``state_dict``), ``optimizer``, ``scaler``
    (``scaler.state_dict()``, or None when ``scaler`` is None), ``epoch``, ``step`` (micro-steps done in
    ``epoch``), ``world_size`` (``dist.get_world_size()`` when ``dist.is_initialized()``, else 1),
    ``model_config`` (``dataclasses.asdict(model.config)``) and every ``extra`` keyword (by
    ``state_dict()`` when it has one).
    Save the model itself, not its wrappers: unwrap ``model.module`` while ``model`` is a
    ``torch.nn.parallel.DistributedDataParallel`` and ``model._orig_mod`` while it has one (torch.compile),
    in any order, so no key starts with ``module.`` or ``_orig_mod.`` and ``model.config`` is found.
    Under torch.distributed (``dist.is_initialized()``) only rank 0 (``dist.get_rank() == 0``) writes;
    other ranks validate the same way and return without writing.
    Create the parent directory. Write to a temporary file in the SAME directory as ``path`` (``os.replace``
    is an atomic rename only within one file system), flush and ``os.fsync`` it (so the bytes are on disk
    before the name points at them), then ``os.replace`` it onto ``path`` (``os.fsync`` and ``os.replace``
    from the ``os`` module; ``shutil.move`` may copy). On any error, ``KeyboardInterrupt`` included (e.g. an
    ``extra`` value that cannot be pickled, a full disk, Ctrl-C), remove the temporary file and re-raise,
    leaving an existing ``path`` untouched. After a save the directory holds ``path`` and no temporary file.
    Saved tensors keep their dtype and values exactly (fp32 stays fp32; ``detach().cpu()`` is fine).
    Before writing anything (on every rank), raise ``ValueError`` naming ``epoch``/``step`` when it is not
    an int >= 0, naming the key when an ``extra`` keyword reuses one of the keys above, and naming
    ``accumulation`` when any parameter of the model still holds a non-zero gradient (a save in
    the middle of an accumulation window; a ``grad`` of None, or one that is all zeros, e.g. after
    ``zero_grad(set_to_none=False)``, is not pending).
    """
    raise NotImplementedError("save_checkpoint: TODO - see lesson 15 §5.2 (aligns with lm_checkpoint)")


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """TODO (lesson 15 §5.3): restore a ``save_checkpoint`` file (``path``: a str or a Path) into ``model``, and
    into ``optimizer`` and ``scaler`` when given, and return its dict.

    Aligns with the load half of ``lm_checkpoint`` plus upstream's ``load_state_dict`` calls in
    ``train_pretrain.py``. Read with ``torch.load(path, map_location="cpu", weights_only=True)``.
    Validate everything BEFORE the first ``load_state_dict``, so a refused file leaves ``model``,
    ``optimizer`` and ``scaler`` exactly as they were. Validating needs no loading: compare the dict
    with ``model.state_dict()``, ``model.config``, ``optimizer.param_groups`` and ``scaler.is_enabled()``.
    A missing file raises ``FileNotFoundError`` whose message contains ``str(path)``. Everything else raises
    ``ValueError`` whose message contains ``str(path)`` and names the offending key:
    - unreadable (truncated, not a ``torch.save`` file, or an object ``weights_only`` refuses), not a dict, or
      its ``model`` entry not a dict;
    - a missing key of ``model``, ``optimizer``, ``scaler``, ``epoch``, ``step``, ``world_size`` (name it);
      ``epoch``/``step`` not ints >= 0, ``world_size`` not an int >= 1 (name the key);
    - ``model_config`` differs from ``dataclasses.asdict(model.config)`` in any field, also one that no
      shape shows (e.g. ``rope_theta``): name the field;
    - ``model`` lacks a key of ``model.state_dict()``, has an extra one, or one tensor's shape or dtype
      differs (fp16 weights are an export, not a resume checkpoint): name the parameter;
    - (``optimizer`` given) an entry that is no optimizer ``state_dict`` (a dict with ``state`` and
      ``param_groups``), a different number of param groups or of parameters, param groups with other
      hyper-parameter keys (another optimizer type), or a state tensor (dim > 0) shaped unlike its
      parameter: name ``optimizer``;
    - (``scaler`` given and enabled) an empty or None saved scaler state (a disabled GradScaler saves ``{}``;
      torch would raise only inside ``scaler.load_state_dict``, after the model changed): name ``scaler``.
    Then load ``model``, ``optimizer`` (if given) and ``scaler`` (if given, and only when the saved scaler
    state is non-empty: ``load_state_dict({})`` raises, and a run without fp16 saves ``{}``).
    ``world_size`` (None: ``dist.get_world_size()`` when ``dist.is_initialized()``, else 1; otherwise an int
    >= 1, or ``ValueError`` naming ``world_size``): when it differs from the saved one, return the int
    ``step * saved_world_size // world_size`` (floor) as ``step`` (upstream's rescale; e.g. step 2 saved by
    2 ranks loads as 4 on 1 rank, 1 on 3 ranks; step 3 saved by 2 loads as 1 on 4). Return the loaded dict
    itself: every saved key, extras such as ``batch_size_semantics`` included, with ``step`` rescaled.
    """
    raise NotImplementedError("load_checkpoint: TODO - see lesson 15 §5.3 (aligns with lm_checkpoint)")


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """TODO (lesson 15 §5.4): ``(start_epoch, start_step)`` to continue from ``checkpoint``.

    Aligns with ``start_epoch = ckp['epoch']; start_step = ckp['step']`` in upstream's ``train_pretrain.py``,
    except that a checkpoint written at the end of an epoch (``step == iters``) resumes at
    ``(epoch + 1, 0)``. Raise ``ValueError`` naming ``iters`` when it is not an int >= 1 and naming ``step``
    when the checkpoint's step is outside ``[0, iters]``.
    """
    raise NotImplementedError("resume_position: TODO - see lesson 15 §5.4")
