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


def _check_count(name: str, value, minimum: int) -> int:
    """``value`` as a count: an int (not a bool) >= ``minimum``, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_non_negative(name: str, value) -> float:
    """A float option that must be >= 0 (NaN is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return value


def count_loss_units(labels: torch.Tensor) -> int:
    """The number of targets the model's loss averages over, as an int (lesson 16 §4.1).

    Logits position i predicts token i + 1, so the targets are ``labels[..., 1:]``; -100 does not count.
    Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4; [[7]] -> 0.
    """
    if not torch.is_tensor(labels):
        raise TypeError(f"labels must be a tensor, got {type(labels).__name__}")
    if labels.ndim == 0:
        raise ValueError("labels must be shaped [seq] or [batch, seq], not a 0-dim tensor")
    if labels.dtype == torch.bool or labels.dtype.is_floating_point or labels.dtype.is_complex:
        raise ValueError(f"labels must hold integer token ids, got {labels.dtype}")
    return int(torch.count_nonzero(labels[..., 1:] != IGNORE_INDEX))


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """Cut one global batch of ``samples`` into its micro-batches, in order (lesson 16 §4.2).

    Examples: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    _check_count("accumulation_steps", accumulation_steps, 1)
    _check_count("global_batch_size", global_batch_size, 1)
    if global_batch_size % accumulation_steps:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size})")
    samples = list(samples)
    if len(samples) > global_batch_size:
        raise ValueError(f"samples ({len(samples)}) must hold at most one global batch ({global_batch_size})")
    micro = global_batch_size // accumulation_steps
    return [samples[i:i + micro] for i in range(0, len(samples), micro)]


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """Optimizer updates in an epoch of ``sample_count`` samples, the short tail included (lesson 16 §4.2).

    Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    _check_count("sample_count", sample_count, 0)
    _check_count("global_batch_size", global_batch_size, 1)
    updates, tail = divmod(sample_count, global_batch_size)
    return updates + (1 if tail else 0)


class TrainingSession:
    """One parameter update executed over ``accumulation_steps`` calls of ``train_step`` (lesson 16 §4.3).

    ``scaler=None`` means no GradScaler at all: a plain ``backward()`` and ``optimizer.step()``. A given
    ``torch.amp.GradScaler`` is driven through its public API: ``scale`` -> ``unscale_`` -> clip -> ``step`` ->
    ``update``, and an overflow skip is read from ``get_scale()`` (``update`` backs the scale off exactly when
    ``step`` skipped). ``self.scaler`` is the scaler given, or None.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        _check_count("accumulation_steps", accumulation_steps, 1)
        owned = {id(p) for p in model.parameters()}
        strangers = sum(1 for group in optimizer.param_groups for p in group["params"] if id(p) not in owned)
        if strangers:
            raise ValueError(f"optimizer holds {strangers} tensor(s) that are not model.parameters() (by identity): "
                             "build the optimizer on this model, not on a copy")
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.autocast = nullcontext() if autocast is None else autocast
        self.accumulation_steps = accumulation_steps
        self.optimizer_step = 0
        self.microsteps_accumulated = 0
        self.accumulation_valid = True
        self._loss_sum = None
        self._loss_units = 0
        self._unscaled_without_update = False   # unscale_ ran, update() did not (an error in between)

    # -- scaler helpers -----------------------------------------------------------------------------------
    @property
    def _scaling(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()

    def _backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def _unscale(self) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
            self._unscaled_without_update = True

    def _step(self) -> bool:
        """Step the optimizer; True when the GradScaler found inf/NaN and skipped it."""
        if self.scaler is None:
            self.optimizer.step()
            return False
        scale_before = self.scaler.get_scale() if self._scaling else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._unscaled_without_update = False
        # Skipped exactly when update() backed the scale off; a grown scale (growth_interval clean steps) is a
        # step that happened, whatever growth_factor / backoff_factor are.
        return scale_before is not None and self.scaler.get_scale() < scale_before

    # -- bookkeeping --------------------------------------------------------------------------------------
    def _clear_update(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.microsteps_accumulated = 0
        self._loss_sum = None
        self._loss_units = 0

    def reset_accumulation(self) -> None:
        if self._unscaled_without_update:
            # An error between unscale_ and update(): close the scaler's books, or the next unscale_ refuses.
            self.scaler.update()
            self._unscaled_without_update = False
        self._clear_update()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        return TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=self.microsteps_accumulated, loss_sum=self._loss_sum,
                                    loss_units=self._loss_units, accumulation_valid=self.accumulation_valid)

    def load_state(self, state: TrainingSessionState) -> None:
        if state.microsteps_accumulated or self.microsteps_accumulated:
            raise ValueError(f"microsteps_accumulated must be 0 on both sides (state: {state.microsteps_accumulated}, "
                             f"session: {self.microsteps_accumulated}): load_state runs at an update boundary only")
        _check_count("optimizer_step", state.optimizer_step, 0)
        lr = _check_non_negative("lr", state.lr)
        self.optimizer_step = state.optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # -- the micro-step -----------------------------------------------------------------------------------
    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("this update failed earlier; call reset_accumulation() to drop it")
        try:
            return self._micro_step(batch, options, step_fn)
        except BaseException:   # KeyboardInterrupt too: a half-built gradient must never reach a step
            self.accumulation_valid = False
            raise

    def _micro_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        units = _check_count("normalization_units", options.normalization_units, 1)
        if options.lr is not None:
            _check_non_negative("lr", options.lr)
        clip = _check_non_negative("clip_grad_norm", options.clip_grad_norm)
        if options.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = options.lr

        closing = options.force_update or self.microsteps_accumulated + 1 >= self.accumulation_steps
        sync = self.model.no_sync() if not closing and hasattr(self.model, "no_sync") else nullcontext()
        with sync:
            with self.autocast:
                output = step_fn(self.model, batch)
            if not isinstance(output, TrainingStepOutput):
                raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(output).__name__}")
            _check_count("gradient_units", output.gradient_units, 0)
            # (S_k / n_k) * n_k / N = S_k / N; 0 units still run a backward (a DDP rank must join the all-reduce)
            self._backward(output.loss * output.gradient_units / units)

        self.microsteps_accumulated += 1
        if output.loss_sum is not None:
            part = output.loss_sum.detach()
            self._loss_sum = part.clone() if self._loss_sum is None else torch.add(self._loss_sum, part)
        self._loss_units += output.loss_units
        if not closing:
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=self.microsteps_accumulated)
        return self._close(options, clip)

    def _close(self, options: TrainingStepOptions, clip: float) -> TrainingStepReport:
        held, loss_sum, loss_units = self.microsteps_accumulated, self._loss_sum, self._loss_units
        if options.before_update is not None and options.before_update():   # sees still-scaled gradients
            self._clear_update()
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=held, aborted=True)
        self._unscale()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip) if clip > 0 else None
        skipped = self._step()
        if not skipped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()
        self._clear_update()
        return TrainingStepReport(parameters_updated=not skipped, optimizer_step=self.optimizer_step,
                                  microsteps_accumulated=held, loss_sum=loss_sum, loss_units=loss_units,
                                  grad_norm=grad_norm, overflow_skipped=skipped)


def migrate_train_state(state: dict) -> dict:
    """Convert a legacy training state to global-batch semantics; the input stays unchanged (lesson 16 §5.4).

    Legacy (no ``batch_size_semantics``): ``batch_size`` the micro-batch, ``accum_steps`` = K (default 1),
    ``sample_count``, ``epoch`` (default 0), ``step`` the micro-steps done (default 0). Inside the epoch it resumes
    at the last update boundary ``step // K`` (``step % K`` micro-steps dropped); at the epoch's last micro-step
    ``ceil(sample_count / batch_size)`` it resumes at update 0 of the next epoch.
    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    semantics = state.get("batch_size_semantics")
    if semantics == GLOBAL_SEMANTICS:
        return dict(state)
    if semantics is not None:
        raise ValueError(f"batch_size_semantics must be {GLOBAL_SEMANTICS!r} or absent, got {semantics!r}")

    def field(key, minimum, default=None):
        if key not in state:
            if default is None:
                raise ValueError(f"{key} is required in a legacy state (no default exists)")
            return default
        return _check_count(key, state[key], minimum)

    batch_size = field("batch_size", 1)
    sample_count = field("sample_count", 1)
    accum_steps = field("accum_steps", 1, default=1)
    epoch = field("epoch", 0, default=0)
    step = field("step", 0, default=0)

    epoch_microsteps = -(-sample_count // batch_size)
    if step > epoch_microsteps:
        raise ValueError(f"step ({step}) is past the epoch's {epoch_microsteps} micro-steps")
    global_batch_size = batch_size * accum_steps
    if step == epoch_microsteps:
        epoch, update, dropped = epoch + 1, 0, 0
        where = "the epoch's end (saved after its tail flush)"
    else:
        update, dropped = divmod(step, accum_steps)
        where = f"micro-step {step}"

    migrated = {key: value for key, value in state.items() if key not in ("batch_size", "step")}
    migrated.update(
        batch_size_semantics=GLOBAL_SEMANTICS, global_batch_size=global_batch_size, accum_steps=accum_steps,
        epoch=epoch, update_step_in_epoch=update, sample_position=update * global_batch_size,
        dropped_microsteps=dropped,
        migration_note=(f"legacy state migrated: micro-batch {batch_size} x accum_steps {accum_steps} = "
                        f"global_batch_size {global_batch_size}; saved at {where}, resuming at update {update} of "
                        f"epoch {epoch}, {dropped} micro-step(s) dropped and trained again"))
    return migrated


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Token-weighted accumulation must leave the gradient of one global-batch backward (lesson 16 §4.4)."""
    batches = masked_micro_batches()
    counts = [b.loss_units for b in batches]
    assert len(set(counts)) == len(counts), f"the test needs unequal valid-target counts, got {counts}"

    truth = tiny_model(SESSION_SCENARIO)
    input_ids = torch.cat([b.input_ids for b in batches])
    labels = torch.cat([b.labels for b in batches])
    (token_nll_sum(truth(input_ids).logits, labels) / shifted_target_count(labels)).backward()

    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in batches])

    expected = dict(truth.named_parameters())
    actual = dict(model.named_parameters())
    assert expected.keys() == actual.keys(), "the two models differ in their parameters"
    for name, param in expected.items():
        got = actual[name].grad
        assert got is not None, f"{name}: the accumulation left no gradient"
        torch.testing.assert_close(got, param.grad, rtol=1e-5, atol=1e-6,
                                   msg=lambda detail, name=name: f"gradient of {name}: {detail}")
