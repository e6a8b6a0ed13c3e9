"""Lesson 16 exercises: token-weighted gradient accumulation and the single-step TrainingSession.

Read course/lessons/16_token_weighted_training_session.md (Chinese:
course/lessons/zh/16_token_weighted_training_session.md), replace each ``raise NotImplementedError``
with your code, then run ``python -m course check 16``. The API types (``TrainingStepOutput``,
``TrainingStepOptions``, ``TrainingStepReport``, ``TrainingSessionState``,
``AccumulationInvalidError``) are given in ``course/protocol/types.py``.
"""
from __future__ import annotations

import math  # noqa: F401
from contextlib import nullcontext  # noqa: F401 - autocast=None and the DDP no_sync switch

import torch  # noqa: F401

from course.protocol.types import (GLOBAL_SEMANTICS, AccumulationInvalidError, TrainingSessionState,  # noqa: F401
                                           TrainingStepOptions, TrainingStepOutput, TrainingStepReport)
from course.minimind import IGNORE_INDEX  # noqa: F401
# for your test (§4.4):
from course.protocol.text import shifted_target_count, token_nll_sum  # noqa: F401
from course.runs import LABEL_CUTS, SESSION_SCENARIO, masked_micro_batches, tiny_model  # noqa: F401


def count_loss_units(labels: torch.Tensor) -> int:
    """TODO (lesson 16 §4.1): the number of targets the model's loss averages over.

    ``labels``: token ids shaped ``[seq]`` or ``[batch, seq]``, -100 (``IGNORE_INDEX``) where a target does not
    count. Count exactly what ``course/minimind/model.py``'s loss divides by (§1.3 teaches which positions).
    Returns the count as an int (the core compares its value; §4.5 asks for a Python int).
    Example: [[5, 6, -100, -100], [-100, 7, 8, 9]] -> 4.
    """
    raise NotImplementedError("count_loss_units: TODO - see lesson 16 §4.1")


def split_global_batch(samples, global_batch_size: int, accumulation_steps: int) -> list[list]:
    """TODO (lesson 16 §4.2): cut one global batch of ``samples`` into its micro-batches, in order.

    ``samples``: the samples of one optimizer update (fewer than ``global_batch_size`` at an epoch's end);
    ``accumulation_steps``: K, a divisor of ``global_batch_size`` (§5.3). Returns a list of lists.
    Example: (range(8), 8, 4) -> [[0, 1], [2, 3], [4, 5], [6, 7]].
    """
    raise NotImplementedError("split_global_batch: TODO - see lesson 16 §4.2")


def steps_per_epoch(sample_count: int, global_batch_size: int) -> int:
    """TODO (lesson 16 §4.2): the number of optimizer updates in an epoch of ``sample_count`` samples.

    ``global_batch_size``: the samples of one update (§5.3). Returns an int.
    Example: (160, 8) -> 20.
    """
    raise NotImplementedError("steps_per_epoch: TODO - see lesson 16 §4.2")


class TrainingSession:
    """TODO (lesson 16 §4.3): one parameter update executed over ``accumulation_steps`` calls of ``train_step``.

    It replaces the accumulation part of ``train_epoch`` (its ``loss / K``, its ``step % K``, its tail flush).
    ``TrainingSession(model, optimizer, *, accumulation_steps, scaler=None, autocast=None)``: ``scaler`` is a
    ``torch.amp.GradScaler`` (None: no scaling); ``autocast`` a context-manager object such as
    ``torch.autocast("cuda", dtype=torch.bfloat16)``, entered with ``with`` around every ``step_fn`` call, never
    called (None: no autocast). It keeps ``model``, ``optimizer``, ``optimizer_step``,
    ``microsteps_accumulated`` and ``accumulation_valid``.
    ``train_step(batch, options, step_fn)`` runs one micro-step: ``step_fn(model, batch)`` returns a
    ``TrainingStepOutput`` whose loss is already divided by its ``gradient_units``. When the update closes (the
    K-th micro-step or ``options.force_update``), its gradient is that of ONE backward of the whole global
    batch (§1.2); it takes one optimizer step at ``options.lr`` (when given) in every param group, clipped to
    ``options.clip_grad_norm`` (0: no clipping). Hooks: ``before_update()`` sees the accumulated gradients
    (still scaled by an enabled scaler) and aborts the update by returning True; ``after_update()`` runs after
    a step that happened, before the gradients are cleared. What the ``TrainingStepReport`` says: §4.3.
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
    lesson 15's stage assembly: ``batch_size`` the micro-batch, ``accum_steps`` = K, ``sample_count`` the
    epoch's samples, ``epoch``, ``step`` the micro-steps done in the epoch) becomes a new dict with its other
    keys kept, ``batch_size`` and ``step`` removed, and ``batch_size_semantics="global"``, ``global_batch_size``,
    ``epoch``, ``update_step_in_epoch``, ``sample_position`` (the first sample of that update),
    ``dropped_microsteps`` (micro-steps to train again) and a ``migration_note`` (where it resumes, in words).
    Where each ``step`` resumes is §5.4's question.
    Example: {batch_size 2, accum_steps 4, sample_count 40, epoch 1, step 0} -> global_batch_size 8, epoch 1,
    update_step_in_epoch 0, sample_position 0, dropped_microsteps 0.
    """
    raise NotImplementedError("migrate_train_state: TODO - see lesson 16 §5.4")


def test_token_weighted_matches_global_batch(accumulate_token_weighted) -> None:
    """TODO (lesson 16 §4.4): a test that token-weighted accumulation gives the global batch's gradient.

    ``accumulate_token_weighted(model, batches)`` is the code under test: from ``(input_ids, labels)``
    micro-batches it must leave in ``.grad`` the gradient of the token-mean NLL of all of them together, one
    micro-batch backward at a time (a correct one: ``course.runs.accumulate_token_weighted``). Return nothing
    when it is right; raise ``AssertionError`` when it is wrong. §4.4 says what the grader runs it on. Tools
    (imported above): ``masked_micro_batches`` (its default cuts: ``LABEL_CUTS``), ``tiny_model(SESSION_SCENARIO)``,
    ``token_nll_sum``, ``shifted_target_count``.
    """
    raise NotImplementedError("test_token_weighted_matches_global_batch: TODO - see lesson 16 §4.4")
