"""Reference solutions for lesson 16 (``impl/train_session.py`` is the student's copy).

Token-weighted gradient accumulation behind a single-step protocol: the run driver counts the
update's valid target tokens before splitting it; ``TrainingSession.train_step`` runs one
micro-batch, rescales its loss by ``gradient_units / normalization_units`` and owns the update
boundary (unscale, clip, optimizer step, zero_grad).

Error policy: any exception inside ``train_step`` marks the accumulation invalid; every later
call raises ``AccumulationInvalidError`` until the caller calls ``reset_accumulation()``, which
drops the half-built gradients. A ``before_update`` abort is a deliberate decision, so it discards
the update's gradients itself and the next call starts a fresh update.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from course.protocol.text import shifted_target_count, token_nll_sum
from course.protocol.types import (GLOBAL_SEMANTICS, AccumulationInvalidError, TrainingSessionState,
                                           TrainingStepOptions, TrainingStepOutput, TrainingStepReport)
from course.minimind import IGNORE_INDEX
from course.reference.train_loop import should_step_optimizer
from course.runs import SESSION_SCENARIO, masked_micro_batches, tiny_model


def count_loss_units(labels: torch.Tensor) -> int:
    """Valid targets as the model's shifted loss sees them: ``labels[..., 1:] != -100``."""
    if not torch.is_tensor(labels) or labels.dim() == 0:
        raise ValueError("labels must be a tensor of shape [..., seq_len], got "
                         f"{type(labels).__name__} {tuple(getattr(labels, 'shape', ()))}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels must hold integer token ids, got dtype {labels.dtype}")
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """Micro-batches of ``global_batch_size // accumulation_steps`` samples, in order.

    A short final global batch (fewer samples than ``global_batch_size``) is split over what
    remains, so its last micro-batch may be smaller and there may be fewer micro-batches.
    """
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if accumulation_steps <= 0:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    if global_batch_size % accumulation_steps:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size}): micro-batch size would be {global_batch_size / accumulation_steps:g}")
    samples = list(samples)
    if not 1 <= len(samples) <= global_batch_size:
        raise ValueError(f"samples must hold 1..global_batch_size={global_batch_size} items, got {len(samples)}")
    micro = global_batch_size // accumulation_steps
    return [samples[i:i + micro] for i in range(0, len(samples), micro)]


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """Optimizer updates per epoch: ``ceil(sample_count / global_batch_size)`` (a short tail counts), in
    integers: a float division rounds counts above 2**53."""
    if sample_count < 0:
        raise ValueError(f"sample_count must be >= 0, got {sample_count}")
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    return -(-sample_count // global_batch_size)


class TrainingSession:
    """Owns model + optimizer (+ scaler, autocast) and executes one parameter update in K calls."""

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        if accumulation_steps <= 0:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        self._validate_optimizer(model, optimizer)
        self.model, self.optimizer = model, optimizer
        self.accumulation_steps = accumulation_steps
        device_type = next(model.parameters()).device.type
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler(device_type, enabled=False)
        self.autocast = autocast if autocast is not None else nullcontext()
        self.optimizer_step = 0
        self.accumulation_valid = True
        self._clear_pending()

    @staticmethod
    def _validate_optimizer(model, optimizer) -> None:
        """Python's counterpart of "moving keeps optimizer references valid": the optimizer must hold the
        model's own Parameter objects (a deepcopy or a rebuilt model would orphan it)."""
        own = {id(p) for p in model.parameters()}
        foreign = sum(id(p) not in own for g in optimizer.param_groups for p in g["params"])
        if foreign:
            raise ValueError(f"optimizer holds {foreign} tensors that are not parameters of model "
                             "(built on a copy?); build the optimizer from model.parameters()")

    def _clear_pending(self) -> None:
        self.microsteps_accumulated = 0
        self._normalization_units = 0
        self._loss_sum = None
        self._loss_units = 0

    def reset_accumulation(self) -> None:
        """Drop a half-built update (after an error) and accept micro-steps again."""
        self.model.zero_grad(set_to_none=True)
        self._clear_pending()
        self.accumulation_valid = True

    def load_state(self, state: TrainingSessionState) -> None:
        """Restore ``optimizer_step`` and the lr of every param group at an update boundary (pending gradients
        are never saved): a state or a session inside an update is refused before anything changes."""
        if state.microsteps_accumulated or self.microsteps_accumulated:
            raise ValueError("load_state needs an update boundary: microsteps_accumulated must be 0, got "
                             f"{state.microsteps_accumulated} (saved) / {self.microsteps_accumulated} (session)")
        self.optimizer_step = state.optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = state.lr

    def state(self) -> TrainingSessionState:
        return TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=self.microsteps_accumulated,
                                    loss_sum=self._loss_sum, loss_units=self._loss_units,
                                    accumulation_valid=self.accumulation_valid)

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("a previous micro-step failed; its half-built update must not be "
                                           "reused: call reset_accumulation() first")
        try:
            return self._train_step(batch, options, step_fn)
        except BaseException:
            self.accumulation_valid = False
            raise

    def _train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if options.normalization_units <= 0:
            raise ValueError("normalization_units must be >= 1 (valid units of the whole update), got "
                             f"{options.normalization_units}: refusing a meaningless update")
        if self.microsteps_accumulated and options.normalization_units != self._normalization_units:
            raise ValueError(f"normalization_units changed inside an update: {self._normalization_units} -> "
                             f"{options.normalization_units}")
        if options.lr is not None and not options.lr >= 0:   # NaN fails too
            raise ValueError(f"lr must be >= 0 (None keeps the current lr), got {options.lr}")
        if not options.clip_grad_norm >= 0:
            raise ValueError(f"clip_grad_norm must be >= 0 (0: no clipping), got {options.clip_grad_norm}")
        self._normalization_units = options.normalization_units
        if options.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = options.lr
        closes_update = options.force_update or should_step_optimizer(self.microsteps_accumulated + 1,
                                                                      self.accumulation_steps)
        # Under DDP only the update's last backward all-reduces (no_sync skips communication).
        no_sync = getattr(self.model, "no_sync", None)
        sync_ctx = no_sync() if no_sync is not None and not closes_update else nullcontext()
        with sync_ctx:
            with self.autocast:
                output = step_fn(self.model, batch)
            if not isinstance(output, TrainingStepOutput):
                raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(output).__name__}")
            if output.gradient_units < 0:
                raise ValueError(f"gradient_units must be >= 0, got {output.gradient_units}")
            weight = output.gradient_units / options.normalization_units
            self.scaler.scale(output.loss * weight).backward()
        if output.loss_sum is not None:
            loss_sum = output.loss_sum.detach()
            self._loss_sum = loss_sum if self._loss_sum is None else self._loss_sum + loss_sum
        self._loss_units += output.loss_units
        self.microsteps_accumulated += 1
        if not closes_update:
            return TrainingStepReport(False, self.optimizer_step, self.microsteps_accumulated)
        return self._close_update(options)

    def _close_update(self, options: TrainingStepOptions) -> TrainingStepReport:
        microsteps, loss_sum, loss_units = self.microsteps_accumulated, self._loss_sum, self._loss_units
        if options.before_update is not None and options.before_update():
            self.reset_accumulation()
            return TrainingStepReport(False, self.optimizer_step, microsteps, aborted=True)
        self.scaler.unscale_(self.optimizer)
        grad_norm = None
        if options.clip_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # update() backs the scale off exactly when it found inf/NaN and skipped the step.
        skipped = scale_before is not None and self.scaler.get_scale() < scale_before
        if not skipped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()
        # the model's, not the optimizer's: a trainable parameter outside the optimizer keeps no stale .grad
        self.model.zero_grad(set_to_none=True)
        self._clear_pending()
        return TrainingStepReport(not skipped, self.optimizer_step, microsteps, loss_sum, loss_units,
                                  grad_norm, overflow_skipped=skipped)


