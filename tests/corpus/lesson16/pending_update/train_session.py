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


from dataclasses import dataclass
from typing import Optional


def count_loss_units(labels: torch.Tensor) -> int:
    """The number of targets the model's loss averages over, as an int (lesson 16 §4.1).

    The model's loss shifts: logits position i predicts label i + 1, so only ``labels[..., 1:]`` are targets,
    and -100 (``IGNORE_INDEX``) marks a target that does not count.
    Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4; [[7]] -> 0.
    """
    if not torch.is_tensor(labels):
        raise TypeError(f"labels must be a tensor, got {type(labels).__name__}")
    if labels.dim() == 0:
        raise ValueError("labels must be shaped [seq] or [batch, seq], got a 0-dim tensor")
    if labels.dtype == torch.bool or labels.dtype.is_floating_point or labels.dtype.is_complex:
        raise ValueError(f"labels must hold integer token ids, got {labels.dtype}")
    targets = labels[..., 1:]
    return int(torch.count_nonzero(targets != IGNORE_INDEX))


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
    micro_batch_size, rest = divmod(global_batch_size, accumulation_steps)
    if rest:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size})")
    items = list(samples)
    if len(items) > global_batch_size:
        raise ValueError(f"samples holds {len(items)} samples, more than global_batch_size ({global_batch_size})")
    micro_batches = []
    for start in range(0, len(items), micro_batch_size):
        micro_batches.append(items[start:start + micro_batch_size])
    return micro_batches


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """The number of optimizer updates in an epoch of ``sample_count`` samples (lesson 16 §4.2).

    One update per global batch, the short tail included: an integer ceiling, exact for any int.
    Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if sample_count < 0:
        raise ValueError(f"sample_count must be >= 0, got {sample_count}")
    full, tail = divmod(sample_count, global_batch_size)
    return full + (1 if tail else 0)


@dataclass
class _PendingUpdate:
    """The update in progress: created by its first micro-step, dropped when it closes or is aborted."""

    microsteps: int = 0
    loss_sum: Optional[torch.Tensor] = None
    loss_units: int = 0
    unscaled: bool = False   # the GradScaler unscaled this update's gradients and has not run update() yet

    def add(self, output: TrainingStepOutput) -> None:
        self.microsteps += 1
        self.loss_units += output.loss_units
        if output.loss_sum is not None:
            detached = output.loss_sum.detach()
            # a new tensor every time: ``+=`` would write into the tensor step_fn returned
            self.loss_sum = detached.clone() if self.loss_sum is None else self.loss_sum + detached


class TrainingSession:
    """One parameter update executed over ``accumulation_steps`` calls of ``train_step`` (lesson 16 §4.3).

    The update in progress lives in a ``_PendingUpdate``; between updates there is none. Each micro-step
    backpropagates ``loss * gradient_units / normalization_units``; the update closes at the K-th micro-step or on
    ``options.force_update``. Any exception in a micro-step invalidates the accumulation until
    ``reset_accumulation()``.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        trained = {id(p) for p in model.parameters()}
        stray = sum(1 for group in optimizer.param_groups for p in group["params"] if id(p) not in trained)
        if stray:
            raise ValueError(f"optimizer holds {stray} tensor(s) that are not model.parameters() (an optimizer "
                             "built on a copy of the model?): the session would train tensors it never steps")
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.scaler = scaler
        self.autocast = autocast
        self.optimizer_step = 0
        self.accumulation_valid = True
        self._pending: Optional[_PendingUpdate] = None

    @property
    def microsteps_accumulated(self) -> int:
        return 0 if self._pending is None else self._pending.microsteps

    def _drop_pending(self) -> None:
        self._pending = None
        self.model.zero_grad(set_to_none=True)

    def reset_accumulation(self) -> None:
        if self._pending is not None and self._pending.unscaled:
            # interrupted between unscale_ and update(): finish the scaler's iteration, or the next unscale_
            # would raise "unscale_() has already been called on this optimizer"
            self.scaler.update()
        self._drop_pending()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        pending = self._pending or _PendingUpdate()
        return TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=pending.microsteps, loss_sum=pending.loss_sum,
                                    loss_units=pending.loss_units, accumulation_valid=self.accumulation_valid)

    def load_state(self, state: TrainingSessionState) -> None:
        if state.microsteps_accumulated:
            raise ValueError(f"microsteps_accumulated is {state.microsteps_accumulated} in the state: only a state "
                             "saved at an update boundary can be loaded")
        if self.microsteps_accumulated:
            raise ValueError(f"microsteps_accumulated is {self.microsteps_accumulated}: the session is inside an "
                             "update, load_state needs an update boundary")
        self.optimizer_step = state.optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = state.lr

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("the accumulation is invalid after a failed train_step: call "
                                           "reset_accumulation() first")
        try:
            return self._micro_step(batch, options, step_fn)
        except BaseException:
            self.accumulation_valid = False
            raise

    def _micro_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        self._check_options(options)
        if options.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = options.lr
        if self._pending is None:
            self._pending = _PendingUpdate()
        pending = self._pending

        closing = options.force_update or pending.microsteps + 1 >= self.accumulation_steps
        scaler = self.scaler if self.scaler is not None and self.scaler.is_enabled() else None
        no_sync = getattr(self.model, "no_sync", None)
        with (no_sync() if no_sync is not None and not closing else nullcontext()):
            with (self.autocast if self.autocast is not None else nullcontext()):
                output = step_fn(self.model, batch)
            if not isinstance(output, TrainingStepOutput):
                raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(output).__name__}")
            if output.gradient_units < 0:
                raise ValueError(f"gradient_units must be >= 0, got {output.gradient_units}")
            weighted = output.loss * (output.gradient_units / options.normalization_units)
            (scaler.scale(weighted) if scaler is not None else weighted).backward()
        pending.add(output)

        if not closing:
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=pending.microsteps)
        return self._close(pending, options, scaler)

    @staticmethod
    def _check_options(options: TrainingStepOptions) -> None:
        if options.normalization_units < 1:
            raise ValueError(f"normalization_units must be >= 1 (the valid targets of the whole update), "
                             f"got {options.normalization_units}")
        if options.lr is not None and (math.isnan(options.lr) or options.lr < 0):
            raise ValueError(f"lr must be >= 0, got {options.lr}")
        if math.isnan(options.clip_grad_norm) or options.clip_grad_norm < 0:
            raise ValueError(f"clip_grad_norm must be >= 0 (0 = no clipping), got {options.clip_grad_norm}")

    def _close(self, pending: _PendingUpdate, options: TrainingStepOptions, scaler) -> TrainingStepReport:
        if options.before_update is not None and options.before_update():
            self._drop_pending()
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=pending.microsteps, aborted=True)
        if scaler is not None:
            scaler.unscale_(self.optimizer)
            pending.unscaled = True
        grad_norm = None
        if options.clip_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)
        if scaler is not None:
            scale = scaler.get_scale()
            scaler.step(self.optimizer)
            scaler.update()
            pending.unscaled = False
            stepped = not scaler.get_scale() < scale   # the scale backs off exactly when inf/NaN skipped the step
        else:
            self.optimizer.step()
            stepped = True
        if stepped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()
        self._drop_pending()
        return TrainingStepReport(parameters_updated=stepped, optimizer_step=self.optimizer_step,
                                  microsteps_accumulated=pending.microsteps, loss_sum=pending.loss_sum,
                                  loss_units=pending.loss_units, grad_norm=grad_norm, overflow_skipped=not stepped)


