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
    """TODO (lesson 16 §4.1): the number of targets the model's loss averages over, as an int.

    ``labels``: token ids shaped ``[seq]`` or ``[batch, seq]``, -100 (``IGNORE_INDEX``) where a target does not
    count. Count exactly what ``course/minimind/model.py``'s loss averages over (lesson 16 §1.3 says which).
    Examples: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4; [[7]] -> 0.
    """
    raise NotImplementedError("count_loss_units: TODO - see lesson 16 §4.1")


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """TODO (lesson 16 §4.2): cut one global batch of ``samples`` into its micro-batches, in order.

    Each micro-batch holds ``global_batch_size / accumulation_steps`` samples; a short last global batch is
    split over what remains. Returns a list of lists.
    Examples: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]]; (range(5), 8, 4) -> [[0, 1], [2, 3], [4]].
    """
    raise NotImplementedError("split_global_batch: TODO - see lesson 16 §4.2")


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """TODO (lesson 16 §4.2): the number of optimizer updates in an epoch of ``sample_count`` samples.

    One update per global batch; a short last global batch is an update too. Returns an int, exact for any int.
    Examples: (160, 8) -> 20; (161, 8) -> 21; (0, 8) -> 0.
    """
    raise NotImplementedError("steps_per_epoch: TODO - see lesson 16 §4.2")


class TrainingSession:
    """TODO (lesson 16 §4.3): one parameter update executed over ``accumulation_steps`` calls of ``train_step``.

    It replaces the accumulation part of ``train_epoch`` (its ``loss / K``, its ``step % K``, its tail flush);
    lesson 16 §1.2 and §5.1-§5.2 explain the protocol, ``course/protocol/types.py`` holds the types.
    ``TrainingSession(model, optimizer, *, accumulation_steps, scaler=None, autocast=None)`` keeps ``model``,
    ``optimizer``, ``optimizer_step``, ``microsteps_accumulated`` and ``accumulation_valid``.
    ``train_step(batch, options, step_fn)`` runs one micro-step: ``step_fn(model, batch)``, under ``autocast``,
    returns a ``TrainingStepOutput`` whose loss is already divided by its ``gradient_units``; weight it by
    ``gradient_units / options.normalization_units`` so that the update equals one backward of the whole
    global batch. The update closes at the K-th micro-step or on ``options.force_update``: ``before_update``
    (True aborts it), unscale, clip to ``options.clip_grad_norm`` (0: no clipping), the optimizer step (an
    enabled scaler skips an overflowing one), ``after_update`` (after a step that happened), the gradients
    cleared.
    ``options.lr``, when given, goes into every param group. The ``TrainingStepReport`` says whether the
    parameters were updated, ``optimizer_step``, ``microsteps_accumulated`` and, on the closing micro-step, the
    update's ``loss_sum`` (detached, still on the device), ``loss_units`` and ``grad_norm`` (before clipping).
    An error inside ``train_step`` invalidates the accumulation: later calls raise ``AccumulationInvalidError``
    until ``reset_accumulation()``. ``state()`` / ``load_state(state)``: its ``TrainingSessionState``.
    Example: K = 2 -> the first ``train_step`` reports ``parameters_updated=False``, the second True.
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
    """TODO (lesson 16 §5.4): convert a legacy training state to global-batch semantics; the input stays unchanged.

    A state with ``batch_size_semantics == "global"`` comes back as an equal copy. A legacy one (no such key;
    lesson 15's stage assembly: ``batch_size`` the micro-batch, ``accum_steps`` = K, ``sample_count``, ``epoch``,
    ``step`` the micro-steps done) becomes a new dict with its other keys kept, ``batch_size`` and ``step``
    removed, and ``batch_size_semantics="global"``, ``global_batch_size``, ``epoch``, ``update_step_in_epoch``,
    ``sample_position`` (the first sample of that update), ``dropped_microsteps`` and a ``migration_note``.
    Pending gradients were never saved: a ``step`` inside the epoch resumes at its last update boundary; the
    epoch's last micro-step resumes at the start of the next epoch (lesson 16 §5.4).
    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 7} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 1, sample_position 8, dropped_microsteps 3.
    """
    raise NotImplementedError("migrate_train_state: TODO - see lesson 16 §5.4")


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """TODO (lesson 16 §4.4): a test that token-weighted accumulation gives the global batch's gradient.

    ``accumulate_token_weighted(model, batches)`` is the code under test: from ``(input_ids, labels)``
    micro-batches it must leave in ``.grad`` the gradient of the token-mean NLL of all of them together, one
    micro-batch backward at a time (a correct one: ``course.runs.accumulate_token_weighted``). Return nothing
    when it is right; raise ``AssertionError`` when it is wrong. §4.4 says what the grader runs it on. Tools
    (imported above): ``masked_micro_batches``, ``tiny_model(SESSION_SCENARIO)``, ``token_nll_sum``,
    ``shifted_target_count``.
    """
    raise NotImplementedError("test_token_weighted_matches_global_batch: TODO - see lesson 16 §4.4")
