"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
import warnings
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model  # noqa: F401 - for your test (§5.6)


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """Lesson 14 §5.1: MiniMind's cosine from ``base_lr`` down to ``0.1 * base_lr``, no warmup (like ``get_lr``)."""
    return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """Lesson 14 §5.2: ``loss / K``, still in the graph, so that K backward passes sum to the mean gradient."""
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """Lesson 14 §5.3: the 1-based micro-step ``step`` closes a window of K (steps K, 2K, ...)."""
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """Lesson 14 §5.4: this call ran micro-steps and the last one is not a window end."""
    return last_step > start_step and last_step % accumulation_steps != 0


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """Lesson 14 §5.5: one epoch of MiniMind's pretrain loop (``train_epoch`` without logging, saving or DDP).

    Returns one dict per micro-step: step, lr, loss (unscaled, aux included), aux_loss, update_closed,
    overflow_skipped, grad_norm (pre-clip, only where an update closed) and tail_flush.
    """
    if scaler is None:
        # A pass-through scaler, as the original MiniMind course text builds it. The torch.cuda.amp spelling
        # is deprecated and warns on construction; the loop must emit no warning, so silence that one here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            scaler = torch.cuda.amp.GradScaler(enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()

    total_steps = epochs * iters
    records = []
    norms = []          # pre-clip norm tensor of every closed update, in order
    last_step = start_step
    for step, (input_ids, labels) in enumerate(loader, start=start_step + 1):
        last_step = step
        input_ids = input_ids.to(device)
        labels = labels.to(device)

        # the lr of this global micro-step, in every param group, also between boundaries
        lr = cosine_lr(epoch * iters + step, total_steps, base_lr)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        # forward, (loss + aux) / K, backward through the scaler; gradients add up in .grad
        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
            scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps)
        scaler.scale(scaled_loss).backward()

        record = {"step": step, "lr": lr, "loss": loss.detach(), "aux_loss": out.aux_loss.detach(),
                  "update_closed": False, "overflow_skipped": False, "grad_norm": None, "tail_flush": False}
        records.append(record)

        # the update at a window's last micro-step: unscale -> clip -> step -> update -> zero_grad
        if should_step_optimizer(step, accumulation_steps):
            scale_before = scaler.get_scale() if scaler.is_enabled() else None
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            record["update_closed"] = True
            # the scale only goes down after a skipped step (inf/NaN found by unscale_)
            record["overflow_skipped"] = scale_before is not None and scaler.get_scale() < scale_before
            norms.append(grad_norm.detach())

    # tail flush: gradients of a partial last window are still waiting
    if should_flush_tail(last_step, start_step, accumulation_steps):
        scale_before = scaler.get_scale() if scaler.is_enabled() else None
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        record = records[-1]
        record["update_closed"] = True
        record["tail_flush"] = True
        record["overflow_skipped"] = scale_before is not None and scaler.get_scale() < scale_before
        norms.append(grad_norm.detach())

    # the loop is over: one device-to-host transfer for all losses, one for all norms
    if records:
        losses = torch.stack([r["loss"].float() for r in records]).tolist()
        aux_losses = torch.stack([r["aux_loss"].float() for r in records]).tolist()
        for record, loss_value, aux_value in zip(records, losses, aux_losses):
            record["loss"] = loss_value
            record["aux_loss"] = aux_value
    if norms:
        norm_values = iter(torch.stack([n.float() for n in norms]).tolist())
        for record in records:
            if record["update_closed"]:
                record["grad_norm"] = next(norm_values)
    return records


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """Lesson 14 §5.6: K accumulated micro-batches must give the gradient of the whole batch at once.

    12 distinct unpadded samples, K = 3 micro-batches of 4 (K != 1, micro-batch size != K), every parameter
    compared element-wise with rtol 1e-4 and atol 1e-7 (float32 rounding here is ~1e-9 after rtol).
    """
    accumulation_steps = 3
    scenario = LoopScenario("accumulation_test", hidden_size=32, num_hidden_layers=1)
    input_ids, labels = tiny_batches(12, 32, 1, 0)[0]

    # expected: one forward/backward of the whole batch
    big_model = tiny_model(scenario)
    out = big_model(input_ids, labels=labels)
    (out.loss + out.aux_loss).backward()

    # actual: the implementation under test on the same samples, cut into K micro-batches
    model = tiny_model(scenario)
    micro_batches = list(zip(input_ids.split(4), labels.split(4)))
    accumulate_gradients(model, micro_batches, accumulation_steps)

    for (name, expected), (_, actual) in zip(big_model.named_parameters(), model.named_parameters()):
        assert actual.grad is not None, f"{name} has no gradient"
        torch.testing.assert_close(actual.grad, expected.grad, rtol=1e-4, atol=1e-7,
                                   msg=lambda m, name=name: f"{name}: {m}")


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