def _legacy_int(state: dict, key: str, default, minimum: int) -> int:
    if key not in state:
        if default is None:
            raise ValueError(f"{key} is required in a legacy training state")
        return default
    value = state[key]
    if type(value) is not int or value < minimum:   # bool is not a count
        raise ValueError(f"{key} must be an int >= {minimum}, got {value!r}")
    return value


def migrate_train_state(state: dict) -> dict:
    """Convert a legacy training state to global-batch semantics; the input stays unchanged (lesson 16 §5.4).

    A legacy state counted ``step`` in micro-steps of ``batch_size`` samples. Inside the epoch it resumes at the
    last update boundary (the micro-steps after it are dropped: their gradients were never saved); at the epoch's
    last micro-step (``ceil(sample_count / batch_size)``, saved after the tail flush) at the next epoch's start.
    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    if "batch_size_semantics" in state:
        if state["batch_size_semantics"] != GLOBAL_SEMANTICS:
            raise ValueError(f"batch_size_semantics must be {GLOBAL_SEMANTICS!r}, got "
                             f"{state['batch_size_semantics']!r}")
        return dict(state)

    micro_batch = _legacy_int(state, "batch_size", None, 1)
    sample_count = _legacy_int(state, "sample_count", None, 1)
    accum_steps = _legacy_int(state, "accum_steps", 1, 1)
    epoch = _legacy_int(state, "epoch", 0, 0)
    step = _legacy_int(state, "step", 0, 0)

    epoch_microsteps = -(-sample_count // micro_batch)
    if step > epoch_microsteps:
        raise ValueError(f"step {step} is beyond the epoch's {epoch_microsteps} micro-steps "
                         f"(sample_count {sample_count}, batch_size {micro_batch})")
    global_batch = micro_batch * accum_steps
    if step == epoch_microsteps:
        epoch, update, dropped = epoch + 1, 0, 0
        where = f"the epoch's last micro-step {step}: every sample was applied, resuming at the next epoch"
    else:
        update, dropped = divmod(step, accum_steps)
        where = (f"micro-step {step} -> update boundary {update}; {dropped} micro-step(s) after it had unsaved "
                 f"gradients and are trained again")

    result = {key: value for key, value in state.items() if key not in ("batch_size", "step")}
    result["batch_size_semantics"] = GLOBAL_SEMANTICS
    result["global_batch_size"] = global_batch
    result["accum_steps"] = accum_steps
    result["epoch"] = epoch
    result["update_step_in_epoch"] = update
    result["sample_position"] = update * global_batch
    result["dropped_microsteps"] = dropped
    result["migration_note"] = (f"migrated a legacy state (batch_size {micro_batch} per micro-step, accum_steps "
                                f"{accum_steps}) to global batch {global_batch}: {where}; resuming at epoch {epoch}, "
                                f"update {update}, sample {update * global_batch}")
    return result


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Token-weighted accumulation must equal ONE backward of the whole global batch (lesson 16 §4.4).

    Micro-batches of unequal valid-target counts (29, 10, 2, 1), so lesson 14's mean of means differs; every
    gradient element is compared with ``rtol=1e-5, atol=1e-6``.
    """
    micro_batches = masked_micro_batches()
    units = [b.loss_units for b in micro_batches]
    assert min(units) != max(units), f"the test needs unequal valid-target counts, got {units}"

    oracle = tiny_model(SESSION_SCENARIO)
    all_ids = torch.cat([b.input_ids for b in micro_batches])
    all_labels = torch.cat([b.labels for b in micro_batches])
    (token_nll_sum(oracle(all_ids).logits, all_labels) / shifted_target_count(all_labels)).backward()
    expected = {name: p.grad for name, p in oracle.named_parameters()}

    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in micro_batches])
    actual = {name: p.grad for name, p in model.named_parameters()}

    assert actual.keys() == expected.keys()
    for name, want in expected.items():
        got = actual[name]
        if want is None:
            assert got is None or torch.count_nonzero(got) == 0, f"{name} should have no gradient"
            continue
        assert got is not None, f"{name} has no gradient: the accumulation never reached it"
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
