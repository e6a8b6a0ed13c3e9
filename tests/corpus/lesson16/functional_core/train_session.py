"""Lesson 16 exercises: token-weighted gradient accumulation and the single-step TrainingSession.

Read course/lessons/16_token_weighted_training_session.md (Chinese:
course/lessons/zh/16_token_weighted_training_session.md), replace each ``raise NotImplementedError``
with your code, then run ``python -m course check 16``. The API types (``TrainingStepOutput``,
``TrainingStepOptions``, ``TrainingStepReport``, ``TrainingSessionState``,
``AccumulationInvalidError``) are given in ``course/protocol/types.py``.

Style of this solution: the arithmetic and the update logic live in small module-level functions;
``TrainingSession`` only keeps the state and calls them in order.
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


# ---------------------------------------------------------------------------------------------------------
# integer helpers
# ---------------------------------------------------------------------------------------------------------

def _is_int(value) -> bool:
    """A real int: Python's bool subclasses int but is no count."""
    return isinstance(value, int) and not isinstance(value, bool)


def _require_int(name: str, value, minimum: int) -> int:
    if not _is_int(value):
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _ceil_div(numerator: int, denominator: int) -> int:
    """ceil(numerator / denominator) in integer arithmetic: exact for any int (no float rounding above 2**53)."""
    return -(-numerator // denominator)


# ---------------------------------------------------------------------------------------------------------
# §4.1, §4.2: counting
# ---------------------------------------------------------------------------------------------------------

def count_loss_units(labels: torch.Tensor) -> int:
    """The number of targets the model's loss averages over, as an int.

    Logits position i predicts token i + 1, so the targets are ``labels[..., 1:]``; -100 (``IGNORE_INDEX``)
    does not count. Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4; [[7]] -> 0.
    """
    if not torch.is_tensor(labels) or labels.dim() == 0:
        raise ValueError(f"labels must be a tensor of token ids shaped [seq] or [batch, seq], got "
                         f"{type(labels).__name__}" + (" with 0 dimensions" if torch.is_tensor(labels) else ""))
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must hold integer token ids (-100 = ignored), got dtype {labels.dtype}")
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """Cut one global batch of ``samples`` into its micro-batches of ``global_batch_size // accumulation_steps``.

    A short last global batch is split over what remains.
    Examples: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    _require_int("global_batch_size", global_batch_size, 1)
    _require_int("accumulation_steps", accumulation_steps, 1)
    if global_batch_size % accumulation_steps:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size})")
    items = list(samples)
    if not 1 <= len(items) <= global_batch_size:
        raise ValueError(f"samples must hold between 1 and global_batch_size ({global_batch_size}) samples, "
                         f"got {len(items)}")
    micro = global_batch_size // accumulation_steps
    return [items[start:start + micro] for start in range(0, len(items), micro)]


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """The number of optimizer updates in an epoch: ceil(sample_count / global_batch_size), the short tail included.

    Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    _require_int("sample_count", sample_count, 0)
    _require_int("global_batch_size", global_batch_size, 1)
    return _ceil_div(sample_count, global_batch_size)


# ---------------------------------------------------------------------------------------------------------
# §4.3: the update logic, one function per rule; TrainingSession calls them
# ---------------------------------------------------------------------------------------------------------

def _check_optimizer_params(model, optimizer) -> None:
    """Every tensor the optimizer steps must be one of ``model.parameters()`` (by identity, §5.2)."""
    owned = {id(p) for p in model.parameters()}
    for index, group in enumerate(optimizer.param_groups):
        for param in group["params"]:
            if id(param) not in owned:
                raise ValueError(f"optimizer param group {index} holds a tensor of shape {tuple(param.shape)} that "
                                 "is not one of model.parameters(): build the optimizer on the model it trains")


def _check_options(options: TrainingStepOptions) -> None:
    """Reject a bad option before anything changes. ``not x >= 0`` also catches NaN."""
    units = options.normalization_units
    if not _is_int(units) or units < 1:
        raise ValueError(f"normalization_units must be an int >= 1 (the valid targets of the whole update), "
                         f"got {units!r}")
    if options.lr is not None and not options.lr >= 0:
        raise ValueError(f"lr must be >= 0 (or None to keep the optimizer's), got {options.lr!r}")
    if options.clip_grad_norm is None or not options.clip_grad_norm >= 0:
        raise ValueError(f"clip_grad_norm must be >= 0 (0 = no clipping), got {options.clip_grad_norm!r}")


def _write_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:   # every group: weight-decay setups have two
        group["lr"] = lr


def _closes_update(microsteps_done: int, accumulation_steps: int, force_update: bool) -> bool:
    """Whether the NEXT micro-step closes the update; decided before its forward (DDP's no_sync)."""
    return bool(force_update) or microsteps_done + 1 >= accumulation_steps


def _sync_context(model, closes: bool):
    """Non-closing micro-steps of a DDP model skip the gradient all-reduce."""
    if closes or not hasattr(model, "no_sync"):
        return nullcontext()
    return model.no_sync()


def _checked_output(output) -> TrainingStepOutput:
    if not isinstance(output, TrainingStepOutput):
        raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(output).__name__}")
    if not _is_int(output.gradient_units) or output.gradient_units < 0:
        raise ValueError(f"gradient_units of the step output must be an int >= 0, got {output.gradient_units!r}")
    return output