# Legacy keys a state may lack, and what their absence means (lesson 16 §5.4). ``batch_size`` and
# ``sample_count`` have no default: without them the global batch and the epoch's end are unknown.
# ``accum_steps`` (K) is the key lesson 15's checkpoints write; the code calls K accumulation_steps.
LEGACY_DEFAULTS = {"epoch": 0, "step": 0, "accum_steps": 1}


def _validate_legacy(legacy: dict) -> None:
    """Every legacy value is an int in its range (a bool is none, though Python's bool subclasses int)."""
    for key, low in (("batch_size", 1), ("sample_count", 1), ("accum_steps", 1), ("step", 0), ("epoch", 0)):
        value = legacy.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"legacy state: {key} must be an int >= {low}, got {value!r}")


def migrate_train_state(state: dict) -> dict:
    """Return a training state with global batch-size semantics (the input is not modified).

    A state without ``batch_size_semantics`` is legacy: ``batch_size`` was the micro-batch, ``step``
    counted micro-steps of the epoch and ``sample_count`` is the epoch's sample count. It becomes
    ``global_batch_size = batch_size * accum_steps``. A ``step`` inside the epoch resumes at the LAST
    UPDATE BOUNDARY: the ``step % accum_steps`` micro-steps after it were never in the file (pending
    gradients are not saved) and are trained again. ``step == ceil(sample_count / batch_size)`` is the
    epoch's end, saved after its tail flush: every sample was applied, so it resumes at the start of
    the next epoch.
    """
    semantics = state.get("batch_size_semantics")
    if semantics == GLOBAL_SEMANTICS:
        return dict(state)
    if semantics is not None:
        raise ValueError(f"batch_size_semantics must be {GLOBAL_SEMANTICS!r} or absent (legacy), got {semantics!r}")
    legacy = {**LEGACY_DEFAULTS, **state}
    _validate_legacy(legacy)
    epoch, step, accum = legacy["epoch"], legacy["step"], legacy["accum_steps"]
    micro_steps_per_epoch = -(-legacy["sample_count"] // legacy["batch_size"])
    if step > micro_steps_per_epoch:
        raise ValueError(f"legacy state: step {step} is past the epoch's end, ceil(sample_count "
                         f"{legacy['sample_count']} / batch_size {legacy['batch_size']}) = {micro_steps_per_epoch} "
                         "micro-steps")
    global_batch = legacy["batch_size"] * accum
    if step == micro_steps_per_epoch:   # the tail flush applied the last step % accum micro-steps
        epoch, update_step, dropped = epoch + 1, 0, 0
        where = (f"epoch {legacy['epoch']} was complete (saved after its tail flush at micro-step {step}); "
                 f"resumed at update 0 of epoch {legacy['epoch'] + 1}, the start of the next epoch")
    else:
        update_step, dropped = step // accum, step % accum
        where = (f"resumed at update {update_step} of epoch {epoch}, the last update boundary "
                 f"({dropped} later micro-steps are trained again)")
    migrated = {k: v for k, v in legacy.items() if k not in ("batch_size", "step")}
    migrated.update(batch_size_semantics=GLOBAL_SEMANTICS, global_batch_size=global_batch, epoch=epoch,
                    update_step_in_epoch=update_step, sample_position=update_step * global_batch,
                    dropped_microsteps=dropped,
                    migration_note=(f"legacy micro-batch semantics: batch_size {legacy['batch_size']} x accum_steps "
                                    f"{accum} -> global_batch_size {global_batch}; {where}"))
    return migrated


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Token-weighted accumulation over micro-batches with UNEQUAL valid-target counts gives the
    gradient of the global batch's mean NLL over its valid targets.

    Inputs chosen so that every catalogued bug shows: 4 micro-batches holding 29, 10, 2 and 1 valid
    shifted targets (equal counts hide the mean of micro-batch means), masked positions in every
    micro-batch but the first (no padding hides counting it), valid targets at position 0 (hides a
    count without the shift); every parameter compared element-wise with a tolerance far above float
    rounding (~1e-8) and far below any bug (a 1 % error of the smallest gradient, elements ~7e-4:
    assert_close's default atol=1e-5 would hide it).
    """
    cuts = ((16, 15), (9, 3), (2, 2), (2, 0))   # valid labels per sample: labels[i, cut:] = -100
    micro_batches = [(batch.input_ids, batch.labels) for batch in masked_micro_batches(cuts)]
    input_ids = torch.cat([ids for ids, _ in micro_batches])
    labels = torch.cat([lab for _, lab in micro_batches])
    big = tiny_model(SESSION_SCENARIO)
    (token_nll_sum(big(input_ids).logits, labels) / shifted_target_count(labels)).backward()
    model = tiny_model(SESSION_SCENARIO)   # seeded: the same weights as big
    accumulate_token_weighted(model, micro_batches)
    for (name, param), expected in zip(model.named_parameters(), big.parameters()):
        torch.testing.assert_close(param.grad, expected.grad, rtol=1e-5, atol=1e-6,
                                   msg=lambda detail: f"gradient of {name}: {detail}")
