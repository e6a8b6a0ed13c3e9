"""Lesson 16 exercises: token-weighted gradient accumulation and the single-step TrainingSession.

Read course/lessons/16_token_weighted_training_session.md (Chinese:
course/lessons/zh/16_token_weighted_training_session.md), replace each ``raise NotImplementedError``
with your code, then run ``python -m course check 16``. The API types (``TrainingStepOutput``,
``TrainingStepOptions``, ``TrainingStepReport``, ``TrainingSessionState``,
``AccumulationInvalidError``) are given in ``course/protocol/types.py``.

Style of this solution: every argument, option, step output and state is validated with a message that names
the bad value first, before anything (parameters, lr, counters, gradients) changes.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
import numbers
from contextlib import nullcontext  # noqa: F401 - autocast=None and the DDP no_sync switch

import torch  # noqa: F401

from course.protocol.types import (GLOBAL_SEMANTICS, AccumulationInvalidError, TrainingSessionState,  # noqa: F401
                                           TrainingStepOptions, TrainingStepOutput, TrainingStepReport)
from course.minimind import IGNORE_INDEX  # noqa: F401
# for your test (§4.4):
from course.protocol.text import shifted_target_count, token_nll_sum  # noqa: F401
from course.runs import SESSION_SCENARIO, masked_micro_batches, tiny_model  # noqa: F401


def _check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; a bool, a float or anything else is a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_non_negative_real(name: str, value, *, allow_inf: bool) -> float:
    """``value`` as a real number >= 0 (NaN refused; inf refused unless ``allow_inf``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number >= 0, got {value!r} of type {type(value).__name__}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    if not allow_inf and math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def count_loss_units(labels: torch.Tensor) -> int:
    """The number of targets the model's loss averages over, as a host-side int.

    Position i of the logits predicts token i + 1, so only ``labels[..., 1:]`` are targets; -100
    (``IGNORE_INDEX``) positions do not count. ``labels`` must be a tensor of integer token ids shaped ``[seq]``
    or ``[batch, seq]``: a 0-dim tensor, a float, complex or bool tensor is a ``ValueError`` naming ``labels``.
    Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4; [[7]] -> 0.
    """
    if not torch.is_tensor(labels):
        raise TypeError(f"labels must be a torch.Tensor of token ids, got {type(labels).__name__}")
    if labels.dim() == 0:
        raise ValueError("labels must be shaped [seq] or [batch, seq], got a 0-dim tensor")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must hold integer token ids (-100 where a target does not count), got dtype "
                         f"{labels.dtype}")
    return int((labels[..., 1:] != IGNORE_INDEX).sum().item())


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """Cut one global batch of ``samples`` into its micro-batches, in order.

    Each micro-batch holds ``global_batch_size // accumulation_steps`` samples; a short last global batch is split
    over what remains. ``samples`` may be any sequence or iterable (list, tuple, range); the result is a new list
    of lists. ``accumulation_steps`` must divide ``global_batch_size``; ``samples`` must hold between 1 and
    ``global_batch_size`` samples.
    Examples: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    _check_int("global_batch_size", global_batch_size, 1)
    _check_int("accumulation_steps", accumulation_steps, 1)
    if global_batch_size % accumulation_steps != 0:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size})")
    try:
        items = list(samples)
    except TypeError as error:
        raise TypeError(f"samples must be a sequence of samples, got {type(samples).__name__}") from error
    if not items:
        raise ValueError("samples must hold at least one sample (an empty global batch is no update)")
    if len(items) > global_batch_size:
        raise ValueError(f"samples holds {len(items)} samples, more than one global batch "
                         f"(global_batch_size {global_batch_size})")
    micro_batch_size = global_batch_size // accumulation_steps
    return [items[start:start + micro_batch_size] for start in range(0, len(items), micro_batch_size)]


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """The number of optimizer updates in an epoch of ``sample_count`` samples: ``ceil(sample_count / global)``.

    A short last global batch is an update too. Integer arithmetic, so the count is exact for any int (a float
    division would round counts above 2**53).
    Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    _check_int("sample_count", sample_count, 0)
    _check_int("global_batch_size", global_batch_size, 1)
    updates, tail = divmod(sample_count, global_batch_size)
    return updates + (1 if tail else 0)


