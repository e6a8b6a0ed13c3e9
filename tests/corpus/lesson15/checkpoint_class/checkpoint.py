"""Lesson 15 exercises: checkpoint and exact resume.

Read course/lessons/15_checkpoint_resume.md (Chinese: course/lessons/zh/15_checkpoint_resume.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 15``.
"""
from __future__ import annotations

import dataclasses  # noqa: F401 - model.config is a dataclass
import io
import os  # noqa: F401 - os.replace, os.fsync
import tempfile  # noqa: F401 - a temporary file next to the target
from collections.abc import Sized  # noqa: F401 - what has a len()
from pathlib import Path  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401 - the current world size
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - unwrapped before saving
from torch.utils.data import Sampler


def _is_count(value, minimum: int = 0) -> bool:
    """True for an int >= ``minimum``; a bool is not a count."""
    return type(value) is not bool and isinstance(value, int) and value >= minimum


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
            raise TypeError(f"SkipBatchSampler: indices must be sized (a range, a list, a sampler with len()), "
                            f"got {type(indices).__name__}")
        if not _is_count(batch_size, 1):
            raise ValueError(f"SkipBatchSampler: batch_size must be an int >= 1, got {batch_size!r}")
        self.indices = indices
        self.batch_size = batch_size
        if not _is_count(skip_batches, 0) or skip_batches > self._total_batches():
            raise ValueError(f"SkipBatchSampler: skip_batches must be an int in [0, {self._total_batches()}] "
                             f"({len(indices)} indices in batches of {batch_size}), got {skip_batches!r}")
        self.skip_batches = skip_batches

    def _total_batches(self) -> int:
        return (len(self.indices) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        buffer, seen = [], 0
        for index in self.indices:  # read afresh on every pass
            buffer.append(index)
            if len(buffer) == self.batch_size:
                if seen >= self.skip_batches:
                    yield buffer
                seen += 1
                buffer = []  # a new list: the one just yielded belongs to the caller
        if buffer and seen >= self.skip_batches:
            yield buffer

    def __len__(self) -> int:
        return max(0, self._total_batches() - self.skip_batches)


class _CheckpointFile:
    """One resume checkpoint on disk: how it is written (atomically, durably), read (safely, onto the CPU) and
    checked against the objects it is about to be loaded into (lesson 15 §5.2-§5.3)."""

    OWN_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config")
    REQUIRED_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size", "model_config")
    COUNTERS = (("epoch", 0), ("step", 0), ("world_size", 1))

    def __init__(self, path):
        self.path = Path(path)

    # ---- helpers shared by save and load
    @staticmethod
    def unwrap(model):
        """The plain model behind DDP (``.module``) and torch.compile (``._orig_mod``), in any order."""
        while True:
            if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
                model = model.module
            elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
                model = model._orig_mod
            else:
                return model

    @staticmethod
    def current_world_size() -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def error(self, key, message) -> ValueError:
        return ValueError(f"checkpoint {self.path}: {key}: {message}")

    # ---- writing
    def write(self, payload: dict) -> None:
        """Serialize ``payload`` in memory, write it beside the target, fsync, then rename it into place. Any
        failure (Ctrl-C and SystemExit included) removes the temporary file and leaves ``path`` untouched."""
        buffer = io.BytesIO()
        torch.save(payload, buffer)  # a pickling error happens here, before the disk is touched
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as handle:
                handle.write(buffer.getbuffer())
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            raise

    # ---- reading
    def read(self) -> dict:
        if not self.path.exists():
            raise FileNotFoundError(f"checkpoint {self.path}: no such file")
        try:
            data = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # empty, truncated, garbage, a directory, a pickle weights_only refuses ...
            raise self.error("file", f"cannot be read as a checkpoint ({type(exc).__name__}: {exc})") from exc
        if not isinstance(data, dict):
            raise self.error("file", f"holds a {type(data).__name__}, not a checkpoint dict")
        for key in self.REQUIRED_KEYS:
            if key not in data:
                raise self.error(key, "missing: not a resume checkpoint (a weights-only file?)")
        for key, minimum in self.COUNTERS:
            if not _is_count(data[key], minimum):
                raise self.error(key, f"must be an int >= {minimum}, got {data[key]!r}")
        return data

    # ---- validation against live objects
    def check_model(self, data: dict, model) -> None:
        saved_config, config = data["model_config"], dataclasses.asdict(model.config)
        if not isinstance(saved_config, dict):
            raise self.error("model_config", f"not a dict ({type(saved_config).__name__})")
        for field in sorted(saved_config.keys() | config.keys()):
            if field not in config:
                raise self.error(f"model_config.{field}", "saved, but the model's config has no such field")
            if field not in saved_config:
                raise self.error(f"model_config.{field}", "missing from the saved config")
            if saved_config[field] != config[field]:
                raise self.error(f"model_config.{field}", f"saved {saved_config[field]!r}, model {config[field]!r}")

        saved, expected = data["model"], model.state_dict()
        if not isinstance(saved, dict):
            raise self.error("model", f"not a state_dict ({type(saved).__name__})")
        for name in sorted(saved.keys() - expected.keys()):
            raise self.error(name, "in the checkpoint but not a key of this model")
        for name, reference in expected.items():
            if name not in saved:
                raise self.error(name, "missing from the checkpoint")
            tensor = saved[name]
            if not torch.is_tensor(tensor):
                raise self.error(name, f"not a tensor ({type(tensor).__name__})")
            if tensor.shape != reference.shape or tensor.dtype != reference.dtype:
                raise self.error(name, f"saved {tuple(tensor.shape)} {tensor.dtype}, "
                                       f"model {tuple(reference.shape)} {reference.dtype}")

    def check_optimizer(self, data: dict, optimizer) -> None:
        saved = data["optimizer"]
        if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict)
                and isinstance(saved.get("param_groups"), list)):
            raise self.error("optimizer", "no optimizer state_dict")
        saved_groups, groups = saved["param_groups"], optimizer.param_groups
        if len(saved_groups) != len(groups):
            raise self.error("optimizer", f"{len(saved_groups)} param groups saved, {len(groups)} in the optimizer")
        param_of = {}
        for i, (saved_group, group) in enumerate(zip(saved_groups, groups)):
            if not isinstance(saved_group, dict) or not isinstance(saved_group.get("params"), list):
                raise self.error("optimizer", f"param group {i} is malformed")
            if len(saved_group["params"]) != len(group["params"]):
                raise self.error("optimizer", f"param group {i}: {len(saved_group['params'])} parameters saved, "
                                              f"{len(group['params'])} in the optimizer")
            if saved_group.keys() != group.keys():
                raise self.error("optimizer", f"param group {i}: hyper-parameters differ "
                                              f"{sorted(saved_group.keys() ^ group.keys())} (another optimizer?)")
            param_of.update(zip(saved_group["params"], group["params"]))
        for pid, state in saved["state"].items():
            if pid not in param_of:
                raise self.error("optimizer", f"state for parameter id {pid!r} that no param group holds")
            if not isinstance(state, dict):
                raise self.error("optimizer", f"state of parameter {pid!r} is not a dict")
            shape = param_of[pid].shape
            for name, value in state.items():
                # per-element state (exp_avg, exp_avg_sq) must match the parameter; scalars (step) need not
                if torch.is_tensor(value) and value.dim() > 0 and value.shape != shape:
                    raise self.error("optimizer", f"{name} of parameter {pid!r} is {tuple(value.shape)}, "
                                                  f"the parameter is {tuple(shape)}")

    def check_scaler(self, data: dict, scaler) -> None:
        state = data["scaler"]
        if scaler.is_enabled() and not (isinstance(state, dict) and state):
            raise self.error("scaler", "the GradScaler is enabled but the checkpoint holds no scaler state "
                                       "(saved by a run without fp16 scaling)")


