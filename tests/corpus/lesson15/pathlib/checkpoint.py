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

# The entries save_checkpoint writes itself: an extra keyword may not overwrite any of them, and a file
# without any of them (a weights file, upstream's resume file) cannot start an exact resume.
CHECKPOINT_KEYS = frozenset({"model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config"})


def _is_int(value) -> bool:
    """An int in the strict sense: ``True`` is not a counter."""
    return isinstance(value, int) and not isinstance(value, bool)


def _current_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _unwrap(model):
    """The plain model inside DistributedDataParallel (``.module``) and torch.compile (``._orig_mod``), any nesting."""
    while True:
        if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


class SkipBatchSampler(Sampler):
    """The batches of a resumed epoch, without the ``skip_batches`` already trained (lesson 15 §5.1).

    Aligns with ``course/minimind/trainer_utils.py::SkipBatchSampler``. The epoch is ``indices`` (any sized
    iterable: a range, a list, a DistributedSampler) cut in order into batches of ``batch_size``, the last one
    possibly shorter; the sampler yields them without the first ``skip_batches``, and ``len()`` counts what it
    yields. Each pass reads ``indices`` again (a sampler reshuffled by ``set_epoch`` gives its new order).
    Use: ``DataLoader(dataset, batch_sampler=SkipBatchSampler(order, batch_size, skip))``.
    Examples: (range(5), 2) -> [0, 1], [2, 3], [4]; (range(7), 3, 1) -> [3, 4, 5], [6], len 2.
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        if not isinstance(indices, Sized):
            raise TypeError(f"indices must have a len() (a range, a list, a sampler), got {type(indices).__name__}")
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        total = -(-len(indices) // batch_size)
        if not _is_int(skip_batches) or not 0 <= skip_batches <= total:
            raise ValueError(f"skip_batches must be an int in [0, {total}] (the epoch has {total} batches of "
                             f"{batch_size}), got {skip_batches!r}")
        self.indices = indices
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    def __iter__(self):
        batch, seen = [], 0
        for index in self.indices:          # read afresh on every pass
            batch.append(index)
            if len(batch) == self.batch_size:
                seen += 1
                if seen > self.skip_batches:
                    yield batch
                batch = []                  # a new list for the next batch
        if batch and seen >= self.skip_batches:
            yield batch

    def __len__(self) -> int:
        return max(0, -(-len(self.indices) // self.batch_size) - self.skip_batches)


def _pending_gradients(model) -> list[str]:
    """Names of the parameters whose gradient holds anything but zeros (NaN and inf count)."""
    return [name for name, p in model.named_parameters()
            if p.grad is not None and bool((p.grad != 0).any())]


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write to ``path`` everything an exact resume needs (the save half of ``lm_checkpoint``).

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept), ``optimizer`` and ``scaler`` (their state_dicts; None without a scaler), ``epoch``,
    ``step``, ``world_size``, ``model_config`` (``dataclasses.asdict(model.config)``) and one entry per extra
    keyword (stored by its ``state_dict()`` when it has one). The write goes to a ``.tmp`` sibling, is fsynced,
    then ``Path.replace``s the target: a save that fails halfway leaves the previous file as it was. A save
    with gradients still pending (inside an accumulation window) is refused with a ValueError; under
    torch.distributed every rank validates and only rank 0 writes.
    Example: ``save_checkpoint("out/resume.pth", model=m, optimizer=o, scaler=None, epoch=0, step=4)``.
    """
    path = Path(path)
    for name, value in (("epoch", epoch), ("step", step)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    clashes = CHECKPOINT_KEYS & extra.keys()
    if clashes:
        raise ValueError(f"extra keyword(s) {sorted(clashes)} would overwrite the checkpoint's own entries")
    model = _unwrap(model)
    pending = _pending_gradients(model)
    if pending:
        raise ValueError(f"cannot save {path}: gradients of {len(pending)} parameter(s) (e.g. {pending[0]}) are "
                         "pending inside an accumulation window; save at an update boundary (after "
                         "optimizer.step() and zero_grad())")
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return

    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": epoch,
        "step": step,
        "world_size": _current_world_size(),
        "model_config": dataclasses.asdict(model.config),
    }
    for key, value in extra.items():
        checkpoint[key] = value.state_dict() if callable(getattr(value, "state_dict", None)) else value

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as handle:
            torch.save(checkpoint, handle)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_model(path: Path, checkpoint: dict, model) -> None:
    config = checkpoint["model_config"]
    if not isinstance(config, dict):
        raise ValueError(f"{path}: model_config must be a dict, got {type(config).__name__}")
    expected = dataclasses.asdict(model.config)
    extra_fields, missing_fields = config.keys() - expected.keys(), expected.keys() - config.keys()
    if extra_fields or missing_fields:
        raise ValueError(f"{path}: model_config differs from this model's fields: extra {sorted(extra_fields, key=str)}, "
                         f"missing {sorted(missing_fields, key=str)}")
    for field, value in expected.items():
        if config[field] != value:
            raise ValueError(f"{path}: model_config.{field} is {config[field]!r}, this model has {value!r}")

    saved, own = checkpoint["model"], model.state_dict()
    extra_names, missing_names = saved.keys() - own.keys(), own.keys() - saved.keys()
    if extra_names or missing_names:
        raise ValueError(f"{path}: the model entry does not fit this model: unexpected parameters "
                         f"{sorted(extra_names, key=str)}, missing parameters {sorted(missing_names, key=str)}")
    for name, tensor in own.items():
        entry = saved[name]
        if not isinstance(entry, torch.Tensor):
            raise ValueError(f"{path}: model entry {name} is a {type(entry).__name__}, not a tensor")
        if entry.shape != tensor.shape or entry.dtype != tensor.dtype:
            raise ValueError(f"{path}: parameter {name} is {entry.dtype} {tuple(entry.shape)} in the file, "
                             f"the model has {tensor.dtype} {tuple(tensor.shape)}")


