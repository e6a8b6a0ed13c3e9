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
    """Lesson 16 §4.1: the number of targets the model's loss averages over, as an int.

    The logits at position i predict token i + 1, so the targets are labels[..., 1:] (position 0 is never
    a target), and -100 does not count.
    Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4; [[7]] -> 0.
    """
    if labels.dim() == 0:
        raise ValueError("labels must have at least one dimension")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer token ids, got {labels.dtype}")
    targets = labels[..., 1:]
    return int((targets != IGNORE_INDEX).sum().item())


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """Lesson 16 §4.2: cut one global batch of samples into its micro-batches, in order.

    Examples: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if global_batch_size % accumulation_steps != 0:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size ({global_batch_size})")
    micro_batch_size = global_batch_size // accumulation_steps
    samples = list(samples)
    micro_batches = []
    for start in range(0, len(samples), micro_batch_size):
        micro_batches.append(samples[start:start + micro_batch_size])
    return micro_batches


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """Lesson 16 §4.2: optimizer updates per epoch = ceil(sample_count / global_batch_size), with integers only.

    Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if sample_count < 0:
        raise ValueError(f"sample_count must be >= 0, got {sample_count}")
    return (sample_count + global_batch_size - 1) // global_batch_size


class TrainingSession:
    """Lesson 16 §4.3: one parameter update executed over ``accumulation_steps`` calls of ``train_step``.

    Each micro-step backpropagates ``loss * gradient_units / normalization_units`` (S_k / N). The update closes
    at the K-th micro-step or on ``force_update``: before_update, unscale, clip, step, after_update, zero_grad.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        # the optimizer must hold the model's own parameters (not the ones of a copy)
        model_param_ids = set(id(p) for p in model.parameters())
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in model_param_ids:
                    raise ValueError("optimizer holds a parameter that is not in model.parameters()")
        if scaler is None:
            # like lesson 14: a disabled GradScaler, so the code path is the same with or without fp16
            device_type = next(model.parameters()).device.type
            scaler = torch.amp.GradScaler(device_type, enabled=False)
        if autocast is None:
            autocast = nullcontext()
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.scaler = scaler
        self.autocast = autocast
        self.optimizer_step = 0
        self.microsteps_accumulated = 0
        self.accumulation_valid = True
        self.loss_sum = None
        self.loss_units = 0

    def _start_new_update(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.microsteps_accumulated = 0
        self.loss_sum = None
        self.loss_units = 0

    def reset_accumulation(self) -> None:
        self._start_new_update()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        return TrainingSessionState(
            lr=self.optimizer.param_groups[0]["lr"],
            optimizer_step=self.optimizer_step,
            microsteps_accumulated=self.microsteps_accumulated,
            loss_sum=self.loss_sum,
            loss_units=self.loss_units,
            accumulation_valid=self.accumulation_valid,
        )

    def load_state(self, state: TrainingSessionState) -> None:
        if state.microsteps_accumulated != 0 or self.microsteps_accumulated != 0:
            raise ValueError("microsteps_accumulated must be 0: load_state only works at an update boundary")
        self.optimizer_step = state.optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = state.lr

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("the accumulation is invalid after an error; call reset_accumulation()")
        try:
            return self._train_step(batch, options, step_fn)
        except BaseException:
            self.accumulation_valid = False
            raise

    def _train_step(self, batch, options, step_fn):
        # check the options first, so that a bad one changes nothing
        if options.normalization_units < 1:
            raise ValueError(f"normalization_units must be >= 1, got {options.normalization_units}")
        if options.lr is not None and (math.isnan(options.lr) or options.lr < 0):
            raise ValueError(f"lr must be >= 0, got {options.lr}")
        if math.isnan(options.clip_grad_norm) or options.clip_grad_norm < 0:
            raise ValueError(f"clip_grad_norm must be >= 0, got {options.clip_grad_norm}")

        if options.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = options.lr

        # decide before the forward if this micro-step closes the update (DDP no_sync needs to know)
        is_last = options.force_update or self.microsteps_accumulated + 1 == self.accumulation_steps
        if not is_last and hasattr(self.model, "no_sync"):
            sync_context = self.model.no_sync()
        else:
            sync_context = nullcontext()

        with sync_context:
            with self.autocast:
                out = step_fn(self.model, batch)
            if not isinstance(out, TrainingStepOutput):
                raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(out)}")
            if out.gradient_units < 0:
                raise ValueError(f"gradient_units must be >= 0, got {out.gradient_units}")
            loss = out.loss * out.gradient_units / options.normalization_units
            self.scaler.scale(loss).backward()

        self.microsteps_accumulated += 1
        if out.loss_sum is not None:
            if self.loss_sum is None:
                self.loss_sum = out.loss_sum.detach().clone()
            else:
                self.loss_sum = self.loss_sum + out.loss_sum.detach()
        self.loss_units += out.loss_units

        if not is_last:
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=self.microsteps_accumulated)

        # ---- close the update ----
        microsteps = self.microsteps_accumulated
        if options.before_update is not None and options.before_update():
            self._start_new_update()
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=microsteps, aborted=True)

        old_scale = self.scaler.get_scale()
        self.scaler.unscale_(self.optimizer)
        try:
            grad_norm = None
            if options.clip_grad_norm > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)
            self.scaler.step(self.optimizer)
        finally:
            self.scaler.update()   # always, so the scaler is ready for the next update even after an error
        # the scaler lowers its scale only when it found inf/NaN and skipped the step
        skipped = self.scaler.is_enabled() and self.scaler.get_scale() < old_scale
        if not skipped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()

        report = TrainingStepReport(parameters_updated=not skipped, optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=microsteps, loss_sum=self.loss_sum,
                                    loss_units=self.loss_units, grad_norm=grad_norm, overflow_skipped=skipped)
        self._start_new_update()
        return report


def migrate_train_state(state: dict) -> dict:
    """Lesson 16 §5.4: convert a legacy training state (micro-batch batch_size, micro-step step) to global-batch
    semantics. The input stays unchanged.

    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    if state.get("batch_size_semantics") == GLOBAL_SEMANTICS:
        return dict(state)

    for key in ("batch_size", "sample_count"):
        if key not in state:
            raise ValueError(f"{key} is missing from the legacy state")
    batch_size = state["batch_size"]
    sample_count = state["sample_count"]
    accum_steps = state.get("accum_steps", 1)
    epoch = state.get("epoch", 0)
    step = state.get("step", 0)
    for key, value, minimum in (("batch_size", batch_size, 1), ("sample_count", sample_count, 1),
                                ("accum_steps", accum_steps, 1), ("epoch", epoch, 0), ("step", step, 0)):
        if type(value) is not int or value < minimum:
            raise ValueError(f"{key} must be an int >= {minimum}, got {value!r}")

    global_batch_size = batch_size * accum_steps
    steps_in_epoch = (sample_count + batch_size - 1) // batch_size   # ceil, with integers
    if step > steps_in_epoch:
        raise ValueError(f"step {step} is past the end of the epoch ({steps_in_epoch} micro-steps)")
    if step == steps_in_epoch:
        # the epoch's last micro-step: saved after the tail flush, so continue with the next epoch
        new_epoch, update, dropped = epoch + 1, 0, 0
    else:
        new_epoch, update, dropped = epoch, step // accum_steps, step % accum_steps

    new_state = dict(state)
    del new_state["batch_size"]
    new_state.pop("step", None)
    new_state["batch_size_semantics"] = GLOBAL_SEMANTICS
    new_state["global_batch_size"] = global_batch_size
    new_state["accum_steps"] = accum_steps
    new_state["epoch"] = new_epoch
    new_state["update_step_in_epoch"] = update
    new_state["sample_position"] = update * global_batch_size
    new_state["dropped_microsteps"] = dropped
    new_state["migration_note"] = (f"migrated a legacy state (batch_size {batch_size} x accum_steps {accum_steps}) "
                                   f"to global_batch_size {global_batch_size}: resume at epoch {new_epoch}, "
                                   f"update {update}, {dropped} micro-steps dropped")
    return new_state


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Lesson 16 §4.4: token-weighted accumulation must give the gradient of one backward of the global batch."""
    batches = masked_micro_batches()   # 29, 10, 2 and 1 valid targets: unequal on purpose

    # expected: one backward over all micro-batches at once
    big_model = tiny_model(SESSION_SCENARIO)
    input_ids = torch.cat([b.input_ids for b in batches])
    labels = torch.cat([b.labels for b in batches])
    loss = token_nll_sum(big_model(input_ids).logits, labels) / shifted_target_count(labels)
    loss.backward()

    # the implementation under test, on a second copy of the same model
    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in batches])

    for (name, expected), (_, actual) in zip(big_model.named_parameters(), model.named_parameters()):
        assert actual.grad is not None, f"{name} has no gradient"
        torch.testing.assert_close(actual.grad, expected.grad, rtol=1e-5, atol=1e-6)