class TrainingSession:
    """One parameter update executed over ``accumulation_steps`` calls of ``train_step`` (lesson 16 §4.3, §5).

    Each micro-step runs ``step_fn(model, batch)`` under ``autocast`` and backpropagates
    ``loss * gradient_units / normalization_units`` (S_k / N), so the K backwards of an update add up to one
    backward of the whole global batch. The update closes at the K-th micro-step or on ``force_update``:
    ``before_update`` (True aborts and drops the gradients), unscale, clip, optimizer step (an enabled GradScaler
    skips an overflowing one), ``after_update`` (only after a step that happened), gradients set to None.

    Any exception inside ``train_step`` marks the accumulation invalid: later calls raise
    ``AccumulationInvalidError`` until ``reset_accumulation()``.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        """Keep ``model``, ``optimizer``, ``scaler`` (None or a GradScaler) and ``autocast`` (None or a context
        manager entered around each forward); ``accumulation_steps`` (K >= 1) micro-steps make one update.

        Every tensor the optimizer holds must be one of ``model.parameters()`` (by identity): an optimizer built on
        a copy of the model would step tensors the session never trains.
        """
        _check_int("accumulation_steps", accumulation_steps, 1)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if scaler is not None and not all(hasattr(scaler, name) for name in
                                          ("scale", "unscale_", "step", "update", "get_scale", "is_enabled")):
            raise TypeError(f"scaler must be None or a torch.amp.GradScaler, got {type(scaler).__name__}")
        if autocast is not None and not (hasattr(autocast, "__enter__") and hasattr(autocast, "__exit__")):
            raise TypeError(f"autocast must be None or a context manager (e.g. torch.autocast(...)), got "
                            f"{type(autocast).__name__}")
        model_params = {id(p) for p in model.parameters()}
        for group_index, group in enumerate(optimizer.param_groups):
            for param_index, param in enumerate(group["params"]):
                if id(param) not in model_params:
                    raise ValueError(f"optimizer param_groups[{group_index}]['params'][{param_index}] (shape "
                                     f"{tuple(param.shape)}) is not one of model.parameters(): the optimizer must "
                                     "be built on the very model the session trains (not a copy of it)")
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

    # ---------------------------------------------------------------- state

    def _discard_update(self) -> None:
        """Drop the update in progress: every ``.grad`` of the model to None, counters and loss totals to 0."""
        self.model.zero_grad(set_to_none=True)
        self.microsteps_accumulated = 0
        self._loss_sum = None
        self._loss_units = 0

    def reset_accumulation(self) -> None:
        """Drop the half-built update (gradients, counters, loss totals) and make the session usable again.

        ``optimizer_step`` and the lr are kept: only the update in progress is lost.
        """
        self._discard_update()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        """The session as it is now: the current lr of param group 0, the optimizer steps, the micro-steps and loss
        totals of the update in progress and whether that accumulation is still valid."""
        return TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=self.microsteps_accumulated, loss_sum=self._loss_sum,
                                    loss_units=self._loss_units, accumulation_valid=self.accumulation_valid)

    def load_state(self, state: TrainingSessionState) -> None:
        """Restore ``optimizer_step`` and the lr of every param group from ``state``, at an update boundary only.

        A state saved inside an update, or a session inside one, is a ``ValueError`` naming
        ``microsteps_accumulated``; every field is checked before anything changes.
        """
        if not isinstance(state, TrainingSessionState):
            raise TypeError(f"state must be a TrainingSessionState, got {type(state).__name__}")
        if state.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the state is {state.microsteps_accumulated}: a session "
                             "state is loaded at an update boundary (0 micro-steps pending)")
        if self.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the session is {self.microsteps_accumulated}: the session "
                             "is inside an update; finish it or call reset_accumulation() before load_state")
        if not state.accumulation_valid:
            raise ValueError("accumulation_valid of the state is False: it was saved after a failed micro-step")
        _check_int("optimizer_step", state.optimizer_step, 0)
        _check_non_negative_real("lr", state.lr, allow_inf=False)
        self.optimizer_step = state.optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = state.lr

    # ---------------------------------------------------------------- one micro-step

    @staticmethod
    def _check_options(options: TrainingStepOptions) -> None:
        """Every option, checked before the first change (lr, counters, gradients)."""
        if not isinstance(options, TrainingStepOptions):
            raise TypeError(f"options must be a TrainingStepOptions, got {type(options).__name__}")
        _check_int("normalization_units", options.normalization_units, 1)
        if options.lr is not None:
            _check_non_negative_real("lr", options.lr, allow_inf=False)
        _check_non_negative_real("clip_grad_norm", options.clip_grad_norm, allow_inf=True)
        if not isinstance(options.force_update, bool):
            raise ValueError(f"force_update must be a bool, got {options.force_update!r}")
        for name in ("before_update", "after_update"):
            hook = getattr(options, name)
            if hook is not None and not callable(hook):
                raise ValueError(f"{name} must be None or a callable, got {type(hook).__name__}")

    @staticmethod
    def _check_output(output) -> TrainingStepOutput:
        """``step_fn``'s result: a TrainingStepOutput with a scalar loss tensor and non-negative int unit counts."""
        if not isinstance(output, TrainingStepOutput):
            raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(output).__name__}")
        if not torch.is_tensor(output.loss) or output.loss.numel() != 1:
            raise ValueError(f"loss of the step output must be a scalar tensor, got "
                             f"{tuple(output.loss.shape) if torch.is_tensor(output.loss) else type(output.loss)}")
        _check_int("gradient_units", output.gradient_units, 0)
        _check_int("loss_units", output.loss_units, 0)
        if output.loss_sum is not None and not torch.is_tensor(output.loss_sum):
            raise ValueError(f"loss_sum of the step output must be a tensor or None, got "
                             f"{type(output.loss_sum).__name__}")
        return output

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        """Run one micro-step of the current update and, when it is the K-th or ``options.force_update`` is set,
        close the update. Returns what happened as a ``TrainingStepReport``.

        Raises ``AccumulationInvalidError`` while an earlier failure has not been cleared by
        ``reset_accumulation()``; any exception raised here (a rejected option or output included) invalidates
        the accumulation.
        """
        if not self.accumulation_valid:
            raise AccumulationInvalidError("the accumulation is invalid: an earlier train_step failed and left a "
                                           "half-built update; call reset_accumulation() before the next update")
        try:
            return self._micro_step(batch, options, step_fn)
        except BaseException:   # KeyboardInterrupt too: the gradients may hold part of a backward
            self.accumulation_valid = False
            raise

    def _micro_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        """Validate, write the lr, forward + weighted backward, accumulate the loss totals, maybe close."""
        self._check_options(options)
        if not callable(step_fn):
            raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
        if options.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = options.lr
        # Decide BEFORE the forward: a DDP model runs non-closing micro-steps inside no_sync().
        closes = options.force_update or self.microsteps_accumulated + 1 >= self.accumulation_steps
        no_sync = getattr(self.model, "no_sync", None)
        sync_context = no_sync() if (not closes and callable(no_sync)) else nullcontext()
        with sync_context:
            with (self.autocast if self.autocast is not None else nullcontext()):
                output = self._check_output(step_fn(self.model, batch))
                # S_k / N written from the micro-batch mean: mean_k * n_k / N
                weighted = output.loss * output.gradient_units / options.normalization_units
            # the backward runs even for gradient_units == 0: a DDP rank must join the gradient all-reduce
            (self.scaler.scale(weighted) if self.scaler is not None else weighted).backward()
        self.microsteps_accumulated += 1
        if output.loss_sum is not None:
            loss_sum = output.loss_sum.detach()   # no graph kept alive; "+" makes a new tensor, never in place
            self._loss_sum = loss_sum if self._loss_sum is None else self._loss_sum + loss_sum
        self._loss_units += output.loss_units
        if not closes:
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=self.microsteps_accumulated)
        return self._close_update(options)

    def _close_update(self, options: TrainingStepOptions) -> TrainingStepReport:
        """before_update -> unscale -> clip -> step (+ scaler update) -> after_update -> gradients to None."""
        microsteps = self.microsteps_accumulated
        loss_sum, loss_units = self._loss_sum, self._loss_units
        if options.before_update is not None and options.before_update():
            self._discard_update()
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=microsteps, aborted=True)
        scaler_on = self.scaler is not None and self.scaler.is_enabled()
        if scaler_on:
            self.scaler.unscale_(self.optimizer)   # clip the true gradients, not the scaled ones
        grad_norm = None
        if options.clip_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)
        if scaler_on:
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            # the scale backs off exactly when inf/NaN was found; a grown scale is a clean step
            stepped = not self.scaler.get_scale() < scale_before
        else:
            self.optimizer.step()
            stepped = True
        if stepped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()
        self._discard_update()
        return TrainingStepReport(parameters_updated=stepped, optimizer_step=self.optimizer_step,
                                  microsteps_accumulated=microsteps, loss_sum=loss_sum, loss_units=loss_units,
                                  grad_norm=grad_norm, overflow_skipped=not stepped)


