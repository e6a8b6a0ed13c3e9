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
    """TODO (lesson 14 §5.1): MiniMind's cosine schedule, from base_lr at s = 0 to 0.1 * base_lr at s = T.

    Aligns with ``course/minimind/trainer_utils.py::get_lr`` (upstream ``trainer/trainer_utils.py``).
    With s = ``current_step`` and T = ``total_steps``, return, as a Python float:

        base_lr * (0.1 + 0.45 * (1 + cos(pi * s / T)))

    so 1.0 * base_lr at s = 0, 0.55 * base_lr at s = T / 2, 0.1 * base_lr at s = T: no warmup, no decay
    to 0. Graded against get_lr to a relative 1e-12; write the formula yourself (do not import get_lr).
    Argument rules (lesson 14 §5.7), checked first: ``ValueError`` naming ``total_steps`` when
    ``total_steps <= 0``; naming ``current_step`` when it is outside ``[0, total_steps]`` (both ends valid).
    """
    raise NotImplementedError("cosine_lr: TODO - see lesson 14 §5.1 (aligns with get_lr)")


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """TODO (lesson 14 §5.2): the loss each micro-step backpropagates, L / K.

    Aligns with the ``loss / args.accumulation_steps`` line of ``course/minimind/train_pretrain.py::train_epoch``.
    Return ``loss / accumulation_steps`` as a tensor that stays in the autograd graph: backpropagating it
    must give d(result)/d(loss) = 1 / K. No ``.item()``, no ``.detach()``, no new tensor built from the value.
    Example: ``scale_loss_for_accumulation(torch.tensor(8.0), 4)`` is ``tensor(2.)``.
    Argument rules (lesson 14 §5.7): ``ValueError`` naming ``accumulation_steps`` when it is <= 0.
    """
    raise NotImplementedError("scale_loss_for_accumulation: TODO - see lesson 14 §5.2")


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """TODO (lesson 14 §5.3): True when 1-based micro-step ``step`` closes an accumulation window.

    Aligns with ``if step % args.accumulation_steps == 0`` in ``train_epoch``: True iff
    ``step % accumulation_steps == 0``. Micro-steps count from 1, so with K = 4 the optimizer steps at
    4, 8, 12, ...; with K = 1 at every micro-step.
    Argument rules (lesson 14 §5.7): ``ValueError`` naming ``accumulation_steps`` when it is <= 0, and
    naming ``step`` when ``step <= 0`` (a 0-based counter is a bug, not an input).
    """
    raise NotImplementedError("should_step_optimizer: TODO - see lesson 14 §5.3")


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """TODO (lesson 14 §5.4): True when the epoch ran micro-steps and ended inside a window.

    Aligns with the tail-flush condition after the loop in ``train_epoch``: flush iff
    ``last_step > start_step`` (a resume at ``start_step == last_step`` ran nothing, whatever
    ``last_step % K`` is) and ``last_step % accumulation_steps != 0`` (windows count from micro-step 1
    of the epoch, not from ``start_step``). Examples (last_step, start_step, K): (10, 0, 4) True;
    (8, 0, 4) False; (0, 0, 4) False; (10, 8, 4) True; (12, 9, 4) False; (6, 6, 4) False.
    Argument rules (lesson 14 §5.7), checked in this order: ``ValueError`` naming ``accumulation_steps``
    when it is <= 0, naming ``start_step`` when ``start_step < 0``, naming ``last_step`` when
    ``last_step < start_step``.
    """
    raise NotImplementedError("should_flush_tail: TODO - see lesson 14 §5.4")


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """TODO (lesson 14 §5.5): one epoch of MiniMind's pretrain loop, without logging/saving/DDP.

    Aligns with ``course/minimind/train_pretrain.py::train_epoch``; build it from the four functions
    above. Graded against that oracle: records, final parameters, AdamW state and GradScaler scale.

    Arguments: ``loader`` is any iterable of ``(input_ids, labels)`` pairs (the checks pass a list; do
    not call ``len(loader)``). ``epoch`` is 0-based, ``epochs`` the run's total, ``iters`` the micro-batches
    of a FULL epoch (also on a resume, when the loader yields only the remaining ones). ``start_step``
    is the number of micro-steps of this epoch done before a resume. ``scaler=None`` means a DISABLED
    ``torch.amp.GradScaler(torch.device(device).type, enabled=False)`` (it never skips a step);
    ``autocast_ctx=None`` means ``nullcontext()``.

    Requirements:
    - Step numbering: micro-steps are 1-based and continue after a resume; the first batch of this call
      is micro-step ``step = start_step + 1``. The lr uses the GLOBAL micro-step:
      ``cosine_lr(epoch * iters + step, epochs * iters, base_lr)``.
    - At EVERY micro-step, before the forward, write that lr into EVERY ``optimizer.param_groups`` entry
      (writing it only at boundaries leaves a stale lr for the tail flush).
    - Move ``input_ids`` and ``labels`` to ``device``. Inside ``autocast_ctx``: the forward
      ``model(input_ids, labels=labels)`` returns ``out``; loss = ``out.loss + out.aux_loss`` (always both
      terms); scaled = ``scale_loss_for_accumulation(loss, accumulation_steps)``. Then
      ``scaler.scale(scaled).backward()``. Gradients add up over a window: never clear them in between.
    - When ``should_step_optimizer(step, accumulation_steps)``, run the update in this order: unscale the
      optimizer's gradients (``scaler.unscale_``); clip with ``torch.nn.utils.clip_grad_norm_`` over
      ``model.parameters()`` and ``grad_clip``, keeping the norm it returns (the pre-clip norm);
      ``scaler.step(optimizer)``; ``scaler.update()``; clear the gradients with the optimizer's
      ``zero_grad``, ``set_to_none=True`` (after an update every ``.grad`` is None). Unscale BEFORE clip,
      or the clip sees scale x gradient. Clip to the ``grad_clip`` passed in, whatever its value.
      The GradScaler skipped the step (inf/NaN gradients) exactly when ``update()`` LOWERED its scale
      (a scale that grows after ``growth_interval`` clean updates is no skip): compare
      ``scaler.get_scale()`` before and after (only when ``scaler.is_enabled()``).
    - After the loop, if ``should_flush_tail(last_step, start_step, accumulation_steps)`` (``last_step`` =
      the last micro-step this call ran, ``start_step`` if none), run the same update once more. The
      loader may yield fewer than ``iters - start_step`` batches (the data ran out): the flush follows
      the last micro-step actually run, never ``iters``.

    Return one dict per micro-step, in order, with keys ``step`` (1-based), ``lr`` (the lr used at that
    micro-step), ``loss`` (UNSCALED, aux included: ``out.loss + out.aux_loss``, not divided by K),
    ``aux_loss`` (``out.aux_loss``), ``update_closed`` (bool: this micro-step closed an accumulation window,
    i.e. the optimizer was asked to step, including the tail flush and a skipped step),
    ``overflow_skipped`` (bool: True iff an enabled GradScaler skipped ``optimizer.step`` there),
    ``grad_norm`` (the pre-clip norm where ``update_closed``, ``inf`` for an overflow, else None) and
    ``tail_flush`` (True only on the last record, when the tail flush closed its window). Values may be
    Python floats or 0-dim tensors; keep detached tensors during the epoch and convert once at the end:
    no device-to-host sync (``.item()``, ``float()``, ``.tolist()``, ...) per micro-step. An epoch that
    runs no micro-step (a resume at ``start_step == iters``) returns ``[]`` and changes nothing.

    Argument rules (lesson 14 §5.7), all checked in this order before any work (before iterating the
    loader): ``ValueError`` naming the argument (first) when ``accumulation_steps``, ``iters`` or ``epochs``
    is <= 0, ``epoch`` is outside ``[0, epochs)`` or ``start_step`` is outside ``[0, iters]``.
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
    ``(input_ids, labels)`` batch, unpadded at ``max_length`` 16 or 32), compute the big batch's gradient with
    ONE backward of its loss, call ``accumulate_gradients`` on a second, identical model with the same
    samples cut into K micro-batches, and assert every parameter's gradient is close to the big batch's
    (``torch.testing.assert_close`` with a stated ``rtol`` / ``atol``). Return nothing; raise
    ``AssertionError`` (any failing ``assert``) when the implementation is wrong. The grader runs it on
    wrong implementations too (§5.6 lists them): each must make it fail. They include a division by the
    micro-batch size (so use micro-batches of a size other than K), the first micro-batch alone (so use
    different samples in each), one per large parameter tensor, a gradient 1 % off in that tensor alone
    (so compare every parameter, with a tolerance far below 1 %; float rounding here is ~1e-8, and the
    smallest gradients, of norm weights, have elements ~6e-4, so their 1 % error ~6e-6 hides under
    ``assert_close``'s default ``atol=1e-5``: state an atol far below it), and gradients with the right
    norms, sums and absolute values but the wrong signs, places or parameters (so compare each gradient
    tensor element-wise with its own parameter's expected gradient).
    """
    raise NotImplementedError("test_accumulation_matches_big_batch: TODO - see lesson 14 §5.6")


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