def _token_weighted_loss(output: TrainingStepOutput, normalization_units: int) -> torch.Tensor:
    """mean_k * n_k / N = S_k / N: summed over the update, the gradient of the global batch's token mean."""
    return output.loss * output.gradient_units / normalization_units


def _backward(loss: torch.Tensor, scaler) -> None:
    (loss if scaler is None else scaler.scale(loss)).backward()


def _add_loss_sum(total, loss_sum):
    """A new tensor each time: ``total += x`` would write into step_fn's tensor (``detach`` shares storage)."""
    if loss_sum is None:
        return total
    loss_sum = loss_sum.detach()
    return loss_sum if total is None else total + loss_sum


def _scaler_enabled(scaler) -> bool:
    return scaler is not None and scaler.is_enabled()


def _unscale(optimizer, scaler) -> None:
    if _scaler_enabled(scaler):
        scaler.unscale_(optimizer)


def _clip(model, max_norm: float):
    """The pre-clip norm of all of ``model.parameters()``, clipped to ``max_norm``; None with clipping off."""
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return None


def _optimizer_step(optimizer, scaler) -> bool:
    """Run the step; False when an enabled GradScaler skipped it (its scale backed off)."""
    if not _scaler_enabled(scaler):
        optimizer.step()
        return True
    scale_before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return not scaler.get_scale() < scale_before


def _clear_grads(model) -> None:
    model.zero_grad(set_to_none=True)


def _report(optimizer_step: int, microsteps: int, **fields) -> TrainingStepReport:
    fields.setdefault("parameters_updated", False)
    return TrainingStepReport(optimizer_step=optimizer_step, microsteps_accumulated=microsteps, **fields)


