"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model  # noqa: F401 - for your test (§5.6)


def _require_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """Lesson 14 §5.1: MiniMind's learning rate at micro-step ``current_step`` of a ``total_steps`` run.

    ``base_lr`` at step 0, ``0.55 * base_lr`` halfway, ``0.1 * base_lr`` at ``total_steps`` (as ``get_lr``).
    """
    _require_positive("total_steps", total_steps)
    if not 0 <= current_step <= total_steps:
        raise ValueError(f"current_step must lie in [0, total_steps={total_steps}], got {current_step!r}")
    progress = current_step / total_steps
    return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """Lesson 14 §5.2: ``loss / accumulation_steps``, kept in the autograd graph."""
    _require_positive("accumulation_steps", accumulation_steps)
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """Lesson 14 §5.3: True on the last micro-step of each window of K (1-based: K, 2K, ...)."""
    if step < 1:
        raise ValueError(f"step is the 1-based micro-step and must be >= 1, got {step!r}")
    _require_positive("accumulation_steps", accumulation_steps)
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """Lesson 14 §5.4: True when this call ran micro-steps and ended inside a window (windows count from 1)."""
    _require_positive("accumulation_steps", accumulation_steps)
    if start_step < 0:
        raise ValueError(f"start_step counts micro-steps done before a resume and must be >= 0, got {start_step!r}")
    if last_step < start_step:
        raise ValueError(f"last_step must be >= start_step={start_step} (start_step when nothing ran), "
                         f"got {last_step!r}")
    ran_something = last_step > start_step
    return ran_something and not should_step_optimizer(last_step, accumulation_steps)


class _AccumulationWindow:
    """One accumulation window: collects K scaled backward passes and closes them with one update.

    ``close()`` runs the update in the one order lesson 14 §1.5 leaves: unscale -> clip -> step ->
    scaler update -> clear the gradients (to None). It returns the pre-clip norm (a tensor, no host sync)
    and whether an enabled GradScaler skipped ``optimizer.step`` because of inf/NaN gradients.
    """

    def __init__(self, model, optimizer, scaler, accumulation_steps, grad_clip):
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.accumulation_steps = accumulation_steps
        self.grad_clip = grad_clip

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(scale_loss_for_accumulation(loss, self.accumulation_steps)).backward()

    def close(self) -> tuple[torch.Tensor, bool]:
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        # update() lowers the scale after a skipped step and only then (it may raise it after a clean one)
        skipped = scale_before is not None and self.scaler.get_scale() < scale_before
        return grad_norm.detach(), skipped


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """Lesson 14 §5.5: one epoch of MiniMind's pretrain loop, aligned with ``train_epoch`` (no logging,
    saving or DDP). One record per micro-step run; ``[]`` when the call runs none."""
    _require_positive("epochs", epochs)
    if not 0 <= epoch < epochs:
        raise ValueError(f"epoch is 0-based and must lie in [0, epochs={epochs}), got {epoch!r}")
    _require_positive("iters", iters)
    if not 0 <= start_step <= iters:
        raise ValueError(f"start_step must lie in [0, iters={iters}], got {start_step!r}")
    _require_positive("accumulation_steps", accumulation_steps)

    if scaler is None:
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()

    window = _AccumulationWindow(model, optimizer, scaler, accumulation_steps, grad_clip)
    total_steps = epochs * iters
    records: list[dict] = []
    losses, aux_losses, norms = [], [], []
    last_step = start_step

    for step, (input_ids, labels) in enumerate(loader, start=start_step + 1):
        last_step = step
        input_ids, labels = input_ids.to(device), labels.to(device)
        lr = cosine_lr(epoch * iters + step, total_steps, base_lr)
        window.set_lr(lr)

        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
        window.backward(loss)
        losses.append(loss.detach())
        aux_losses.append(out.aux_loss.detach())

        record = {"step": step, "lr": lr, "update_closed": False, "overflow_skipped": False,
                  "grad_norm": None, "tail_flush": False}
        if should_step_optimizer(step, accumulation_steps):
            grad_norm, skipped = window.close()
            norms.append(grad_norm)
            record.update(update_closed=True, overflow_skipped=skipped)
        records.append(record)

    if should_flush_tail(last_step, start_step, accumulation_steps):
        grad_norm, skipped = window.close()
        norms.append(grad_norm)
        records[-1].update(update_closed=True, overflow_skipped=skipped, tail_flush=True)

    if not records:
        return records
    # one host transfer per quantity for the whole epoch, not one per micro-step
    loss_values = torch.stack([t.float() for t in losses]).tolist()
    aux_values = torch.stack([t.float() for t in aux_losses]).tolist()
    norm_values = torch.stack([t.float() for t in norms]).tolist() if norms else []
    norm_iter = iter(norm_values)
    for record, loss_value, aux_value in zip(records, loss_values, aux_values):
        record["loss"] = loss_value
        record["aux_loss"] = aux_value
        if record["update_closed"]:
            record["grad_norm"] = next(norm_iter)
    return records


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """Lesson 14 §5.6: accumulated gradients of K micro-batches == gradients of the big batch.

    K = 4 micro-batches of 2 distinct samples (length 32, no padding), made with ``chunk``; every
    parameter's gradient must be present and equal the big batch's element-wise (rtol 1e-4, atol 1e-6).
    """
    k = 4
    scenario = LoopScenario("accumulation_matches_big_batch", hidden_size=32, num_hidden_layers=1)
    input_ids, labels = tiny_batches(8, 32, 1, 1)[0]

    reference = tiny_model(scenario)
    big = reference(input_ids, labels=labels)
    (big.loss + big.aux_loss).backward()
    expected = {name: p.grad.detach().clone() for name, p in reference.named_parameters()}

    model = tiny_model(scenario)
    accumulate_gradients(model, list(zip(input_ids.chunk(k), labels.chunk(k))), k)
    actual = {name: p.grad for name, p in model.named_parameters()}

    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        assert actual[name] is not None, f"no gradient for {name}"
        torch.testing.assert_close(actual[name], grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda detail, name=name: f"gradient of {name}: {detail}")


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
