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
    """TODO (lesson 16 §4.1): the number of targets the model's loss averages over, as a Python int.

    Aligns with the shift in ``course/minimind/model.py::MiniMindForCausalLM.forward``
    (``labels[:, 1:]``, ``ignore_index=-100``): count ``labels[..., 1:] != -100``, so position 0 is never
    a target; works for ``[seq]`` and ``[batch, seq]``. Example: ``[[5, 6, -100, -100], [-100, 7, 8, 9]]`` -> 4.
    Raise ``ValueError`` naming ``labels`` for a 0-dim input or a dtype that holds no token ids (float, complex,
    bool).
    """
    raise NotImplementedError("count_loss_units: TODO - see lesson 16 §4.1")


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """TODO (lesson 16 §4.2): cut one global batch into micro-batches of global // accum samples.

    ``samples`` is any sequence (a list, a tuple, a range); keep the order and return a list of lists. A short
    final global batch is split over what remains (the
    last micro-batch may be smaller): 5 samples, global 8, accum 4 -> ``[[0, 1], [2, 3], [4]]``. Raise ``ValueError`` naming the argument when ``global_batch_size`` or
    ``accumulation_steps`` is < 1, when ``global_batch_size % accumulation_steps != 0`` (name
    ``accumulation_steps``), or when ``samples`` is empty or longer than ``global_batch_size``; the bad argument
    is the first one the message names.
    """
    raise NotImplementedError("split_global_batch: TODO - see lesson 16 §4.2")


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """TODO (lesson 16 §4.2): optimizer updates per epoch, ``ceil(sample_count / global_batch_size)``.

    Raise ``ValueError`` naming the argument when ``sample_count < 0`` or ``global_batch_size < 1``.
    """
    raise NotImplementedError("steps_per_epoch: TODO - see lesson 16 §4.2")


class TrainingSession:
    """TODO (lesson 16 §4.3): one parameter update executed over ``accumulation_steps`` calls.

    Replaces the accumulation part of ``course/minimind/train_pretrain.py::train_epoch`` (``loss / K``,
    ``step % K``, the tail flush). Public API the checks use:

    * ``__init__(model, optimizer, *, accumulation_steps, scaler=None, autocast=None)``:
      ``ValueError`` naming ``accumulation_steps`` if < 1, and naming ``optimizer`` if it holds a
      tensor that is not one of ``model.parameters()``. ``scaler=None`` means a disabled
      ``torch.amp.GradScaler`` for the model's device; ``autocast=None`` means ``nullcontext()``.
    * attributes ``optimizer_step`` (updates done), ``microsteps_accumulated``, ``accumulation_valid``.
    * ``train_step(batch, options, step_fn) -> TrainingStepReport``: ``ValueError`` naming
      ``normalization_units`` if it is < 1 or changes inside an update (nothing is updated); set
      ``options.lr`` if given, in EVERY param group; run ``output = step_fn(model, batch)`` under autocast
      (a ``TrainingStepOutput``, else ``TypeError`` naming ``TrainingStepOutput``; ``gradient_units < 0`` ->
      ``ValueError`` naming ``gradient_units``, while 0, a micro-batch without valid targets, is allowed and adds
      nothing); backward ``output.loss * output.gradient_units / normalization_units``
      through ``scaler.scale(...)``; add ``output.loss_sum.detach()`` (when not None) and
      ``output.loss_units`` to the update's totals. On a micro-step that does not close the update, convert
      no tensor to the host: no ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` (an ``if`` on a tensor) or
      ``.tolist()``. This micro-step closes the update when ``options.force_update`` is set or it is the
      K-th micro-step of the update. A non-closing micro-step returns
      ``TrainingStepReport(parameters_updated=False, optimizer_step=<unchanged>,
      microsteps_accumulated=<micro-steps so far, this one included>)`` (``loss_sum`` None, ``loss_units`` 0).
      A closing one, in this order: ``before_update()`` True -> ``reset_accumulation()`` (gradients and
      counters dropped, no step) and report ``aborted=True``; else ``scaler.unscale_``, clip with
      ``clip_grad_norm_(model.parameters(), clip_grad_norm)`` if ``clip_grad_norm > 0`` (report its pre-clip
      norm as ``grad_norm``; ``grad_norm`` is ``None`` when clipping is off), ``scaler.step``,
      ``scaler.update``; the scaler skipped the step (inf/NaN) exactly when ``update()`` lowered its scale
      (compare ``scaler.get_scale()`` before and after, when enabled; a scale that grew is no skip). If it stepped: ``optimizer_step += 1``
      and ``after_update()`` (it sees the new parameters and the gradients still in place); never on a
      skipped update. Then ``optimizer.zero_grad(set_to_none=True)``. Report ``parameters_updated`` (it
      stepped), ``overflow_skipped`` (it skipped; ``optimizer_step`` does not advance), the new
      ``optimizer_step``, the update's ``microsteps_accumulated`` (e.g. 2 for a tail of 2), its ``loss_sum``
      (still a device tensor) and ``loss_units``; the session's own counters and totals are 0 again, every
      ``.grad`` is ``None``, and the next update starts clean. If the model has
      ``no_sync`` (DDP), run the forward and backward of every non-closing micro-step inside ``model.no_sync()``.
    * any exception inside ``train_step`` - in ``step_fn``, in backward, in ``before_update`` or
      ``after_update``, anywhere - propagates unchanged and makes every later call raise
      ``AccumulationInvalidError`` (its message names ``reset_accumulation()``) until ``reset_accumulation()``,
      which drops the gradients (``zero_grad(set_to_none=True)``) and the pending counters and totals, and
      accepts micro-steps again.
    * ``state() -> TrainingSessionState``: the lr of param group 0 as it is now, ``optimizer_step``,
      ``microsteps_accumulated``, the pending ``loss_sum`` / ``loss_units``, ``accumulation_valid``.
    * ``load_state(state)``: only at an update boundary. If ``state.microsteps_accumulated`` or the
      session's own is not 0, raise ``ValueError`` naming ``microsteps_accumulated`` and change
      nothing; else restore ``optimizer_step`` and set ``state.lr`` in every param group.
    """

    def __init__(self, model, optimizer, *, accumulation_steps: int, scaler=None, autocast=None):
        raise NotImplementedError("TrainingSession: TODO - see lesson 16 §4.3")

    def reset_accumulation(self) -> None:
        raise NotImplementedError("TrainingSession.reset_accumulation: TODO - see lesson 16 §4.3")

    def state(self) -> TrainingSessionState:
        raise NotImplementedError("TrainingSession.state: TODO - see lesson 16 §4.3")

    def load_state(self, state: TrainingSessionState) -> None:
        raise NotImplementedError("TrainingSession.load_state: TODO - see lesson 16 §4.3")

    def train_step(self, batch, options: TrainingStepOptions, step_fn) -> TrainingStepReport:
        raise NotImplementedError("TrainingSession.train_step: TODO - see lesson 16 §4.3")


