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
    """Lesson 14 §5.1: eta_s = base_lr * (0.1 + 0.45 * (1 + cos(pi * s / T))), for 0 <= s <= T (``get_lr``)."""
    assert total_steps >= 1, f"total_steps must be >= 1, got {total_steps}"
    assert 0 <= current_step <= total_steps, f"current_step must be in [0, {total_steps}], got {current_step}"
    cosine = math.cos(math.pi * current_step / total_steps)
    return base_lr * (0.1 + 0.45 * (1 + cosine))


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """Lesson 14 §5.2: the micro-step's loss divided by K (a graph node, not a copy)."""
    assert accumulation_steps >= 1, f"accumulation_steps must be >= 1, got {accumulation_steps}"
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """Lesson 14 §5.3: does 1-based micro-step ``step`` close a window of K?"""
    assert accumulation_steps >= 1, f"accumulation_steps must be >= 1, got {accumulation_steps}"
    assert step >= 1, f"step must be 1-based (>= 1), got {step}"
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """Lesson 14 §5.4: flush iff this call ran a micro-step and the last one left a partial window."""
    assert accumulation_steps >= 1, f"accumulation_steps must be >= 1, got {accumulation_steps}"
    assert start_step >= 0, f"start_step must be >= 0, got {start_step}"
    assert last_step >= start_step, f"last_step must be >= start_step ({start_step}), got {last_step}"
    if last_step == start_step:
        return False
    return last_step % accumulation_steps != 0


def _update(model, optimizer, scaler, grad_clip):
    """Close a window. Returns (pre-clip grad norm tensor, whether the GradScaler skipped the step).

    Without a scaler: clip -> step -> zero_grad. With one: unscale -> clip -> step -> update -> zero_grad.
    """
    if scaler is None:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        return grad_norm, False
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    # a skipped step (inf/NaN) is the only thing that makes update() lower the scale
    skipped = scale_before is not None and scaler.get_scale() < scale_before
    return grad_norm, skipped


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """Lesson 14 §5.5: MiniMind's ``train_epoch`` without logging, saving or DDP.

    ``scaler=None``: no GradScaler at all (plain backward and step); a given GradScaler is used as is.
    """
    assert accumulation_steps >= 1, f"accumulation_steps must be >= 1, got {accumulation_steps}"
    assert iters >= 1, f"iters must be >= 1, got {iters}"
    assert epochs >= 1, f"epochs must be >= 1, got {epochs}"
    assert 0 <= epoch < epochs, f"epoch must be in [0, {epochs}), got {epoch}"
    assert 0 <= start_step <= iters, f"start_step must be in [0, {iters}], got {start_step}"

    ctx = nullcontext() if autocast_ctx is None else autocast_ctx
    total_steps = epochs * iters

    records = []
    loss_tensors, aux_tensors, norm_tensors = [], [], []
    batches = iter(loader)
    step = start_step
    while True:
        try:
            input_ids, labels = next(batches)
        except StopIteration:
            break
        step += 1
        input_ids = input_ids.to(device)
        labels = labels.to(device)

        lr = cosine_lr(epoch * iters + step, total_steps, base_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr

        with ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
            scaled = scale_loss_for_accumulation(loss, accumulation_steps)
        if scaler is None:
            scaled.backward()
        else:
            scaler.scale(scaled).backward()

        loss_tensors.append(loss.detach())
        aux_tensors.append(out.aux_loss.detach())
        record = {"step": step, "lr": lr, "update_closed": False, "overflow_skipped": False,
                  "grad_norm": None, "tail_flush": False}
        if should_step_optimizer(step, accumulation_steps):
            grad_norm, skipped = _update(model, optimizer, scaler, grad_clip)
            norm_tensors.append(grad_norm.detach())
            record["update_closed"] = True
            record["overflow_skipped"] = skipped
        records.append(record)

    # `step` is now the last micro-step run (start_step if the loader was empty)
    if should_flush_tail(step, start_step, accumulation_steps):
        grad_norm, skipped = _update(model, optimizer, scaler, grad_clip)
        norm_tensors.append(grad_norm.detach())
        records[-1]["update_closed"] = True
        records[-1]["overflow_skipped"] = skipped
        records[-1]["tail_flush"] = True

    if records:
        # convert once at the end of the epoch: no host sync per micro-step
        losses = torch.stack([t.float() for t in loss_tensors]).tolist()
        aux_losses = torch.stack([t.float() for t in aux_tensors]).tolist()
        norms = torch.stack([t.float() for t in norm_tensors]).tolist() if norm_tensors else []
        j = 0
        for i, record in enumerate(records):
            record["loss"] = losses[i]
            record["aux_loss"] = aux_losses[i]
            if record["update_closed"]:
                record["grad_norm"] = norms[j]
                j += 1
    return records


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """Lesson 14 §5.6: test that accumulating K micro-batches reproduces the big batch's gradient.

    K = 2 micro-batches of 3 distinct, unpadded samples (length 32). Each parameter must have a gradient,
    and |actual - expected| <= 1e-7 + 1e-4 * |expected| element by element.
    """
    k = 2
    scenario = LoopScenario("accumulation_vs_big_batch", hidden_size=32, num_hidden_layers=1)
    input_ids, labels = tiny_batches(6, 32, 1, 3)[0]

    expected_model = tiny_model(scenario)
    out = expected_model(input_ids, labels=labels)
    (out.loss + out.aux_loss).backward()

    actual_model = tiny_model(scenario)
    micro_batches = [(input_ids[i:i + 3], labels[i:i + 3]) for i in range(0, 6, 3)]
    accumulate_gradients(actual_model, micro_batches, k)

    expected_params = dict(expected_model.named_parameters())
    actual_params = dict(actual_model.named_parameters())
    assert sorted(actual_params) == sorted(expected_params)
    for name, param in expected_params.items():
        expected = param.grad
        actual = actual_params[name].grad
        assert actual is not None, f"{name}: .grad is None after accumulation"
        assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        error = (actual - expected).abs()
        bound = 1e-7 + 1e-4 * expected.abs()
        assert bool((error <= bound).all()), (
            f"{name}: accumulated gradient differs from the big batch's by up to {error.max().item():.3e}")


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
