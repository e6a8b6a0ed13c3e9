"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
import numbers
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model  # noqa: F401 - for your test (§5.6)


# --- argument checking ---------------------------------------------------------------------------------------


def _require_int(name: str, value) -> None:
    """``value`` must be an integer (bool is not an integer here: ``True`` as a step count is a bug)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")


def _require_real(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r})")


def _require_at_least(name: str, value, minimum: int) -> None:
    _require_int(name, value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _require_in_range(name: str, value, low: int, high: int, *, high_inclusive: bool, high_name: str) -> None:
    _require_int(name, value)
    too_high = value > high if high_inclusive else value >= high
    if value < low or too_high:
        bracket = "]" if high_inclusive else ")"
        raise ValueError(f"{name} must be in [{low}, {high_name}={high}{bracket}, got {value}")


def _require_learning_rate(name: str, value) -> None:
    _require_real(name, value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


# --- exercises -----------------------------------------------------------------------------------------------


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """MiniMind's ``get_lr``: ``base_lr * (0.1 + 0.45 * (1 + cos(pi * s / T)))`` for 0 <= s <= T.

    ``base_lr`` at s = 0, ``0.55 * base_lr`` at s = T / 2, ``0.1 * base_lr`` at s = T; no warmup.
    ``TypeError`` for a non-int step count or a non-real ``base_lr``; ``ValueError`` (naming the argument) for
    ``total_steps <= 0``, ``current_step`` outside ``[0, total_steps]``, or a negative / non-finite ``base_lr``.
    """
    _require_at_least("total_steps", total_steps, 1)
    _require_in_range("current_step", current_step, 0, total_steps, high_inclusive=True, high_name="total_steps")
    _require_learning_rate("base_lr", base_lr)
    progress = current_step / total_steps
    return float(base_lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))))


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """``loss / K``, still part of the autograd graph (d(loss / K) / d(loss) = 1 / K).

    ``TypeError`` when ``loss`` is not a tensor or K not an int; ``ValueError`` when K <= 0.
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
    _require_at_least("accumulation_steps", accumulation_steps, 1)
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """Whether the 1-based micro-step ``step`` closes a window of K (True at K, 2K, ...; every step for K = 1).

    ``TypeError`` for non-int arguments; ``ValueError`` when K <= 0 or ``step <= 0`` (a 0-based counter is a bug).
    """
    _require_at_least("accumulation_steps", accumulation_steps, 1)
    _require_at_least("step", step, 1)
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """Whether this call ran micro-steps (``last_step > start_step``) and ended inside a window.

    Windows count from micro-step 1 of the epoch, not from ``start_step``. ``TypeError`` for non-int arguments;
    ``ValueError`` when K <= 0, ``start_step < 0`` or ``last_step < start_step``.
    """
    _require_at_least("accumulation_steps", accumulation_steps, 1)
    _require_at_least("start_step", start_step, 0)
    _require_int("last_step", last_step)
    if last_step < start_step:
        raise ValueError(f"last_step must be >= start_step={start_step}, got {last_step}")
    return last_step > start_step and last_step % accumulation_steps != 0


