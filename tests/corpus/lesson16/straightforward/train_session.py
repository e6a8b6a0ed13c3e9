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
    """The number of targets the model's loss averages over, as an int (lesson 16 §4.1).

    Position ``i`` of the logits predicts token ``i + 1``, so the targets are ``labels[..., 1:]``;
    positions holding -100 (``IGNORE_INDEX``) do not count.
    Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4; [[7]] -> 0.
    """
    if labels.dim() == 0:
        raise ValueError("labels must have a sequence dimension, got a 0-dim tensor")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels must hold integer token ids, got dtype {labels.dtype}")
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """Cut one global batch of ``samples`` into its micro-batches, in order (lesson 16 §4.2).

    Each micro-batch holds ``global_batch_size / accumulation_steps`` samples; a short last global batch is
    split over what remains. Returns a list of lists.
    Examples: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    if global_batch_size % accumulation_steps:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size})")
    samples = list(samples)
    if len(samples) > global_batch_size:
        raise ValueError(f"samples ({len(samples)}) must not hold more than global_batch_size "
                         f"({global_batch_size}) samples")
    micro = global_batch_size // accumulation_steps
    return [samples[i:i + micro] for i in range(0, len(samples), micro)]


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """The number of optimizer updates in an epoch of ``sample_count`` samples (lesson 16 §4.2).

    One update per global batch; a short last global batch is an update too. Integer ceiling: exact for any int.
    Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if sample_count < 0:
        raise ValueError(f"sample_count must be >= 0, got {sample_count}")
    return (sample_count + global_batch_size - 1) // global_batch_size


