"""Reference solutions for lesson 15 (``impl/checkpoint.py`` is the student's copy).

Where upstream (``course/minimind/trainer_utils.py``: ``SkipBatchSampler``, ``lm_checkpoint``) is
lossy or silent, these are exact and loud: fp32 model state, atomic writes, ``weights_only=True``
loading that validates everything before touching the model, and a refusal to save pending
(accumulated but not yet applied) gradients.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sized
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Sampler

REQUIRED_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size")


def _is_int(value) -> bool:
    """An int that is not a bool: ``True`` is an int to Python but never a batch size, step or world size."""
    return isinstance(value, int) and not isinstance(value, bool)


def _validate_sampler_arguments(indices, batch_size, skip_batches) -> None:
    """The sampler's argument rules (the hardening tier, lesson 15 §5.5): in the order indices, batch_size,
    skip_batches, the first bad one is named."""
    if not isinstance(indices, Sized):
        raise TypeError(f"indices must be sized and re-iterable (a range, list or Sampler), got a "
                        f"{type(indices).__name__}: without len() neither the skip nor len(sampler) is defined")
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    total = (len(indices) + batch_size - 1) // batch_size
    if not _is_int(skip_batches) or not 0 <= skip_batches <= total:
        raise ValueError(f"skip_batches must be an int in [0, {total}] (the epoch has {total} batches of "
                         f"{batch_size}), got {skip_batches!r}")


class SkipBatchSampler(Sampler):
    """Batches ``indices`` in order, skipping the first ``skip_batches`` full batches (upstream semantics:
    the final partial batch is kept, ``len = ceil(N / batch_size) - skip_batches``). ``indices`` is read
    afresh on every pass (a DistributedSampler reshuffles after ``set_epoch``), so it must be sized."""

    def __init__(self, indices, batch_size: int, skip_batches: int = 0):
        _validate_sampler_arguments(indices, batch_size, skip_batches)
        self.indices = indices
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    def __iter__(self):
        skipped_samples = self.skip_batches * self.batch_size
        batch = []
        for position, index in enumerate(self.indices):  # any iterable sampler, e.g. DistributedSampler
            if position < skipped_samples:
                continue
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def __len__(self) -> int:
        return (len(self.indices) + self.batch_size - 1) // self.batch_size - self.skip_batches


def _world_size(world_size):
    if world_size is None:
        return dist.get_world_size() if dist.is_initialized() else 1
    if not _is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 or None, got {world_size!r}")
    return world_size


def _unwrapped(model):
    """The model itself under its wrappers: DDP keeps it in ``.module``, torch.compile in ``._orig_mod``
    (either may wrap the other), so the saved keys carry no ``module.`` / ``_orig_mod.`` prefix."""
    while isinstance(model, DistributedDataParallel) or hasattr(model, "_orig_mod"):
        model = model.module if isinstance(model, DistributedDataParallel) else model._orig_mod
    return model


def _model_config(model):
    config = getattr(model, "config", None)
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else None


def _validate_save_arguments(epoch, step, extra: dict) -> None:
    """The save's argument rules (the hardening tier, lesson 15 §5.5): counters are ints >= 0, no extra
    overwrites a checkpoint key."""
    if not _is_int(epoch) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    if not _is_int(step) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    overlap = sorted(set(extra) & {*REQUIRED_KEYS, "model_config"})
    if overlap:
        raise ValueError(f"extra keys {overlap} would overwrite the checkpoint's own entries")


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write a resume checkpoint atomically: a temporary file in the same directory, fsync'd, then
    ``os.replace``; the parent directory is created. Under torch.distributed only rank 0 writes.

    Holds the fp32 state of the unwrapped model (no DDP/compile key prefixes), optimizer and scaler
    state, ``epoch``/``step`` (micro-steps done in ``epoch``), the world size and the model config,
    plus ``extra`` (objects with a ``state_dict`` are stored by it, e.g. a training state carrying
    ``batch_size_semantics``).
    """
    path = Path(path)
    model = _unwrapped(model)
    _validate_save_arguments(epoch, step, extra)
    if any(p.grad is not None and bool(p.grad.ne(0).any()) for p in model.parameters()):
        raise ValueError(f"cannot save at epoch {epoch} step {step}: the model holds accumulated gradients "
                         "that a checkpoint cannot carry; save only at an update boundary (after "
                         "optimizer.step and zero_grad), i.e. when step is a multiple of accumulation_steps "
                         "or after the tail flush")
    if dist.is_initialized() and dist.get_rank() != 0:
        return  # every rank holds the same state; one writer, no race on the file
    checkpoint = {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": epoch,
        "step": step,
        "world_size": _world_size(None),
        "model_config": _model_config(model),
    }
    checkpoint.update({k: v.state_dict() if hasattr(v, "state_dict") else v for k, v in extra.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(checkpoint, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


ABSENT = "<absent>"  # a config field only one side has


def _bad(path, what):
    return ValueError(f"checkpoint {str(path)!r}: {what}")


def _validate_model_state(path, state, model, saved_config):
    config = _model_config(model)
    if saved_config is not None and config is not None and saved_config != config:
        pairs = {k: (saved_config.get(k, ABSENT), config.get(k, ABSENT))
                 for k in sorted(config.keys() | saved_config.keys())}
        diff = {k: pair for k, pair in pairs.items() if pair[0] != pair[1]}
        raise _bad(path, f"written for another model config; (checkpoint, model) differ in {diff}")
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise _bad(path, f"model state does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, want in expected.items():
        got = state[name]
        if not torch.is_tensor(got) or got.shape != want.shape:
            shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
            raise _bad(path, f"model.{name} has shape {shape}, the model expects {tuple(want.shape)}")
        if got.dtype != want.dtype:
            raise _bad(path, f"model.{name} is {got.dtype}, the model is {want.dtype}: a lossy weights "
                             "export is not a resume checkpoint")


def _validate_optimizer_state(path, state, optimizer):
    if not isinstance(state, dict) or not {"state", "param_groups"} <= set(state):
        raise _bad(path, "optimizer entry is not an optimizer state_dict")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_ids = [i for group in state["param_groups"] for i in group["params"]]
    unknown = sorted(set(state["state"]) - set(saved_ids), key=str)
    if unknown:
        raise _bad(path, f"optimizer state for parameter ids {unknown[:5]} that no param group holds")
    if len(state["param_groups"]) != len(optimizer.param_groups) or len(saved_ids) != len(params):
        raise _bad(path, f"optimizer state has {len(saved_ids)} parameters in {len(state['param_groups'])} "
                         f"groups, the optimizer {len(params)} in {len(optimizer.param_groups)}")
    for saved_group, group in zip(state["param_groups"], optimizer.param_groups):
        if set(saved_group) != set(group):
            raise _bad(path, f"optimizer hyper-parameters {sorted(set(saved_group) - {'params'})} do not match this "
                             f"optimizer's {sorted(set(group) - {'params'})}: state of another optimizer type")
    for saved_id, param in zip(saved_ids, params):
        for key, value in state["state"].get(saved_id, {}).items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:
                raise _bad(path, f"optimizer {key} of parameter {saved_id} has shape {tuple(value.shape)}, "
                                 f"the parameter {tuple(param.shape)}")


def _validate_checkpoint(path, checkpoint, model, optimizer, scaler) -> None:
    """Everything an exact resume needs of the file, checked against the objects before any of them changes."""
    if not isinstance(checkpoint, dict):
        raise _bad(path, f"holds a {type(checkpoint).__name__}, not a resume checkpoint dict")
    missing = [k for k in REQUIRED_KEYS if k not in checkpoint]
    if missing:
        raise _bad(path, f"missing {missing}: a weights file or another format, not a resume checkpoint")
    for key in ("epoch", "step", "world_size"):
        if not _is_int(checkpoint[key]) or checkpoint[key] < (1 if key == "world_size" else 0):
            raise _bad(path, f"{key} is {checkpoint[key]!r}")
    if not isinstance(checkpoint["model"], dict):
        raise _bad(path, "model entry is not a state_dict")
    _validate_model_state(path, checkpoint["model"], model, checkpoint.get("model_config"))
    if optimizer is not None:
        _validate_optimizer_state(path, checkpoint["optimizer"], optimizer)
    if scaler is not None and scaler.is_enabled() and not checkpoint["scaler"]:
        raise _bad(path, "scaler state is empty (saved from a disabled GradScaler, a run without fp16) but the "
                         "scaler is enabled")


def load_checkpoint(path, *, model, optimizer=None, scaler=None, world_size=None) -> dict:
    """Restore a ``save_checkpoint`` file into ``model`` (and ``optimizer``/``scaler`` when given).

    Reads with ``weights_only=True`` (no arbitrary code from a file), validates every entry BEFORE
    changing anything, and returns the checkpoint dict. When the world size differs from the saved one,
    ``step`` is rescaled as upstream does: ``step * saved // current``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise _bad(path, f"cannot be read with weights_only=True (truncated, not a torch.save file, or "
                         f"holding arbitrary objects): {type(exc).__name__}: {str(exc)[:200]}") from None
    _validate_checkpoint(path, checkpoint, model, optimizer, scaler)
    current = _world_size(world_size)  # the last refusal: it too comes before anything is loaded
    model.load_state_dict(checkpoint["model"])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler is not None and checkpoint["scaler"]:
        scaler.load_state_dict(checkpoint["scaler"])
    if checkpoint["world_size"] != current:
        checkpoint["step"] = checkpoint["step"] * checkpoint["world_size"] // current
    return checkpoint


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """``(start_epoch, start_step)`` for a loop with ``iters`` micro-batches per epoch; a checkpoint
    written at the end of an epoch (``step == iters``) resumes at the start of the next one."""
    if not _is_int(iters) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    epoch, step = checkpoint["epoch"], checkpoint["step"]
    if not 0 <= step <= iters:
        raise ValueError(f"checkpoint step must be in [0, iters={iters}], got {step}: written for a longer "
                         "epoch (other batch_size or data)?")
    return (epoch + 1, 0) if step == iters else (epoch, step)
