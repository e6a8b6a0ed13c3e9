"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None

import torch


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


# --- Extensions: fix upstream (optional; lesson 14 §10; graded by ``python -m course check 14 --all``) ---


def accumulation_divisor(step: int, iters: int, accumulation_steps: int) -> int:
    """TODO (lesson 14 §10.1, optional): the number micro-step ``step`` divides its loss by.

    Upstream divides every micro-batch loss by K, also in an epoch's last, partial window of
    r = iters % K micro-batches, so the tail update applies r/K times the mean of its gradients.
    Return K (``accumulation_steps``) for a micro-step inside a full window and r for one in the last,
    partial window (the last r micro-steps, ``step > iters - r``; windows count from micro-step 1 of the
    epoch); when K divides ``iters`` there is no partial window and every micro-step returns K.
    E.g. iters=6, K=4: steps 1..6 -> 4, 4, 4, 4, 2, 2; iters=3, K=8: 3, 3, 3.
    ``step`` is 1-based. Raise ``ValueError`` naming the argument when ``accumulation_steps`` or
    ``iters`` is <= 0, or ``step`` is outside ``[1, iters]``.
    """
    raise NotImplementedError("accumulation_divisor: TODO - see lesson 14 §10.1 (optional)")


def lr_per_update(epoch: int, step: int, iters: int, epochs: int, accumulation_steps: int,
                  base_lr: float) -> float:
    """TODO (lesson 14 §10.2, optional): the lr of the optimizer update that micro-step ``step`` belongs to.

    Upstream evaluates the cosine at every micro-step; the schedule here runs over optimizer updates:
    with U = ceil(iters / K) updates per epoch (the last one may be a tail flush) and N = epochs * U
    updates in all, micro-step ``step`` (1-based) of ``epoch`` (0-based) belongs to update
    n = epoch * U + ceil(step / K) (1-based), and its lr is ``cosine_lr(n, N, base_lr)``, i.e.
    ``base_lr * (0.1 + 0.45 * (1 + cos(pi * n / N)))``: the same for every micro-step of a window,
    ending at 0.1 * base_lr on the last update. Raise ``ValueError`` naming the argument when
    ``accumulation_steps``, ``iters`` or ``epochs`` is <= 0, ``epoch`` is outside ``[0, epochs)`` or
    ``step`` is outside ``[1, iters]``.
    """
    raise NotImplementedError("lr_per_update: TODO - see lesson 14 §10.2 (optional)")


def update_cadence_due(step: int, iters: int, accumulation_steps: int, interval: int) -> bool:
    """TODO (lesson 14 §10.2, optional): whether a log or a save counted in updates is due at ``step``.

    Upstream logs and saves when ``step % interval == 0 or step == iters``, counting micro-steps, so a save
    can fall inside a window whose gradients are not in the checkpoint. Count in updates instead: return
    True when the 1-based micro-step ``step`` closes update n = step / K (``step % K == 0``) with
    ``n % interval == 0``, and always at ``step == iters`` (the epoch's last update, a tail flush or a full
    window); otherwise False. E.g. iters=10, K=2, interval=2: True at steps 4, 8 and 10.
    Raise ``ValueError`` naming the argument when ``accumulation_steps``, ``iters`` or ``interval`` is <= 0,
    or ``step`` is outside ``[1, iters]``.
    """
    raise NotImplementedError("update_cadence_due: TODO - see lesson 14 §10.2 (optional)")


def adamw_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """TODO (lesson 14 §10.3, optional): AdamW parameter groups with no weight decay on norms and embeddings.

    Upstream passes ``model.parameters()`` to AdamW, so every parameter gets the same decay. Return two
    groups, ``[{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]``:
    ``no_decay`` holds every parameter with fewer than 2 dimensions (norm weights, biases) and the weight
    of every ``torch.nn.Embedding``; ``decay`` holds the other parameters. Skip parameters with
    ``requires_grad=False``; keep ``model.named_parameters()`` order. Each parameter appears exactly once:
    MiniMind ties ``lm_head.weight`` to ``model.embed_tokens.weight`` (the same ``Parameter``), and
    ``named_parameters()`` yields it once. Raise ``ValueError`` naming ``weight_decay`` when it is
    negative (or NaN).
    """
    raise NotImplementedError("adamw_param_groups: TODO - see lesson 14 §10.3 (optional)")


def warmup_cosine_lr(current_step: int, total_steps: int, base_lr: float, warmup_steps: int) -> float:
    """TODO (lesson 14 §10.4, optional): a linear warmup of W steps, then MiniMind's cosine.

    With s = ``current_step``, T = ``total_steps``, W = ``warmup_steps``:
    ``base_lr * s / W`` for s < W (0 at s = 0, rising linearly), then
    ``cosine_lr(s - W, T - W, base_lr) = base_lr * (0.1 + 0.45 * (1 + cos(pi * (s - W) / (T - W))))``
    for W <= s <= T: ``base_lr`` at s = W, ``0.1 * base_lr`` at s = T. W = 0 is ``cosine_lr`` itself.
    Raise ``ValueError`` naming the argument when ``total_steps <= 0``, ``warmup_steps`` is outside
    ``[0, total_steps)`` or ``current_step`` is outside ``[0, total_steps]``.
    """
    raise NotImplementedError("warmup_cosine_lr: TODO - see lesson 14 §10.4 (optional)")
