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

    Contract: ``labels`` holds token ids with -100 (``IGNORE_INDEX``) where a target does not count, shaped
    ``[seq]`` or ``[batch, seq]``. Count exactly the targets whose NLL ``course/minimind/model.py``'s loss
    (and ``token_nll_sum``) averages over - no more, no fewer (lesson 16 §1.3 says which positions those are).
    Return an ``int`` (a host-side count, not a tensor).

    Examples: ``[[5, 6, -100, -100], [-100, 7, 8, 9]]`` -> 4; ``[[1, 2, 3, 4, 5]]`` -> 4; ``[[7]]`` -> 0;
    ``[3, -100, 4, 5]`` -> 2; ``[[-100, -100, -100]]`` -> 0.

    Argument rules: a 0-dim tensor, or a dtype that holds no token ids (every float dtype: float16, bfloat16,
    float32, float64; complex; bool: a mask is not labels), is a ``ValueError`` naming ``labels``. Graded
    exactly (the count and its type).
    """
    raise NotImplementedError("count_loss_units: TODO - see lesson 16 §4.1")


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """TODO (lesson 16 §4.2): cut one global batch into its micro-batches, in order.

    Contract: every micro-batch holds ``global_batch_size / accumulation_steps`` samples, except that a short
    final global batch (fewer samples than ``global_batch_size``) is split over what remains, so its last
    micro-batch may be smaller and there may be fewer micro-batches. ``samples`` is any sequence (a list, a
    tuple, a range); the result is always a list of lists, the samples in their given order.

    Examples: ``(range(8), 8, 4)`` -> ``[[0, 1], [2, 3], [4, 5], [6, 7]]``; ``(range(5), 8, 4)`` ->
    ``[[0, 1], [2, 3], [4]]``; ``(["only"], 8, 4)`` -> ``[["only"]]``; ``(range(9), 12, 3)`` ->
    ``[[0, 1, 2, 3], [4, 5, 6, 7], [8]]``.

    Argument rules (``ValueError`` whose message names the bad argument first): ``global_batch_size`` < 1;
    ``accumulation_steps`` < 1, or one that does not divide ``global_batch_size`` (name
    ``accumulation_steps``: it is the one to change); ``samples`` empty or longer than ``global_batch_size``.
    """
    raise NotImplementedError("split_global_batch: TODO - see lesson 16 §4.2")


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """TODO (lesson 16 §4.2): the number of optimizer updates in an epoch of ``sample_count`` samples.

    Contract: one update per global batch of the epoch; a short last global batch is an update too (with its
    own, smaller N). Exact for any int, above 2**53 too (``(2**53 + 1, 1)`` -> ``2**53 + 1``: a float division
    rounds it). Examples: ``(160, 8)`` -> 20; ``(161, 8)`` -> 21; ``(7, 8)`` -> 1; ``(0, 8)`` -> 0.

    Argument rules: ``ValueError`` naming ``sample_count`` when it is < 0, naming ``global_batch_size`` when
    it is < 1.
    """
    raise NotImplementedError("steps_per_epoch: TODO - see lesson 16 §4.2")


class TrainingSession:
    """TODO (lesson 16 §4.3): one parameter update executed over ``accumulation_steps`` calls.

    Replaces the accumulation part of ``course/minimind/train_pretrain.py::train_epoch`` (its ``loss / K``,
    its ``step % K``, its tail flush); lessons 16 §1.2 (the weighting), §4.3 and §5.1-§5.2 (the protocol)
    say why each rule below exists. Types: ``course/protocol/types.py``.

    Public API (what the checks call):

    * ``TrainingSession(model, optimizer, *, accumulation_steps, scaler=None, autocast=None)``.
      ``scaler=None`` means a disabled ``torch.amp.GradScaler`` for the model's device; ``autocast=None``
      means no autocast (``nullcontext()``).
    * attributes ``model`` and ``optimizer`` (the ones given), ``optimizer_step`` (optimizer steps done),
      ``microsteps_accumulated`` (micro-steps of the pending update), ``accumulation_valid``.
    * ``train_step(batch, options, step_fn) -> TrainingStepReport``: one micro-step. ``step_fn(model, batch)``
      runs under the session's autocast and returns a ``TrainingStepOutput``.
    * ``reset_accumulation()``, ``state() -> TrainingSessionState``, ``load_state(state)``.

    Reports. A micro-step that does not close the update reports ``parameters_updated=False``, the unchanged
    ``optimizer_step``, ``microsteps_accumulated`` = micro-steps of this update so far (this one included),
    ``loss_sum=None``, ``loss_units=0``. The micro-step that closes the update reports what happened to it:
    ``parameters_updated`` (the optimizer stepped), ``overflow_skipped`` (an enabled GradScaler found inf/NaN
    and skipped the step), ``aborted`` (``before_update`` said so); the new ``optimizer_step``; the update's
    ``microsteps_accumulated`` (2 for a tail of 2); its ``loss_sum`` (the sum of the micro-steps'
    ``output.loss_sum``, detached, still a device tensor) and ``loss_units`` (the sum of their ``output.loss_units``,
    not of ``gradient_units``); ``grad_norm``, the
    total norm of the UNSCALED gradient before clipping when ``clip_grad_norm > 0``, else ``None``.

    Invariants (graded against one backward of the whole global batch, parameters after an SGD step, the
    GradScaler's scale, and the calls the session makes):

    * An update closes at its K-th micro-step or on ``options.force_update``, whichever comes first (K = 1:
      every micro-step is an update). Exactly one optimizer step per update that is neither aborted nor
      skipped; none inside an update (parameters untouched until it closes).
    * The gradient present when the update closes equals ONE backward of the whole global batch's token-mean
      loss (NLL sum / N, N = ``normalization_units``, §1.2): each micro-step contributes its loss in
      proportion to its ``gradient_units`` out of the update's ``normalization_units``. A micro-batch with
      ``gradient_units == 0`` (no valid target) is allowed and adds nothing, but its backward still runs (every
      micro-step runs one): under DDP a rank whose closing micro-step holds only padding must still join the
      gradient all-reduce, or every other rank waits in it forever.
    * Clipping (``clip_grad_norm > 0``) limits the total norm of the unscaled gradient to ``clip_grad_norm``
      with ``torch.nn.utils.clip_grad_norm_``'s coefficient over ``model.parameters()`` (all of them, also a
      trainable parameter the optimizer does not hold); 0 means no clipping.
    * ``options.lr``, when given (not None: 0.0 is an lr), is the lr of EVERY param group from this micro-step on;
      else the optimizer's own lr stays.
    * Hooks: ``before_update()`` runs once per update at its boundary, with the update's gradients in
      ``.grad``, before unscale and the optimizer step (with an enabled GradScaler it sees them still scaled);
      returning True aborts the update (no step, its gradients dropped, report ``aborted=True``). ``after_update()`` runs once after an optimizer step that happened
      (never on a skipped or aborted update) and sees the new parameters and the gradients still in place.
    * A skipped update (GradScaler overflow): parameters unchanged, ``optimizer_step`` does not advance, no
      ``after_update``. Every update that is not aborted goes through the GradScaler exactly once, skipped
      or not, so its scale backs off once per overflow. A scale that GREW (after ``growth_interval`` clean
      steps) belongs to a step that happened: no skip. Whatever the scaler's ``backoff_factor`` and
      ``growth_factor``.
    * After an update closes (stepped, skipped or aborted) every ``.grad`` of ``model.parameters()`` is ``None``
      (also of a trainable parameter the optimizer does not hold), the session's counters and loss totals are 0
      again, and the next update starts clean, whatever its K, lr, clipping or N. Loss totals hold detached
      tensors (no micro-step's graph kept alive), and the session never writes into a tensor ``step_fn``
      returned (its values stay as returned).
    * On a micro-step that does not close the update, no tensor is converted or copied to the host (no
      ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` / an ``if`` on a tensor, ``.tolist()``, ``.cpu()``,
      ``.numpy()``).
    * Under DDP (the model has ``no_sync``): the forward and backward of every micro-step that does not close
      the update run inside ``model.no_sync()``; the closing one outside it (one gradient all-reduce).
    * Errors: any exception inside ``train_step`` (in ``step_fn``, in backward, in a hook, anywhere; a
      ``BaseException`` such as ``KeyboardInterrupt`` included) propagates unchanged and makes every later
      ``train_step`` raise ``AccumulationInvalidError`` (its message names ``reset_accumulation()``) until
      ``reset_accumulation()``, which drops the gradients (every ``.grad`` of the model None), the pending counters
      and totals, and accepts micro-steps again.
    * ``state()``: the session as it is now: lr of param group 0 (after ``load_state``, the loaded one),
      ``optimizer_step``, ``microsteps_accumulated``, the pending ``loss_sum`` / ``loss_units``,
      ``accumulation_valid`` (False after an error, until ``reset_accumulation()``). ``load_state(state)`` restores
      ``optimizer_step`` and sets ``state.lr`` in every param group - only at an update boundary.

    Argument rules (a rejected call changes no parameter, lr, counter or total; a rejected ``train_step`` is
    still an error inside ``train_step``, so it invalidates the accumulation like any other):

    * constructor: ``accumulation_steps`` < 1 -> ``ValueError`` naming ``accumulation_steps``; an optimizer
      holding a tensor that is not one of ``model.parameters()`` (by identity: built on a copy) ->
      ``ValueError`` naming ``optimizer``.
    * ``train_step``: ``options.normalization_units`` < 1, or different from the value the pending update
      started with -> ``ValueError`` naming ``normalization_units`` (1 is allowed); ``options.lr`` or
      ``options.clip_grad_norm`` below 0 or NaN -> ``ValueError`` naming it (0.0 is valid for both);
      ``step_fn`` returning anything but a ``TrainingStepOutput`` -> ``TypeError`` naming
      ``TrainingStepOutput``; ``gradient_units`` < 0 -> ``ValueError`` naming ``gradient_units``. A rejected
      option changes no lr (the options are checked before ``options.lr`` is written). These are errors
      inside ``train_step``: like any error, a rejected option or step_fn output invalidates the
      accumulation (``AccumulationInvalidError`` until ``reset_accumulation()``).
    * ``load_state``: the saved state's or the session's ``microsteps_accumulated`` not 0 -> ``ValueError``
      naming ``microsteps_accumulated``, nothing changed.
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

    Contract. A state with ``batch_size_semantics == "global"`` comes back as an equal copy; any other value
    -> ``ValueError`` naming ``batch_size_semantics``. A state without the key is legacy (lesson 15's stage
    assembly): ``batch_size`` was the micro-batch, ``step`` counted the epoch's micro-steps done,
    ``accum_steps`` is K, ``sample_count`` the epoch's samples. Return a new dict: every other key carried
    over (model, optimizer, ...), ``batch_size`` and ``step`` removed, and

    * ``batch_size_semantics="global"``; ``global_batch_size``: the samples of one legacy update;
    * ``epoch``, ``update_step_in_epoch``: where the run resumes; ``sample_position``: the index, in the
      epoch's sample order, of the first sample of that update;
    * ``dropped_microsteps``: micro-steps done but never applied, trained again after the resume;
    * ``migration_note``: a sentence saying where it resumes.

    Rules. Pending gradients are never saved, so a ``step`` inside the epoch resumes at the last update
    boundary it passed and drops the micro-steps after it (the note says "update boundary"). The epoch has
    as many micro-steps as micro-batches (a partial last one counts); a ``step`` equal to that count is the
    epoch's end, saved after its tail flush applied every sample: it resumes at update 0 of the next epoch,
    nothing dropped (the note says "start of the next epoch"). A larger ``step`` -> ``ValueError`` naming
    ``step``.

    Keys: ``batch_size``, ``sample_count`` required (ints >= 1, no default); ``accum_steps`` int >= 1
    (default 1); ``step``, ``epoch`` ints >= 0 (default 0). A bool is no int here (``batch_size=True`` is
    bad, though Python's ``bool`` subclasses ``int``). A missing required key or a bad value ->
    ``ValueError`` naming that key first.

    Worked examples (epoch, update_step_in_epoch, sample_position, dropped_microsteps, global_batch_size):

    * ``{batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7}`` -> (1, 1, 8, 3, 8);
      with ``step 8`` -> (1, 2, 16, 0, 8).
    * ``{batch_size 6, accum_steps 4, sample_count 160, epoch 0, step 27}`` (27 micro-batches: the end)
      -> (1, 0, 0, 0, 24); with ``step 26`` -> (0, 6, 144, 2, 24); ``step 28`` -> ``ValueError`` (``step``).
    * ``{batch_size 4, sample_count 40}`` -> (0, 0, 0, 0, 4), ``accum_steps`` 1 filled in.
    """
    raise NotImplementedError("migrate_train_state: TODO - see lesson 16 §5.4")


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """TODO (lesson 16 §4.4): write a test that token-weighted accumulation gives the global batch's gradient.

    The argument is the implementation under test, called as ``accumulate_token_weighted(model, batches)``
    with ``(input_ids, labels)`` pairs (labels -100 where a target does not count): it must leave in
    ``.grad`` the gradient of the token-mean NLL (NLL sum / valid shifted targets) of ALL the batches
    together, built one micro-batch backward at a time, and make no optimizer step.
    ``course.runs.accumulate_token_weighted`` is a correct one.

    What your test must prove: on micro-batches built so that every wrong implementation of lesson 16 §4.4's
    table gives a different gradient, the gradient the implementation leaves equals, for every parameter
    and element-wise, ONE backward of the whole global batch's token-mean loss on the same (seeded) model,
    within a tolerance you state. Return nothing; raise ``AssertionError`` when it does not hold.

    How it is graded: it must pass the correct implementation, in float32 and in float64 (float rounding,
    ~1e-8, is no bug), and raise ``AssertionError`` (a crash is no verdict) on each wrong one of §4.4:
    the mean of micro-batch means, counts with masked or unshifted targets, each micro-batch by its own
    count, a single large gradient tensor 1 % off (elements as small as ~7e-4), wrong signs, swapped
    parameters or shifted elements that keep every norm and sum, one element of each tensor wrong, and the
    smallest gradient tensor zeroed. Two malformed ones must fail it too, with any exception: a parameter
    left without a gradient (``.grad`` None) and an implementation that raises. The tools are imported above
    (``masked_micro_batches``, ``tiny_model(SESSION_SCENARIO)``, ``token_nll_sum``, ``shifted_target_count``).
    """
    raise NotImplementedError("test_token_weighted_matches_global_batch: TODO - see lesson 16 §4.4")
