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
    """MiniMind's learning rate at micro-step ``current_step`` of a ``total_steps`` run (lesson 14 §1.2).

    lr = base_lr * (0.1 + 0.45 * (1 + cos(pi * s / T))): base_lr at s = 0, 0.1 * base_lr at s = T.
    Examples: (0, 100, 1.0) -> 1.0; (50, 100, 1.0) -> 0.55; (100, 100, 1.0) -> 0.1.
    """
    progress = current_step / total_steps
    lr = base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
    return float(lr)


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """The loss divided by K, so that K backward passes add up to the mean gradient (lesson 14 §1.3).

    Example: (tensor(8.), 4) -> tensor(2.).
    """
    scaled_loss = loss / accumulation_steps
    return scaled_loss


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """True when the 1-based micro-step ``step`` is the last one of a window of K = ``accumulation_steps``.

    Examples: K = 4 -> True at steps 4, 8, 12, ...; K = 1 -> True at every step.
    """
    if step % accumulation_steps == 0:
        return True
    return False


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """True when the epoch ran at least one micro-step (last_step > start_step) and the last one did not
    close a window (last_step % K != 0), so there are gradients that no update has used yet.

    Examples (last_step, start_step, K): (10, 0, 4) -> True; (8, 0, 4) -> False; (6, 6, 4) -> False.
    """
    if last_step <= start_step:
        return False  # nothing ran in this call
    if last_step % accumulation_steps == 0:
        return False  # the last micro-step already closed its window
    return True


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """One epoch of MiniMind's pretrain loop, like ``train_pretrain.py::train_epoch`` without logging and saving.

    Returns one dict per micro-step: step, lr, loss (not divided by K, aux included), aux_loss, update_closed,
    overflow_skipped, grad_norm (before clipping, None where no update closed), tail_flush.
    Example: 6 micro-batches, K = 4 -> updates close at steps 4 and 6; step 6 is the tail flush.
    """
    if scaler is None:
        device_type = torch.device(device).type
        scaler = torch.amp.GradScaler(device_type, enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()

    # I keep everything in lists during the epoch and make the records at the end,
    # so there is no .item() on every micro-step (lesson 14 §5.5).
    steps = []
    lrs = []
    losses = []          # detached tensors
    aux_losses = []      # detached tensors
    update_closed = []
    overflow_skipped = []
    grad_norms = []      # a detached tensor where an update closed, else None
    tail_flush = []

    last_step = start_step
    step = start_step
    for input_ids, labels in loader:
        step = step + 1
        last_step = step

        # learning rate of this micro-step, on the global schedule of the whole run
        global_step = epoch * iters + step
        total_steps = epochs * iters
        lr = cosine_lr(global_step, total_steps, base_lr)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        input_ids = input_ids.to(device)
        labels = labels.to(device)

        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
            scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps)

        scaler.scale(scaled_loss).backward()

        steps.append(step)
        lrs.append(lr)
        losses.append(loss.detach())
        aux_losses.append(out.aux_loss.detach())
        tail_flush.append(False)

        if should_step_optimizer(step, accumulation_steps):
            scale_before = scaler.get_scale()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scale_after = scaler.get_scale()
            update_closed.append(True)
            overflow_skipped.append(scale_after < scale_before)  # the scaler halves its scale after a skip
            grad_norms.append(grad_norm.detach())
        else:
            update_closed.append(False)
            overflow_skipped.append(False)
            grad_norms.append(None)

    # tail flush: the last window was not complete, but its gradients are still in param.grad
    if should_flush_tail(last_step, start_step, accumulation_steps):
        scale_before = scaler.get_scale()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scale_after = scaler.get_scale()
        update_closed[-1] = True
        overflow_skipped[-1] = scale_after < scale_before
        grad_norms[-1] = grad_norm.detach()
        tail_flush[-1] = True

    if len(steps) == 0:
        return []  # a resume at start_step == iters: nothing ran

    # convert the tensors to Python numbers, once for the whole epoch
    loss_values = torch.stack(losses).tolist()
    aux_loss_values = torch.stack(aux_losses).tolist()
    norms_that_exist = [norm for norm in grad_norms if norm is not None]
    if len(norms_that_exist) > 0:
        norm_values = torch.stack(norms_that_exist).tolist()
    else:
        norm_values = []

    records = []
    next_norm = 0
    for i in range(len(steps)):
        if grad_norms[i] is None:
            grad_norm_value = None
        else:
            grad_norm_value = float(norm_values[next_norm])
            next_norm = next_norm + 1
        records.append({
            "step": int(steps[i]),
            "lr": float(lrs[i]),
            "loss": float(loss_values[i]),
            "aux_loss": float(aux_loss_values[i]),
            "update_closed": bool(update_closed[i]),
            "overflow_skipped": bool(overflow_skipped[i]),
            "grad_norm": grad_norm_value,
            "tail_flush": bool(tail_flush[i]),
        })
    return records


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """Check that K accumulated micro-batches give the same gradients as one big batch (lesson 14 §5.6).

    Passes (returns None) for a correct ``accumulate_gradients``, raises AssertionError for a wrong one.
    """
    K = 4
    micro_batch_size = 2
    scenario = LoopScenario("lesson14_test_accumulation", hidden_size=32, num_hidden_layers=1)

    # one batch of 8 different samples, no padding at max_length 32
    batch = tiny_batches(K * micro_batch_size, 32, 1, 0)[0]
    input_ids = batch[0]
    labels = batch[1]

    # expected gradient: the whole batch at once
    model_big = tiny_model(scenario)
    out = model_big(input_ids, labels=labels)
    loss = out.loss + out.aux_loss
    loss.backward()

    # actual gradient: the same samples cut into K micro-batches of 2
    micro_batches = []
    for i in range(K):
        start = i * micro_batch_size
        end = start + micro_batch_size
        micro_batches.append((input_ids[start:end], labels[start:end]))
    model_acc = tiny_model(scenario)
    accumulate_gradients(model_acc, micro_batches, K)

    # compare every parameter's gradient, element by element
    big_params = dict(model_big.named_parameters())
    acc_params = dict(model_acc.named_parameters())
    for name in big_params:
        expected = big_params[name].grad
        actual = acc_params[name].grad
        assert expected is not None, f"{name} has no gradient in the big batch"
        assert actual is not None, f"{name} has no gradient after accumulate_gradients"
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-6)


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
