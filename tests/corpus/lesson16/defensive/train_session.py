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


import numbers

_NOT_TOKEN_IDS = "labels must hold integer token ids"


def _is_int(value) -> bool:
    """A true integer count: ``int`` (or a numpy-style integral), never ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _require_count(name: str, value, minimum: int) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def count_loss_units(labels: torch.Tensor) -> int:
    """The number of targets the model's loss averages over, as an int (lesson 16 §4.1).

    The loss is ``cross_entropy(logits[:, :-1], labels[:, 1:], ignore_index=-100)``: position 0 is never a
    target and -100 (``IGNORE_INDEX``) never counts. Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4;
    [[7]] -> 0.
    """
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.dim() == 0:
        raise ValueError("labels must be shaped [seq] or [batch, seq], got a 0-dim tensor")
    dtype = labels.dtype
    if dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"{_NOT_TOKEN_IDS}, got dtype {dtype}")
    return int((labels[..., 1:] != IGNORE_INDEX).sum().item())


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """Cut one global batch of ``samples`` into its micro-batches, in order (lesson 16 §4.2).

    Each micro-batch holds ``global_batch_size / accumulation_steps`` samples; a short last global batch is
    split over what remains. Returns a list of lists.
    Examples: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    _require_count("global_batch_size", global_batch_size, 1)
    _require_count("accumulation_steps", accumulation_steps, 1)
    if global_batch_size % accumulation_steps != 0:
        raise ValueError(f"accumulation_steps ({accumulation_steps}) must divide global_batch_size "
                         f"({global_batch_size})")
    items = list(samples)
    if not items:
        raise ValueError("samples must hold at least one sample: an update needs data")
    if len(items) > global_batch_size:
        raise ValueError(f"samples ({len(items)}) must not exceed global_batch_size ({global_batch_size}): "
                         "split one global batch at a time")
    size = global_batch_size // accumulation_steps
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """The number of optimizer updates in an epoch of ``sample_count`` samples (lesson 16 §4.2).

    One update per global batch; a short last global batch is an update too. Integer arithmetic only (a float
    division rounds above 2**53). Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    sample_count = _require_count("sample_count", sample_count, 0)
    global_batch_size = _require_count("global_batch_size", global_batch_size, 1)
    return -(-sample_count // global_batch_size)


def _check_rate(name: str, value, *, allow_inf: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r})")
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if not allow_inf and math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value}")


class TrainingSession:
    """One parameter update executed over ``accumulation_steps`` calls of ``train_step`` (lesson 16 §4.3).

    Every option and every ``step_fn`` output is validated before it is used; the counters are plain ints; the
    GradScaler's skip decision is read through its public API (``get_scale`` before and after ``update``).
    An exception anywhere inside ``train_step`` (``KeyboardInterrupt`` included) invalidates the accumulation
    until ``reset_accumulation()``.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.accumulation_steps = _require_count("accumulation_steps", accumulation_steps, 1)
        if scaler is not None:
            missing = [m for m in ("scale", "unscale_", "step", "update", "get_scale", "is_enabled")
                       if not callable(getattr(scaler, m, None))]
            if missing:
                raise TypeError(f"scaler must be a torch.amp.GradScaler (or None); {type(scaler).__name__} lacks "
                                f"{', '.join(missing)}")
        if autocast is not None and not (hasattr(autocast, "__enter__") and hasattr(autocast, "__exit__")):
            raise TypeError(f"autocast must be a context manager (or None), got {type(autocast).__name__}")
        model_ids = {id(p) for p in model.parameters()}
        for index, group in enumerate(optimizer.param_groups):
            for param in group["params"]:
                if id(param) not in model_ids:
                    raise ValueError(f"optimizer param group {index} holds a tensor of shape {tuple(param.shape)} "
                                     "that is not one of model.parameters() (by identity): build the optimizer "
                                     "on this model, after any copy or rebuild")
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.autocast = autocast
        self.optimizer_step = 0
        self.microsteps_accumulated = 0
        self.accumulation_valid = True
        self._loss_sum = None
        self._loss_units = 0
        self._scaler_mid_iteration = False   # unscale_ ran, update() has not: set only around the closing step

    # -- state ---------------------------------------------------------------------------------------------
    def _clear(self) -> None:
        """Back to an update boundary: every gradient of the model None, counters and totals 0."""
        self.model.zero_grad(set_to_none=True)
        self.microsteps_accumulated = 0
        self._loss_sum = None
        self._loss_units = 0

    def reset_accumulation(self) -> None:
        if self._scaler_mid_iteration:
            # an error between unscale_ and update(): end the GradScaler's iteration through its public API,
            # otherwise the next unscale_ raises "unscale_() has already been called on this optimizer"
            self.scaler.update()
            self._scaler_mid_iteration = False
        self._clear()
        self.accumulation_valid = True

    def state(self) -> TrainingSessionState:
        return TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=self.microsteps_accumulated, loss_sum=self._loss_sum,
                                    loss_units=self._loss_units, accumulation_valid=self.accumulation_valid)

    def load_state(self, state: TrainingSessionState) -> None:
        if not isinstance(state, TrainingSessionState):
            raise TypeError(f"state must be a TrainingSessionState, got {type(state).__name__}")
        if state.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the state is {state.microsteps_accumulated}: a state "
                             "saved inside an update cannot be loaded (its gradients were never saved)")
        if self.microsteps_accumulated != 0:
            raise ValueError(f"microsteps_accumulated of the session is {self.microsteps_accumulated}: finish "
                             "or reset the update before load_state")
        optimizer_step = _require_count("optimizer_step", state.optimizer_step, 0)
        _check_rate("lr", state.lr, allow_inf=False)
        self.optimizer_step = optimizer_step
        for group in self.optimizer.param_groups:
            group["lr"] = state.lr

    # -- one micro-step ------------------------------------------------------------------------------------
    @staticmethod
    def _check_options(options) -> None:
        if not isinstance(options, TrainingStepOptions):
            raise TypeError(f"options must be a TrainingStepOptions, got {type(options).__name__}")
        _require_count("normalization_units", options.normalization_units, 1)
        if options.lr is not None:
            _check_rate("lr", options.lr, allow_inf=False)
        _check_rate("clip_grad_norm", options.clip_grad_norm, allow_inf=True)
        if not isinstance(options.force_update, bool):
            raise TypeError(f"force_update must be a bool, got {type(options.force_update).__name__}")
        for hook in ("before_update", "after_update"):
            if getattr(options, hook) is not None and not callable(getattr(options, hook)):
                raise TypeError(f"{hook} must be callable or None")

    @staticmethod
    def _check_output(output) -> None:
        if not isinstance(output, TrainingStepOutput):
            raise TypeError(f"step_fn must return a TrainingStepOutput, got {type(output).__name__}")
        _require_count("gradient_units", output.gradient_units, 0)
        _require_count("loss_units", output.loss_units, 0)
        if not isinstance(output.loss, torch.Tensor) or output.loss.numel() != 1:
            raise TypeError("TrainingStepOutput.loss must be a one-element tensor, got "
                            f"{type(output.loss).__name__}")
        if output.loss_sum is not None and not isinstance(output.loss_sum, torch.Tensor):
            raise TypeError(f"TrainingStepOutput.loss_sum must be a tensor or None, got "
                            f"{type(output.loss_sum).__name__}")

    def _scaler_enabled(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        if not self.accumulation_valid:
            raise AccumulationInvalidError("the accumulation is invalid: an earlier train_step raised; call "
                                           "reset_accumulation() to drop the half-built update")
        try:
            return self._train_step(batch, options, step_fn)
        except BaseException:
            self.accumulation_valid = False
            raise

    def _train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        self._check_options(options)   # before anything changes: a rejected option touches no lr or counter
        if not callable(step_fn):
            raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
        if options.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = options.lr

        closes = options.force_update or self.microsteps_accumulated + 1 >= self.accumulation_steps
        sync_context = nullcontext()
        if not closes and hasattr(self.model, "no_sync"):
            sync_context = self.model.no_sync()   # DDP: one gradient all-reduce per update
        with sync_context:
            with (self.autocast if self.autocast is not None else nullcontext()):
                output = step_fn(self.model, batch)
            self._check_output(output)
            weighted = output.loss * output.gradient_units / options.normalization_units
            if self._scaler_enabled():
                weighted = self.scaler.scale(weighted)
            weighted.backward()   # runs for gradient_units == 0 too: a DDP rank must join the all-reduce

        self.microsteps_accumulated += 1
        self._loss_units += int(output.loss_units)
        if output.loss_sum is not None:
            part = output.loss_sum.detach()
            self._loss_sum = part.clone() if self._loss_sum is None else torch.add(self._loss_sum, part)

        if not closes:
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=self.microsteps_accumulated)
        return self._close_update(options)

    def _close_update(self, options: TrainingStepOptions) -> TrainingStepReport:
        microsteps = self.microsteps_accumulated
        if options.before_update is not None and options.before_update():
            self._clear()
            return TrainingStepReport(parameters_updated=False, optimizer_step=self.optimizer_step,
                                      microsteps_accumulated=microsteps, aborted=True)

        scaled = self._scaler_enabled()
        if scaled:
            self.scaler.unscale_(self.optimizer)   # clip the true gradients, not the scaled ones
            self._scaler_mid_iteration = True
        grad_norm = None
        if options.clip_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)

        skipped = False
        if scaled:
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self._scaler_mid_iteration = False
            # update() backs the scale off exactly when step() found inf/NaN; a grown scale is a clean step
            skipped = self.scaler.get_scale() < scale_before
        else:
            self.optimizer.step()

        if not skipped:
            self.optimizer_step += 1
            if options.after_update is not None:
                options.after_update()
        report = TrainingStepReport(parameters_updated=not skipped, optimizer_step=self.optimizer_step,
                                    microsteps_accumulated=microsteps, loss_sum=self._loss_sum,
                                    loss_units=self._loss_units, grad_norm=grad_norm, overflow_skipped=skipped)
        self._clear()
        return report


