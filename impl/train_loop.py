"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model  # noqa: F401 - for your test (§5.6)


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """TODO (lesson 14 §5.1): MiniMind's cosine schedule, from base_lr down to 0.1 * base_lr.

    Aligns with ``course/minimind/trainer_utils.py::get_lr`` (upstream ``trainer/trainer_utils.py``).
    Raise ``ValueError`` naming the argument when ``total_steps <= 0`` or ``current_step`` is
    outside ``[0, total_steps]``.
    """
    raise NotImplementedError("cosine_lr: TODO - see lesson 14 §5.1 (aligns with get_lr)")


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """TODO (lesson 14 §5.2): the loss each micro-step backpropagates, L / K.

    Aligns with the ``loss / args.accumulation_steps`` line of ``course/minimind/train_pretrain.py::train_epoch``.
    Raise ``ValueError`` naming ``accumulation_steps`` when it is <= 0.
    """
    raise NotImplementedError("scale_loss_for_accumulation: TODO - see lesson 14 §5.2")


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """TODO (lesson 14 §5.3): True when 1-based micro-step ``step`` closes an accumulation window.

    Aligns with ``if step % args.accumulation_steps == 0`` in ``train_epoch``.
    Raise ``ValueError`` naming the argument when ``accumulation_steps <= 0`` or ``step <= 0``.
    """
    raise NotImplementedError("should_step_optimizer: TODO - see lesson 14 §5.3")


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """TODO (lesson 14 §5.4): True when the epoch ran micro-steps and ended inside a window.

    Aligns with the tail-flush condition after the loop in ``train_epoch``: flush iff
    ``last_step > start_step`` (a resume at ``start_step == last_step`` ran nothing, whatever
    ``last_step % K`` is) and ``last_step % accumulation_steps != 0`` (windows count from micro-step 1
    of the epoch, not from ``start_step``).
    Raise ``ValueError`` naming the argument when ``accumulation_steps <= 0``, ``start_step < 0``
    or ``last_step < start_step``.
    """
    raise NotImplementedError("should_flush_tail: TODO - see lesson 14 §5.4")


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """TODO (lesson 14 §5.5): one epoch of MiniMind's pretrain loop, without logging/saving/DDP.

    Aligns with ``course/minimind/train_pretrain.py::train_epoch``. Use the four functions above.
    Set the lr in EVERY ``optimizer.param_groups`` entry at every micro-step.
    Return one dict per micro-step with ``step``, ``lr``, ``loss`` (unscaled, aux included),
    ``aux_loss``, ``update_closed`` (bool: this micro-step closed an accumulation window, i.e. the
    optimizer was asked to step, including the tail flush), ``overflow_skipped`` (bool: True iff an
    enabled GradScaler found inf/NaN gradients and skipped ``optimizer.step`` there; its ``update()``
    then lowers the scale, so compare ``scaler.get_scale()`` before and after), ``grad_norm``
    (pre-clip norm where an update closed, else None) and ``tail_flush`` (True on the micro-step whose
    window the tail flush closed). An epoch that runs no micro-step (a resume at ``start_step == iters``)
    returns ``[]`` and changes nothing. ``scaler=None`` means a disabled ``torch.amp.GradScaler``
    (it never skips); ``autocast_ctx=None`` means ``nullcontext()``. Before any work, raise
    ``ValueError`` naming the argument when ``accumulation_steps``, ``iters`` or ``epochs`` is <= 0,
    ``epoch`` is outside ``[0, epochs)`` or ``start_step`` is outside ``[0, iters]``.
    """
    raise NotImplementedError("train_one_epoch: TODO - see lesson 14 §5.5 (aligns with train_epoch)")


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """TODO (lesson 14 §5.6): write a test that K accumulated micro-batches give one big batch's gradient.

    ``accumulate_gradients(model, micro_batches, accumulation_steps)`` is the implementation under test:
    it calls ``model(input_ids, labels=labels)`` on each ``(input_ids, labels)`` of ``micro_batches``
    (exactly ``accumulation_steps`` of them), backpropagates that output's ``(loss + aux_loss) / K`` and
    leaves the summed gradients in each parameter's ``.grad`` (no optimizer step). A correct version
    is ``course.runs.accumulate_gradients``: your test must pass on it.
    Your test: build a model and data (``tiny_model(LoopScenario(...))`` gives a seeded dense MiniMind,
    the same weights every call; ``tiny_batches(batch_size, max_length, 1, seed)[0]`` gives one
    ``(input_ids, labels)`` batch, unpadded at ``max_length=32``), compute the big batch's gradient with
    ONE backward of its loss, call ``accumulate_gradients`` on a second, identical model with the same
    samples cut into K micro-batches, and assert every parameter's gradient is close to the big batch's
    (``torch.testing.assert_close`` with a stated ``rtol`` / ``atol``). Return nothing; raise
    ``AssertionError`` (any failing ``assert``) when the implementation is wrong. The grader runs it on
    wrong implementations too (§5.6 lists them): each must make it fail.
    """
    raise NotImplementedError("test_accumulation_matches_big_batch: TODO - see lesson 14 §5.6")