def _check_optimizer(path: Path, saved, optimizer) -> None:
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        raise ValueError(f"{path}: the optimizer entry is not an optimizer state_dict")
    groups, saved_groups = optimizer.param_groups, saved["param_groups"]
    if len(saved_groups) != len(groups):
        raise ValueError(f"{path}: optimizer has {len(saved_groups)} param groups in the file, "
                         f"{len(groups)} here")
    params = {}
    for i, (group, saved_group) in enumerate(zip(groups, saved_groups)):
        if not isinstance(saved_group, dict) or not isinstance(saved_group.get("params"), list):
            raise ValueError(f"{path}: optimizer param group {i} is malformed")
        if len(saved_group["params"]) != len(group["params"]):
            raise ValueError(f"{path}: optimizer param group {i} holds {len(saved_group['params'])} parameters "
                             f"in the file, {len(group['params'])} here")
        keys, saved_keys = group.keys() - {"params"}, saved_group.keys() - {"params"}
        if keys != saved_keys:
            raise ValueError(f"{path}: optimizer param group {i} has other hyper-parameters (another optimizer "
                             f"type?): only in the file {sorted(saved_keys - keys)}, only here {sorted(keys - saved_keys)}")
        params.update(zip(saved_group["params"], group["params"]))
    unknown = saved["state"].keys() - params.keys()
    if unknown:
        raise ValueError(f"{path}: optimizer state under parameter ids no group holds: {sorted(unknown, key=str)}")
    for pid, state in saved["state"].items():
        if not isinstance(state, dict):
            raise ValueError(f"{path}: optimizer state of parameter {pid} is not a dict")
        shape = params[pid].shape
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shape:
                raise ValueError(f"{path}: optimizer state {key!r} of parameter {pid} has shape "
                                 f"{tuple(value.shape)}, the parameter {tuple(shape)}")


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """Restore a ``save_checkpoint`` file into ``model`` (and ``optimizer`` and ``scaler`` when given) bit for
    bit; return its dict.

    Refuse, with a ValueError naming the path and before changing anything, a file an exact resume cannot
    start from: a weights-only file, fp16 weights, another model's shapes or config, another optimizer's state,
    no scaler state for an enabled scaler (a missing file: FileNotFoundError). Load safely
    (``weights_only=True``) onto the CPU, whatever device wrote the file. ``world_size`` (default: the current
    one): when it differs from the saved one, the returned ``step`` is rescaled as upstream does (lesson 15
    §1.6). Example: step 2 saved by 2 ranks -> step 4 on 1 rank.
    """
    path = Path(path)
    if world_size is not None and (not _is_int(world_size) or world_size < 1):
        raise ValueError(f"{path}: world_size must be None or an int >= 1, got {world_size!r}")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # empty, truncated, garbage, a directory, refused by weights_only ...
        raise ValueError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path}: a checkpoint is a dict, this file holds a {type(checkpoint).__name__}")

    missing = CHECKPOINT_KEYS - checkpoint.keys()
    if missing:
        raise ValueError(f"{path}: not a resume checkpoint (a weights file?), missing key(s) {sorted(missing)}")
    if not isinstance(checkpoint["model"], dict):
        raise ValueError(f"{path}: the model entry is a {type(checkpoint['model']).__name__}, not a state_dict")
    for key, least in (("epoch", 0), ("step", 0), ("world_size", 1)):
        if not _is_int(checkpoint[key]) or checkpoint[key] < least:
            raise ValueError(f"{path}: {key} must be an int >= {least}, got {checkpoint[key]!r}")

    model = _unwrap(model)
    _check_model(path, checkpoint, model)
    if optimizer is not None:
        _check_optimizer(path, checkpoint["optimizer"], optimizer)
    saved_scaler = checkpoint["scaler"]
    if saved_scaler is not None and not isinstance(saved_scaler, dict):
        raise ValueError(f"{path}: the scaler entry is a {type(saved_scaler).__name__}, not a state_dict")
    if scaler is not None and scaler.is_enabled():
        if not saved_scaler:
            raise ValueError(f"{path}: the scaler is enabled but the file holds no scaler state "
                             "(written with a disabled GradScaler or none)")
        lacking = scaler.state_dict().keys() - saved_scaler.keys()
        if lacking:
            raise ValueError(f"{path}: the scaler state lacks {sorted(lacking)}")

    # Everything checked: now, and only now, change the objects.
    model.load_state_dict(checkpoint["model"])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler is not None and saved_scaler:
        scaler.load_state_dict(saved_scaler)

    current = _current_world_size() if world_size is None else world_size
    if checkpoint["world_size"] != current:
        checkpoint["step"] = checkpoint["step"] * checkpoint["world_size"] // current
    return checkpoint


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """Where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)`` (lesson 15 §5.4).

    As upstream (``ckp['epoch'], ckp['step']``), except that a checkpoint written at the end of an epoch
    (``step == iters``, the micro-batches of an epoch) continues at step 0 of the next epoch.
    Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    """
    if not _is_int(iters) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    epoch, step = checkpoint["epoch"], checkpoint["step"]
    if not _is_int(step) or not 0 <= step <= iters:
        raise ValueError(f"step must be an int in [0, iters={iters}], got {step!r}")
    if not _is_int(epoch) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    return (epoch + 1, 0) if step == iters else (epoch, step)
