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
    """TODO (lesson 14 §5.1): MiniMind's learning rate at micro-step ``current_step`` of a ``total_steps`` run.

    Aligns with ``course/minimind/trainer_utils.py::get_lr``; lesson 14 §1.2 derives it. Returns a float.
    Examples: (0, 100, 1.0) -> 1.0; (100, 100, 1.0) -> 0.1 (it ends at a tenth of ``base_lr``, no warmup).
    """
    raise NotImplementedError("cosine_lr: TODO - see lesson 14 §5.1 (aligns with get_lr)")


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """TODO (lesson 14 §5.2): the loss one micro-step backpropagates, so that K = ``accumulation_steps`` of them
    add up to the gradient of their mean (lesson 14 §1.3).

    Returns a tensor that is still part of the autograd graph. Example: (tensor(8.), 4) -> tensor(2.).
    """
    raise NotImplementedError("scale_loss_for_accumulation: TODO - see lesson 14 §5.2")


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """TODO (lesson 14 §5.3): whether the 1-based micro-step ``step`` closes a window of K = ``accumulation_steps``.

    Windows count from micro-step 1 (the first one is 1..K). Returns a bool.
    Examples: K = 4 -> True at steps 4, 8, 12, ...; K = 1 -> True at every step.
    """
    raise NotImplementedError("should_step_optimizer: TODO - see lesson 14 §5.3")


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """TODO (lesson 14 §5.4): whether the epoch ends with accumulated gradients that no update has applied.

    ``last_step``: the last micro-step this call ran (``start_step`` when it ran none); ``start_step``: the
    micro-steps of the epoch done before a resume; windows of K = ``accumulation_steps`` count from micro-step 1
    of the epoch. Returns a bool. Examples (last_step, start_step, K): (10, 0, 4) -> True; (8, 0, 4) -> False.
    """
    raise NotImplementedError("should_flush_tail: TODO - see lesson 14 §5.4")


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """TODO (lesson 14 §5.5): one epoch of MiniMind's pretrain loop, built from your four functions above.

    Aligns with ``course/minimind/train_pretrain.py::train_epoch`` without logging, saving or DDP; lesson 14 §1
    explains each step, §5.5 what is graded. ``loader`` yields ``(input_ids, labels)``; ``device``: where they go
    (``"cpu"``, ``"cuda:0"``); ``epoch`` is 0-based of ``epochs``; ``iters``: micro-batches of a full epoch;
    ``start_step``: micro-steps of this epoch done before a resume. ``scaler``: a ``torch.amp.GradScaler``, None
    for no loss scaling; ``autocast_ctx``: a context manager around each forward pass, None for no autocast.
    Returns one dict per micro-step run: ``step`` (1-based), ``lr``, ``loss`` (not divided by K, aux included),
    ``aux_loss``, ``update_closed`` (an update closed here), ``overflow_skipped`` (the scaler skipped it),
    ``grad_norm`` (before clipping, where an update closed; else None), ``tail_flush`` (closed by the flush
    after the loop). Example: 6 micro-batches, K = 4 -> updates close at steps 4 and 6; step 6 is the flush.
    """
    raise NotImplementedError("train_one_epoch: TODO - see lesson 14 §5.5 (aligns with train_epoch)")


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """TODO (lesson 14 §5.6): a test that K accumulated micro-batches give the gradient of one big batch.

    ``accumulate_gradients(model, micro_batches, accumulation_steps)`` is the code under test: it backpropagates
    each micro-batch's ``(loss + aux_loss) / K`` and leaves the sum in every ``.grad`` (a correct one is
    ``course.runs.accumulate_gradients``). Return nothing when it is right; raise ``AssertionError`` when it is
    wrong. §5.6 says what the grader runs it on. Tools (imported above): ``tiny_model(LoopScenario(...))``, a
    seeded model, and ``tiny_batches(batch_size, max_length, 1, seed)[0]``, one batch.
    """
    raise NotImplementedError("test_accumulation_matches_big_batch: TODO - see lesson 14 §5.6")


# --- Extensions: fix upstream (optional; lesson 14 §10; graded by ``python -m course check 14 --all``) ---


def accumulation_divisor(step: int, iters: int, accumulation_steps: int) -> int:
    """TODO (lesson 14 §10.1, optional): the number micro-step ``step`` divides its loss by.

    Upstream divides every micro-batch loss by K, also in an epoch's last, partial window, so the tail
    update applies only r/K of the mean of its r gradients. Contract: every update's gradient is the MEAN
    of its own micro-batch gradients, the tail's included. Windows of K = ``accumulation_steps`` count from
    micro-step 1 (1-based ``step``); a full window's micro-steps return K, the partial window's (if any)
    return its size r; when K divides ``iters`` there is none. Returns an int.
    Examples, steps 1..iters: iters=6, K=4 -> 4, 4, 4, 4, 2, 2; iters=3, K=8 -> 3, 3, 3; iters=8, K=4 -> all
    4; iters=7, K=3 -> 3 (x6), 1. Graded also by accumulating a real epoch with it (the tail's gradient).
    Argument rules, in this order: ``ValueError`` naming ``accumulation_steps`` or ``iters`` when it is
    <= 0, naming ``step`` when it is outside ``[1, iters]``.
    """
    raise NotImplementedError("accumulation_divisor: TODO - see lesson 14 §10.1 (optional)")


