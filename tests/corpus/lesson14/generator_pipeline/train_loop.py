"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model  # noqa: F401 - for your test (§5.6)


def _check_accumulation_steps(accumulation_steps: int) -> None:
    """The one argument this file validates: K, the number of micro-batches per optimizer update."""
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1 (micro-batches per update), got {accumulation_steps}")


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """MiniMind's learning rate at micro-step ``current_step`` of a ``total_steps`` run (lesson 14 §1.2).

    A tenth of ``base_lr`` is the floor, the other nine tenths follow half a cosine from 1 down to 0:
    ``base_lr`` at s = 0, 0.55 x ``base_lr`` at s = T/2, 0.1 x ``base_lr`` at s = T. No warmup.
    Examples: (0, 100, 1.0) -> 1.0; (50, 100, 1.0) -> 0.55; (100, 100, 1.0) -> 0.1.
    """
    return base_lr * 0.1 + base_lr * 0.9 * 0.5 * (1 + math.cos(math.pi * current_step / total_steps))


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """``loss / K``, still in the autograd graph: K backward passes of it add up to the MEAN gradient.

    Example: (tensor(8.), 4) -> tensor(2.).
    """
    _check_accumulation_steps(accumulation_steps)
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """Whether the 1-based micro-step ``step`` is the last of its window of K (windows 1..K, K+1..2K, ...).

    Examples: K = 4 -> True at 4, 8, 12, ...; K = 1 -> True at every step.
    """
    _check_accumulation_steps(accumulation_steps)
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """Whether this call left gradients of its own waiting: it ran a micro-step (``last_step > start_step``)
    and stopped inside a window (windows count from micro-step 1 of the epoch, not from ``start_step``).

    Examples (last_step, start_step, K): (10, 0, 4) -> True; (8, 0, 4) -> False; (6, 6, 4) -> False.
    """
    _check_accumulation_steps(accumulation_steps)
    ran_something = last_step > start_step
    inside_a_window = last_step % accumulation_steps != 0
    return ran_something and inside_a_window


# --- train_one_epoch as a pipeline of generators -------------------------------------------------------
#
#   loader --numbered--> (step, batch) --forward_backward--> (step, lr, loss, aux) --updates--> records
#
# Each stage pulls one item from the previous one, so micro-step s+1's forward only starts after the stage
# downstream has finished deciding (and running) the update of micro-step s: the order of lesson 14 §0.


def _numbered(loader, start_step):
    """Stage 1: the micro-batches with their 1-based micro-step, continuing after a resume."""
    yield from enumerate(loader, start=start_step + 1)


