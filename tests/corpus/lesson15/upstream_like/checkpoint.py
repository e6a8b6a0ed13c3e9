"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.

This version follows upstream MiniMind's ``SkipBatchSampler`` and ``lm_checkpoint`` (course/minimind/
trainer_utils.py) line by line where it can, and changes what lesson 15 §8 says upstream gets wrong:
fp32 instead of fp16 weights, ``fsync`` before ``os.replace``, explicit ``weights_only=True`` with
``map_location="cpu"``, validation before anything is loaded, and refusals instead of silent fallbacks.
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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def current_world_size() -> int:
    """Upstream's ``current_world_size``."""
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main_process() -> bool:
    """Upstream's ``is_main_process``: rank 0, or no process group at all."""
    return not dist.is_initialized() or dist.get_rank() == 0


def unwrap_model(model):
    """Upstream unwraps with ``model.module if isinstance(model, DistributedDataParallel)`` and
    ``getattr(model, "_orig_mod", model)``; here both, repeatedly, in whatever order they were applied."""
    while isinstance(model, DistributedDataParallel) or hasattr(model, "_orig_mod"):
        model = model.module if isinstance(model, DistributedDataParallel) else model._orig_mod
    return model


class SkipBatchSampler(Sampler):
    """The batches of a resumed epoch, without the ``skip_batches`` already trained (lesson 15 §5.1).

    Upstream's sampler (same iteration, same ``len``), plus the argument checks upstream lacks. The epoch is
    ``indices`` (any sized iterable: a range, a list, a DistributedSampler) cut in order into batches of
    ``batch_size``, the last one possibly shorter; the sampler yields them without the first ``skip_batches``.
    Each pass reads ``indices`` again (a sampler reshuffled by ``set_epoch`` gives its new order).
    Examples: (range(5), 2) -> [0, 1], [2, 3], [4]; (range(7), 3, 1) -> [3, 4, 5], [6], len 2.
    """

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        if not isinstance(indices, Sized):
            raise TypeError(f"SkipBatchSampler: indices must be sized (have a len()), got {type(indices).__name__}")
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"SkipBatchSampler: batch_size must be an int >= 1, got {batch_size!r}")
        total_batches = (len(indices) + batch_size - 1) // batch_size
        if not _is_int(skip_batches) or skip_batches < 0 or skip_batches > total_batches:
            raise ValueError(f"SkipBatchSampler: skip_batches must be an int in [0, {total_batches}], "
                             f"got {skip_batches!r} (a checkpoint of another batch size or dataset?)")
        self.sampler = indices
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    def __iter__(self):
        batch, skipped = [], 0
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                if skipped < self.skip_batches:
                    skipped += 1
                    batch = []
                    continue
                yield batch
                batch = []
        if len(batch) > 0 and skipped >= self.skip_batches:
            yield batch

    def __len__(self):
        total_batches = (len(self.sampler) + self.batch_size - 1) // self.batch_size
        return max(0, total_batches - self.skip_batches)


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """The save half of ``lm_checkpoint``, writing only the resume file, to ``path``.

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept: upstream's ``.half()`` is dropped), ``optimizer`` and ``scaler`` (their state_dicts;
    None without a scaler), ``epoch``, ``step``, ``world_size``, ``model_config`` and one entry per extra keyword
    (upstream's ``kwargs`` loop, keeping ``None`` values too). Written to ``path + ".tmp"``, fsynced, then
    ``os.replace``d; on any failure the ``.tmp`` is removed and the previous file stays. Refused with a
    ValueError: counters that are not ints >= 0, an extra that would overwrite a key, gradients pending inside
    an accumulation window. Under torch.distributed every rank checks, rank 0 writes.
    Example: ``save_checkpoint("out/resume.pth", model=m, optimizer=o, scaler=None, epoch=0, step=4)``.
    """
    for key, value in (("epoch", epoch), ("step", step)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"save_checkpoint: {key} must be an int >= 0, got {value!r}")
    for key in extra:
        if key in ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config"):
            raise ValueError(f"save_checkpoint: extra keyword {key!r} would overwrite the checkpoint's {key!r}")
    raw_model = unwrap_model(model)
    for name, param in raw_model.named_parameters():
        if param.grad is not None and bool(param.grad.ne(0).any()):
            raise ValueError(f"save_checkpoint: {name} has a non-zero gradient, the save falls inside an "
                             "accumulation window (pending gradients are in no state_dict); save at an update "
                             "boundary")
    if not is_main_process():
        return

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    resume_path = os.fspath(path)
    state_dict = raw_model.state_dict()      # upstream: {k: v.half().cpu() ...}; fp32 for an exact resume
    resume_data = {"model": state_dict, "optimizer": optimizer.state_dict(),
                   "scaler": scaler.state_dict() if scaler is not None else None,
                   "epoch": epoch, "step": step, "world_size": current_world_size(),
                   "model_config": dataclasses.asdict(raw_model.config)}
    for key, value in extra.items():
        resume_data[key] = value.state_dict() if hasattr(value, "state_dict") else value
    resume_tmp = resume_path + ".tmp"
    try:
        with open(resume_tmp, "wb") as f:
            torch.save(resume_data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(resume_tmp, resume_path)
    except BaseException:
        if os.path.exists(resume_tmp):
            os.remove(resume_tmp)
        raise


def _validate(path, ckp_data, model, optimizer, scaler) -> None:
    """Everything upstream leaves to ``load_state_dict`` (which fails after part of the state is loaded),
    checked up front. Each refusal is a ValueError naming ``path`` and the key."""
    if not isinstance(ckp_data, dict):
        raise ValueError(f"{path}: not a resume checkpoint (a {type(ckp_data).__name__}, not a dict)")
    for key in ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config"):
        if key not in ckp_data:
            raise ValueError(f"{path}: missing key {key!r} (a weights file, or not a resume checkpoint)")
    for key, lowest in (("epoch", 0), ("step", 0), ("world_size", 1)):
        if not _is_int(ckp_data[key]) or ckp_data[key] < lowest:
            raise ValueError(f"{path}: {key} must be an int >= {lowest}, got {ckp_data[key]!r}")

    # the model: config field by field, then every tensor's name, shape and dtype
    saved_config, config = ckp_data["model_config"], dataclasses.asdict(model.config)
    if not isinstance(saved_config, dict):
        raise ValueError(f"{path}: model_config is not a dict")
    for field in sorted(set(saved_config) | set(config), key=str):
        if field not in saved_config or field not in config or saved_config[field] != config[field]:
            raise ValueError(f"{path}: model_config field {field!r} differs: file "
                             f"{saved_config.get(field, '<absent>')!r}, model {config.get(field, '<absent>')!r}")
    saved_state, state = ckp_data["model"], model.state_dict()
    if not isinstance(saved_state, dict):
        raise ValueError(f"{path}: model entry is not a state_dict")
    for name in sorted(set(saved_state) | set(state), key=str):
        if name not in state:
            raise ValueError(f"{path}: unexpected model key {name!r}")
        if name not in saved_state:
            raise ValueError(f"{path}: missing model key {name!r}")
        saved = saved_state[name]
        if not isinstance(saved, torch.Tensor):
            raise ValueError(f"{path}: model key {name!r} is not a tensor")
        if saved.shape != state[name].shape or saved.dtype != state[name].dtype:
            raise ValueError(f"{path}: model key {name!r} is {saved.dtype}{list(saved.shape)}, the model expects "
                             f"{state[name].dtype}{list(state[name].shape)}")

    # the optimizer: what torch's load_state_dict checks, and what it does not (keys, unknown ids, shapes)
    if optimizer is not None:
        saved_opt = ckp_data["optimizer"]
        if not (isinstance(saved_opt, dict) and isinstance(saved_opt.get("state"), dict)
                and isinstance(saved_opt.get("param_groups"), list)
                and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in saved_opt["param_groups"])):
            raise ValueError(f"{path}: optimizer entry is not an optimizer state_dict")
        groups, saved_groups = optimizer.param_groups, saved_opt["param_groups"]
        if len(groups) != len(saved_groups):
            raise ValueError(f"{path}: optimizer has {len(saved_groups)} param groups in the file, expected "
                             f"{len(groups)}")
        id_map = {}
        for group, saved_group in zip(groups, saved_groups):
            if len(group["params"]) != len(saved_group["params"]):
                raise ValueError(f"{path}: optimizer param group sizes differ ({len(saved_group['params'])} in "
                                 f"the file, {len(group['params'])} expected)")
            if set(group) != set(saved_group):
                raise ValueError(f"{path}: optimizer hyper-parameters differ (another optimizer type?): "
                                 f"{sorted(set(group) ^ set(saved_group))}")
            id_map.update(zip(saved_group["params"], group["params"]))
        for pid, param_state in saved_opt["state"].items():
            if pid not in id_map or not isinstance(param_state, dict):
                raise ValueError(f"{path}: optimizer state for parameter id {pid!r} that no param group holds")
            for key, value in param_state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != id_map[pid].shape:
                    raise ValueError(f"{path}: optimizer state {key!r} of parameter {pid!r} has shape "
                                     f"{list(value.shape)}, the parameter {list(id_map[pid].shape)}")

    # the scaler: torch refuses an empty state only after the model is loaded
    saved_scaler = ckp_data["scaler"]
    if saved_scaler is not None and not isinstance(saved_scaler, dict):
        raise ValueError(f"{path}: scaler entry is not a state_dict")
    if scaler is not None and scaler.is_enabled():
        if not saved_scaler:
            raise ValueError(f"{path}: scaler state is empty (saved without an enabled GradScaler) and this "
                             "GradScaler is enabled")
        if not set(scaler.state_dict()) <= set(saved_scaler):
            raise ValueError(f"{path}: scaler state lacks {sorted(set(scaler.state_dict()) - set(saved_scaler))}")


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """The load half of ``lm_checkpoint`` plus the ``load_state_dict`` calls of upstream's ``main``.

    Restores a ``save_checkpoint`` file into ``model`` (and ``optimizer`` and ``scaler`` when given) bit for
    bit and returns its dict. Unlike upstream: a missing file is a FileNotFoundError (not ``None``), the load
    is ``weights_only=True`` onto the CPU, and everything is validated before anything is loaded: a file an
    exact resume cannot start from (a weights-only file, fp16 weights, another model's shapes or config, another
    optimizer's state, no scaler state for an enabled scaler) is a ValueError naming the path. ``world_size``
    (default: the current one): when it differs from the saved one, ``step`` is rescaled as upstream does.
    Example: step 2 saved by 2 ranks -> step 4 on 1 rank.
    """
    if world_size is not None and (not _is_int(world_size) or world_size < 1):
        raise ValueError(f"{path}: world_size must be None or an int >= 1, got {world_size!r}")
    resume_path = os.fspath(path)
    if not os.path.exists(resume_path):
        raise FileNotFoundError(f"{resume_path}: no resume checkpoint")
    try:
        ckp_data = torch.load(resume_path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{resume_path}: unreadable checkpoint ({type(exc).__name__}: {exc})") from exc
    raw_model = unwrap_model(model)
    _validate(resume_path, ckp_data, raw_model, optimizer, scaler)

    # upstream's main(): model, optimizer, scaler from the checkpoint
    raw_model.load_state_dict(ckp_data["model"])
    if optimizer is not None:
        optimizer.load_state_dict(ckp_data["optimizer"])
    if scaler is not None and ckp_data["scaler"]:
        scaler.load_state_dict(ckp_data["scaler"])

    saved_ws = ckp_data["world_size"]
    current_ws = current_world_size() if world_size is None else world_size
    if saved_ws != current_ws:
        ckp_data["step"] = ckp_data["step"] * saved_ws // current_ws
    return ckp_data


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """``start_epoch, start_step = ckp['epoch'], ckp['step']`` as upstream, except that a checkpoint written at
    the end of an epoch (``step == iters``) continues at step 0 of the next epoch (upstream would run an empty
    epoch first). Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    """
    if not _is_int(iters) or iters < 1:
        raise ValueError(f"resume_position: iters must be an int >= 1, got {iters!r}")
    start_epoch, start_step = checkpoint["epoch"], checkpoint["step"]
    if not _is_int(start_step) or not 0 <= start_step <= iters:
        raise ValueError(f"resume_position: step must be an int in [0, {iters}], got {start_step!r}")
    if start_step == iters:
        start_epoch, start_step = start_epoch + 1, 0
    return start_epoch, start_step
