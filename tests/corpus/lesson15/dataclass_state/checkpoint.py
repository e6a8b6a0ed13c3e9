"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.
"""
from __future__ import annotations

import contextlib
import dataclasses  # noqa: F401 - model.config is a dataclass
import os  # noqa: F401 - os.replace, os.fsync
import tempfile  # noqa: F401 - a temporary file next to the target
from collections.abc import Sized  # noqa: F401 - what has a len()
from pathlib import Path  # noqa: F401
from typing import Any, Optional

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - unwrapped before saving
from torch.utils.data import Sampler


# ---------------------------------------------------------------------------------------------------------------
# What a resume checkpoint holds (lesson 15 §0): one small dataclass, turned into the dict that is saved.
# ---------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ResumeState:
    """The fixed entries of a resume checkpoint; the caller's extras are added next to them."""

    model: dict                     # the unwrapped model's state_dict, fp32 as trained
    optimizer: Optional[dict]       # optimizer.state_dict(): AdamW's exp_avg, exp_avg_sq, step
    scaler: Optional[dict]          # scaler.state_dict() ({} for a disabled GradScaler), None without a scaler
    epoch: int                      # the epoch the saved micro-steps belong to
    step: int                       # micro-steps of that epoch already trained
    world_size: int                 # processes that trained them (to rescale step on another world size)
    model_config: Optional[dict]    # dataclasses.asdict(model.config)

    def to_dict(self) -> dict:
        # Not dataclasses.asdict: that deep-copies every tensor one by one, which doubles the memory and
        # stores the tied embedding / lm_head twice. A shallow dict keeps the state dicts as they are.
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


