"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.

Layout of this solution: every refusal lives in one ``_validate_*`` function per kind of object (the file,
the model, the optimizer, the scaler, the save's arguments). ``load_checkpoint`` runs all of them before it
touches anything, then applies; ``save_checkpoint`` runs its validation on every rank, then rank 0 writes.
"""
from __future__ import annotations

import dataclasses  # noqa: F401 - model.config is a dataclass
import itertools
import os  # noqa: F401 - os.replace, os.fsync
import tempfile  # noqa: F401 - a temporary file next to the target
from collections.abc import Sized  # noqa: F401 - what has a len()
from pathlib import Path  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - unwrapped before saving
from torch.utils.data import Sampler

REQUIRED_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config")
RESERVED_KEYS = REQUIRED_KEYS  # an extra keyword of one of these names would overwrite the entry
SCALER_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _is_int_at_least(value, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _unwrap(model):
    """Peel DistributedDataParallel (``.module``) and torch.compile (``._orig_mod``) wrappers, in any order."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _world_size_now() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _config_of(model):
    config = getattr(model, "config", None)
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) and not isinstance(config, type) else None


# ---------------------------------------------------------------------------------------------------- 5.1

class SkipBatchSampler(Sampler):
    """The batches of a resumed epoch, without the ``skip_batches`` already trained (lesson 15 §5.1).

    Aligns with ``course/minimind/trainer_utils.py::SkipBatchSampler``: ``indices`` cut in order into batches of
    ``batch_size`` (the last one possibly shorter), the first ``skip_batches`` left out; ``len()`` counts what is
    yielded. Each pass iterates ``indices`` again (a DistributedSampler reshuffled by ``set_epoch``).
    Examples: (range(5), 2) -> [0, 1], [2, 3], [4]; (range(7), 3, 1) -> [3, 4, 5], [6], len 2.
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        super().__init__()
        self._validate(indices, batch_size, skip_batches)
        self.indices = indices
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    @staticmethod
    def _validate(indices, batch_size, skip_batches) -> None:
        """All argument checks, in the order indices, batch_size, skip_batches."""
        if not isinstance(indices, Sized):
            raise TypeError(f"indices must have a len() (a range, list or sampler), got a "
                            f"{type(indices).__name__}")
        if not _is_int_at_least(batch_size, 1):
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        batches = -(-len(indices) // batch_size)
        if not _is_int_at_least(skip_batches, 0) or skip_batches > batches:
            raise ValueError(f"skip_batches must be an int in [0, {batches}] for {len(indices)} indices in batches "
                             f"of {batch_size}, got {skip_batches!r}")

    def __iter__(self):
        it = iter(self.indices)
        # the skipped batches: consumed, never yielded (a short last batch counts as one)
        for _ in itertools.islice(it, self.skip_batches * self.batch_size):
            pass
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch:
                return
            yield batch

    def __len__(self) -> int:
        return max(0, -(-len(self.indices) // self.batch_size) - self.skip_batches)


# ---------------------------------------------------------------------------------------------------- 5.2

def _validate_save(path, model, epoch, step, extra) -> None:
    """Every refusal of a save: counters, extras that would overwrite an entry, pending gradients."""
    for key, value in (("epoch", epoch), ("step", step)):
        if not _is_int_at_least(value, 0):
            raise ValueError(f"{path}: {key} must be an int >= 0, got {value!r}")
    for key in extra:
        if key in RESERVED_KEYS:
            raise ValueError(f"{path}: the extra keyword {key!r} would overwrite the checkpoint's {key!r}")
    for name, param in model.named_parameters():
        if param.grad is not None and torch.count_nonzero(param.grad).item() > 0:
            raise ValueError(f"{path}: parameter {name!r} holds pending gradients (inside an accumulation window); "
                             f"save at an update boundary, param.grad is not in any state_dict")


def _write_atomically(content: dict, path: Path) -> None:
    """A temporary file in the target's directory, fsync, then os.replace; removed again on any failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name + ".", suffix=".tmp", delete=False)
    try:
        with handle:
            torch.save(content, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        try:
            os.remove(handle.name)
        except OSError:
            pass
        raise


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write to ``path`` everything an exact resume needs (lesson 15 §5.2; the save half of ``lm_checkpoint``).

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept), ``optimizer`` and ``scaler`` (their state_dicts; None without a scaler), ``epoch``,
    ``step``, ``world_size``, ``model_config`` (``dataclasses.asdict(model.config)``) and one entry per extra
    keyword. A save that fails halfway leaves the previous file as it was; a save with gradients still pending
    is refused with a ValueError; under torch.distributed every rank validates, only rank 0 writes.
    Example: ``save_checkpoint("out/resume.pth", model=m, optimizer=o, scaler=None, epoch=0, step=4)``.
    """
    path = Path(path)
    plain = _unwrap(model)
    _validate_save(path, plain, epoch, step, extra)
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    content = {
        "model": plain.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": epoch,
        "step": step,
        "world_size": _world_size_now(),
        "model_config": _config_of(plain),
    }
    for key, value in extra.items():
        state_dict = getattr(value, "state_dict", None)
        content[key] = state_dict() if callable(state_dict) else value
    _write_atomically(content, path)


# ---------------------------------------------------------------------------------------------------- 5.3

def _validate_world_size_argument(path, world_size) -> int:
    if world_size is None:
        return _world_size_now()
    if not _is_int_at_least(world_size, 1):
        raise ValueError(f"{path}: world_size must be None or an int >= 1, got {world_size!r}")
    return world_size


def _read(path) -> dict:
    """The file's dict, read safely onto the CPU; FileNotFoundError or ValueError naming the path."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path}: not a readable checkpoint: {type(exc).__name__}: {exc}") from exc
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path}: the file holds a {type(checkpoint).__name__}, not a checkpoint dict")
    return checkpoint


