"""Where optimizer updates fall in a run of micro-steps: the arithmetic of the stage assembly
(``impl/train_pretrain_impl.py``), derived once.

Micro-steps count from 1 within each epoch; K micro-steps make a window and windows restart with each
epoch, so an epoch of ``iters`` micro-steps has ceil(iters / K) updates, the last one a tail flush of
iters % K micro-steps when K does not divide iters. Updates count from 1 over the whole run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def window_error(flag: str, micro_steps: int, accumulation_steps: int) -> str | None:
    """Why ``--flag`` (counted in micro-steps, 0 for off) cannot say where to save or stop, or None: a
    checkpoint cannot hold accumulated gradients, so it must be a multiple of K."""
    if micro_steps < 0 or micro_steps % accumulation_steps:
        return (f"--{flag} must be 0 or a positive multiple of --accumulation_steps ({accumulation_steps}), "
                f"got {micro_steps}")
    return None


@dataclass(frozen=True)
class UpdatePlan:
    iters: int               # micro-steps per epoch
    accumulation_steps: int  # K
    epochs: int

    def __post_init__(self):
        for name in ("iters", "accumulation_steps", "epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"UpdatePlan: {name} must be an int >= 1, got {value!r}")

    @property
    def updates_per_epoch(self) -> int:
        return math.ceil(self.iters / self.accumulation_steps)

    def closes_update(self, step: int) -> bool:
        """Micro-step ``step`` of an epoch ends an update: a full window, or the epoch's tail flush."""
        if not 1 <= step <= self.iters:
            raise ValueError(f"step must be in [1, iters={self.iters}], got {step}")
        return step % self.accumulation_steps == 0 or step == self.iters

    def update_index(self, epoch: int, step: int) -> int:
        """The run's update that micro-step ``step`` of ``epoch`` (0-based) belongs to, counted from 1; step 0
        (nothing of the epoch done yet, e.g. a resume at the epoch's start) gives the updates before the epoch."""
        if not 0 <= step <= self.iters:
            raise ValueError(f"step must be in [0, iters={self.iters}], got {step}")
        return epoch * self.updates_per_epoch + math.ceil(step / self.accumulation_steps)

    def position(self, micro_steps: int) -> tuple[int, int]:
        """(epoch, step) of the run's micro-step number ``micro_steps`` (from 1): epoch 0-based, step 1..iters."""
        if micro_steps < 1:
            raise ValueError(f"micro_steps must be >= 1, got {micro_steps}")
        epoch, index = divmod(micro_steps - 1, self.iters)
        return epoch, index + 1

    def stop_error(self, stop_after: int) -> str | None:
        """Why the run cannot stop after ``stop_after`` micro-steps (0: no stop), or None. A stop inside a
        window would make the loop flush that partial window as an update the uninterrupted run never makes;
        windows restart with each epoch, so a multiple of K can still fall inside one after a tail."""
        if not stop_after:
            return None
        epoch, step = self.position(stop_after)
        if epoch >= self.epochs or self.closes_update(step):
            return None
        return (f"--stop_after {stop_after} is micro-step {step} of epoch {epoch + 1} ({self.iters} micro-steps "
                f"per epoch), inside an accumulation window; stop at a multiple of --accumulation_steps "
                f"({self.accumulation_steps}) within the epoch or at its end")

    def stop_step(self, epoch: int, stop_after: int) -> int | None:
        """The micro-step of ``epoch`` after which the run stops (``stop_after`` counts over the run, 0: no
        stop), or None when it does not stop in this epoch."""
        if not stop_after:
            return None
        stop_epoch, step = self.position(stop_after)
        return step if stop_epoch == epoch else None

    def save_steps(self, save_interval: int) -> set[int]:
        """Micro-steps of every epoch that write a resume checkpoint: multiples of ``save_interval``, and the
        epoch's end (after its tail flush); none for interval 0."""
        if not save_interval:
            return set()
        return set(range(save_interval, self.iters, save_interval)) | {self.iters}

    def eval_steps(self, epoch: int, eval_interval: int) -> list[int]:
        """Micro-steps of ``epoch`` before its end that close a full window whose update is a multiple of
        ``eval_interval``."""
        if eval_interval < 1:
            raise ValueError(f"eval_interval must be >= 1, got {eval_interval}")
        return [step for step in range(self.accumulation_steps, self.iters, self.accumulation_steps)
                if self.update_index(epoch, step) % eval_interval == 0]

    def log_due(self, previous_step: int, step: int, log_interval: int) -> bool:
        """An update closing at ``step``, the one before at ``previous_step``, is logged: it crosses a multiple
        of ``log_interval`` micro-steps, or it ends the epoch."""
        return step // log_interval > previous_step // log_interval or step == self.iters
