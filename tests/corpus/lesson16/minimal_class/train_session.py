"""Lesson 16 exercises: token-weighted gradient accumulation and the single-step TrainingSession.

Read course/lessons/16_token_weighted_training_session.md (Chinese:
course/lessons/zh/16_token_weighted_training_session.md), replace each ``raise NotImplementedError``
with your code, then run ``python -m course check 16``. The API types (``TrainingStepOutput``,
``TrainingStepOptions``, ``TrainingStepReport``, ``TrainingSessionState``,
``AccumulationInvalidError``) are given in ``course/protocol/types.py``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
from contextlib import nullcontext  # noqa: F401 - autocast=None and the DDP no_sync switch

import torch  # noqa: F401

from course.protocol.types import (GLOBAL_SEMANTICS, AccumulationInvalidError, TrainingSessionState,  # noqa: F401
                                           TrainingStepOptions, TrainingStepOutput, TrainingStepReport)
from course.minimind import IGNORE_INDEX  # noqa: F401
# for your test (§4.4):
from course.protocol.text import shifted_target_count, token_nll_sum  # noqa: F401
from course.runs import SESSION_SCENARIO, masked_micro_batches, tiny_model  # noqa: F401


def count_loss_units(labels: torch.Tensor) -> int:
    """The shifted targets that count: ``labels[..., 1:] != -100``. [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """One global batch as micro-batches of ``global_batch_size // accumulation_steps``; a short one keeps its tail.

    (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    if global_batch_size % accumulation_steps:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size})")
    samples = list(samples)
    size = global_batch_size // accumulation_steps
    return [samples[i:i + size] for i in range(0, len(samples), size)]


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """Updates per epoch, the short tail included: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0."""
    return (sample_count + global_batch_size - 1) // global_batch_size


class TrainingSession:
    """One update over ``accumulation_steps`` calls of ``train_step``; each backpropagates S_k / N."""

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        owned = {id(p) for p in model.parameters()}
        if any(id(p) not in owned for group in optimizer.param_groups for p in group["params"]):
            raise ValueError("optimizer holds tensors that are not model.parameters()")
        self.model, self.optimizer, self.scaler, self.autocast = model, optimizer, scaler, autocast
        self.accumulation_steps = accumulation_steps
        self.optimizer_step = 0
        self.accumulation_valid = True
        self.microsteps_accumulated = 0
        self.loss_sum = None
        self.loss_units = 0

    def _clear(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.microsteps_accumulated = 0
        self.loss_sum = None
        self.loss_units = 0

    def reset_accumulation(self) -> None:
        self._clear()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        return TrainingSessionState(self.optimizer.param_groups[0]["lr"], self.optimizer_step,
                                    self.microsteps_accumulated, self.loss_sum, self.loss_units,
                                    self.accumulation_valid)

    def load_state(self, state: TrainingSessionState) -> None:
        if state.microsteps_accumulated or self.microsteps_accumulated:
            raise ValueError("microsteps_accumulated must be 0: load_state only at an update boundary")
        self.optimizer_step = state.optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = state.lr

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("a micro-step failed; call reset_accumulation()")
        try:
            return self._step(batch, options, step_fn)
        except BaseException:
            self.accumulation_valid = False
            raise

    def _step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not options.normalization_units >= 1:
            raise ValueError(f"normalization_units must be >= 1, got {options.normalization_units}")
        if options.lr is not None and not options.lr >= 0:
            raise ValueError(f"lr must be >= 0, got {options.lr}")
        if not options.clip_grad_norm >= 0:
            raise ValueError(f"clip_grad_norm must be >= 0, got {options.clip_grad_norm}")
        if options.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = options.lr

        closes = options.force_update or self.microsteps_accumulated + 1 >= self.accumulation_steps
        sync = nullcontext() if closes or not hasattr(self.model, "no_sync") else self.model.no_sync()
        with sync:
            with self.autocast or nullcontext():
                out = step_fn(self.model, batch)
            if out.gradient_units < 0:
                raise ValueError(f"gradient_units must be >= 0, got {out.gradient_units}")
            loss = out.loss * out.gradient_units / options.normalization_units
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self.microsteps_accumulated += 1
        if out.loss_sum is not None:
            s = out.loss_sum.detach()
            self.loss_sum = s if self.loss_sum is None else self.loss_sum + s
        self.loss_units += out.loss_units
        n = self.microsteps_accumulated
        if not closes:
            return TrainingStepReport(False, self.optimizer_step, n)

        if options.before_update is not None and options.before_update():
            self._clear()
            return TrainingStepReport(False, self.optimizer_step, n, aborted=True)
        scaling = self.scaler is not None and self.scaler.is_enabled()
        if scaling:
            self.scaler.unscale_(self.optimizer)
        grad_norm = None
        if options.clip_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)
        stepped = True
        if scaling:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale
        else:
            self.optimizer.step()
        if stepped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()
        loss_sum, loss_units = self.loss_sum, self.loss_units
        self._clear()
        return TrainingStepReport(stepped, self.optimizer_step, n, loss_sum, loss_units, grad_norm,
                                  overflow_skipped=not stepped)


def migrate_train_state(state: dict) -> dict:
    """A legacy (micro-batch) state as a global-batch state resumed at an update boundary; a global one is copied.

    {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    if state.get("batch_size_semantics") == GLOBAL_SEMANTICS:
        return dict(state)
    batch, k = state["batch_size"], state.get("accum_steps", 1)
    epoch, step = state.get("epoch", 0), state.get("step", 0)
    if step == -(-state["sample_count"] // batch):   # the epoch's last micro-step, saved after the tail flush
        epoch, update, dropped = epoch + 1, 0, 0
    else:
        update, dropped = divmod(step, k)
    new = {key: value for key, value in state.items() if key not in ("batch_size", "step")}
    new.update(batch_size_semantics=GLOBAL_SEMANTICS, global_batch_size=batch * k, accum_steps=k, epoch=epoch,
               update_step_in_epoch=update, sample_position=update * batch * k, dropped_microsteps=dropped,
               migration_note=f"legacy micro-batch {batch} x {k} read as global batch {batch * k}: resuming at "
                              f"update {update} of epoch {epoch}, {dropped} micro-steps trained again")
    return new


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Unequal micro-batches (29, 10, 2, 1 targets): the accumulated gradient must equal one global backward."""
    batches = masked_micro_batches()
    reference = tiny_model(SESSION_SCENARIO)
    labels = torch.cat([b.labels for b in batches])
    logits = reference(torch.cat([b.input_ids for b in batches])).logits
    (token_nll_sum(logits, labels) / shifted_target_count(labels)).backward()

    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in batches])
    for (name, want), got in zip(reference.named_parameters(), model.parameters()):
        assert got.grad is not None, f"{name} has no gradient"
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-6)