def _forward_backward(numbered, model, optimizer, scaler, autocast_ctx, device, lr_of_step, accumulation_steps):
    """Stage 2: write the rate into every param group, forward under autocast, backward of (loss + aux) / K
    through the scaler. Yields ``(step, lr, loss, aux_loss)`` with the two losses detached and unscaled."""
    for step, (input_ids, labels) in numbered:
        lr = lr_of_step(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        input_ids = input_ids.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
        scaler.scale(scale_loss_for_accumulation(loss, accumulation_steps)).backward()
        yield step, lr, loss.detach(), out.aux_loss.detach()


def _updates(micro_steps, run_update, start_step, accumulation_steps):
    """Stage 3: close a window where ``should_step_optimizer`` says so, and the partial last window after the
    loader ran dry. A record is held back one micro-step, so the tail flush can be written on the last one."""
    held = None
    last_step = start_step
    for step, lr, loss, aux_loss in micro_steps:
        if held is not None:
            yield held
        last_step = step
        closed = should_step_optimizer(step, accumulation_steps)
        grad_norm, skipped = run_update() if closed else (None, False)
        held = {"step": step, "lr": lr, "loss": loss, "aux_loss": aux_loss, "update_closed": closed,
                "overflow_skipped": skipped, "grad_norm": grad_norm, "tail_flush": False}
    if should_flush_tail(last_step, start_step, accumulation_steps):
        grad_norm, skipped = run_update()
        held.update(update_closed=True, overflow_skipped=skipped, grad_norm=grad_norm, tail_flush=True)
    if held is not None:
        yield held


def _optimizer_update(model, optimizer, scaler, grad_clip):
    """unscale -> clip -> step -> update the scale -> clear. Returns (pre-clip norm, skipped by the scaler).

    ``scaler.step`` does not say whether it stepped; an enabled scaler lowers its scale after (and only after)
    a step it skipped for inf/NaN, so the scale read before and after tells."""
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    skipped = scale_before is not None and scaler.get_scale() < scale_before
    return grad_norm.detach(), skipped


def _as_python(records):
    """Drain the pipeline, then turn its tensors into Python numbers with one ``tolist`` per quantity."""
    records = list(records)
    if not records:
        return []
    losses = torch.stack([r["loss"] for r in records]).tolist()
    aux_losses = torch.stack([r["aux_loss"] for r in records]).tolist()
    norm_tensors = [r["grad_norm"] for r in records if r["grad_norm"] is not None]
    norms = iter(torch.stack(norm_tensors).tolist() if norm_tensors else [])
    return [{"step": int(r["step"]), "lr": float(r["lr"]), "loss": loss, "aux_loss": aux,
             "update_closed": bool(r["update_closed"]), "overflow_skipped": bool(r["overflow_skipped"]),
             "grad_norm": next(norms) if r["grad_norm"] is not None else None,
             "tail_flush": bool(r["tail_flush"])}
            for r, loss, aux in zip(records, losses, aux_losses)]


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """One epoch of MiniMind's pretrain loop (``train_pretrain.py::train_epoch`` without logging, saving, DDP).

    Returns one dict per micro-step run: ``step``, ``lr``, ``loss`` (unscaled, aux included), ``aux_loss``,
    ``update_closed``, ``overflow_skipped``, ``grad_norm`` (pre-clip, None where no update closed) and
    ``tail_flush``. Example: 6 micro-batches, K = 4 -> updates close at steps 4 and 6; step 6 is the flush.
    """
    _check_accumulation_steps(accumulation_steps)
    if scaler is None:
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()

    total_steps = epochs * iters

    def lr_of_step(step):
        return cosine_lr(epoch * iters + step, total_steps, base_lr)

    def run_update():
        return _optimizer_update(model, optimizer, scaler, grad_clip)

    numbered = _numbered(loader, start_step)
    micro_steps = _forward_backward(numbered, model, optimizer, scaler, autocast_ctx, device, lr_of_step,
                                    accumulation_steps)
    return _as_python(_updates(micro_steps, run_update, start_step, accumulation_steps))


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """K = 4 accumulated micro-batches of 2 samples must give the gradient of one batch of 8 (lesson 14 §5.6).

    Returns nothing when ``accumulate_gradients`` is right; raises ``AssertionError`` when it is wrong.
    """
    scenario = LoopScenario("lesson14_accumulation_test", hidden_size=32, num_hidden_layers=1)
    accumulation_steps, micro_batch_size = 4, 2
    input_ids, labels = tiny_batches(accumulation_steps * micro_batch_size, 32, 1, 14)[0]
    assert bool((labels != -100).all()), "the test needs unpadded samples (equal target counts)"

    # Expected: one forward and backward of the whole batch.
    expected_model = tiny_model(scenario)
    out = expected_model(input_ids, labels=labels)
    (out.loss + out.aux_loss).backward()

    # Actual: the same samples as K micro-batches of 2 (2 != K, so dividing by the micro-batch size shows).
    actual_model = tiny_model(scenario)
    micro_batches = list(zip(input_ids.split(micro_batch_size), labels.split(micro_batch_size)))
    accumulate_gradients(actual_model, micro_batches, accumulation_steps)

    # Verdict: every parameter, every element. float32 rounding of the two summation orders stays below
    # ~3e-8 here; the smallest bug to see (1 % of a norm weight's gradient, ~4e-4) is ~4e-6: atol 1e-7 and
    # rtol 1e-4 sit between the two.
    pairs = ((name, expected.grad, actual.grad)
             for (name, expected), actual in zip(expected_model.named_parameters(), actual_model.parameters()))
    compared = 0
    for name, expected_grad, actual_grad in pairs:
        assert expected_grad is not None, f"{name}: the big batch gave no gradient"
        assert actual_grad is not None, f"{name}: accumulate_gradients left no gradient"
        torch.testing.assert_close(actual_grad, expected_grad, rtol=1e-4, atol=1e-7,
                                   msg=lambda m, name=name: f"{name}: {m}")
        compared += 1
    assert compared == len(list(expected_model.parameters())), "not every parameter was compared"


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
