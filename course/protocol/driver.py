"""The text run driver: it owns data order, counters, the lr schedule and the checkpoint cadence;
the ``TrainingSession`` owns accumulation and the update (lesson 16 §5.1).

Per update: shuffled indices -> one global batch -> its ``normalization_units`` (valid targets of
the whole global batch, counted on the host BEFORE splitting) -> micro-batches -> ``train_step``
per micro-batch, ``force_update`` on the last one -> when the update closes: lr schedule, counters,
checkpoint cadence and loss readback advance by one UPDATE step. ``max_steps``, ``global_step``
and ``update_step_in_epoch`` all count updates.

The schedule is MiniMind's ``get_lr`` per UPDATE. ``impl`` is the lesson-16 implementation whose
``split_global_batch``, ``steps_per_epoch`` and ``count_loss_units`` the driver calls (the student's
or the reference); saving and resuming a training state is ``train_state``'s job.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from course.minimind import get_lr

from .text import collate, token_weighted_step
from .types import TrainingRunState, TrainingStepOptions


def epoch_order(sample_count: int, seed: int, epoch: int) -> list[int]:
    """The epoch's shuffled sample indices: a pure function of (seed, epoch), so a resume replays it."""
    return torch.randperm(sample_count, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def dataset_identity(dataset, name: str) -> str:
    return f"{name}:{len(dataset)}"


class LossReadback:
    """Update losses stay on the device until read back, all pending ones in one host copy.

    One push per update, in order: a step pushed twice or a skipped step is a ValueError.
    """

    def __init__(self):
        self._pending: list[tuple[int, torch.Tensor, int]] = []
        self._last_step: Optional[int] = None
        self.values_read = 0

    def push(self, global_step: int, loss_sum: torch.Tensor, loss_units: int) -> None:
        if self._last_step is not None and global_step != self._last_step + 1:
            raise ValueError(f"global_step {global_step} pushed after {self._last_step}: the loss readback takes one "
                             f"push per update, in order (expected {self._last_step + 1})")
        self._last_step = global_step
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


def run_text_training(session, dataset, run: TrainingRunState, *, global_batch_size: int, accumulation_steps: int,
                      epochs: int, grad_clip: float = 1.0, max_steps: int = 0, save_interval: int = 0,
                      save_fn: Optional[Callable[[TrainingRunState], None]] = None, log_interval: int = 0,
                      log_fn: Optional[Callable[[dict], None]] = None, readback: Optional[LossReadback] = None,
                      step_fn=token_weighted_step, impl, on_update=None) -> list[dict]:
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
    pinned = next(session.model.parameters()).is_cuda
    while run.epoch < epochs and not (max_steps and run.global_step >= max_steps):
        order = epoch_order(len(dataset), run.seed, run.epoch)
        while run.update_step_in_epoch < updates_per_epoch and not (max_steps and run.global_step >= max_steps):
            start = run.update_step_in_epoch * global_batch_size
            samples = [dataset[i] for i in order[start:start + global_batch_size]]
            micro_batches = [collate(m, impl.count_loss_units, pin_memory=pinned)
                             for m in impl.split_global_batch(samples, global_batch_size, accumulation_steps)]
            units = sum(b.loss_units for b in micro_batches)
            lr = get_lr(run.global_step + 1, run.total_steps, run.base_lr)
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
