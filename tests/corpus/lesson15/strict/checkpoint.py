"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.
"""
from __future__ import annotations

import dataclasses  # noqa: F401 - model.config is a dataclass
import os  # noqa: F401 - os.replace, os.fsync
import tempfile  # noqa: F401 - a temporary file next to the target
from collections.abc import Iterable, Mapping
from collections.abc import Sized  # noqa: F401 - what has a len()
from pathlib import Path  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - unwrapped before saving
from torch.utils.data import Sampler

# Keys that save_checkpoint writes itself (an extra keyword may not overwrite them) and that load_checkpoint
# requires: together they are what an exact resume reads.
_CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config")


# ------------------------------------------------------------------------------------------------ argument checks
def _is_int(value) -> bool:
    """An int in the counting sense: ``True`` is not a batch size, a step or a world size."""
    return isinstance(value, int) and not isinstance(value, bool)


def _require_int(name: str, value, minimum: int, where: str) -> None:
    if not _is_int(value):
        raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {value!r}")


def _require_path(path, where: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}: path must be a str or os.PathLike, got {type(path).__name__}")
    if isinstance(path, str) and not path:
        raise ValueError(f"{where}: path must not be empty")
    return Path(path)


def _require_module(model, where: str) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{where}: model must be a torch.nn.Module, got {type(model).__name__}")


def _require_optimizer(optimizer, where: str, optional: bool) -> None:
    if optimizer is None and optional:
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        allowed = "None or a torch.optim.Optimizer" if optional else "a torch.optim.Optimizer"
        raise TypeError(f"{where}: optimizer must be {allowed}, got {type(optimizer).__name__}")


def _require_scaler(scaler, where: str) -> None:
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"{where}: scaler must be None or a torch.amp.GradScaler, got {type(scaler).__name__}")


def _unwrap(model):
    """The model itself, without DistributedDataParallel (``.module``) or torch.compile (``._orig_mod``)
    wrappers, whichever order they were applied in."""
    while True:
        if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _config_of(model, where: str) -> dict:
    config = getattr(model, "config", None)
    if config is None or not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"{where}: the model ({type(model).__name__}) has no dataclass .config to record")
    return dataclasses.asdict(config)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _current_world_size() -> int:
    return dist.get_world_size() if _distributed() else 1


# ------------------------------------------------------------------------------------------------ the sampler
class SkipBatchSampler(Sampler):
    """The batches of a resumed epoch, without the ``skip_batches`` already trained.

    Aligns with ``course/minimind/trainer_utils.py::SkipBatchSampler``. The epoch is ``indices`` (any sized
    iterable: a range, a list, a DistributedSampler) cut in order into batches of ``batch_size``, the last one
    possibly shorter; the sampler yields them without the first ``skip_batches``, and ``len()`` counts what it
    yields. Each pass reads ``indices`` again (a sampler reshuffled by ``set_epoch`` gives its new order).
    Use: ``DataLoader(dataset, batch_sampler=SkipBatchSampler(order, batch_size, skip))``.
    Examples: (range(5), 2) -> [0, 1], [2, 3], [4]; (range(7), 3, 1) -> [3, 4, 5], [6], len 2.

    Checked in this order: ``indices`` sized and iterable (TypeError), ``batch_size`` an int >= 1,
    ``skip_batches`` an int in [0, ceil(len(indices) / batch_size)] (ValueError).
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        where = "SkipBatchSampler"
        if not isinstance(indices, Sized) or not isinstance(indices, Iterable):
            raise TypeError(f"{where}: indices must be a sized iterable (a range, a list, a sampler with len()); "
                            f"{type(indices).__name__} has no len() or cannot be iterated")
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"{where}: batch_size must be an int >= 1, got {batch_size!r}")
        total = self._count_batches(len(indices), batch_size)
        if not _is_int(skip_batches) or not 0 <= skip_batches <= total:
            raise ValueError(f"{where}: skip_batches must be an int in [0, {total}] ({len(indices)} indices make "
                             f"{total} batches of {batch_size}), got {skip_batches!r}; a larger skip means the "
                             "checkpoint belongs to another batch size or dataset")
        self.indices = indices
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    @staticmethod
    def _count_batches(n: int, batch_size: int) -> int:
        return (n + batch_size - 1) // batch_size

    def __iter__(self):
        order = list(self.indices)  # this pass's order (a DistributedSampler reshuffles per set_epoch)
        for start in range(self.skip_batches * self.batch_size, len(order), self.batch_size):
            yield order[start:start + self.batch_size]  # a fresh list every time

    def __len__(self) -> int:
        return max(0, self._count_batches(len(self.indices), self.batch_size) - self.skip_batches)