def migrate_train_state(state: dict) -> dict:
    """Convert a legacy training state to global-batch semantics; the input stays unchanged.

    A state with ``batch_size_semantics == "global"`` comes back as an equal copy. A legacy one (no such key:
    ``batch_size`` the micro-batch, ``accum_steps`` = K, ``sample_count``, ``epoch``, ``step`` the micro-steps done)
    becomes a new dict with its other keys kept, ``batch_size`` and ``step`` removed, and
    ``batch_size_semantics="global"``, ``global_batch_size``, ``epoch``, ``update_step_in_epoch``,
    ``sample_position``, ``dropped_microsteps`` and ``migration_note``. A ``step`` inside the epoch resumes at its
    last update boundary; the epoch's last micro-step (``ceil(sample_count / batch_size)``) resumes at update 0 of
    the next epoch. Defaults: ``epoch`` 0, ``step`` 0, ``accum_steps`` 1; ``batch_size`` and ``sample_count`` have
    none. A bad value is a ``ValueError`` that names its key first.
    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    semantics = state.get("batch_size_semantics")
    if semantics == GLOBAL_SEMANTICS:
        return dict(state)
    if semantics is not None:
        raise ValueError(f"batch_size_semantics must be {GLOBAL_SEMANTICS!r} (or absent for a legacy state), got "
                         f"{semantics!r}")
    for key in ("batch_size", "sample_count"):
        if key not in state:
            raise ValueError(f"{key} is missing: a legacy state needs it (no default: without it the global batch "
                             "and the epoch's end are unknown)")
    batch_size = _check_int("batch_size", state["batch_size"], 1)
    sample_count = _check_int("sample_count", state["sample_count"], 1)
    accum_steps = _check_int("accum_steps", state.get("accum_steps", 1), 1)
    epoch = _check_int("epoch", state.get("epoch", 0), 0)
    step = _check_int("step", state.get("step", 0), 0)
    microsteps_per_epoch = -(-sample_count // batch_size)
    if step > microsteps_per_epoch:
        raise ValueError(f"step {step} is past the end of the epoch: {sample_count} samples in micro-batches of "
                         f"{batch_size} make {microsteps_per_epoch} micro-steps")
    global_batch_size = batch_size * accum_steps
    if step == microsteps_per_epoch:
        # the legacy loop saved after its tail flush: every sample of the epoch was applied
        resume_epoch, update, dropped = epoch + 1, 0, 0
        note = (f"migrated a legacy state (micro-batch {batch_size}, accum_steps {accum_steps}) saved at the end "
                f"of epoch {epoch} (micro-step {step} of {microsteps_per_epoch}) to global_batch_size "
                f"{global_batch_size}: resuming at update 0 of epoch {resume_epoch}, no micro-step dropped")
    else:
        resume_epoch, update, dropped = epoch, step // accum_steps, step % accum_steps
        note = (f"migrated a legacy state (micro-batch {batch_size}, accum_steps {accum_steps}, micro-step {step}) "
                f"to global_batch_size {global_batch_size}: resuming at update {update} of epoch {resume_epoch} "
                f"(sample {update * global_batch_size}); {dropped} micro-step(s) after that update boundary had "
                "unsaved gradients and will be trained again")
    migrated = {key: value for key, value in state.items() if key not in ("batch_size", "step")}
    migrated.update({
        "batch_size_semantics": GLOBAL_SEMANTICS,
        "global_batch_size": global_batch_size,
        "accum_steps": accum_steps,
        "epoch": resume_epoch,
        "update_step_in_epoch": update,
        "sample_position": update * global_batch_size,
        "dropped_microsteps": dropped,
        "migration_note": note,
    })
    return migrated


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """A test that token-weighted accumulation gives the global batch's gradient (lesson 16 §4.4).

    Micro-batches with UNEQUAL valid-target counts (29, 10, 2, 1: with equal counts the mean of means would pass);
    the target is ONE backward of ``token_nll_sum / shifted_target_count`` over all of them concatenated; every
    parameter's gradient is compared element-wise (rtol 1e-5, atol 1e-6). Errors of the implementation under test
    propagate; a wrong gradient raises ``AssertionError``.
    """
    batches = masked_micro_batches()
    counts = [shifted_target_count(b.labels) for b in batches]
    assert len(set(counts)) > 1, f"the test needs unequal valid-target counts per micro-batch, got {counts}"

    reference = tiny_model(SESSION_SCENARIO)
    input_ids = torch.cat([b.input_ids for b in batches])
    labels = torch.cat([b.labels for b in batches])
    total = shifted_target_count(labels)
    assert total == sum(counts) > 0
    (token_nll_sum(reference(input_ids).logits, labels) / total).backward()

    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in batches])

    expected = dict(reference.named_parameters())
    actual = dict(model.named_parameters())
    assert actual.keys() == expected.keys(), "the model under test does not have the reference's parameters"
    for name, ref_param in expected.items():
        want, got = ref_param.grad, actual[name].grad
        if want is None:
            assert got is None or torch.count_nonzero(got) == 0, f"{name}: gradient where the global batch has none"
            continue
        assert got is not None, f"{name}: no gradient after the accumulation (.grad is None)"
        assert got.shape == want.shape, f"{name}: gradient shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6,
                                   msg=lambda detail, name=name: f"{name}: the accumulated gradient is not the "
                                                                 f"global batch's\n{detail}")