class TrainingSession:
    """One parameter update executed over ``accumulation_steps`` calls of ``train_step``.

    Each micro-step backpropagates ``loss * gradient_units / normalization_units`` (S_k / N), so an update equals
    one backward of the whole global batch. The update closes at the K-th micro-step or on ``force_update``:
    ``before_update`` (True aborts), unscale, clip, step (a GradScaler may skip it), ``after_update`` (only after a
    step that happened), gradients set to None. Any error invalidates the accumulation until
    ``reset_accumulation()``.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        _require_int("accumulation_steps", accumulation_steps, 1)
        _check_optimizer_params(model, optimizer)
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.scaler = scaler
        self.autocast = autocast
        self.optimizer_step = 0
        self.microsteps_accumulated = 0
        self.accumulation_valid = True
        self._loss_sum = None
        self._loss_units = 0

    def _start_new_update(self) -> None:
        _clear_grads(self.model)
        self.microsteps_accumulated = 0
        self._loss_sum = None
        self._loss_units = 0

    def reset_accumulation(self) -> None:
        self._start_new_update()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        return TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=self.microsteps_accumulated, loss_sum=self._loss_sum,
                                    loss_units=self._loss_units, accumulation_valid=self.accumulation_valid)

    def load_state(self, state: TrainingSessionState) -> None:
        if state.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the state is {state.microsteps_accumulated}: a state is "
                             "loaded at an update boundary (0)")
        if self.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the session is {self.microsteps_accumulated}: load a state "
                             "at an update boundary, or reset_accumulation() first")
        _require_int("optimizer_step", state.optimizer_step, 0)
        if not state.lr >= 0:
            raise ValueError(f"lr of the state must be >= 0, got {state.lr!r}")
        self.optimizer_step = state.optimizer_step
        _write_lr(self.optimizer, state.lr)

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("an earlier micro-step failed: its half-built update cannot be "
                                           "continued; call reset_accumulation() first")
        try:
            return self._train_step(batch, options, step_fn)
        except BaseException:   # KeyboardInterrupt included: the gradients may be half-accumulated
            self.accumulation_valid = False
            raise

    def _train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        _check_options(options)
        if options.lr is not None:
            _write_lr(self.optimizer, options.lr)
        closes = _closes_update(self.microsteps_accumulated, self.accumulation_steps, options.force_update)
        with _sync_context(self.model, closes):
            with self.autocast if self.autocast is not None else nullcontext():
                output = _checked_output(step_fn(self.model, batch))
                loss = _token_weighted_loss(output, options.normalization_units)
            _backward(loss, self.scaler)
        self.microsteps_accumulated += 1
        self._loss_sum = _add_loss_sum(self._loss_sum, output.loss_sum)
        self._loss_units += output.loss_units
        if not closes:
            return _report(self.optimizer_step, self.microsteps_accumulated)
        return self._close_update(options)

    def _close_update(self, options: TrainingStepOptions) -> TrainingStepReport:
        held, loss_sum, loss_units = self.microsteps_accumulated, self._loss_sum, self._loss_units
        if options.before_update is not None and options.before_update():
            self._start_new_update()   # a deliberate abort: its gradients are dropped here
            return _report(self.optimizer_step, held, aborted=True)
        _unscale(self.optimizer, self.scaler)
        grad_norm = _clip(self.model, options.clip_grad_norm)
        stepped = _optimizer_step(self.optimizer, self.scaler)
        if stepped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()
        self._start_new_update()
        return _report(self.optimizer_step, held, parameters_updated=stepped, overflow_skipped=not stepped,
                       loss_sum=loss_sum, loss_units=loss_units, grad_norm=grad_norm)


# ---------------------------------------------------------------------------------------------------------
# §5.4: legacy states
# ---------------------------------------------------------------------------------------------------------

def _legacy_resume_point(step: int, accum_steps: int, microsteps_per_epoch: int) -> tuple[bool, int, int]:
    """(next epoch?, update step in epoch, dropped micro-steps) of a legacy micro-step ``step``."""
    if step == microsteps_per_epoch:   # saved after the tail flush: the whole epoch was applied
        return True, 0, 0
    return False, step // accum_steps, step % accum_steps


def migrate_train_state(state: dict) -> dict:
    """Convert a legacy training state (``batch_size`` = micro-batch, ``step`` = micro-steps) to global-batch
    semantics; a ``"global"`` state comes back as an equal copy. The input stays unchanged.

    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    semantics = state.get("batch_size_semantics")
    if semantics == GLOBAL_SEMANTICS:
        return dict(state)
    if semantics is not None:
        raise ValueError(f"batch_size_semantics must be {GLOBAL_SEMANTICS!r} or absent (legacy), got {semantics!r}")
    for key in ("batch_size", "sample_count"):
        if key not in state:
            raise ValueError(f"{key} is missing from the legacy state: without it the global batch and the "
                             "epoch's end are unknown")
    batch_size = _require_int("batch_size", state["batch_size"], 1)
    sample_count = _require_int("sample_count", state["sample_count"], 1)
    accum_steps = _require_int("accum_steps", state.get("accum_steps", 1), 1)
    epoch = _require_int("epoch", state.get("epoch", 0), 0)
    step = _require_int("step", state.get("step", 0), 0)
    microsteps_per_epoch = _ceil_div(sample_count, batch_size)
    if step > microsteps_per_epoch:
        raise ValueError(f"step ({step}) is past the epoch's end: {sample_count} samples in micro-batches of "
                         f"{batch_size} are {microsteps_per_epoch} micro-steps")
    global_batch_size = batch_size * accum_steps
    next_epoch, update, dropped = _legacy_resume_point(step, accum_steps, microsteps_per_epoch)
    if next_epoch:
        epoch += 1
        note = (f"legacy state (micro-batch {batch_size} x accum_steps {accum_steps}) saved at the end of epoch "
                f"{epoch - 1} (micro-step {step} of {microsteps_per_epoch}): resuming at update 0 of epoch {epoch} "
                f"with global_batch_size {global_batch_size}; nothing dropped")
    else:
        note = (f"legacy state (micro-batch {batch_size} x accum_steps {accum_steps}, micro-step {step}) migrated "
                f"to global_batch_size {global_batch_size}: resuming at update {update} of epoch {epoch} (sample "
                f"{update * global_batch_size}); {dropped} micro-step(s) after that boundary were never saved "
                f"and are trained again")
    migrated = {key: value for key, value in state.items() if key not in ("batch_size", "step")}
    migrated.update(batch_size_semantics=GLOBAL_SEMANTICS, global_batch_size=global_batch_size,
                    accum_steps=accum_steps, epoch=epoch, update_step_in_epoch=update,
                    sample_position=update * global_batch_size, dropped_microsteps=dropped, migration_note=note)
    return migrated


# ---------------------------------------------------------------------------------------------------------
# §4.4: the test
# ---------------------------------------------------------------------------------------------------------

def _global_batch_gradients(batches) -> dict:
    """The truth: ONE backward of the token-mean NLL of all micro-batches concatenated."""
    model = tiny_model(SESSION_SCENARIO)
    input_ids = torch.cat([b.input_ids for b in batches])
    labels = torch.cat([b.labels for b in batches])
    (token_nll_sum(model(input_ids).logits, labels) / shifted_target_count(labels)).backward()
    return {name: param.grad for name, param in model.named_parameters()}


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Token-weighted accumulation over micro-batches with UNEQUAL valid-target counts (29, 10, 2, 1) must leave
    in ``.grad`` the gradient of one global-batch backward, every element of every parameter."""
    batches = masked_micro_batches()
    counts = [shifted_target_count(b.labels) for b in batches]
    assert len(set(counts)) > 1, f"the micro-batches must hold unequal valid-target counts, got {counts}"
    expected = _global_batch_gradients(batches)

    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in batches])   # its errors propagate
    got = dict(model.named_parameters())
    assert got.keys() == expected.keys(), "the model under test has other parameters than the reference"
    for name, want in expected.items():
        grad = got[name].grad
        if want is None:
            assert grad is None or not grad.any(), f"{name}: the global batch gives no gradient, got one"
            continue
        assert grad is not None, f"{name}: no gradient after the accumulation (.grad is None)"
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: accumulated gradient differs from one "
                                                            f"global-batch backward\n{m}")