# ------------------------------------------------------------------------------------------------ save
def _pending_gradient(model) -> str | None:
    """The name of the first parameter whose gradient holds a non-zero value (NaN and inf included), if any."""
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is not None and bool(torch.ne(grad, 0).any()):
            return name
    return None


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write to ``path`` everything an exact resume needs (the save half of ``lm_checkpoint``).

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept), ``optimizer`` and ``scaler`` (their state_dicts; None without a scaler), ``epoch``,
    ``step``, ``world_size``, ``model_config`` (``dataclasses.asdict(model.config)``) and one entry per extra
    keyword. A save that fails halfway leaves the previous file as it was; a save with gradients still pending
    (inside an accumulation window) is refused with a ValueError; under torch.distributed only rank 0 writes
    (every rank validates).
    Example: ``save_checkpoint("out/resume.pth", model=m, optimizer=o, scaler=None, epoch=0, step=4)``.
    """
    where = f"save_checkpoint({path!r})"
    target = _require_path(path, where)
    _require_module(model, where)
    _require_optimizer(optimizer, where, optional=False)
    _require_scaler(scaler, where)
    _require_int("epoch", epoch, 0, where)
    _require_int("step", step, 0, where)
    for key in extra:
        if key in _CHECKPOINT_KEYS:
            raise ValueError(f"{where}: the extra keyword {key!r} would overwrite the checkpoint's own {key!r} entry")
    net = _unwrap(model)
    config = _config_of(net, where)
    pending = _pending_gradient(model)
    if pending is not None:
        raise ValueError(f"{where}: parameter {pending!r} holds a pending gradient: this is inside a gradient "
                         "accumulation window, whose gradients no state_dict holds; save at an update boundary")
    if target.is_dir():
        raise IsADirectoryError(f"{where}: {target} is a directory")
    if _distributed() and dist.get_rank() != 0:
        return  # rank 0 writes the (identical) state; the others have validated it

    checkpoint = {
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": epoch,
        "step": step,
        "world_size": _current_world_size(),
        "model_config": config,
    }
    for key, value in extra.items():
        state_dict = getattr(value, "state_dict", None)
        checkpoint[key] = state_dict() if callable(state_dict) else value

    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(checkpoint, handle)
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
        os.rename(tmp_name, target)  # atomic on POSIX, within the target's own file system
    except BaseException:  # Ctrl-C and SystemExit too: no half-written temporary file stays behind
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# ------------------------------------------------------------------------------------------------ load
class _Refusal:
    """Builds the ValueErrors of load_checkpoint: each names the path and the offending key."""

    def __init__(self, path):
        self.path = path

    def __call__(self, key: str, reason: str) -> ValueError:
        return ValueError(f"load_checkpoint({str(self.path)!r}): {key}: {reason}")


def _check_counters(checkpoint: dict, refuse: _Refusal) -> None:
    for key, minimum in (("epoch", 0), ("step", 0), ("world_size", 1)):
        value = checkpoint[key]
        if not _is_int(value) or value < minimum:
            raise refuse(key, f"must be an int >= {minimum}, got {type(value).__name__} {value!r}")


def _check_config(saved, config: dict, refuse: _Refusal) -> None:
    if not isinstance(saved, dict):
        raise refuse("model_config", f"must be a dict, got {type(saved).__name__}")
    for field in config:
        if field not in saved:
            raise refuse(f"model_config.{field}", "missing from the checkpoint's config")
    for field in saved:
        if field not in config:
            raise refuse(f"model_config.{field}", "the checkpoint's config has this field, the model's has not")
    for field, value in config.items():
        if saved[field] != value:
            raise refuse(f"model_config.{field}", f"saved {saved[field]!r}, the model has {value!r}")


def _check_model_state(saved, expected: dict, refuse: _Refusal) -> None:
    if not isinstance(saved, dict):
        raise refuse("model", f"must be a state_dict (dict), got {type(saved).__name__}")
    for name in expected:
        if name not in saved:
            raise refuse(name, "missing from the checkpoint's model state")
    for name in saved:
        if name not in expected:
            raise refuse(name, "in the checkpoint's model state, but not a key of this model")
    for name, reference in expected.items():
        tensor = saved[name]
        if not torch.is_tensor(tensor):
            raise refuse(name, f"must be a tensor, got {type(tensor).__name__}")
        if tensor.dtype != reference.dtype:
            raise refuse(name, f"saved as {tensor.dtype}, the model holds {reference.dtype} (an export, not a "
                               "resume checkpoint?)")
        if tensor.shape != reference.shape:
            raise refuse(name, f"saved shape {tuple(tensor.shape)}, the model's is {tuple(reference.shape)}")


def _check_optimizer_state(saved, optimizer, refuse: _Refusal) -> None:
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        raise refuse("optimizer", "no optimizer state_dict (expected a dict with 'state' and 'param_groups')")
    saved_groups, groups = saved["param_groups"], optimizer.param_groups
    if len(saved_groups) != len(groups):
        raise refuse("optimizer", f"{len(saved_groups)} param group(s) saved, the optimizer has {len(groups)}")
    param_of_id = {}
    for i, (saved_group, group) in enumerate(zip(saved_groups, groups)):
        if not isinstance(saved_group, dict) or not isinstance(saved_group.get("params"), list):
            raise refuse("optimizer", f"param group {i} has no list of parameter ids")
        if len(saved_group["params"]) != len(group["params"]):
            raise refuse("optimizer", f"param group {i}: {len(saved_group['params'])} parameter(s) saved, "
                                      f"the optimizer has {len(group['params'])}")
        if set(saved_group) != set(group):
            raise refuse("optimizer", f"param group {i}: hyper-parameter keys differ "
                                      f"({sorted(set(saved_group) ^ set(group))}): another optimizer type?")
        for pid, param in zip(saved_group["params"], group["params"]):
            if pid in param_of_id:
                raise refuse("optimizer", f"parameter id {pid!r} appears twice in the saved param groups")
            param_of_id[pid] = param
    for pid, state in saved["state"].items():
        if pid not in param_of_id:
            raise refuse("optimizer", f"state under parameter id {pid!r}, which no saved param group holds")
        if not isinstance(state, dict):
            raise refuse("optimizer", f"state of parameter id {pid!r} must be a dict, got {type(state).__name__}")
        param = param_of_id[pid]
        for key, value in state.items():
            if not torch.is_tensor(value) or value.dim() == 0:
                continue  # scalar state (AdamW's step) has no parameter shape
            if value.shape != param.shape:
                raise refuse("optimizer", f"state {key!r} of parameter id {pid!r} has shape {tuple(value.shape)}, "
                                          f"the parameter {tuple(param.shape)}")


def _check_scaler_state(saved, scaler, refuse: _Refusal) -> None:
    if scaler.is_enabled():
        if not isinstance(saved, dict) or not saved:
            raise refuse("scaler", "the GradScaler is enabled but the checkpoint holds no scaler state (written by a "
                                   "run with a disabled or no scaler)")
    elif saved is not None and not isinstance(saved, dict):
        raise refuse("scaler", f"must be a GradScaler state_dict or None, got {type(saved).__name__}")


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
    where = f"load_checkpoint({path!r})"
    source = _require_path(path, where)
    _require_module(model, where)
    _require_optimizer(optimizer, where, optional=True)
    _require_scaler(scaler, where)
    refuse = _Refusal(source)
    if world_size is not None and (not _is_int(world_size) or world_size < 1):
        raise refuse("world_size", f"the argument must be None or an int >= 1, got {world_size!r}")
    net = _unwrap(model)
    config = _config_of(net, where)

    if not source.exists():
        raise FileNotFoundError(f"{where}: no such file: {source}")
    if source.is_dir():
        raise refuse("path", "is a directory, not a checkpoint file")
    try:
        checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # whatever torch.load raises on an unreadable file
        raise refuse("path", f"cannot be read as a checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(checkpoint, dict):
        raise refuse("path", f"holds a {type(checkpoint).__name__}, not a checkpoint dict")
    for key in _CHECKPOINT_KEYS:
        if key not in checkpoint:
            raise refuse(key, "missing: this is not a resume checkpoint (a weights-only file?)")
    _check_counters(checkpoint, refuse)
    _check_config(checkpoint["model_config"], config, refuse)
    _check_model_state(checkpoint["model"], net.state_dict(), refuse)
    if optimizer is not None:
        _check_optimizer_state(checkpoint["optimizer"], optimizer, refuse)
    if scaler is not None:
        _check_scaler_state(checkpoint["scaler"], scaler, refuse)

    # Validated: only now is anything changed.
    net.load_state_dict(checkpoint["model"], strict=True)
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler is not None and checkpoint["scaler"]:
        scaler.load_state_dict(checkpoint["scaler"])  # scale, growth tracker and the growth/backoff settings

    result = dict(checkpoint)
    current = _current_world_size() if world_size is None else world_size
    if checkpoint["world_size"] != current:
        result["step"] = checkpoint["step"] * checkpoint["world_size"] // current  # floored, as upstream
    return result


# ------------------------------------------------------------------------------------------------ position
def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """Where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)``.

    As upstream (``ckp['epoch'], ckp['step']``), except that a checkpoint written at the end of an epoch
    (``step == iters``, the micro-batches of an epoch) continues at step 0 of the next epoch.
    Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    ``iters`` (an int >= 1) is checked first, then the step (an int in [0, iters]), then the epoch (an int
    >= 0); the checkpoint is only read.
    """
    where = "resume_position"
    if not _is_int(iters) or iters < 1:
        raise ValueError(f"{where}: iters must be an int >= 1, got {iters!r}")
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f"{where}: checkpoint must be a dict, got {type(checkpoint).__name__}")
    for key in ("step", "epoch"):
        if key not in checkpoint:
            raise ValueError(f"{where}: the checkpoint has no {key!r}")
    step, epoch = checkpoint["step"], checkpoint["epoch"]
    if not _is_int(step) or not 0 <= step <= iters:
        raise ValueError(f"{where}: step {step!r} is outside [0, iters] = [0, {iters}]")
    if not _is_int(epoch) or epoch < 0:
        raise ValueError(f"{where}: epoch must be an int >= 0, got {epoch!r}")
    if step == iters:
        return epoch + 1, 0
    return epoch, step