def _validate_file(path, checkpoint: dict) -> None:
    """The entries every resume checkpoint has, and its counters."""
    for key in REQUIRED_KEYS:
        if key not in checkpoint:
            raise ValueError(f"{path}: missing key {key!r} (a weights file, or not written by save_checkpoint)")
    for key, minimum in (("epoch", 0), ("step", 0), ("world_size", 1)):
        if not _is_int_at_least(checkpoint[key], minimum):
            raise ValueError(f"{path}: {key} must be an int >= {minimum}, got {checkpoint[key]!r}")


def _validate_model(path, checkpoint: dict, model) -> None:
    """Config field by field, then every state-dict entry: present, no extra, a tensor of the same shape and dtype."""
    saved_config, config = checkpoint["model_config"], _config_of(model)
    if isinstance(saved_config, dict) and isinstance(config, dict):
        for field in [*config, *(f for f in saved_config if f not in config)]:
            if field not in saved_config:
                raise ValueError(f"{path}: model_config has no field {field!r}")
            if field not in config:
                raise ValueError(f"{path}: model_config has a field {field!r} the model's config does not")
            if saved_config[field] != config[field]:
                raise ValueError(f"{path}: model_config {field!r} = {saved_config[field]!r}, the model has "
                                 f"{config[field]!r}")
    elif saved_config != config:
        raise ValueError(f"{path}: model_config {saved_config!r} differs from the model's {config!r}")

    saved = checkpoint["model"]
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: model entry is a {type(saved).__name__}, not a state dict")
    expected = model.state_dict()
    missing = [name for name in expected if name not in saved]
    if missing:
        raise ValueError(f"{path}: model parameter {missing[0]!r} is missing from the checkpoint")
    unexpected = [name for name in saved if name not in expected]
    if unexpected:
        raise ValueError(f"{path}: model parameter {unexpected[0]!r} does not exist in this model")
    for name, tensor in expected.items():
        value = saved[name]
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: model parameter {name!r} is a {type(value).__name__}, not a tensor")
        if value.shape != tensor.shape:
            raise ValueError(f"{path}: model parameter {name!r} has shape {tuple(value.shape)}, the model "
                             f"{tuple(tensor.shape)}")
        if value.dtype != tensor.dtype:
            raise ValueError(f"{path}: model parameter {name!r} is {value.dtype}, the model trains in "
                             f"{tensor.dtype} (an fp16 export cannot resume exactly)")