def save_checkpoint(path, *, model, optimizer, scaler, epoch, step, **extra) -> None:
    """Write to ``path`` everything an exact resume needs (the save half of ``lm_checkpoint``).

    The file is a dict that ``torch.load(path, weights_only=True)`` reads: ``model`` (the unwrapped model's
    state_dict, fp32 kept), ``optimizer`` and ``scaler`` (their state_dicts; None without a scaler), ``epoch``,
    ``step``, ``world_size``, ``model_config`` (``dataclasses.asdict(model.config)``) and one entry per extra
    keyword. A save that fails halfway leaves the previous file as it was; a save with gradients still pending
    (inside an accumulation window) is refused with a ValueError; under torch.distributed only rank 0 writes.
    Example: ``save_checkpoint("out/resume.pth", model=m, optimizer=o, scaler=None, epoch=0, step=4)``.
    """
    file = _CheckpointFile(path)
    for key, value in (("epoch", epoch), ("step", step)):
        if not _is_count(value, 0):
            raise file.error(key, f"must be an int >= 0, got {value!r}")
    clashing = [key for key in extra if key in _CheckpointFile.OWN_KEYS]
    if clashing:
        raise file.error(clashing[0], "an extra keyword may not overwrite a key the checkpoint writes itself")
    pending = [name for name, p in model.named_parameters() if p.grad is not None and bool(torch.any(p.grad != 0))]
    if pending:
        raise file.error("gradients", f"{len(pending)} parameter(s) hold pending gradients (e.g. {pending[0]}): "
                                      "saving inside an accumulation window would lose them; save at an update boundary")
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return

    net = _CheckpointFile.unwrap(model)
    payload = {
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "epoch": epoch,
        "step": step,
        "world_size": _CheckpointFile.current_world_size(),
        "model_config": dataclasses.asdict(net.config),
    }
    for key, value in extra.items():
        payload[key] = value.state_dict() if hasattr(value, "state_dict") and callable(value.state_dict) else value
    file.write(payload)


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
    file = _CheckpointFile(path)
    if world_size is not None and not _is_count(world_size, 1):
        raise file.error("world_size", f"the argument must be None or an int >= 1, got {world_size!r}")
    data = file.read()
    net = _CheckpointFile.unwrap(model)
    file.check_model(data, net)
    if optimizer is not None:
        file.check_optimizer(data, optimizer)
    if scaler is not None:
        file.check_scaler(data, scaler)

    net.load_state_dict(data["model"])
    if optimizer is not None:
        optimizer.load_state_dict(data["optimizer"])
    if scaler is not None and data["scaler"]:
        scaler.load_state_dict(data["scaler"])

    current = _CheckpointFile.current_world_size() if world_size is None else world_size
    if data["world_size"] != current:
        data["step"] = data["step"] * data["world_size"] // current
    return data


def resume_position(checkpoint, iters: int) -> tuple[int, int]:
    """Where the loop continues after loading ``checkpoint``: ``(start_epoch, start_step)``.

    As upstream (``ckp['epoch'], ckp['step']``), except that a checkpoint written at the end of an epoch
    (``step == iters``, the micro-batches of an epoch) continues at step 0 of the next epoch.
    Examples with iters = 6: {'epoch': 1, 'step': 2} -> (1, 2); {'epoch': 0, 'step': 6} -> (1, 0).
    """
    if not _is_count(iters, 1):
        raise ValueError(f"resume_position: iters must be an int >= 1, got {iters!r}")
    epoch, step = checkpoint["epoch"], checkpoint["step"]
    if not _is_count(step, 0) or step > iters:
        raise ValueError(f"resume_position: step {step!r} is outside [0, iters] = [0, {iters}]")
    if step == iters:
        return epoch + 1, 0
    return epoch, step
