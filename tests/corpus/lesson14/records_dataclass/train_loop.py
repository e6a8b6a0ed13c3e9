"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model  # noqa: F401 - for your test (§5.6)


def _check_at_least_one(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """MiniMind's ``get_lr``: ``base_lr * (0.1 + 0.45 * (1 + cos(pi * s / T)))``, from base_lr down to base_lr / 10."""
    _check_at_least_one("total_steps", total_steps)
    if not 0 <= current_step <= total_steps:
        raise ValueError(f"current_step must be in [0, total_steps={total_steps}], got {current_step}")
    return float(base_lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * current_step / total_steps))))


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """``loss / K``: K of these backpropagated add up to the gradient of the mean loss. Stays in the graph."""
    _check_at_least_one("accumulation_steps", accumulation_steps)
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """Whether the 1-based micro-step ``step`` is the last of its window (windows 1..K, K+1..2K, ...)."""
    _check_at_least_one("accumulation_steps", accumulation_steps)
    if step < 1:
        raise ValueError(f"step must be >= 1 (micro-steps are 1-based), got {step}")
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """Whether this call ran at least one micro-step and stopped inside a window (windows count from step 1)."""
    _check_at_least_one("accumulation_steps", accumulation_steps)
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    if last_step < start_step:
        raise ValueError(f"last_step must be >= start_step={start_step}, got {last_step}")
    ran_something = last_step > start_step
    return ran_something and not should_step_optimizer(last_step, accumulation_steps)


@dataclass
class MicroStepRecord:
    """What happened at one micro-step. During the epoch ``loss``, ``aux_loss`` and ``grad_norm`` hold detached
    tensors (no host sync per micro-step); ``_finalize`` turns them into Python floats after the loop."""
    step: int
    lr: float
    loss: Any
    aux_loss: Any
    update_closed: bool = False
    overflow_skipped: bool = False
    grad_norm: Optional[Any] = None
    tail_flush: bool = False


def _close_window(model, optimizer, scaler, grad_clip, record: MicroStepRecord, *, tail: bool) -> None:
    """The update, in the one order that works: unscale -> clip -> step -> update -> zero_grad."""
    scale_before = scaler.get_scale()          # 1.0 and no sync for a disabled scaler
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    record.update_closed = True
    record.tail_flush = tail
    record.grad_norm = grad_norm.detach()
    # update() backs the scale off after a step it skipped for inf/NaN, and only then.
    record.overflow_skipped = scaler.is_enabled() and scaler.get_scale() < scale_before


def _finalize(records: list[MicroStepRecord]) -> list[dict]:
    """Tensors -> Python floats, with one host transfer for the whole epoch."""
    if not records:
        return []
    values = [r.loss for r in records] + [r.aux_loss for r in records]
    values += [r.grad_norm for r in records if r.grad_norm is not None]
    host = torch.stack([v.float() for v in values]).cpu()   # the epoch's one device-to-host copy
    n = len(records)
    norms = iter(host[2 * n:].tolist())
    losses, aux_losses = host[:n].tolist(), host[n:2 * n].tolist()
    for record, loss, aux_loss in zip(records, losses, aux_losses):
        record.loss = float(loss)
        record.aux_loss = float(aux_loss)
        if record.grad_norm is not None:
            record.grad_norm = float(next(norms))
    return [asdict(record) for record in records]


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """One epoch of MiniMind's pretrain loop (``train_epoch`` without logging, saving or DDP).

    One dict per micro-step run (``MicroStepRecord`` fields); the tail flush, if any, is on the last record.
    """
    for name, value in (("accumulation_steps", accumulation_steps), ("iters", iters), ("epochs", epochs)):
        _check_at_least_one(name, value)
    if not 0 <= epoch < epochs:
        raise ValueError(f"epoch must be in [0, epochs={epochs}), got {epoch}")
    if not 0 <= start_step <= iters:
        raise ValueError(f"start_step must be in [0, iters={iters}], got {start_step}")

    if scaler is None:
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()

    total_steps = epochs * iters
    records: list[MicroStepRecord] = []
    window_open = False      # gradients of this call wait in .grad, not yet applied by an update

    step = start_step
    for input_ids, labels in loader:
        step += 1
        input_ids, labels = input_ids.to(device), labels.to(device)

        lr = cosine_lr(epoch * iters + step, total_steps, base_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr

        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
            scaled = scale_loss_for_accumulation(loss, accumulation_steps)
        scaler.scale(scaled).backward()
        window_open = True

        record = MicroStepRecord(step=step, lr=lr, loss=loss.detach(), aux_loss=out.aux_loss.detach())
        records.append(record)

        if should_step_optimizer(step, accumulation_steps):
            _close_window(model, optimizer, scaler, grad_clip, record, tail=False)
            window_open = False

    # Same decision as should_flush_tail(step, start_step, K): a micro-step ran and no boundary followed it.
    if window_open:
        _close_window(model, optimizer, scaler, grad_clip, records[-1], tail=True)

    return _finalize(records)


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """K = 2 micro-batches of 3 samples must give the big batch's gradient, parameter by parameter."""
    scenario = LoopScenario("accumulation-vs-big-batch", hidden_size=32, num_hidden_layers=1)
    k, micro_batch_size = 2, 3
    input_ids, labels = tiny_batches(k * micro_batch_size, 16, 1, 7)[0]

    big = tiny_model(scenario)
    out = big(input_ids, labels=labels)
    (out.loss + out.aux_loss).backward()

    accumulated = tiny_model(scenario)
    micro_batches = list(zip(input_ids.split(micro_batch_size), labels.split(micro_batch_size)))
    accumulate_gradients(accumulated, micro_batches, k)

    for (name, p_big), (_, p_acc) in zip(big.named_parameters(), accumulated.named_parameters(), strict=True):
        assert p_acc.grad is not None, f"{name}: accumulate_gradients left no gradient"
        torch.testing.assert_close(p_acc.grad, p_big.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: accumulated gradient != big batch's\n{m}")


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
