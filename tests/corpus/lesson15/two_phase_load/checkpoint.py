"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.
"""
from __future__ import annotations

import dataclasses  # noqa: F401 - model.config is a dataclass
import itertools
import math
import os  # noqa: F401 - os.replace, os.fsync
import tempfile  # noqa: F401 - a temporary file next to the target
from collections.abc import Sized  # noqa: F401 - what has a len()
from pathlib import Path  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - unwrapped before saving
from torch.utils.data import Sampler

_RESERVED = ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config")


def _strict_int(value) -> bool:
    # bool subclasses int, but True is not a step count nor a batch size
    return type(value) is not bool and isinstance(value, int)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _plain_model(model):
    """Strip DistributedDataParallel (.module) and torch.compile (._orig_mod) wrappers, in any order."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
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
            raise TypeError(f"indices needs a len(): got a {type(indices).__name__} (a generator or iterator "
                            "has no number of batches and would be empty on the second pass)")
        if not _strict_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        n_batches = math.ceil(len(indices) / batch_size)
        if not _strict_int(skip_batches) or skip_batches < 0 or skip_batches > n_batches:
            raise ValueError(f"skip_batches must be an int between 0 and {n_batches} (batches in the epoch), "
                             f"got {skip_batches!r}")
        self.indices = indices
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    def __iter__(self):
        # the trained batches are whole ones: drop their skip_batches * batch_size indices, batch the rest
        remaining = itertools.islice(iter(self.indices), self.skip_batches * self.batch_size, None)
        while True:
            batch = list(itertools.islice(remaining, self.batch_size))
            if not batch:
                return
            yield batch

    def __len__(self) -> int:
        return max(0, math.ceil(len(self.indices) / self.batch_size) - self.skip_batches)


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write to ``path`` everything an exact resume needs (the save half of ``lm_checkpoint``).

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept), ``optimizer`` and ``scaler`` (their state_dicts; None without a scaler), ``epoch``,
    ``step``, ``world_size``, ``model_config`` (``dataclasses.asdict(model.config)``) and one entry per extra
    keyword. The bytes go to a temporary file in the target's directory, are fsynced, and ``os.replace`` puts
    it in place: a save that fails halfway (any BaseException) leaves the previous file as it was. A save with
    gradients still pending (inside an accumulation window) is refused with a ValueError; under
    torch.distributed every rank checks, only rank 0 writes.
    Example: ``save_checkpoint("out/resume.pth", model=m, optimizer=o, scaler=None, epoch=0, step=4)``.
    """
    # -- checks, on every rank
    if not _strict_int(epoch) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    if not _strict_int(step) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    for key in extra:
        if key in _RESERVED:
            raise ValueError(f"extra key {key!r} is one of the checkpoint's own entries {_RESERVED}")
    plain = _plain_model(model)
    for name, param in plain.named_parameters():
        grad = param.grad
        if grad is not None and torch.count_nonzero(grad).item() > 0:   # NaN and inf are non-zero
            raise ValueError(f"parameter {name} holds a pending gradient: the save is inside an accumulation "
                             "window, whose gradients no state_dict keeps; save after the optimizer step")
    if _distributed() and dist.get_rank() != 0:
        return

    # -- the dict
    payload = {
        "model": plain.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "epoch": epoch,
        "step": step,
        "world_size": dist.get_world_size() if _distributed() else 1,
        "model_config": dataclasses.asdict(plain.config),
    }
    for key, value in extra.items():
        payload[key] = value.state_dict() if hasattr(value, "state_dict") else value

    # -- the atomic, durable write
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    tmp = tempfile.NamedTemporaryFile(mode="wb", dir=directory, prefix=os.path.basename(target) + ".",
                                      suffix=".tmp", delete=False)
    try:
        with tmp:
            torch.save(payload, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, target)
    except BaseException:
        try:
            os.unlink(tmp.name)
        except FileNotFoundError:
            pass
        raise


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """Restore a ``save_checkpoint`` file into ``model`` (and ``optimizer`` and ``scaler`` when given) bit for
    bit; return its dict.

    Two phases: first read the file and check every entry against ``model``, ``optimizer`` and ``scaler``
    (nothing is changed); then, only when all of it passed, call their ``load_state_dict``. A refusal is a
    ValueError naming the path and the key: a weights-only file, fp16 weights, another model's shapes or config,
    another optimizer's state, no scaler state for an enabled scaler (a missing file: FileNotFoundError). The
    file is read with ``weights_only=True`` onto the CPU. ``world_size`` (default: the current one): when it
    differs from the saved one, the returned ``step`` is rescaled as upstream does (lesson 15 §1.6).
    Example: step 2 saved by 2 ranks -> step 4 on 1 rank.
    """
    # ---------------- phase 1: read and validate into locals ----------------
    if world_size is None:
        target_world_size = dist.get_world_size() if _distributed() else 1
    elif _strict_int(world_size) and world_size >= 1:
        target_world_size = world_size
    else:
        raise ValueError(f"{path}: world_size must be None or an int >= 1, got {world_size!r}")

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path}: cannot be read as a checkpoint: {type(exc).__name__}: {exc}") from exc
    if not isinstance(ckpt, dict):
        raise ValueError(f"{path}: expected a dict, found {type(ckpt).__name__}")
    for key in ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config"):
        if key not in ckpt:
            raise ValueError(f"{path}: key {key!r} missing: not a resume checkpoint (a weights file?)")

    model_state = ckpt["model"]
    if not isinstance(model_state, dict):
        raise ValueError(f"{path}: 'model' is a {type(model_state).__name__}, not a state_dict")
    epoch, step, saved_world_size = ckpt["epoch"], ckpt["step"], ckpt["world_size"]
    if not _strict_int(epoch) or epoch < 0:
        raise ValueError(f"{path}: epoch must be an int >= 0, got {epoch!r}")
    if not _strict_int(step) or step < 0:
        raise ValueError(f"{path}: step must be an int >= 0, got {step!r}")
    if not _strict_int(saved_world_size) or saved_world_size < 1:
        raise ValueError(f"{path}: world_size must be an int >= 1, got {saved_world_size!r}")

    plain = _plain_model(model)
    config, wanted_config = ckpt["model_config"], dataclasses.asdict(plain.config)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: model_config is a {type(config).__name__}, not a dict")
    for field in list(wanted_config) + [f for f in config if f not in wanted_config]:
        if field not in config:
            raise ValueError(f"{path}: model_config has no field {field!r}")
        if field not in wanted_config:
            raise ValueError(f"{path}: model_config has a field {field!r} this model's config does not")
        if config[field] != wanted_config[field]:
            raise ValueError(f"{path}: model_config field {field!r} is {config[field]!r}, the model's is "
                             f"{wanted_config[field]!r}")

    wanted_state = plain.state_dict()
    for name in list(wanted_state) + [n for n in model_state if n not in wanted_state]:
        if name not in model_state:
            raise ValueError(f"{path}: model parameter {name!r} missing from the file")
        if name not in wanted_state:
            raise ValueError(f"{path}: model parameter {name!r} in the file is not in this model")
        value, like = model_state[name], wanted_state[name]
        if not torch.is_tensor(value):
            raise ValueError(f"{path}: model entry {name!r} is a {type(value).__name__}, not a tensor")
        if value.shape != like.shape:
            raise ValueError(f"{path}: model parameter {name!r} has shape {tuple(value.shape)}, "
                             f"the model {tuple(like.shape)}")
        if value.dtype != like.dtype:
            raise ValueError(f"{path}: model parameter {name!r} is {value.dtype}, the model is {like.dtype} "
                             "(a half-precision export cannot resume exactly)")

    optimizer_state = ckpt["optimizer"]
    if optimizer is not None:
        _validate_optimizer_state(path, optimizer_state, optimizer)

    scaler_state = ckpt["scaler"]
    if scaler_state is not None and not isinstance(scaler_state, dict):
        raise ValueError(f"{path}: scaler is a {type(scaler_state).__name__}, not a state_dict")
    scaler_to_load = None
    if scaler is not None and scaler.is_enabled():
        if not scaler_state:
            raise ValueError(f"{path}: scaler state is empty (a disabled GradScaler or none wrote it), "
                             "but this scaler is enabled")
        for key in scaler.state_dict():
            if key not in scaler_state:
                raise ValueError(f"{path}: scaler state lacks {key!r}")
        scaler_to_load = scaler_state

    if saved_world_size != target_world_size:
        step = step * saved_world_size // target_world_size

    # ---------------- phase 2: apply, all checks passed ----------------
    plain.load_state_dict(model_state)
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state)
    if scaler_to_load is not None:
        scaler.load_state_dict(scaler_to_load)
    result = dict(ckpt)
    result["step"] = step
    return result


def _validate_optimizer_state(path, state, optimizer) -> None:
    """Refuse (ValueError naming ``optimizer``) a saved state that ``optimizer.load_state_dict`` would reject or
    load wrongly: another group layout, other hyper-parameter keys, unknown ids, moments of another shape."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict) \
            or not isinstance(state.get("param_groups"), list):
        raise ValueError(f"{path}: optimizer entry is not an optimizer state_dict")
    saved_groups, groups = state["param_groups"], optimizer.param_groups
    if len(saved_groups) != len(groups):
        raise ValueError(f"{path}: optimizer state has {len(saved_groups)} param groups, the optimizer "
                         f"{len(groups)}")
    param_of_id = {}
    for index, (saved, group) in enumerate(zip(saved_groups, groups)):
        if not isinstance(saved, dict) or not isinstance(saved.get("params"), list):
            raise ValueError(f"{path}: optimizer param group {index} has no params list")
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(f"{path}: optimizer param group {index} has {len(saved['params'])} parameters, "
                             f"the optimizer's {len(group['params'])}")
        saved_keys = sorted(k for k in saved if k != "params")
        keys = sorted(k for k in group if k != "params")
        if saved_keys != keys:
            raise ValueError(f"{path}: optimizer param group {index} hyper-parameters {saved_keys} differ from "
                             f"{keys} (another optimizer type)")
        for pid, param in zip(saved["params"], group["params"]):
            param_of_id[pid] = param
    for pid, per_param in state["state"].items():
        if pid not in param_of_id:
            raise ValueError(f"{path}: optimizer state for parameter id {pid!r}, which no param group holds")
        if not isinstance(per_param, dict):
            raise ValueError(f"{path}: optimizer state for parameter id {pid!r} is not a dict")
        param = param_of_id[pid]
        for key, value in per_param.items():
            # scalars (AdamW's step) aside, every state tensor has its parameter's shape
            if torch.is_tensor(value) and value.ndim > 0 and tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"{path}: optimizer state {key!r} of parameter id {pid!r} has shape "
                                 f"{tuple(value.shape)}, the parameter {tuple(param.shape)}")


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """Where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)`` (lesson 15 §5.4).

    As upstream (``ckp['epoch'], ckp['step']``), except that a checkpoint written at the end of an epoch
    (``step == iters``, the micro-batches of an epoch) continues at step 0 of the next epoch.
    Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    """
    if not _strict_int(iters) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    step = checkpoint["step"]
    if not _strict_int(step) or step < 0 or step > iters:
        raise ValueError(f"step {step!r} is outside [0, iters={iters}]")
    epoch = checkpoint["epoch"]
    if step == iters:
        return epoch + 1, 0
    return epoch, step
