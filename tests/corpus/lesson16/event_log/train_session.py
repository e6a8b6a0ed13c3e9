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
from typing import NamedTuple, Optional

import torch  # noqa: F401

from course.protocol.types import (GLOBAL_SEMANTICS, AccumulationInvalidError, TrainingSessionState,  # noqa: F401
                                           TrainingStepOptions, TrainingStepOutput, TrainingStepReport)
from course.minimind import IGNORE_INDEX  # noqa: F401
# for your test (§4.4):
from course.protocol.text import shifted_target_count, token_nll_sum  # noqa: F401
from course.runs import SESSION_SCENARIO, masked_micro_batches, tiny_model  # noqa: F401


def _is_int(value) -> bool:
    """A real Python int; ``bool`` subclasses ``int`` but is not a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def count_loss_units(labels: torch.Tensor) -> int:
    """The number of targets the model's loss averages over, as an int (lesson 16 §4.1).

    ``labels``: token ids shaped ``[seq]`` or ``[batch, seq]``, -100 (``IGNORE_INDEX``) where a target does not
    count. Position i of the logits predicts token i + 1, so the targets are ``labels[..., 1:]``.
    Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4; [[7]] -> 0.
    """
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor of token ids, got {type(labels).__name__}")
    if labels.dim() == 0:
        raise ValueError("labels must be shaped [seq] or [batch, seq], got a 0-dim tensor")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must hold integer token ids, got dtype {labels.dtype}")
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """Cut one global batch of ``samples`` into its micro-batches, in order (lesson 16 §4.2).

    Each micro-batch holds ``global_batch_size / accumulation_steps`` samples; a short last global batch is
    split over what remains. Returns a list of lists.
    Examples: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    if not _is_int(accumulation_steps) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")
    if not _is_int(global_batch_size) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be an int >= 1, got {global_batch_size!r}")
    if global_batch_size % accumulation_steps:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size})")
    items = list(samples)
    if len(items) > global_batch_size:
        raise ValueError(f"samples holds {len(items)} samples, more than one global batch "
                         f"(global_batch_size {global_batch_size})")
    micro = global_batch_size // accumulation_steps
    return [items[start:start + micro] for start in range(0, len(items), micro)]


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """The number of optimizer updates in an epoch of ``sample_count`` samples (lesson 16 §4.2).

    One update per global batch; a short last global batch is an update too. Integer ceiling, exact for any int.
    Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    if not _is_int(sample_count) or sample_count < 0:
        raise ValueError(f"sample_count must be an int >= 0, got {sample_count!r}")
    if not _is_int(global_batch_size) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be an int >= 1, got {global_batch_size!r}")
    return -(-sample_count // global_batch_size)


class _MicroEvent(NamedTuple):
    """What one micro-step of the open update left behind (its gradient is already in ``.grad``)."""
    loss_sum: Optional[torch.Tensor]   # detached, on the device
    loss_units: int
    gradient_units: int


class TrainingSession:
    """One parameter update executed over ``accumulation_steps`` calls of ``train_step`` (lesson 16 §4.3).

    The session keeps a small log of the open update's micro-steps (``_MicroEvent``: detached loss sum and
    unit counts); the update's totals are computed from that log when the update closes, and the log is
    cleared with the gradients. Each micro loss is weighted by ``gradient_units / normalization_units`` before
    its backward, so the accumulated gradient is the one of one backward of the whole global batch.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        if not _is_int(accumulation_steps) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")
        model_params = {id(p) for p in model.parameters()}
        for index, group in enumerate(optimizer.param_groups):
            for param in group["params"]:
                if id(param) not in model_params:
                    raise ValueError(f"optimizer param group {index} holds a tensor that is not one of "
                                     "model.parameters() (an optimizer built on a copy of the model?)")
        if scaler is None:
            device_type = next(model.parameters()).device.type
            scaler = torch.amp.GradScaler(device_type, enabled=False)
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.autocast = autocast if autocast is not None else nullcontext()
        self.accumulation_steps = accumulation_steps
        self.optimizer_step = 0
        self.accumulation_valid = True
        self._events: list[_MicroEvent] = []

    # -- the event log ------------------------------------------------------------------------------------
    @property
    def microsteps_accumulated(self) -> int:
        return len(self._events)

    def _totals(self) -> tuple[Optional[torch.Tensor], int]:
        """The open update's loss numerator (a new device tensor, or None) and its loss units."""
        sums = [e.loss_sum for e in self._events if e.loss_sum is not None]
        loss_sum = torch.stack([s.reshape(()) for s in sums]).sum() if sums else None
        return loss_sum, sum(e.loss_units for e in self._events)

    def _clear(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self._events.clear()

    # -- public API ---------------------------------------------------------------------------------------
    def reset_accumulation(self) -> None:
        """Drop the half-built update (gradients and log) and accept calls again."""
        self._clear()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        loss_sum, loss_units = self._totals()
        return TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=self.microsteps_accumulated, loss_sum=loss_sum,
                                    loss_units=loss_units, accumulation_valid=self.accumulation_valid)

    def load_state(self, state: TrainingSessionState) -> None:
        if state.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the state is {state.microsteps_accumulated}: a state is "
                             "loaded only at an update boundary")
        if self.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the session is {self.microsteps_accumulated}: load_state "
                             "is refused inside an update")
        if not _is_int(state.optimizer_step) or state.optimizer_step < 0:
            raise ValueError(f"optimizer_step must be an int >= 0, got {state.optimizer_step!r}")
        if state.lr is None or not state.lr >= 0:
            raise ValueError(f"lr must be >= 0, got {state.lr!r}")
        self.optimizer_step = state.optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = state.lr

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("a previous train_step failed inside this update; call "
                                           "reset_accumulation() before training on")
        try:
            return self._train_step(batch, options, step_fn)
        except BaseException:
            self.accumulation_valid = False
            raise

    # -- one micro-step -----------------------------------------------------------------------------------
    @staticmethod
    def _check_options(options: TrainingStepOptions) -> None:
        units = options.normalization_units
        if not _is_int(units) or units < 1:
            raise ValueError(f"normalization_units must be an int >= 1 (the valid targets of the whole update), "
                             f"got {units!r}")
        if options.lr is not None and not options.lr >= 0:   # NaN fails `>=` too
            raise ValueError(f"lr must be >= 0, got {options.lr!r}")
        if options.clip_grad_norm is None or not options.clip_grad_norm >= 0:
            raise ValueError(f"clip_grad_norm must be >= 0 (0: no clipping), got {options.clip_grad_norm!r}")

    def _train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        self._check_options(options)
        # Decided before the forward: under DDP a non-closing micro-step must run inside no_sync().
        closes = options.force_update or self.microsteps_accumulated + 1 >= self.accumulation_steps
        no_sync = getattr(self.model, "no_sync", None)
        sync_ctx = nullcontext() if closes or no_sync is None else no_sync()

        with sync_ctx:
            with self.autocast:
                output = step_fn(self.model, batch)
            if not isinstance(output, TrainingStepOutput):
                raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(output).__name__}")
            if not _is_int(output.gradient_units) or output.gradient_units < 0:
                raise ValueError(f"gradient_units must be an int >= 0, got {output.gradient_units!r}")
            # mean_k * n_k / N = S_k / N; a micro-batch with 0 units still runs its backward (DDP all-reduce).
            weighted = output.loss * (output.gradient_units / options.normalization_units)
            self.scaler.scale(weighted).backward()

        self._events.append(_MicroEvent(None if output.loss_sum is None else output.loss_sum.detach(),
                                        output.loss_units, output.gradient_units))
        if not closes:
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=self.microsteps_accumulated)
        return self._close_update(options)

    def _close_update(self, options: TrainingStepOptions) -> TrainingStepReport:
        held = self.microsteps_accumulated
        if options.before_update is not None and options.before_update():
            self._clear()   # an abort: the update's gradients are dropped, nothing steps
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=held, aborted=True)

        if options.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = options.lr
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.unscale_(self.optimizer)
        try:
            grad_norm = None
            if options.clip_grad_norm > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)
            self.scaler.step(self.optimizer)
        finally:
            # even when clip or step raised: close the scaler's books on this update, or the next unscale_
            # (after reset_accumulation) refuses to run
            self.scaler.update()
        # update() backs the scale off exactly when inf/NaN was found; a grown scale is a clean step.
        skipped = scale_before is not None and self.scaler.get_scale() < scale_before
        if not skipped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()

        loss_sum, loss_units = self._totals()
        self._clear()
        return TrainingStepReport(parameters_updated=not skipped, optimizer_step=self.optimizer_step,
                                  microsteps_accumulated=held, loss_sum=loss_sum, loss_units=loss_units,
                                  grad_norm=grad_norm, overflow_skipped=skipped)