class TrainingSession:
    """One parameter update executed over ``accumulation_steps`` calls of ``train_step`` (lesson 16 §4.3).

    Each micro-step backpropagates ``loss * gradient_units / normalization_units`` (S_k / N for the token-weighted
    step function), so the closed update holds the gradient of one backward of the whole global batch. The update
    closes at the K-th micro-step or on ``options.force_update``: before_update (True aborts) -> unscale -> clip ->
    optimizer step (an enabled GradScaler may skip it) -> scaler update -> after_update (only after a real step)
    -> gradients set to None. Any error inside ``train_step`` invalidates the accumulation until
    ``reset_accumulation()``.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        model_params = {id(p) for p in model.parameters()}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in model_params:
                    raise ValueError("optimizer holds a tensor that is not one of model.parameters(): build the "
                                     "optimizer from this model's parameters (not from a copy)")
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.scaler = scaler
        self.autocast = autocast if autocast is not None else nullcontext()
        self.optimizer_step = 0
        self.microsteps_accumulated = 0
        self.loss_sum = None
        self.loss_units = 0
        self.accumulation_valid = True
        self._unscaled = False   # scaler.unscale_ ran and scaler.update() has not yet

    def _clear_update(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.microsteps_accumulated = 0
        self.loss_sum = None
        self.loss_units = 0

    def reset_accumulation(self) -> None:
        """Drop the half-built update (gradients, counters, loss totals) and accept micro-steps again."""
        if self._unscaled:
            # interrupted between unscale_ and update(): close the scaler's iteration, or the next
            # unscale_ raises "unscale_() has already been called"
            self.scaler.update()
            self._unscaled = False
        self._clear_update()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        return TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=self.microsteps_accumulated, loss_sum=self.loss_sum,
                                    loss_units=self.loss_units, accumulation_valid=self.accumulation_valid)

    def load_state(self, state: TrainingSessionState) -> None:
        if state.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the state is {state.microsteps_accumulated}: a state is "
                             "loaded at an update boundary only")
        if self.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the session is {self.microsteps_accumulated}: load_state "
                             "runs at an update boundary only")
        self.optimizer_step = state.optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = state.lr
        self.loss_sum = None
        self.loss_units = 0

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("a previous train_step failed: call reset_accumulation() before "
                                           "training again")
        try:
            if options.normalization_units < 1:
                raise ValueError(f"normalization_units must be >= 1, got {options.normalization_units}")
            if options.lr is not None and not options.lr >= 0:
                raise ValueError(f"lr must be >= 0, got {options.lr}")
            if not options.clip_grad_norm >= 0:
                raise ValueError(f"clip_grad_norm must be >= 0, got {options.clip_grad_norm}")
            if options.lr is not None:
                for group in self.optimizer.param_groups:
                    group["lr"] = options.lr

            # decided before the forward: under DDP the non-closing micro-steps run inside no_sync()
            closes = options.force_update or self.microsteps_accumulated + 1 >= self.accumulation_steps
            use_scaler = self.scaler is not None and self.scaler.is_enabled()
            sync = nullcontext() if closes or not hasattr(self.model, "no_sync") else self.model.no_sync()
            with sync:
                with self.autocast:
                    out = step_fn(self.model, batch)
                if not isinstance(out, TrainingStepOutput):
                    raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(out).__name__}")
                if out.gradient_units < 0:
                    raise ValueError(f"gradient_units must be >= 0, got {out.gradient_units}")
                loss = out.loss * out.gradient_units / options.normalization_units
                if use_scaler:
                    loss = self.scaler.scale(loss)
                loss.backward()

            self.microsteps_accumulated += 1
            if out.loss_sum is not None:
                part = out.loss_sum.detach()
                self.loss_sum = part.clone() if self.loss_sum is None else self.loss_sum + part
            self.loss_units += out.loss_units

            if not closes:
                return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                          microsteps_accumulated=self.microsteps_accumulated)

            microsteps = self.microsteps_accumulated
            if options.before_update is not None and options.before_update():
                self._clear_update()
                return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                          microsteps_accumulated=microsteps, aborted=True)

            if use_scaler:
                self.scaler.unscale_(self.optimizer)
                self._unscaled = True
            grad_norm = None
            if options.clip_grad_norm > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)
            skipped = False
            if use_scaler:
                scale_before = self.scaler.get_scale()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self._unscaled = False
                skipped = self.scaler.get_scale() < scale_before   # update() backs off exactly on inf/NaN
            else:
                self.optimizer.step()
            if not skipped:
                self.optimizer_step += 1
                if options.after_update is not None:
                    options.after_update()

            report = TrainingStepReport(parameters_updated=not skipped, optimizer_step=self.optimizer_step,
                                        microsteps_accumulated=microsteps, loss_sum=self.loss_sum,
                                        loss_units=self.loss_units, grad_norm=grad_norm, overflow_skipped=skipped)
            self._clear_update()
            return report
        except BaseException:
            self.accumulation_valid = False
            raise


def migrate_train_state(state: dict) -> dict:
    """Convert a legacy training state to global-batch semantics; the input stays unchanged (lesson 16 §5.4).

    Legacy (no ``batch_size_semantics``): ``batch_size`` is the micro-batch, ``step`` the micro-steps done in
    ``epoch``. Pending gradients were never saved, so a step inside the epoch resumes at its last update boundary
    and the micro-steps after it are trained again; the epoch's last micro-step (saved after the tail flush)
    resumes at update 0 of the next epoch.
    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    semantics = state.get("batch_size_semantics")
    if semantics == GLOBAL_SEMANTICS:
        return dict(state)
    if semantics is not None:
        raise ValueError(f"batch_size_semantics must be {GLOBAL_SEMANTICS!r} or absent, got {semantics!r}")

    def int_field(key, default, minimum):
        if key not in state:
            if default is None:
                raise ValueError(f"{key} is missing from the legacy state")
            return default
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{key} must be an int >= {minimum}, got {value!r}")
        return value

    batch_size = int_field("batch_size", None, 1)
    sample_count = int_field("sample_count", None, 1)
    accum_steps = int_field("accum_steps", 1, 1)
    epoch = int_field("epoch", 0, 0)
    step = int_field("step", 0, 0)

    microsteps_per_epoch = (sample_count + batch_size - 1) // batch_size
    if step > microsteps_per_epoch:
        raise ValueError(f"step ({step}) is past the epoch's end ({microsteps_per_epoch} micro-steps of "
                         f"{batch_size} for {sample_count} samples)")
    global_batch_size = batch_size * accum_steps
    if step == microsteps_per_epoch:
        # saved after the tail flush: the whole epoch was applied
        epoch, update, dropped = epoch + 1, 0, 0
    else:
        update, dropped = step // accum_steps, step % accum_steps
    position = update * global_batch_size

    migrated = {k: v for k, v in state.items() if k not in ("batch_size", "step")}
    migrated.update(
        batch_size_semantics=GLOBAL_SEMANTICS, global_batch_size=global_batch_size, accum_steps=accum_steps,
        epoch=epoch, update_step_in_epoch=update, sample_position=position, dropped_microsteps=dropped,
        migration_note=(f"legacy state (micro-batch {batch_size} x {accum_steps} accumulation steps, step {step}) "
                        f"resumed as global batch {global_batch_size} at update {update} of epoch {epoch} "
                        f"(sample {position}); {dropped} micro-step(s) after the last update boundary were never "
                        f"applied and are trained again"))
    return migrated


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Token-weighted accumulation must leave the gradient of ONE backward of the whole global batch (§4.4).

    The micro-batches hold 29, 10, 2 and 1 valid targets, so lesson 14's mean of means cannot pass; every
    parameter's gradient is compared element-wise with rtol 1e-5, atol 1e-6.
    """
    batches = masked_micro_batches()
    counts = [shifted_target_count(b.labels) for b in batches]
    assert len(set(counts)) > 1, f"the micro-batches must hold unequal valid-target counts, got {counts}"

    expected_model = tiny_model(SESSION_SCENARIO)
    input_ids = torch.cat([b.input_ids for b in batches])
    labels = torch.cat([b.labels for b in batches])
    loss = token_nll_sum(expected_model(input_ids).logits, labels) / shifted_target_count(labels)
    loss.backward()

    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in batches])

    for (name, expected), (_, param) in zip(expected_model.named_parameters(), model.named_parameters()):
        if expected.grad is None:
            assert param.grad is None or not param.grad.any(), f"{name}: unexpected gradient"
            continue
        assert param.grad is not None, f"{name}: no gradient after the accumulation"
        torch.testing.assert_close(param.grad, expected.grad, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