def lr_per_update(epoch: int, step: int, iters: int, epochs: int, accumulation_steps: int,
                  base_lr: float) -> float:
    """TODO (lesson 14 §10.2, optional): the lr of the optimizer update that micro-step ``step`` belongs to.

    Upstream evaluates the cosine at every micro-step; here the same schedule (``cosine_lr``'s, to a
    relative 1e-12) runs over optimizer UPDATES of the whole run instead. Contract: count the updates of an
    epoch with its tail flush included; number them from 1 over all epochs; every micro-step of a window
    gets the lr of the update that window makes, so the lr is constant within a window, and the run's last
    update gets exactly 0.1 x base_lr. ``epoch`` is 0-based, ``step`` 1-based.
    Examples (base_lr = 1.0): iters=6, K=4, epochs=2 -> 4 updates in all; epoch 0 steps 1..4 share update 1
    (lr 0.86820, to 5 digits), steps 5..6 share update 2 (0.55); epoch 1 step 6 is update 4 -> 0.1.
    Argument rules, in this order: ``ValueError`` naming the argument when ``accumulation_steps``, ``iters``
    or ``epochs`` is <= 0, ``epoch`` is outside ``[0, epochs)`` or ``step`` is outside ``[1, iters]``.
    """
    raise NotImplementedError("lr_per_update: TODO - see lesson 14 §10.2 (optional)")


def update_cadence_due(step: int, iters: int, accumulation_steps: int, interval: int) -> bool:
    """TODO (lesson 14 §10.2, optional): whether a log or a save counted in UPDATES is due at ``step``.

    Upstream logs and saves every ``interval`` MICRO-steps (and at the epoch's last), so a save can fall
    inside a window whose gradients are not in the checkpoint. Contract: due only on a micro-step that
    closes a window (1-based, windows of K from micro-step 1), when the number of updates closed so far in
    the epoch is a multiple of ``interval``; and always at ``step == iters`` (the epoch's last update, a
    full window or the tail flush). Returns a bool.
    Examples, the due steps of 1..iters: iters=10, K=2, interval=2 -> 4, 8, 10; iters=12, K=4, interval=2
    -> 8, 12; iters=7, K=1, interval=3 -> 3, 6, 7; iters=3, K=8, interval=5 -> 3.
    Argument rules, in this order: ``ValueError`` naming the argument when ``accumulation_steps``,
    ``iters`` or ``interval`` is <= 0, or ``step`` is outside ``[1, iters]``.
    """
    raise NotImplementedError("update_cadence_due: TODO - see lesson 14 §10.2 (optional)")


def adamw_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """TODO (lesson 14 §10.3, optional): AdamW parameter groups with no weight decay on norms and embeddings.

    Upstream passes ``model.parameters()`` to AdamW, so every parameter gets the same decay. Contract:
    returns exactly two dicts, the decayed group first (``"weight_decay": weight_decay``) and the exempt
    group second (``"weight_decay": 0.0``), each with its ``"params"`` list, ready for
    ``torch.optim.AdamW(groups, lr=...)``. Exempt: every parameter with fewer than 2 dimensions (norm
    weights, biases) and every ``torch.nn.Embedding``'s weight; all other parameters decay. Parameters
    with ``requires_grad=False`` appear in neither group; every trainable one appears exactly once (MiniMind
    ties ``lm_head.weight`` to the embedding: one ``Parameter``, one entry, exempt); within a group, the
    order of ``model.named_parameters()``.
    Argument rules: ``ValueError`` naming ``weight_decay`` when it is negative or NaN; 0.0 and values
    >= 1 are valid.
    """
    raise NotImplementedError("adamw_param_groups: TODO - see lesson 14 §10.3 (optional)")


def warmup_cosine_lr(current_step: int, total_steps: int, base_lr: float, warmup_steps: int) -> float:
    """TODO (lesson 14 §10.4, optional): a linear warmup of W = ``warmup_steps`` steps, then MiniMind's cosine.

    Contract, with s = ``current_step`` and T = ``total_steps``: during the warmup (s < W) the lr rises
    linearly from 0 at s = 0 towards ``base_lr``, reaching it exactly at s = W; from s = W to s = T it is
    ``cosine_lr``'s schedule run over the remaining T - W steps (``base_lr`` at W, 0.1 x base_lr at T).
    W = 0 is ``cosine_lr`` itself. Graded against that to a relative 1e-12. Returns a Python float.
    Examples (T=100, base_lr=1.0, W=10): s=0 -> 0.0; s=5 -> 0.5; s=10 -> 1.0; s=55 -> 0.55; s=100 -> 0.1.
    Argument rules, in this order: ``ValueError`` naming the argument when ``total_steps <= 0``,
    ``warmup_steps`` is outside ``[0, total_steps)`` or ``current_step`` is outside ``[0, total_steps]``.
    """
    raise NotImplementedError("warmup_cosine_lr: TODO - see lesson 14 §10.4 (optional)")
