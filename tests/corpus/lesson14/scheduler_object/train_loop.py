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
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """MiniMind's cosine learning rate (``trainer_utils.py::get_lr``): no warmup, from ``base_lr`` at step 0
    down to ``0.1 * base_lr`` at ``total_steps``, both ends included.

    Raises ``ValueError`` if ``total_steps < 1`` or ``current_step`` is outside ``[0, total_steps]``.
    Examples: (0, 100, 1.0) -> 1.0; (50, 100, 1.0) -> 0.55; (100, 100, 1.0) -> 0.1.
    """
    if total_steps <= 0:
        raise ValueError(f"total_steps must be >= 1 (micro-steps of the whole run), got {total_steps!r}")
    if not 0 <= current_step <= total_steps:
        raise ValueError(f"current_step must lie in [0, total_steps={total_steps}], got {current_step!r}")
    return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))


class CosineSchedule:
    """The rate of each micro-step of one epoch, on the run's global schedule.

    ``schedule(step)`` maps the epoch's 1-based micro-step ``step`` to ``cosine_lr(offset + step, total_steps,
    base_lr)``, with ``offset = epoch * iters`` and ``total_steps = epochs * iters``: the schedule neither
    restarts each epoch nor after a resume. ``schedule.apply(optimizer, step)`` also writes the rate into
    every param group and returns it.
    """

    def __init__(self, base_lr: float, *, epoch: int, epochs: int, iters: int):
        self.base_lr = base_lr
        self.offset = epoch * iters
        self.total_steps = epochs * iters

    def __call__(self, step: int) -> float:
        return cosine_lr(self.offset + step, self.total_steps, self.base_lr)

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        lr = self(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def __repr__(self) -> str:
        return f"CosineSchedule(base_lr={self.base_lr}, offset={self.offset}, total_steps={self.total_steps})"


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """``loss / accumulation_steps`` as part of the autograd graph (the gradient w.r.t. ``loss`` is 1/K).

    Raises ``ValueError`` if ``accumulation_steps < 1``. Example: (tensor(8.), 4) -> tensor(2.).
    """
    _require_positive("accumulation_steps", accumulation_steps)
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """True when the 1-based micro-step ``step`` closes its window of ``accumulation_steps``.

    Raises ``ValueError`` if ``accumulation_steps < 1`` or ``step < 1`` (a 0-based counter is a bug).
    Examples: K = 4 -> True at 4, 8, 12, ...; K = 1 -> True at every step.
    """
    _require_positive("accumulation_steps", accumulation_steps)
    if step <= 0:
        raise ValueError(f"step must be the 1-based micro-step (>= 1), got {step!r}")
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """True when the call ran at least one micro-step and stopped inside a window, so gradients it
    accumulated are waiting. Windows count from micro-step 1 of the epoch, not from ``start_step``.

    Raises ``ValueError`` if ``accumulation_steps < 1``, ``start_step < 0`` or ``last_step < start_step``.
    Examples (last_step, start_step, K): (10, 0, 4) -> True; (8, 0, 4) -> False; (6, 6, 4) -> False.
    """
    _require_positive("accumulation_steps", accumulation_steps)
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0 (micro-steps done before a resume), got {start_step!r}")
    if last_step < start_step:
        raise ValueError(f"last_step must be >= start_step={start_step} (the last micro-step run, start_step "
                         f"when none ran), got {last_step!r}")
    return last_step > start_step and last_step % accumulation_steps != 0


def _check_epoch_arguments(*, epoch, epochs, iters, accumulation_steps, start_step) -> None:
    _require_positive("accumulation_steps", accumulation_steps)
    _require_positive("iters", iters)
    _require_positive("epochs", epochs)
    if not 0 <= epoch < epochs:
        raise ValueError(f"epoch must be 0-based, in [0, {epochs - 1}] for epochs={epochs}, got {epoch!r}")
    if not 0 <= start_step <= iters:
        raise ValueError(f"start_step must lie in [0, iters={iters}] (micro-steps already done), got {start_step!r}")


def _optimizer_update(model, optimizer, scaler, grad_clip):
    """unscale -> clip -> step -> update -> zero_grad. Returns the pre-clip norm (a tensor) and whether an
    enabled scaler skipped the step: it lowers its scale after a skipped step, and only then."""
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    skipped = scale_before is not None and scaler.get_scale() < scale_before
    return grad_norm.detach(), skipped


def _records_to_python(records: list[dict]) -> list[dict]:
    """Replace the tensors of ``records`` by Python floats in one pass: one stack and one ``tolist`` per
    tensor field, so the epoch costs a fixed number of host syncs, not one per micro-step."""
    if not records:
        return []
    losses = torch.stack([r["loss"] for r in records]).tolist()
    aux_losses = torch.stack([r["aux_loss"] for r in records]).tolist()
    closed_at = [i for i, r in enumerate(records) if r["grad_norm"] is not None]
    norms = torch.stack([records[i]["grad_norm"] for i in closed_at]).tolist() if closed_at else []
    norm_at = dict(zip(closed_at, norms))
    return [dict(r, loss=losses[i], aux_loss=aux_losses[i], grad_norm=norm_at.get(i))
            for i, r in enumerate(records)]


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """One epoch of MiniMind's pretrain loop (``train_pretrain.py::train_epoch`` without logging, saving or DDP).

    Arguments are validated before the loader is touched (``ValueError``). ``scaler=None`` is a disabled
    GradScaler for the device's type, ``autocast_ctx=None`` a ``nullcontext``. Returns one dict per micro-step:
    ``step``, ``lr``, ``loss`` (unscaled, aux included), ``aux_loss``, ``update_closed``, ``overflow_skipped``,
    ``grad_norm`` (pre-clip where an update closed, else None), ``tail_flush``.
    """
    _check_epoch_arguments(epoch=epoch, epochs=epochs, iters=iters, accumulation_steps=accumulation_steps,
                           start_step=start_step)
    if scaler is None:
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()
    schedule = CosineSchedule(base_lr, epoch=epoch, epochs=epochs, iters=iters)

    records: list[dict] = []
    last_step = start_step
    for step, (input_ids, labels) in enumerate(loader, start=start_step + 1):
        last_step = step
        lr = schedule.apply(optimizer, step)
        input_ids = input_ids.to(device)
        labels = labels.to(device)
        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
        scaler.scale(scale_loss_for_accumulation(loss, accumulation_steps)).backward()

        grad_norm, skipped = None, False
        if should_step_optimizer(step, accumulation_steps):
            grad_norm, skipped = _optimizer_update(model, optimizer, scaler, grad_clip)
        records.append({"step": step, "lr": lr, "loss": loss.detach(), "aux_loss": out.aux_loss.detach(),
                        "update_closed": grad_norm is not None, "overflow_skipped": skipped,
                        "grad_norm": grad_norm, "tail_flush": False})

    if should_flush_tail(last_step, start_step, accumulation_steps):
        grad_norm, skipped = _optimizer_update(model, optimizer, scaler, grad_clip)
        records[-1].update(update_closed=True, overflow_skipped=skipped, grad_norm=grad_norm, tail_flush=True)

    return _records_to_python(records)


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """K = 4 micro-batches of 3 samples through ``accumulate_gradients`` must give, element for element, the
    gradient of one forward/backward of the 12 samples as one batch (lesson 14 §5.6).

    Tolerances, derived per parameter tensor with ``scale = max |expected grad|``:
    * float32 rounding: the two results sum the same terms in another order; each element's error is a few
      ulps of the largest terms it sums, ~1e-7 * scale (measured <= 3e-8 on the embedding, scale 0.12).
    * the smallest bug to catch: 1 % of a tensor's gradient (1e-2 * scale on its largest element), or one
      element holding >= 1 % of the scale negated (an error >= 2e-2 * scale).
    ``atol = 1e-4 * scale`` and ``rtol = 1e-4`` sit about 1000 times above the first and 50 times below the
    second, for every tensor whatever its own size (a norm weight's gradient is ~1e-3, the embedding's ~1e-1).
    """
    scenario = LoopScenario("lesson14_accumulation_matches_big_batch", hidden_size=32, num_hidden_layers=1)
    accumulation_steps, micro_batch_size, max_length = 4, 3, 16
    input_ids, labels = tiny_batches(accumulation_steps * micro_batch_size, max_length, 1, 2024)[0]
    assert bool((labels != -100).all()), "padded samples: the big batch's mean is not the mean of the means"

    expected_model = tiny_model(scenario)
    out = expected_model(input_ids, labels=labels)
    (out.loss + out.aux_loss).backward()
    expected = dict(expected_model.named_parameters())

    actual_model = tiny_model(scenario)
    micro_batches = list(zip(input_ids.chunk(accumulation_steps), labels.chunk(accumulation_steps)))
    assert len(micro_batches) == accumulation_steps
    accumulate_gradients(actual_model, micro_batches, accumulation_steps)
    actual = dict(actual_model.named_parameters())

    assert actual.keys() == expected.keys(), "the two models do not have the same parameters"
    rtol = 1e-4
    for name, param in expected.items():
        expected_grad = param.grad
        actual_grad = actual[name].grad
        assert expected_grad is not None, f"{name}: no gradient from the big batch"
        assert actual_grad is not None, f"{name}: accumulate_gradients left .grad None"
        scale = float(expected_grad.abs().max())
        atol = max(1e-4 * scale, 1e-12)
        torch.testing.assert_close(actual_grad, expected_grad, rtol=rtol, atol=atol,
                                   msg=lambda m, name=name, atol=atol: f"{name} (rtol={rtol}, atol={atol:.2e}): {m}")


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