def _validate_epoch_arguments(model, loader, optimizer, device, epoch, epochs, iters, base_lr,
                              accumulation_steps, grad_clip, scaler, autocast_ctx, start_step) -> None:
    # The lesson's rules first, in its table's order (§5.7), then the arguments it leaves implicit.
    _require_at_least("accumulation_steps", accumulation_steps, 1)
    _require_at_least("iters", iters, 1)
    _require_at_least("epochs", epochs, 1)
    _require_in_range("epoch", epoch, 0, epochs, high_inclusive=False, high_name="epochs")
    _require_in_range("start_step", start_step, 0, iters, high_inclusive=True, high_name="iters")
    _require_learning_rate("base_lr", base_lr)
    _require_real("grad_clip", grad_clip)
    if not grad_clip > 0:   # also refuses NaN
        raise ValueError(f"grad_clip must be > 0 (math.inf never clips), got {grad_clip!r}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not hasattr(loader, "__iter__"):     # checked without starting the iteration
        raise TypeError(f"loader must be an iterable of (input_ids, labels), got {type(loader).__name__}")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    torch.device(device)                     # an unknown device string raises here, before any work
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler or None, got {type(scaler).__name__}")
    if autocast_ctx is not None and not (hasattr(autocast_ctx, "__enter__") and hasattr(autocast_ctx, "__exit__")):
        raise TypeError(f"autocast_ctx must be a context manager or None, got {type(autocast_ctx).__name__}")


def _run_update(model, optimizer, scaler, grad_clip):
    """unscale -> clip -> step -> update -> zero_grad (lesson 14 §1.5).

    Returns the pre-clip norm (a detached tensor) and whether the scaler skipped ``optimizer.step()``. The skip is
    read through the scaler's public API: ``update()`` lowers the scale after a skipped step, and only then (after
    ``growth_interval`` clean steps it raises it).
    """
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    skipped = scale_before is not None and scaler.get_scale() < scale_before
    return grad_norm.detach(), bool(skipped)


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """One epoch of MiniMind's pretrain loop (``train_pretrain.py::train_epoch`` without logging, saving or DDP).

    Every argument is checked before the loader is touched: ``TypeError`` for a wrong type, ``ValueError`` naming
    the argument for a value out of range. A loader that yields more than ``iters - start_step`` batches is refused
    (``ValueError``) before the extra batch is trained on. Returns one dict per micro-step run: ``step``, ``lr``,
    ``loss`` (unscaled, aux included), ``aux_loss``, ``update_closed``, ``overflow_skipped``, ``grad_norm``
    (pre-clip where an update closed, else None), ``tail_flush``.
    """
    _validate_epoch_arguments(model, loader, optimizer, device, epoch, epochs, iters, base_lr,
                              accumulation_steps, grad_clip, scaler, autocast_ctx, start_step)
    if scaler is None:
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()

    total_steps = epochs * iters
    rows = []            # per micro-step: step, lr and the flags
    loss_tensors, aux_tensors, norm_tensors = [], [], []
    last_step = start_step

    for step, batch in enumerate(loader, start=start_step + 1):
        if step > iters:
            raise ValueError(f"loader yielded more than iters - start_step = {iters - start_step} batches "
                             f"(iters={iters}, start_step={start_step})")
        input_ids, labels = batch
        input_ids = input_ids.to(device)
        labels = labels.to(device)
        last_step = step

        lr = cosine_lr(epoch * iters + step, total_steps, base_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr

        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
            scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps)
        scaler.scale(scaled_loss).backward()

        loss_tensors.append(loss.detach())
        aux_tensors.append(out.aux_loss.detach())
        row = {"step": step, "lr": lr, "update_closed": False, "overflow_skipped": False, "tail_flush": False}
        rows.append(row)

        if should_step_optimizer(step, accumulation_steps):
            grad_norm, skipped = _run_update(model, optimizer, scaler, grad_clip)
            row.update(update_closed=True, overflow_skipped=skipped)
            norm_tensors.append(grad_norm)

    if should_flush_tail(last_step, start_step, accumulation_steps):
        grad_norm, skipped = _run_update(model, optimizer, scaler, grad_clip)
        rows[-1].update(update_closed=True, overflow_skipped=skipped, tail_flush=True)
        norm_tensors.append(grad_norm)

    if not rows:         # a resume at start_step == iters: nothing ran, nothing changed
        return []

    # One device-to-host transfer for the whole epoch (no sync per micro-step).
    n = len(rows)
    values = torch.stack([t.float() for t in loss_tensors + aux_tensors + norm_tensors]).tolist()
    losses, aux_losses, norms = values[:n], values[n:2 * n], iter(values[2 * n:])

    records = []
    for row, loss_value, aux_value in zip(rows, losses, aux_losses):
        records.append({
            "step": int(row["step"]),
            "lr": float(row["lr"]),
            "loss": float(loss_value),
            "aux_loss": float(aux_value),
            "update_closed": bool(row["update_closed"]),
            "overflow_skipped": bool(row["overflow_skipped"]),
            "grad_norm": float(next(norms)) if row["update_closed"] else None,
            "tail_flush": bool(row["tail_flush"]),
        })
    return records


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """K accumulated micro-batches must give the gradient of the whole batch, for K = 2, 3 and 4.

    One batch of 12 distinct, unpadded samples (max_length 32); micro-batches of 6, 3 and 4 samples for K = 2, 4
    and 3, so K never equals the micro-batch size. Expected: ONE backward of the big batch's loss + aux loss on a
    fresh seeded model. Actual: ``accumulate_gradients`` on another fresh copy. Every parameter's gradient must
    exist, have the expected shape and dtype, and pass ``torch.allclose(rtol=1e-4, atol=1e-6)``: far above the
    float rounding of reordered sums (~1e-8), far below a 1 % error of the smallest gradients (~6e-4 * 1e-2).
    """
    if not callable(accumulate_gradients):
        raise TypeError(f"accumulate_gradients must be callable, got {type(accumulate_gradients).__name__}")
    rtol, atol = 1e-4, 1e-6
    scenario = LoopScenario("l14-accumulation-vs-big-batch", hidden_size=32, num_hidden_layers=1)
    input_ids, labels = tiny_batches(12, 32, 1, 2024)[0]

    big = tiny_model(scenario)
    out = big(input_ids, labels=labels)
    (out.loss + out.aux_loss).backward()
    expected = {name: param.grad for name, param in big.named_parameters()}
    assert all(g is not None for g in expected.values()), "the big-batch backward must reach every parameter"

    for k in (2, 3, 4):
        model = tiny_model(scenario)
        micro_batches = list(zip(input_ids.chunk(k), labels.chunk(k)))
        assert len(micro_batches) == k
        accumulate_gradients(model, micro_batches, k)

        actual = dict(model.named_parameters())
        assert actual.keys() == expected.keys(), f"K={k}: the model's parameters changed"
        for name, want in expected.items():
            got = actual[name].grad
            assert got is not None, f"K={k}: {name} has no gradient after accumulate_gradients"
            assert got.shape == want.shape and got.dtype == want.dtype, (
                f"K={k}: {name} gradient is {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}")
            if not torch.allclose(got, want, rtol=rtol, atol=atol):
                worst = ((got - want).abs() - rtol * want.abs()).max().item()
                raise AssertionError(f"K={k}: {name} gradient differs from the big batch's "
                                     f"(max |diff| - rtol*|want| = {worst:.3e} > atol {atol})")


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