_LEGACY_FIELDS = (  # key, default (None: required), minimum
    ("batch_size", None, 1),
    ("accum_steps", 1, 1),
    ("sample_count", None, 1),
    ("epoch", 0, 0),
    ("step", 0, 0),
)


def migrate_train_state(state: dict) -> dict:
    """Convert a legacy training state to global-batch semantics; the input stays unchanged (lesson 16 §5.4).

    Legacy (no ``batch_size_semantics``): ``batch_size`` = micro-batch, ``accum_steps`` = K, ``step`` = micro-steps
    done in ``epoch``. Inside the epoch it resumes at the last update boundary ``step // K`` and the ``step % K``
    micro-steps after it are dropped (trained again); ``step == ceil(sample_count / batch_size)`` is the epoch's
    end (saved after the tail flush) and resumes at update 0 of the next epoch.
    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    semantics = state.get("batch_size_semantics")
    if semantics == GLOBAL_SEMANTICS:
        return dict(state)
    if "batch_size_semantics" in state:
        raise ValueError(f"batch_size_semantics must be {GLOBAL_SEMANTICS!r} (or absent for a legacy state), "
                         f"got {semantics!r}")

    values = {}
    for key, default, minimum in _LEGACY_FIELDS:
        if key not in state:
            if default is None:
                raise ValueError(f"{key} is missing: a legacy state needs it (no default exists)")
            values[key] = default
            continue
        value = state[key]
        if not _is_int(value):
            raise ValueError(f"{key} must be an int, got {type(value).__name__} ({value!r})")
        if value < minimum:
            raise ValueError(f"{key} must be >= {minimum}, got {value}")
        values[key] = int(value)

    micro, accum, samples = values["batch_size"], values["accum_steps"], values["sample_count"]
    epoch, step = values["epoch"], values["step"]
    epoch_end = -(-samples // micro)   # micro-steps per epoch, the short last micro-batch included
    if step > epoch_end:
        raise ValueError(f"step ({step}) is past the end of the epoch ({epoch_end} micro-steps of batch_size "
                         f"{micro} over sample_count {samples})")
    global_batch = micro * accum
    if step == epoch_end:
        next_epoch, update, dropped = epoch + 1, 0, 0
        note = (f"legacy state at the end of epoch {epoch} (micro-step {step} of {epoch_end}, saved after the tail "
                f"flush): resuming at update 0 of epoch {next_epoch} with global batch {global_batch} "
                f"({micro} x {accum}); nothing is dropped")
    else:
        next_epoch, update, dropped = epoch, step // accum, step % accum
        note = (f"legacy state at micro-step {step} of epoch {epoch}: resuming at its last update boundary, update "
                f"{update} (sample {update * global_batch}), with global batch {global_batch} ({micro} x {accum}); "
                f"{dropped} micro-step(s) after that boundary had unsaved gradients and are trained again")

    migrated = {key: value for key, value in state.items() if key not in ("batch_size", "step")}
    migrated.update({
        "batch_size_semantics": GLOBAL_SEMANTICS,
        "global_batch_size": global_batch,
        "accum_steps": accum,
        "epoch": next_epoch,
        "update_step_in_epoch": update,
        "sample_position": update * global_batch,
        "dropped_microsteps": dropped,
        "migration_note": note,
    })
    return migrated


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """Token-weighted accumulation must give the gradient of one global-batch backward (lesson 16 §4.4).

    Builds micro-batches with unequal valid-target counts (29, 10, 2, 1: equal counts would let lesson 14's mean
    of means through), computes the oracle with ONE backward of ``token_nll_sum / N`` over all of them, runs the
    implementation on a second copy of the same seeded model, and compares every parameter's gradient
    element-wise (rtol 1e-5, atol 1e-6). The implementation's own exceptions propagate.
    """
    batches = masked_micro_batches()
    counts = [shifted_target_count(b.labels) for b in batches]
    assert len(set(counts)) > 1, f"the check needs unequal valid-target counts per micro-batch, got {counts}"

    reference = tiny_model(SESSION_SCENARIO)
    input_ids = torch.cat([b.input_ids for b in batches])
    labels = torch.cat([b.labels for b in batches])
    total = shifted_target_count(labels)
    assert total == sum(counts) and total > 0
    (token_nll_sum(reference(input_ids).logits, labels) / total).backward()

    model = tiny_model(SESSION_SCENARIO)
    accumulate_token_weighted(model, [(b.input_ids, b.labels) for b in batches])   # its errors propagate

    reference_params = dict(reference.named_parameters())
    params = dict(model.named_parameters())
    assert params.keys() == reference_params.keys(), "the model under test has other parameters"
    for name, ref in reference_params.items():
        grad = params[name].grad
        if ref.grad is None:
            assert grad is None or not bool(grad.any()), f"{name}: a gradient where the global batch has none"
            continue
        assert grad is not None, f"{name}: .grad is None, the accumulation never reached this parameter"
        assert grad.shape == ref.grad.shape, f"{name}: gradient shape {tuple(grad.shape)} != {tuple(ref.grad.shape)}"
        torch.testing.assert_close(grad, ref.grad, rtol=1e-5, atol=1e-6,
                                   msg=lambda detail, name=name: f"gradient of {name} differs from one "
                                                                 f"global-batch backward: {detail}")
