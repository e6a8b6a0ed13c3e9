"""The text run driver (design note §8): it owns data order, counters and checkpoints; the
``TrainingSession`` owns accumulation and the update.

Per update: shuffled indices -> one global batch -> its ``normalization_units`` (valid targets of
the whole global batch, counted on the host BEFORE splitting) -> micro-batches -> ``train_step``
per micro-batch, ``force_update`` on the last one -> when the update closes: lr schedule, counters,
checkpoint cadence and loss readback advance by one UPDATE step. ``max_steps``, ``global_step``
and ``update_step_in_epoch`` all count updates.

Checkpoints are lesson 15's resume checkpoints (``save_checkpoint`` / ``load_checkpoint``: atomic,
validated, ``weights_only``); the training state travels in their ``extra`` keys with
``batch_size_semantics="global"``, so ``step`` counts UPDATES of the epoch. A checkpoint without
``batch_size_semantics`` (e.g. from lesson 15's stage assembly) is a legacy state.
"""
from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

import torch

from course.reference.core import train_session as reference_impl
from course.reference.core.checkpoint import load_checkpoint, save_checkpoint
from course.reference.core.train_loop import cosine_lr
from course.session_types import (GLOBAL_SEMANTICS, TrainingRunState, TrainingSessionState,
                                  TrainingStepOptions)

from .text import collate, token_weighted_step