CHECKPOINT_KEYS = tuple(field.name for field in dataclasses.fields(ResumeState))
_SCALER_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _is_count(value: Any, minimum: int) -> bool:
    """An int (a bool is not one here) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model behind DistributedDataParallel (``.module``) and torch.compile (``._orig_mod``), any order."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _current_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _model_config(model: torch.nn.Module) -> Optional[dict]:
    config = getattr(model, "config", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return None


# ---------------------------------------------------------------------------------------------------------------
# 5.1 SkipBatchSampler
# ---------------------------------------------------------------------------------------------------------------

class SkipBatchSampler(Sampler):
    """The batches of a resumed epoch, without the ``skip_batches`` already trained (lesson 15 §5.1).

    Aligns with ``course/minimind/trainer_utils.py::SkipBatchSampler``. The epoch is ``indices`` (any sized
    iterable: a range, a list, a DistributedSampler) cut in order into batches of ``batch_size``, the last one
    possibly shorter; the sampler yields them without the first ``skip_batches``, and ``len()`` counts what it
    yields. Each pass reads ``indices`` again (a sampler reshuffled by ``set_epoch`` gives its new order).
    Use: ``DataLoader(dataset, batch_sampler=SkipBatchSampler(order, batch_size, skip))``.
    Examples: (range(5), 2) -> [0, 1], [2, 3], [4]; (range(7), 3, 1) -> [3, 4, 5], [6], len 2.

    Nothing is materialised here: the number of batches is computed from ``len(indices)`` whenever it is
    needed, and each pass lists ``indices`` afresh.
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        super().__init__()
        if not isinstance(indices, Sized):
            raise TypeError(f"indices must be sized (a range, a list, a sampler with len()), got "
                            f"{type(indices).__name__}: a generator has no number of batches and is empty on a "
                            f"second pass")
        if not _is_count(batch_size, 1):
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.indices = indices
        self.batch_size = batch_size
        total = self._total_batches()
        if not _is_count(skip_batches, 0) or skip_batches > total:
            raise ValueError(f"skip_batches must be an int in [0, {total}] (the epoch has {total} batches of "
                             f"{batch_size}), got {skip_batches!r}: a checkpoint of another batch size or dataset?")
        self.skip_batches = skip_batches

    def _total_batches(self) -> int:
        return -(-len(self.indices) // self.batch_size)  # ceil(N / bs): the last batch may be short

    def __len__(self) -> int:
        return max(0, self._total_batches() - self.skip_batches)

    def __iter__(self):
        order = list(self.indices)  # read again on every pass: set_epoch may have reshuffled it
        bs = self.batch_size
        for b in range(self.skip_batches, -(-len(order) // bs)):
            yield order[b * bs:(b + 1) * bs]  # a new list per batch


# ---------------------------------------------------------------------------------------------------------------
# 5.2 save_checkpoint
# ---------------------------------------------------------------------------------------------------------------

def _pending_gradient(model: torch.nn.Module) -> Optional[str]:
    """The first parameter holding a non-zero (or NaN/inf) gradient, or None. Zeros are not pending."""
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is not None and bool((grad != 0).any()):
            return name
    return None


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable where the platform allows it (POSIX); best effort."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_torch_save(obj: dict, path: Path) -> None:
    """torch.save into a temporary file beside ``path``, fsync it, then os.replace it onto ``path``."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp_name, path)
    except BaseException:  # Ctrl-C and SystemExit too: never leave the temporary file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(directory)


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write to ``path`` everything an exact resume needs (lesson 15 §5.2; the save half of ``lm_checkpoint``).

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept), ``optimizer`` and ``scaler`` (their state_dicts; None without a scaler), ``epoch``,
    ``step``, ``world_size``, ``model_config`` (``dataclasses.asdict(model.config)``) and one entry per extra
    keyword (an object with ``state_dict()`` is stored by it). A save that fails halfway leaves the previous
    file as it was; a save with gradients still pending (inside an accumulation window) is refused with a
    ValueError; under torch.distributed every rank validates and only rank 0 writes.
    Example: ``save_checkpoint("out/resume.pth", model=m, optimizer=o, scaler=None, epoch=0, step=4)``.
    """
    path = Path(path)
    for key, value in (("epoch", epoch), ("step", step)):
        if not _is_count(value, 0):
            raise ValueError(f"{path}: {key} must be an int >= 0, got {value!r}")
    clashes = [key for key in extra if key in CHECKPOINT_KEYS]
    if clashes:
        raise ValueError(f"{path}: extra keyword {clashes[0]!r} would overwrite the checkpoint's own "
                         f"{clashes[0]!r} entry")
    plain = _unwrap(model)
    pending = _pending_gradient(plain)
    if pending is not None:
        raise ValueError(f"{path}: parameter {pending!r} holds a gradient of an unfinished accumulation window; "
                         f"param.grad is in no state_dict, so save only at an update boundary")
    if dist.is_initialized() and dist.get_rank() != 0:
        return  # every rank has the same state after an update; rank 0 writes it

    state = ResumeState(
        model=plain.state_dict(),
        optimizer=None if optimizer is None else optimizer.state_dict(),
        scaler=None if scaler is None else scaler.state_dict(),
        epoch=epoch,
        step=step,
        world_size=_current_world_size(),
        model_config=_model_config(plain),
    )
    content = state.to_dict()
    for key, value in extra.items():
        content[key] = value.state_dict() if callable(getattr(value, "state_dict", None)) else value
    _atomic_torch_save(content, path)


# ---------------------------------------------------------------------------------------------------------------
# 5.3 load_checkpoint
# ---------------------------------------------------------------------------------------------------------------

def _check_model(path, saved_model, saved_config, model: torch.nn.Module) -> None:
    if not isinstance(saved_model, dict):
        raise ValueError(f"{path}: 'model' is not a state dict ({type(saved_model).__name__})")
    current_config = _model_config(model)
    if saved_config != current_config:
        if not isinstance(saved_config, dict) or not isinstance(current_config, dict):
            raise ValueError(f"{path}: model_config {saved_config!r} does not match the model's {current_config!r}")
        for field in sorted(set(saved_config) | set(current_config)):
            if field not in current_config:
                raise ValueError(f"{path}: model_config has a field {field!r} the model's config lacks")
            if field not in saved_config:
                raise ValueError(f"{path}: model_config lacks the model's field {field!r}")
            if saved_config[field] != current_config[field]:
                raise ValueError(f"{path}: model_config field {field!r} is {saved_config[field]!r}, the model has "
                                 f"{current_config[field]!r}")
    expected = model.state_dict()
    for name in expected:
        if name not in saved_model:
            raise ValueError(f"{path}: the checkpoint's model has no parameter {name!r}")
    for name in saved_model:
        if name not in expected:
            raise ValueError(f"{path}: the checkpoint's model has a parameter {name!r} this model does not")
    for name, tensor in expected.items():
        value = saved_model[name]
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: model entry {name!r} is a {type(value).__name__}, not a tensor")
        if value.shape != tensor.shape or value.dtype != tensor.dtype:
            raise ValueError(f"{path}: parameter {name!r} is {value.dtype} {tuple(value.shape)}, the model needs "
                             f"{tensor.dtype} {tuple(tensor.shape)} (an fp16 export or another model?)")


def _check_optimizer(path, saved, optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        raise ValueError(f"{path}: 'optimizer' holds no optimizer state_dict")
    groups, saved_groups = optimizer.param_groups, saved["param_groups"]
    if len(saved_groups) != len(groups):
        raise ValueError(f"{path}: optimizer has {len(saved_groups)} param groups, this optimizer "
                         f"{len(groups)}")
    param_of_id = {}
    for i, (saved_group, group) in enumerate(zip(saved_groups, groups)):
        if not isinstance(saved_group, dict) or not isinstance(saved_group.get("params"), list):
            raise ValueError(f"{path}: optimizer param group {i} is malformed")
        if len(saved_group["params"]) != len(group["params"]):
            raise ValueError(f"{path}: optimizer param group {i} has {len(saved_group['params'])} parameters, "
                             f"this optimizer {len(group['params'])}")
        saved_keys, keys = set(saved_group) - {"params"}, set(group) - {"params"}
        if saved_keys != keys:
            raise ValueError(f"{path}: optimizer param group {i} has hyper-parameters {sorted(saved_keys)}, this "
                             f"optimizer {sorted(keys)} (another optimizer type?)")
        param_of_id.update(zip(saved_group["params"], group["params"]))
    for param_id, param_state in saved["state"].items():
        if param_id not in param_of_id:
            raise ValueError(f"{path}: optimizer state for parameter id {param_id!r}, which no param group holds")
        if not isinstance(param_state, dict):
            raise ValueError(f"{path}: optimizer state of parameter id {param_id!r} is not a dict")
        param = param_of_id[param_id]
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise ValueError(f"{path}: optimizer state {key!r} of parameter id {param_id!r} has shape "
                                 f"{tuple(value.shape)}, its parameter {tuple(param.shape)}")


def _check_scaler(path, saved, scaler) -> None:
    if not scaler.is_enabled():
        return  # a disabled GradScaler has no state to restore
    if not isinstance(saved, dict) or not saved:
        raise ValueError(f"{path}: scaler state is empty (saved by a disabled GradScaler or without one), but this "
                         f"scaler is enabled")
    missing = [key for key in _SCALER_KEYS if key not in saved]
    if missing:
        raise ValueError(f"{path}: scaler state lacks {missing}")


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """Restore a ``save_checkpoint`` file into ``model`` (and ``optimizer`` and ``scaler`` when given) bit for
    bit; return its dict (lesson 15 §5.3).

    Refuses, with a ValueError naming the path and before changing anything, a file an exact resume cannot
    start from: a weights-only file, fp16 weights, another model's shapes or config, another optimizer's state,
    no scaler state for an enabled scaler (a missing file: FileNotFoundError). Loads with ``weights_only=True``
    onto the CPU. ``world_size`` (default: the current one): when it differs from the saved one, the returned
    ``step`` is rescaled as upstream does, floor(step * saved / current). Example: step 2 saved by 2 ranks ->
    step 4 on 1 rank.
    """
    if world_size is None:
        world_size = _current_world_size()
    elif not _is_count(world_size, 1):
        raise ValueError(f"{path}: world_size must be None or an int >= 1, got {world_size!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # empty, truncated, garbage, a directory, refused by weights_only, ...
        raise ValueError(f"{path}: cannot be read as a checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path}: holds a {type(checkpoint).__name__}, not a checkpoint dict")
    if not isinstance(checkpoint.get("model"), dict):
        # a weights file is itself a state_dict: no 'model' entry
        raise ValueError(f"{path}: no 'model' state dict (a weights file is no resume checkpoint)")
    for key in CHECKPOINT_KEYS:
        if key not in checkpoint:
            raise ValueError(f"{path}: missing key {key!r}; not a resume checkpoint")
    for key, minimum in (("epoch", 0), ("step", 0), ("world_size", 1)):
        if not _is_count(checkpoint[key], minimum):
            raise ValueError(f"{path}: {key} must be an int >= {minimum}, got {checkpoint[key]!r}")

    plain = _unwrap(model)
    _check_model(path, checkpoint["model"], checkpoint["model_config"], plain)
    if optimizer is not None:
        _check_optimizer(path, checkpoint["optimizer"], optimizer)
    if scaler is not None:
        _check_scaler(path, checkpoint["scaler"], scaler)

    # Everything checked: now restore, bit for bit.
    plain.load_state_dict(checkpoint["model"])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler is not None and scaler.is_enabled():
        scaler.load_state_dict(checkpoint["scaler"])  # scale, growth tracker and the growth/backoff settings

    saved_world_size = checkpoint["world_size"]
    if saved_world_size != world_size:
        checkpoint["step"] = checkpoint["step"] * saved_world_size // world_size  # samples seen, floored
    return checkpoint


# ---------------------------------------------------------------------------------------------------------------
# 5.4 resume_position
# ---------------------------------------------------------------------------------------------------------------

def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """Where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)`` (lesson 15 §5.4).

    As upstream (``ckp['epoch'], ckp['step']``), except that a checkpoint written at the end of an epoch
    (``step == iters``, the micro-batches of an epoch) continues at step 0 of the next epoch.
    Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    """
    if not _is_count(iters, 1):
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    step = checkpoint.get("step")
    if not _is_count(step, 0) or step > iters:
        raise ValueError(f"step must be an int in [0, iters={iters}], got {step!r}")
    epoch = checkpoint.get("epoch")
    if not _is_count(epoch, 0):
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    if step == iters:
        return epoch + 1, 0  # the epoch is complete: the next one starts from its first micro-batch
    return epoch, step
