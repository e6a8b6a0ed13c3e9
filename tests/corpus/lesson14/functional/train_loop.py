"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model  # noqa: F401 - for your test (§5.6)


# --- helpers (pure where possible) -------------------------------------------------------------------------


def _require_positive_k(accumulation_steps: int) -> None:
    # The one rule the arithmetic needs: ``% 0`` and ``/ 0`` crash, a negative K makes no window.
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")


def _cosine_factor(current_step: int, total_steps: int) -> float:
    """Half a cosine from 1 (s = 0) down to 0 (s = T)."""
    return 0.5 * (1.0 + math.cos(math.pi * current_step / total_steps))


def _global_step(epoch: int, iters: int, step: int) -> int:
    return epoch * iters + step


def _set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _forward_loss(model, input_ids, labels, autocast_ctx):
    """(training loss = LM + aux, aux loss), both still in the graph."""
    with autocast_ctx:
        out = model(input_ids, labels=labels)
        loss = out.loss + out.aux_loss
    return loss, out.aux_loss


def _apply_update(model, optimizer, scaler, grad_clip):
    """unscale -> clip -> step -> update -> zero_grad. Returns (pre-clip norm tensor, skipped?)."""
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    # update() lowers the scale exactly when step() found inf/NaN and skipped optimizer.step().
    skipped = scale_before is not None and scaler.get_scale() < scale_before
    return grad_norm, skipped


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """MiniMind's learning rate (``get_lr``): cosine from ``base_lr`` at s = 0 to ``base_lr / 10`` at s = T."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    lr_min = 0.1 * base_lr
    return float(lr_min + (base_lr - lr_min) * _cosine_factor(current_step, total_steps))


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """``loss / K``, still in the autograd graph, so K backward passes add up to the mean gradient."""
    _require_positive_k(accumulation_steps)
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """True when the 1-based micro-step ``step`` closes a window of K (steps K, 2K, ...)."""
    _require_positive_k(accumulation_steps)
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """True when this call ran micro-steps and the last one left a partial window (windows count from 1)."""
    _require_positive_k(accumulation_steps)
    return last_step > start_step and last_step % accumulation_steps != 0


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """One epoch of MiniMind's pretrain loop (``train_epoch`` without logging, saving or DDP).

    Returns one dict per micro-step run: ``step``, ``lr``, ``loss`` (unscaled, aux included), ``aux_loss``,
    ``update_closed``, ``overflow_skipped``, ``grad_norm`` (pre-clip, or None), ``tail_flush``.
    """
    _require_positive_k(accumulation_steps)
    # T = epochs * iters divides the schedule's step: both must be positive.
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if scaler is None:
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()

    total_steps = epochs * iters
    steps, lrs, losses, aux_losses = [], [], [], []
    norms, norm_at = [], []          # pre-clip norm tensors and the record index each belongs to
    skipped_at = set()
    last_step = start_step

    for step, (input_ids, labels) in enumerate(loader, start=start_step + 1):
        last_step = step
        input_ids = input_ids.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        lr = cosine_lr(_global_step(epoch, iters, step), total_steps, base_lr)
        _set_lr(optimizer, lr)

        loss, aux_loss = _forward_loss(model, input_ids, labels, autocast_ctx)
        scaler.scale(scale_loss_for_accumulation(loss, accumulation_steps)).backward()

        steps.append(step)
        lrs.append(lr)
        losses.append(loss.detach())
        aux_losses.append(aux_loss.detach())

        if should_step_optimizer(step, accumulation_steps):
            grad_norm, skipped = _apply_update(model, optimizer, scaler, grad_clip)
            norms.append(grad_norm.detach())
            norm_at.append(len(steps) - 1)
            if skipped:
                skipped_at.add(len(steps) - 1)

    tail_at = None
    if should_flush_tail(last_step, start_step, accumulation_steps):
        grad_norm, skipped = _apply_update(model, optimizer, scaler, grad_clip)
        tail_at = len(steps) - 1
        norms.append(grad_norm.detach())
        norm_at.append(tail_at)
        if skipped:
            skipped_at.add(tail_at)

    if not steps:
        return []

    # One host transfer per quantity for the whole epoch, not one per micro-step.
    loss_values = torch.stack(losses).tolist()
    aux_values = torch.stack(aux_losses).tolist()
    norm_values = torch.stack(norms).tolist() if norms else []
    norm_by_index = dict(zip(norm_at, norm_values))

    return [
        {
            "step": int(step),
            "lr": float(lr),
            "loss": float(loss_value),
            "aux_loss": float(aux_value),
            "update_closed": i in norm_by_index,
            "overflow_skipped": i in skipped_at,
            "grad_norm": None if i not in norm_by_index else float(norm_by_index[i]),
            "tail_flush": i == tail_at,
        }
        for i, (step, lr, loss_value, aux_value) in enumerate(zip(steps, lrs, loss_values, aux_values))
    ]


def _grads_by_name(model) -> dict:
    return {name: param.grad for name, param in model.named_parameters()}


def _split(batch, k: int) -> list:
    input_ids, labels = batch
    return list(zip(input_ids.chunk(k), labels.chunk(k)))


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """K accumulated micro-batches (``accumulate_gradients``) must give the gradient of one big batch.

    8 distinct unpadded samples, K = 4 micro-batches of 2 (so K != 1 and K != micro-batch size); every
    parameter's gradient compared element-wise at rtol 1e-4, atol 1e-6 (far above float32 rounding,
    far below a 1 % error of the smallest gradients, ~6e-4).
    """
    scenario = LoopScenario("l14-accumulation-test", hidden_size=32, num_hidden_layers=1)
    k = 4
    batch = tiny_batches(8, 32, 1, 1234)[0]

    reference = tiny_model(scenario)
    out = reference(batch[0], labels=batch[1])
    (out.loss + out.aux_loss).backward()
    expected = _grads_by_name(reference)

    candidate = tiny_model(scenario)
    accumulate_gradients(candidate, _split(batch, k), k)
    actual = _grads_by_name(candidate)

    assert all(g is not None for g in expected.values()), "the big-batch backward left a parameter without .grad"
    missing = [name for name, g in actual.items() if g is None]
    assert not missing, f"no gradient accumulated for {missing}"
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