def migrate_train_state(state: dict) -> dict:
    """TODO (lesson 16 §5.4): convert a legacy (micro-batch semantics) training state; never modify the input.

    A state with ``batch_size_semantics == "global"`` comes back as an equal copy; any other value
    -> ``ValueError`` naming ``batch_size_semantics``. A state without the key is legacy:
    ``batch_size`` = micro-batch and ``sample_count`` = samples per epoch (both required, ints >= 1),
    ``epoch`` (default 0, an int >= 0), ``step`` = micro-steps done in the epoch (default 0, an int >= 0),
    ``accum_steps`` (default 1, an int >= 1); a missing key with a default takes it, a missing required key or
    a bad value -> ``ValueError`` naming the key (first). The epoch has ``ceil(sample_count / batch_size)`` micro-steps;
    a larger ``step`` -> ``ValueError`` naming ``step``. Return the state (defaults filled in)
    without ``batch_size``/``step`` and with ``batch_size_semantics="global"``,
    ``global_batch_size = batch_size * accum_steps``, ``update_step_in_epoch``, ``sample_position``
    (= ``update_step_in_epoch * global_batch_size``, the first sample of the resumed update in the
    epoch's order), ``dropped_microsteps`` and a ``migration_note`` that says where it resumes:

    * ``step`` inside the epoch: resume at the last update boundary, ``update_step_in_epoch = step //
      accum_steps``; the ``step % accum_steps`` later micro-steps are dropped (trained again) and
      the note says "update boundary";
    * ``step == ceil(sample_count / batch_size)``, the epoch's end (saved after its tail flush, so
      every sample was applied): resume at update 0 of ``epoch + 1``, nothing dropped, and the note
      says "start of the next epoch".
    """
    raise NotImplementedError("migrate_train_state: TODO - see lesson 16 §5.4")


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """TODO (lesson 16 §4.4): write a test that token-weighted accumulation gives the global batch's gradient.

    The argument is the implementation under test, called as ``accumulate_token_weighted(model, batches)``:
    for the ``(input_ids, labels)`` pairs of ``batches`` (labels -100 where a target does not count) it
    counts N, the valid shifted targets (``labels[..., 1:] != -100``) of ALL of them, then backpropagates
    ``token_nll_sum(model(input_ids).logits, labels) / N`` for each and leaves the summed gradients in
    ``.grad`` (no optimizer step). A correct version is ``course.runs.accumulate_token_weighted``: your
    test must pass on it.
    Your test: build micro-batches whose valid-target counts are UNEQUAL
    (``masked_micro_batches(cuts)`` gives one ``TextBatch`` per pair of cuts, sample i keeping labels
    ``[:cut_i]``, at most 16; use ``(b.input_ids, b.labels)``), compute the global batch's gradient with
    ONE backward of ``token_nll_sum(logits, labels) / shifted_target_count(labels)`` on all of them
    concatenated (``tiny_model(SESSION_SCENARIO)`` gives the same seeded model every call), call
    ``accumulate_token_weighted`` on a second model, and assert every parameter's gradient is close
    (``torch.testing.assert_close`` with a stated ``rtol`` / ``atol``). Return nothing; raise
    ``AssertionError`` when the implementation is wrong. The grader runs it on wrong implementations
    too (§4.4 lists them): each must make it fail. They include, one per large parameter tensor, a
    gradient 1 % off in that tensor alone: compare every parameter, with a tolerance far below 1 % (the
    norm weights' gradients have elements ~7e-4: ``assert_close``'s default ``atol=1e-5`` hides their 1 %
    error), element-wise (wrong signs, places or parameters keep every norm, sum and absolute value).
    """
    raise NotImplementedError("test_token_weighted_matches_global_batch: TODO - see lesson 16 §4.4")
