"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.
"""
from __future__ import annotations

import dataclasses  # noqa: F401 - model.config is a dataclass
import os  # noqa: F401 - os.replace, os.fsync
import tempfile  # noqa: F401 - a temporary file next to the target
from collections.abc import Sized  # noqa: F401 - what has a len()
from itertools import islice
from pathlib import Path  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - unwrapped before saving
from torch.utils.data import Sampler

# The keys save_checkpoint writes itself; an extra keyword may not overwrite them.
_OWN_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config")
# What load_checkpoint needs to resume exactly (a weights file has none of them but "model").
_REQUIRED_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config")


def _is_int(value, minimum: int) -> bool:
    """An int (a bool is not one here) that is >= minimum."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _unwrap(model):
    """The plain model behind DistributedDataParallel / DataParallel and torch.compile, in any order."""
    while True:
        if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def _current_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _n_batches(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


class SkipBatchSampler(Sampler):
    """The batches of a resumed epoch, without the ``skip_batches`` already trained.

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
        if not _is_int(batch_size, 1):
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        total = _n_batches(len(indices), batch_size)
        if not _is_int(skip_batches, 0) or skip_batches > total:
            raise ValueError(f"skip_batches must be an int in [0, {total}] (the epoch has {total} batches of "
                             f"{batch_size}), got {skip_batches!r}")
        self.indices = indices
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    def _batches(self):
        it = iter(self.indices)
        while batch := list(islice(it, self.batch_size)):
            yield batch

    def __iter__(self):
        return islice(self._batches(), self.skip_batches, None)

    def __len__(self) -> int:
        return max(0, _n_batches(len(self.indices), self.batch_size) - self.skip_batches)


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write to ``path`` everything an exact resume needs (the save half of ``lm_checkpoint``).

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept), ``optimizer`` and ``scaler`` (their state_dicts; None without a scaler), ``epoch``,
    ``step``, ``world_size``, ``model_config`` (``dataclasses.asdict(model.config)``) and one entry per extra
    keyword. A save that fails halfway leaves the previous file as it was; a save with gradients still pending
    (inside an accumulation window) is refused with a ValueError; under torch.distributed only rank 0 writes.
    """
    for name, value in (("epoch", epoch), ("step", step)):
        if not _is_int(value, 0):
            raise ValueError(f"save_checkpoint {path}: {name} must be an int >= 0, got {value!r}")
    clashes = sorted(set(extra) & set(_OWN_KEYS))
    if clashes:
        raise ValueError(f"save_checkpoint {path}: extra keyword(s) {clashes} would overwrite the checkpoint's own keys")
    for name, param in model.named_parameters():
        if param.grad is not None and bool((param.grad != 0).any()):
            raise ValueError(f"save_checkpoint {path}: parameter {name} holds a pending gradient: the save is inside "
                             "an accumulation window; save only at update boundaries (after optimizer.step/zero_grad)")
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return  # rank 0 writes; every rank holds the same state after an update

    net = _unwrap(model)
    checkpoint = {
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": epoch,
        "step": step,
        "world_size": _current_world_size(),
        "model_config": dataclasses.asdict(net.config),
    }
    for key, value in extra.items():
        checkpoint[key] = value.state_dict() if callable(getattr(value, "state_dict", None)) else value

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """Restore a ``save_checkpoint`` file into ``model`` (and ``optimizer`` and ``scaler`` when given) bit for
    bit; return its dict (``step`` rescaled when ``world_size`` differs from the saved one, lesson 15 §1.6).

    Everything is validated before anything is loaded; a refusal is a ValueError naming the path and the key
    (a missing file: FileNotFoundError).
    """
    def refuse(key, why):
        raise ValueError(f"load_checkpoint {path}: {key}: {why}")

    if world_size is not None and not _is_int(world_size, 1):
        refuse("world_size", f"must be None or an int >= 1, got {world_size!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"load_checkpoint {path}: no such file")
    try:
        ckp = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # empty, truncated, garbage, a directory, an object weights_only refuses ...
        raise ValueError(f"load_checkpoint {path}: not a readable checkpoint ({type(e).__name__}: {e})") from e

    if not isinstance(ckp, dict):
        refuse("checkpoint", f"expected a dict, got {type(ckp).__name__}")
    for key in _REQUIRED_KEYS:
        if key not in ckp:
            refuse(key, "missing (a weights-only file, or not written by save_checkpoint)")
    for key, minimum in (("epoch", 0), ("step", 0), ("world_size", 1)):
        if not _is_int(ckp[key], minimum):
            refuse(key, f"must be an int >= {minimum}, got {ckp[key]!r}")

    net = _unwrap(model)
    saved_config, config = ckp["model_config"], dataclasses.asdict(net.config)
    if not isinstance(saved_config, dict):
        refuse("model_config", f"expected a dict, got {type(saved_config).__name__}")
    for field in sorted(set(saved_config) | set(config)):
        if field not in saved_config or field not in config or saved_config[field] != config[field]:
            refuse(f"model_config.{field}", f"saved {saved_config.get(field, '<missing>')!r}, "
                                            f"model has {config.get(field, '<missing>')!r}")

    saved_model, expected = ckp["model"], net.state_dict()
    if not isinstance(saved_model, dict):
        refuse("model", f"expected a state_dict, got {type(saved_model).__name__}")
    for name in sorted(set(saved_model) | set(expected)):
        if name not in saved_model:
            refuse(name, "missing from the checkpoint")
        if name not in expected:
            refuse(name, "not a key of this model")
        t, ref = saved_model[name], expected[name]
        if not torch.is_tensor(t) or t.shape != ref.shape or t.dtype != ref.dtype:
            got = f"{tuple(t.shape)} {t.dtype}" if torch.is_tensor(t) else type(t).__name__
            refuse(name, f"saved {got}, model has {tuple(ref.shape)} {ref.dtype}")

    if optimizer is not None:
        _check_optimizer(ckp["optimizer"], optimizer, refuse)
    if scaler is not None and scaler.is_enabled() and (not isinstance(ckp["scaler"], dict) or not ckp["scaler"]):
        refuse("scaler", "the scaler is enabled but the checkpoint holds no GradScaler state")

    # Everything checked: now load.
    net.load_state_dict(ckp["model"])
    if optimizer is not None:
        optimizer.load_state_dict(ckp["optimizer"])
    if scaler is not None and ckp["scaler"]:
        scaler.load_state_dict(ckp["scaler"])

    result = dict(ckp)
    current = world_size if world_size is not None else _current_world_size()
    if ckp["world_size"] != current:
        result["step"] = ckp["step"] * ckp["world_size"] // current
    return result


def _check_optimizer(saved, optimizer, refuse) -> None:
    """Refuse an optimizer state that ``optimizer.load_state_dict`` would reject or load wrongly."""
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        refuse("optimizer", "no optimizer state_dict in the file")
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        refuse("optimizer", f"{len(saved['param_groups'])} param groups saved, the optimizer has {len(groups)}")
    params_by_id = {}
    for i, (saved_group, group) in enumerate(zip(saved["param_groups"], groups)):
        if not isinstance(saved_group, dict) or len(saved_group.get("params", ())) != len(group["params"]):
            refuse("optimizer", f"param group {i} holds another number of parameters")
        if set(saved_group) != set(group):
            refuse("optimizer", f"param group {i} has other hyper-parameters "
                                f"({sorted(set(saved_group) ^ set(group))}): another optimizer type?")
        params_by_id.update(zip(saved_group["params"], group["params"]))
    for pid, state in saved["state"].items():
        if pid not in params_by_id:
            refuse("optimizer", f"state for parameter id {pid!r}, which no param group holds")
        param = params_by_id[pid]
        for name, value in (state.items() if isinstance(state, dict) else ()):
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:
                refuse("optimizer", f"state {name!r} of parameter {pid} is {tuple(value.shape)}, "
                                    f"the parameter is {tuple(param.shape)}")


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """Where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)``.

    As upstream (``ckp['epoch'], ckp['step']``), except that a checkpoint written at the end of an epoch
    (``step == iters``, the micro-batches of an epoch) continues at step 0 of the next epoch.
    Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    """
    if not _is_int(iters, 1):
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    epoch, step = checkpoint["epoch"], checkpoint["step"]
    if not _is_int(step, 0) or step > iters:
        raise ValueError(f"step {step!r} of the checkpoint is outside [0, iters={iters}]")
    return (epoch + 1, 0) if step == iters else (epoch, step)