def epoch_order(sample_count: int, seed: int, epoch: int) -> list[int]:
    """The epoch's shuffled sample indices: a pure function of (seed, epoch), so a resume replays it."""
    return torch.randperm(sample_count, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def dataset_identity(dataset, name: str) -> str:
    return f"{name}:{len(dataset)}"


class LossReadback:
    """Update losses stay on the device until read back, all pending ones in one host copy."""

    def __init__(self):
        self._pending: list[tuple[int, torch.Tensor, int]] = []
        self.values_read = 0

    def push(self, global_step: int, loss_sum: torch.Tensor, loss_units: int) -> None:
        self._pending.append((global_step, loss_sum, loss_units))

    def drain(self) -> dict[int, float]:
        """``{global_step: mean loss per valid token}`` for every update pushed since the last drain."""
        if not self._pending:
            return {}
        sums = torch.stack([s for _, s, _ in self._pending]).double().cpu().tolist()
        values = {step: total / max(units, 1) for (step, _, units), total in zip(self._pending, sums)}
        self.values_read += len(values)
        self._pending.clear()
        return values


def save_train_state(path, session, run: TrainingRunState, *, global_batch_size: int, accum_steps: int) -> Path:
    """Save run state + session state as a lesson-15 resume checkpoint, at an update boundary."""
    if session.microsteps_accumulated:
        raise ValueError(f"a training state is saved at an update boundary; microsteps_accumulated is "
                         f"{session.microsteps_accumulated}")
    run_fields = {k: v for k, v in asdict(run).items() if k not in ("epoch", "update_step_in_epoch")}
    session_state = session.state()
    save_checkpoint(path, model=session.model, optimizer=session.optimizer, scaler=session.scaler,
                    epoch=run.epoch, step=run.update_step_in_epoch, batch_size_semantics=GLOBAL_SEMANTICS,
                    global_batch_size=global_batch_size, accum_steps=accum_steps,
                    optimizer_step=session_state.optimizer_step, lr=session_state.lr, **run_fields)
    return Path(path)


def load_train_state(path, session, *, global_batch_size: int, accum_steps: int, sample_count: int,
                     identity: str, impl=reference_impl) -> tuple[TrainingRunState, str]:
    """Resume ``session`` from a new or legacy checkpoint; returns the run state and a note on what was restored.

    ``load_checkpoint`` validates the file against model / optimizer / scaler before loading them. The
    run checks need the file's keys, so they run after it; a refusal there puts the session's model,
    optimizer and scaler back as they were before raising.
    """
    loaded = [part for part in (session.model, session.optimizer, session.scaler) if part is not None]
    before = [copy.deepcopy(part.state_dict()) for part in loaded]
    checkpoint = load_checkpoint(path, model=session.model, optimizer=session.optimizer, scaler=session.scaler)
    try:
        return _run_state_of(checkpoint, session, global_batch_size=global_batch_size, accum_steps=accum_steps,
                             sample_count=sample_count, identity=identity, impl=impl)
    except Exception:
        for part, state in zip(loaded, before):
            part.load_state_dict(state)
        raise


def _run_state_of(checkpoint: dict, session, *, global_batch_size: int, accum_steps: int, sample_count: int,
                  identity: str, impl) -> tuple[TrainingRunState, str]:
    if checkpoint.get("batch_size_semantics") is not None:   # a new state: ``step`` counts updates
        checkpoint["update_step_in_epoch"] = checkpoint.pop("step")
    state = impl.migrate_train_state(checkpoint)
    for key, wanted in (("global_batch_size", global_batch_size), ("accum_steps", accum_steps)):
        if state[key] != wanted:
            raise ValueError(f"{key} of the checkpoint is {state[key]}, the run asks for {wanted}: "
                             "resume with the checkpoint's global batch and accumulation")
    if state.get("dataset_identity", identity) != identity:
        raise ValueError(f"dataset_identity of the checkpoint is {state['dataset_identity']!r}, "
                         f"this run reads {identity!r}")
    updates_per_epoch = impl.steps_per_epoch(sample_count, global_batch_size)
    global_step = state.get("global_step", state["epoch"] * updates_per_epoch + state["update_step_in_epoch"])
    session.load_state(TrainingSessionState(lr=state.get("lr", session.optimizer.param_groups[0]["lr"]),
                                            optimizer_step=state.get("optimizer_step", global_step),
                                            microsteps_accumulated=0, loss_sum=None, loss_units=0,
                                            accumulation_valid=True))
    run = TrainingRunState(epoch=state["epoch"], update_step_in_epoch=state["update_step_in_epoch"],
                           global_step=global_step, sample_position=state["sample_position"],
                           dataset_identity=identity, seed=state.get("seed", 42),
                           base_lr=state.get("base_lr", TrainingRunState.base_lr),
                           total_steps=state.get("total_steps", 0))
    note = state.get("migration_note", f"resumed at update {run.update_step_in_epoch} of epoch {run.epoch}")
    return run, note


def run_text_training(session, dataset, run: TrainingRunState, *, global_batch_size: int, accum_steps: int,
                      epochs: int, grad_clip: float = 1.0, max_steps: int = 0, save_interval: int = 0,
                      save_fn: Optional[Callable[[TrainingRunState], None]] = None, log_interval: int = 0,
                      log_fn: Optional[Callable[[dict], None]] = None, readback: Optional[LossReadback] = None,
                      step_fn=token_weighted_step, impl=reference_impl, on_update=None) -> list[dict]:
    """Train from ``run`` (updated in place) until ``epochs`` or ``max_steps`` updates; one record per update.

    ``save_fn(run)`` runs every ``save_interval`` updates, at an update boundary (e.g. ``save_train_state``).
    """
    if epochs <= 0:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if max_steps < 0:
        raise ValueError(f"max_steps must be >= 0 (0 = no limit), got {max_steps}")
    updates_per_epoch = impl.steps_per_epoch(len(dataset), global_batch_size)
    run.total_steps = epochs * updates_per_epoch   # the schedule follows this run's --epochs
    readback = readback if readback is not None else LossReadback()
    records: list[dict] = []

    def flush_losses():
        for step, loss in readback.drain().items():
            records[step - first_step]["loss"] = loss

    first_step = run.global_step + 1
    while run.epoch < epochs and not (max_steps and run.global_step >= max_steps):
        order = epoch_order(len(dataset), run.seed, run.epoch)
        while run.update_step_in_epoch < updates_per_epoch and not (max_steps and run.global_step >= max_steps):
            start = run.update_step_in_epoch * global_batch_size
            samples = [dataset[i] for i in order[start:start + global_batch_size]]
            micro_batches = [collate(m, impl.count_loss_units)
                             for m in impl.split_global_batch(samples, global_batch_size, accum_steps)]
            units = sum(b.loss_units for b in micro_batches)
            lr = cosine_lr(run.global_step + 1, run.total_steps, run.base_lr)
            for i, batch in enumerate(micro_batches):
                options = TrainingStepOptions(lr=lr, clip_grad_norm=grad_clip, normalization_units=units,
                                              force_update=i == len(micro_batches) - 1)
                report = session.train_step(batch, options, step_fn)
            if not report.update_closed:
                raise RuntimeError(f"the last micro-batch of update {run.global_step + 1} did not close the "
                                   f"update (report: {report})")
            run.update_step_in_epoch += 1
            run.global_step += 1
            run.sample_position = start + len(samples)
            readback.push(run.global_step, report.loss_sum, report.loss_units)
            records.append({"epoch": run.epoch, "update_step": run.update_step_in_epoch, "global_step": run.global_step,
                            "lr": lr, "samples": len(samples), "microsteps": report.microsteps_accumulated,
                            "normalization_units": units, "parameters_updated": report.parameters_updated,
                            "grad_norm": report.grad_norm, "loss": None,
                            "updates_per_epoch": updates_per_epoch})
            if on_update is not None:
                on_update(records[-1])
            if log_interval and (run.global_step % log_interval == 0 or run.update_step_in_epoch == updates_per_epoch):
                flush_losses()
                if log_fn is not None:
                    log_fn(records[-1])
            if save_interval and run.global_step % save_interval == 0 and save_fn is not None:
                save_fn(run)
        if run.update_step_in_epoch == updates_per_epoch:
            run.epoch, run.update_step_in_epoch, run.sample_position = run.epoch + 1, 0, 0
    flush_losses()
    for record in records:
        if torch.is_tensor(record["grad_norm"]):
            record["grad_norm"] = float(record["grad_norm"])
    return records