def _validate_optimizer(path, saved, optimizer) -> None:
    """Same number of groups and parameters, same hyper-parameter keys, state only for known ids, moments
    shaped like their parameters."""
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict)
            and isinstance(saved.get("param_groups"), list)):
        raise ValueError(f"{path}: optimizer: the checkpoint holds no optimizer state_dict")
    if len(saved["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"{path}: optimizer: {len(saved['param_groups'])} param groups saved, "
                         f"{len(optimizer.param_groups)} in this optimizer")
    param_by_id = {}
    for index, (saved_group, group) in enumerate(zip(saved["param_groups"], optimizer.param_groups)):
        if not isinstance(saved_group, dict) or not isinstance(saved_group.get("params"), list):
            raise ValueError(f"{path}: optimizer: param group {index} has no parameter list")
        if len(saved_group["params"]) != len(group["params"]):
            raise ValueError(f"{path}: optimizer: param group {index} has {len(saved_group['params'])} parameters "
                             f"saved, {len(group['params'])} here")
        if set(saved_group) - {"params"} != set(group) - {"params"}:
            raise ValueError(f"{path}: optimizer: param group {index} has hyper-parameters "
                             f"{sorted(set(saved_group) - {'params'})}, this optimizer "
                             f"{sorted(set(group) - {'params'})}: another optimizer type")
        param_by_id.update(zip(saved_group["params"], group["params"]))
    for param_id, state in saved["state"].items():
        if param_id not in param_by_id:
            raise ValueError(f"{path}: optimizer: state under parameter id {param_id!r}, which no param group holds")
        if not isinstance(state, dict):
            raise ValueError(f"{path}: optimizer: the state of parameter id {param_id!r} is not a dict")
        shape = param_by_id[param_id].shape
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shape:
                raise ValueError(f"{path}: optimizer: {key!r} of parameter id {param_id!r} has shape "
                                 f"{tuple(value.shape)}, the parameter {tuple(shape)}")


def _validate_scaler(path, saved, scaler) -> None:
    """An enabled GradScaler needs the full saved state; a disabled one needs nothing."""
    if not scaler.is_enabled():
        return
    if not isinstance(saved, dict) or not saved:
        raise ValueError(f"{path}: scaler: this GradScaler is enabled but the checkpoint has no scaler state "
                         f"(a disabled GradScaler saves {{}})")
    missing = [key for key in SCALER_STATE_KEYS if key not in saved]
    if missing:
        raise ValueError(f"{path}: scaler: the saved scaler state lacks {missing}")


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """Restore a ``save_checkpoint`` file into ``model`` (and ``optimizer`` and ``scaler`` when given) bit for
    bit; return a shallow copy of its dict with ``step`` rescaled to the current world size.

    Refuses, with a ValueError naming the path and before changing anything, a file an exact resume cannot
    start from (a missing file: FileNotFoundError). Loaded with ``weights_only=True`` onto the CPU. ``world_size``
    (default: the current one): when it differs from the saved one, step = floor(step * saved / current)
    (lesson 15 §1.6). Example: step 2 saved by 2 ranks -> step 4 on 1 rank.
    """
    world_size = _validate_world_size_argument(path, world_size)
    checkpoint = _read(path)
    plain = _unwrap(model)

    # validate everything ...
    _validate_file(path, checkpoint)
    _validate_model(path, checkpoint, plain)
    if optimizer is not None:
        _validate_optimizer(path, checkpoint["optimizer"], optimizer)
    if scaler is not None:
        _validate_scaler(path, checkpoint["scaler"], scaler)

    # ... then apply
    plain.load_state_dict(checkpoint["model"])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler is not None and scaler.is_enabled():
        scaler.load_state_dict(checkpoint["scaler"])

    result = dict(checkpoint)
    if checkpoint["world_size"] != world_size:
        result["step"] = checkpoint["step"] * checkpoint["world_size"] // world_size
    return result


# ---------------------------------------------------------------------------------------------------- 5.4

def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """Where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)`` (lesson 15 §5.4).

    As upstream (``ckp['epoch'], ckp['step']``), except that a checkpoint written at the end of an epoch
    (``step == iters``) continues at step 0 of the next epoch. The checkpoint is only read.
    Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    """
    if not _is_int_at_least(iters, 1):
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    step = checkpoint["step"]
    if not _is_int_at_least(step, 0) or step > iters:
        raise ValueError(f"step must be an int in [0, {iters}] (iters), got {step!r}")
    epoch = checkpoint["epoch"]
    if not _is_int_at_least(epoch, 0):
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    return (epoch + 1, 0) if step == iters else (epoch, step)
