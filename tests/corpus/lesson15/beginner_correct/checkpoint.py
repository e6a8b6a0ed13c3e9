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


def is_int(value):
    # a bool is an int in Python, but True is not a batch size or a step
    return isinstance(value, int) and not isinstance(value, bool)


class SkipBatchSampler(Sampler):
    """The batches of a resumed epoch, without the ``skip_batches`` already trained (lesson 15 §5.1).

    Same batches and length as ``course/minimind/trainer_utils.py::SkipBatchSampler``, plus argument checks.
    Examples: (range(5), 2) -> [0, 1], [2, 3], [4]; (range(7), 3, 1) -> [3, 4, 5], [6], len 2.
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        if not isinstance(indices, Sized):
            raise TypeError("indices must have a len() (a range, a list or a sampler), not a generator")
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        num_batches = (len(indices) + batch_size - 1) // batch_size
        if not is_int(skip_batches) or skip_batches < 0 or skip_batches > num_batches:
            raise ValueError(f"skip_batches must be between 0 and {num_batches}, got {skip_batches!r}")
        self.indices = indices
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    def __iter__(self):
        batch = []
        skipped = 0
        for idx in self.indices:
            batch.append(idx)
            if len(batch) == self.batch_size:
                if skipped < self.skip_batches:
                    skipped += 1
                else:
                    yield batch
                batch = []
        if len(batch) > 0 and skipped >= self.skip_batches:
            yield batch

    def __len__(self):
        num_batches = (len(self.indices) + self.batch_size - 1) // self.batch_size
        return max(0, num_batches - self.skip_batches)


def unwrap(model):
    # DDP keeps the model in .module, torch.compile in ._orig_mod
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def current_world_size():
    if dist.is_initialized():
        return dist.get_world_size()
    return 1


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write to ``path`` everything an exact resume needs (lesson 15 §5.2).

    The dict holds ``model`` (fp32 state_dict of the unwrapped model), ``optimizer``, ``scaler`` (None without
    a scaler), ``epoch``, ``step``, ``world_size``, ``model_config`` and the extra keywords. The file is written
    to ``path + ".tmp"``, fsynced and renamed with ``os.replace``. Refuses pending gradients. Rank 0 writes.
    """
    if not is_int(epoch) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    if not is_int(step) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    for key in extra:
        if key in ("world_size", "model_config"):
            raise ValueError(f"extra keyword {key!r} would overwrite the checkpoint's {key!r}")

    model = unwrap(model)
    for name, param in model.named_parameters():
        if param.grad is not None and (param.grad != 0).any():
            raise ValueError(f"parameter {name} still has a gradient: saving inside an accumulation window "
                             f"would lose it, save at an update boundary")

    if dist.is_initialized() and dist.get_rank() != 0:
        return

    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": epoch,
        "step": step,
        "world_size": current_world_size(),
        "model_config": dataclasses.asdict(model.config),
    }
    for key, value in extra.items():
        if hasattr(value, "state_dict"):
            checkpoint[key] = value.state_dict()
        else:
            checkpoint[key] = value

    path = str(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp_path = path + ".tmp"
    try:
        with open(tmp_path, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """Restore a ``save_checkpoint`` file into ``model`` (and ``optimizer`` and ``scaler``); return its dict.

    Everything is checked before anything is loaded: a file that an exact resume cannot start from raises a
    ValueError naming the path. ``step`` is rescaled when the world size changed (lesson 15 §1.6).
    """
    if world_size is None:
        world_size = current_world_size()
    elif not is_int(world_size) or world_size < 1:
        raise ValueError(f"{path}: world_size must be None or an int >= 1, got {world_size!r}")

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path}: cannot read the checkpoint ({e})") from e
    if not isinstance(ckpt, dict):
        raise ValueError(f"{path}: not a checkpoint dict")

    for key in ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config"):
        if key not in ckpt:
            raise ValueError(f"{path}: missing key {key!r} (is this a weights file?)")
    if not isinstance(ckpt["model"], dict):
        raise ValueError(f"{path}: 'model' is not a state dict")
    for key in ("epoch", "step"):
        if not is_int(ckpt[key]) or ckpt[key] < 0:
            raise ValueError(f"{path}: {key} must be an int >= 0, got {ckpt[key]!r}")
    if not is_int(ckpt["world_size"]) or ckpt["world_size"] < 1:
        raise ValueError(f"{path}: world_size must be an int >= 1, got {ckpt['world_size']!r}")

    # the model
    model = unwrap(model)
    config = dataclasses.asdict(model.config)
    saved_config = ckpt["model_config"]
    if not isinstance(saved_config, dict):
        raise ValueError(f"{path}: model_config is not a dict")
    for field in list(config) + [field for field in saved_config if field not in config]:
        if field not in saved_config or field not in config or saved_config[field] != config[field]:
            raise ValueError(f"{path}: model_config field {field!r} differs: saved "
                             f"{saved_config.get(field, '<missing>')!r}, model {config.get(field, '<missing>')!r}")
    expected = model.state_dict()
    saved = ckpt["model"]
    for name in list(expected) + [name for name in saved if name not in expected]:
        if name not in saved:
            raise ValueError(f"{path}: parameter {name} is missing from the checkpoint")
        if name not in expected:
            raise ValueError(f"{path}: parameter {name} is not in the model")
        if not isinstance(saved[name], torch.Tensor):
            raise ValueError(f"{path}: parameter {name} is not a tensor")
        if saved[name].shape != expected[name].shape or saved[name].dtype != expected[name].dtype:
            raise ValueError(f"{path}: parameter {name} is {saved[name].dtype} {list(saved[name].shape)}, the "
                             f"model has {expected[name].dtype} {list(expected[name].shape)}")

    # the optimizer
    if optimizer is not None:
        saved_opt = ckpt["optimizer"]
        if not isinstance(saved_opt, dict) or "state" not in saved_opt or "param_groups" not in saved_opt:
            raise ValueError(f"{path}: no optimizer state_dict in the checkpoint")
        if len(saved_opt["param_groups"]) != len(optimizer.param_groups):
            raise ValueError(f"{path}: optimizer has a different number of param groups")
        params_by_id = {}
        for saved_group, group in zip(saved_opt["param_groups"], optimizer.param_groups):
            if len(saved_group["params"]) != len(group["params"]):
                raise ValueError(f"{path}: optimizer param group has a different number of parameters")
            if set(saved_group) != set(group):
                raise ValueError(f"{path}: optimizer hyper-parameters differ (another optimizer?)")
            for param_id, param in zip(saved_group["params"], group["params"]):
                params_by_id[param_id] = param
        for param_id, state in saved_opt["state"].items():
            if param_id not in params_by_id:
                raise ValueError(f"{path}: optimizer state for an unknown parameter id {param_id}")
            for key, value in state.items():
                if key == "step":
                    continue
                if isinstance(value, torch.Tensor) and value.shape != params_by_id[param_id].shape:
                    raise ValueError(f"{path}: optimizer state {key} has shape {list(value.shape)}, its parameter "
                                     f"{list(params_by_id[param_id].shape)}")

    # the scaler
    if scaler is not None and scaler.is_enabled() and not ckpt["scaler"]:
        raise ValueError(f"{path}: the scaler is enabled but the checkpoint has no scaler state")

    # all checks passed: load
    model.load_state_dict(ckpt["model"])
    if optimizer is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    if scaler is not None and scaler.is_enabled():
        scaler.load_state_dict(ckpt["scaler"])

    if ckpt["world_size"] != world_size:
        ckpt["step"] = ckpt["step"] * ckpt["world_size"] // world_size
    return ckpt


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """``(start_epoch, start_step)`` after loading ``checkpoint`` (lesson 15 §5.4).

    Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    """
    if not is_int(iters) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    epoch = checkpoint["epoch"]
    step = checkpoint["step"]
    if not is_int(step) or step < 0 or step > iters:
        raise ValueError(f"step must be between 0 and iters={iters}, got {step!r}")
    if step == iters:
        return epoch + 1, 0
    return epoch, step