_LEGACY_DEFAULTS = {"epoch": 0, "step": 0, "accum_steps": 1}


def migrate_train_state(state: dict) -> dict:
    """Convert a legacy training state to global-batch semantics; the input stays unchanged (lesson 16 §5.4).

    A state with ``batch_size_semantics == "global"`` comes back as an equal copy. A legacy one (``batch_size``
    the micro-batch, ``accum_steps`` = K, ``sample_count``, ``epoch``, ``step`` the micro-steps done) resumes
    at its last update boundary, or at the start of the next epoch when ``step`` is the epoch's last micro-step.
    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    semantics = state.get("batch_size_semantics")
    if semantics is not None:
        if semantics != GLOBAL_SEMANTICS:
            raise ValueError(f"batch_size_semantics must be {GLOBAL_SEMANTICS!r} or absent, got {semantics!r}")
        return dict(state)

    values = {}
    for key in ("batch_size", "sample_count", "accum_steps", "epoch", "step"):
        if key not in state:
            if key not in _LEGACY_DEFAULTS:
                raise ValueError(f"{key} is missing from the legacy state: without it the global batch and the "
                                 "epoch's end are unknown")
            values[key] = _LEGACY_DEFAULTS[key]
            continue
        value = state[key]
        lowest = 0 if key in ("epoch", "step") else 1
        if not _is_int(value) or value < lowest:
            raise ValueError(f"{key} must be an int >= {lowest}, got {value!r}")
        values[key] = value

    batch, accum, step = values["batch_size"], values["accum_steps"], values["step"]
    microsteps_per_epoch = -(-values["sample_count"] // batch)
    if step > microsteps_per_epoch:
        raise ValueError(f"step ({step}) is past the epoch's end ({microsteps_per_epoch} micro-steps of "
                         f"{batch} over {values['sample_count']} samples)")
    global_batch = batch * accum
    if step == microsteps_per_epoch:   # saved after the tail flush: every sample of the epoch was applied
        epoch, update, dropped = values["epoch"] + 1, 0, 0
    else:
        epoch, update, dropped = values["epoch"], step // accum, step % accum

    migrated = {k: v for k, v in state.items() if k not in ("batch_size", "step")}
    note = (f"legacy state (micro-batch {batch} x accum_steps {accum}, micro-step {step} of epoch "
            f"{values['epoch']}) read as global_batch_size {global_batch}: resuming at update {update} of epoch "
            f"{epoch} (sample {update * global_batch})")
    note += (f"; {dropped} micro-step(s) after that boundary were never applied and are trained again"
             if dropped else "; no micro-step dropped")
    migrated.update(batch_size_semantics=GLOBAL_SEMANTICS, global_batch_size=global_batch, accum_steps=accum,
                    sample_count=values["sample_count"], epoch=epoch, update_step_in_epoch=update,
                    sample_position=update * global_batch, dropped_microsteps=dropped, migration_note=note)
    return migrated


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Token-weighted accumulation must give the gradient of ONE backward of the whole global batch (§4.4).

    Unequal valid-target counts per micro-batch (29, 10, 2, 1), every parameter compared element-wise.
    """
    batches = masked_micro_batches()
    counts = [shifted_target_count(b.labels) for b in batches]
    assert len(set(counts)) > 1, f"the micro-batches must hold unequal valid-target counts, got {counts}"

    # the truth: one forward / backward over all micro-batches concatenated
    reference = tiny_model(SESSION_SCENARIO)
    input_ids = torch.cat([b.input_ids for b in batches])
    labels = torch.cat([b.labels for b in batches])
    (token_nll_sum(reference(input_ids).logits, labels) / shifted_target_count(labels)).backward()
    expected = {name: p.grad for name, p in reference.named_parameters()}

    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in batches])
    got = dict(model.named_parameters())
    assert set(got) == set(expected), "the model under test has other parameters"
    for name, want in expected.items():
        grad = got[name].grad
        if want is None:
            assert grad is None, f"{name}: the global batch gives no gradient, the accumulation gives one"
            continue
        assert grad is not None, f"{name}: no gradient after the accumulation"
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
