"""Reference solutions for lesson 14 (``impl/train_loop.py`` is the student's copy).

Each function matches the oracle in ``course/minimind`` bitwise on CPU fp32; the differences from
upstream are argument checks (a clear ``ValueError`` instead of a silent wrong answer) and the
per-micro-step records that ``train_one_epoch`` returns.
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model


def _validate_counts(**counts: int) -> None:
    """Each count must be >= 1: a ValueError naming it instead of a ZeroDivisionError or a silent wrong answer."""
    for name, value in counts.items():
        if value <= 0:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _validate_position(*, epoch: int, epochs: int, step: int, iters: int) -> None:
    """``epoch`` in [0, epochs) and the 1-based micro-step ``step`` in [1, iters]."""
    if not 0 <= epoch < epochs:
        raise ValueError(f"epoch must be in [0, epochs={epochs}), got {epoch}")
    if not 1 <= step <= iters:
        raise ValueError(f"step must be in [1, iters={iters}], got {step}")


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """MiniMind's schedule (``get_lr``): ``base_lr * (0.1 + 0.45 * (1 + cos(pi * s / T)))``."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    if not 0 <= current_step <= total_steps:
        raise ValueError(f"current_step must be in [0, total_steps={total_steps}], got {current_step}")
    return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """Divide by K so that K accumulated backward passes give the mean micro-batch gradient."""
    _validate_counts(accumulation_steps=accumulation_steps)
    return loss / accumulation_steps


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """True at the end of each accumulation window; ``step`` is the 1-based micro-step."""
    _validate_counts(accumulation_steps=accumulation_steps)
    if step <= 0:
        raise ValueError(f"step must be >= 1 (micro-steps are 1-based), got {step}")
    return step % accumulation_steps == 0


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """True when the epoch ran at least one micro-step and ended inside a window."""
    _validate_counts(accumulation_steps=accumulation_steps)
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    if last_step < start_step:
        raise ValueError(f"last_step must be >= start_step={start_step}, got {last_step}")
    return last_step > start_step and last_step % accumulation_steps != 0


def _optimizer_update(model, optimizer, scaler, grad_clip):
    """unscale -> clip -> step -> update -> zero_grad; returns the pre-clip gradient norm and whether
    the GradScaler skipped ``optimizer.step`` (``update()`` backs the scale off exactly then)."""
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, scale_before is not None and scaler.get_scale() < scale_before


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """One epoch of MiniMind's pretrain loop without logging, saving or DDP.

    Returns one record per micro-step: ``step``, ``lr``, ``loss`` (unscaled, aux included),
    ``aux_loss``, ``update_closed`` (the optimizer was asked to step), ``overflow_skipped`` (the
    GradScaler found inf/NaN and skipped that step), ``grad_norm`` (pre-clip, or None) and ``tail_flush``.
    """
    _validate_counts(accumulation_steps=accumulation_steps, iters=iters, epochs=epochs)
    if not 0 <= epoch < epochs:
        raise ValueError(f"epoch must be in [0, epochs={epochs}), got {epoch}")
    if not 0 <= start_step <= iters:
        raise ValueError(f"start_step must be in [0, iters={iters}], got {start_step}")
    if scaler is None:
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)
    if autocast_ctx is None:
        autocast_ctx = nullcontext()

    steps, lrs, losses, aux_losses, grad_norms, skipped_steps = [], [], [], [], {}, set()
    last_step = start_step
    for step, (input_ids, labels) in enumerate(loader, start=start_step + 1):
        # asynchronous from pinned host memory on CUDA (§5.5); on the CPU both are the same tensors
        input_ids, labels = input_ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        last_step = step
        lr = cosine_lr(epoch * iters + step, epochs * iters, base_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
            scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps)
        scaler.scale(scaled_loss).backward()
        if should_step_optimizer(step, accumulation_steps):
            grad_norms[step], skipped = _optimizer_update(model, optimizer, scaler, grad_clip)
            if skipped:
                skipped_steps.add(step)
        steps.append(step)
        lrs.append(optimizer.param_groups[-1]["lr"])  # what the optimizer really holds, as upstream logs it
        losses.append(loss.detach())
        aux_losses.append(out.aux_loss.detach())

    tail_step = None
    if should_flush_tail(last_step, start_step, accumulation_steps):
        tail_step = last_step
        grad_norms[tail_step], skipped = _optimizer_update(model, optimizer, scaler, grad_clip)
        if skipped:
            skipped_steps.add(tail_step)

    if not steps:
        return []
    # One device-to-host copy for the whole epoch instead of one sync per micro-step.
    loss_values = torch.stack(losses).float().tolist()
    aux_values = torch.stack(aux_losses).float().tolist()
    norm_values = dict(zip(grad_norms, torch.stack(list(grad_norms.values())).float().tolist())) \
        if grad_norms else {}
    return [{"step": s, "lr": lr, "loss": loss_v, "aux_loss": aux_v,
             "update_closed": s in norm_values, "overflow_skipped": s in skipped_steps,
             "grad_norm": norm_values.get(s),
             "tail_flush": s == tail_step}
            for s, lr, loss_v, aux_v in zip(steps, lrs, loss_values, aux_values)]


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """K accumulated micro-batches with loss / K give the gradient of one big batch.

    Inputs chosen so that every catalogued bug shows: K = 2 (K = 1 hides a missing division),
    micro-batches of 3 different samples (3 != K; identical ones hide "first micro-batch only"), no
    padding (the mean of micro-batch means is then the big batch's mean), every parameter compared
    element-wise with a tolerance far above float rounding (~1e-8) and far below any bug (a 1 % error
    of the smallest gradient, elements ~6e-4: assert_close's default atol=1e-5 would hide it).
    """
    scenario = LoopScenario("accumulation test", hidden_size=32, num_hidden_layers=1, max_length=16)
    k, micro_size = 2, 3
    input_ids, labels = tiny_batches(k * micro_size, scenario.max_length, 1, seed=0)[0]
    big = tiny_model(scenario)
    out = big(input_ids, labels=labels)
    (out.loss + out.aux_loss).backward()
    model = tiny_model(scenario)   # seeded: the same weights as big
    accumulate_gradients(model, list(zip(input_ids.split(micro_size), labels.split(micro_size))), k)
    for (name, param), expected in zip(model.named_parameters(), big.parameters()):
        torch.testing.assert_close(param.grad, expected.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda detail: f"gradient of {name}: {detail}")


# --- Extensions: fix upstream (lesson 14 §10; optional, graded by ``python -m course check 14 --all``) ---


def accumulation_divisor(step: int, iters: int, accumulation_steps: int) -> int:
    """What micro-step ``step`` divides its loss by: K in full windows, r = iters % K in the last, partial one."""
    _validate_counts(accumulation_steps=accumulation_steps, iters=iters)
    if not 1 <= step <= iters:
        raise ValueError(f"step must be in [1, iters={iters}], got {step}")
    tail = iters % accumulation_steps
    return tail if step > iters - tail else accumulation_steps


def lr_per_update(epoch: int, step: int, iters: int, epochs: int, accumulation_steps: int,
                  base_lr: float) -> float:
    """MiniMind's cosine over optimizer updates: update n (1-based, over all epochs) of N gets cosine_lr(n, N)."""
    _validate_counts(accumulation_steps=accumulation_steps, iters=iters, epochs=epochs)
    _validate_position(epoch=epoch, epochs=epochs, step=step, iters=iters)
    updates_per_epoch = math.ceil(iters / accumulation_steps)
    update = epoch * updates_per_epoch + math.ceil(step / accumulation_steps)
    return cosine_lr(update, epochs * updates_per_epoch, base_lr)


def update_cadence_due(step: int, iters: int, accumulation_steps: int, interval: int) -> bool:
    """True where a log or save counted in updates is due: ``step`` closes update n (n = ceil(step / K)) and
    n % interval == 0, or ``step`` closes the epoch's last update (step == iters)."""
    _validate_counts(accumulation_steps=accumulation_steps, iters=iters, interval=interval)
    if not 1 <= step <= iters:
        raise ValueError(f"step must be in [1, iters={iters}], got {step}")
    if step == iters:
        return True
    closes_update = step % accumulation_steps == 0
    return closes_update and (step // accumulation_steps) % interval == 0


def adamw_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decay for matrices, none for 1-D parameters and embeddings (each parameter once)."""
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for _, param in model.named_parameters():  # yields a tied parameter once
        if not param.requires_grad:
            continue
        if param.ndim < 2 or id(param) in embeddings:
            no_decay.append(param)
        else:
            decay.append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine_lr(current_step: int, total_steps: int, base_lr: float, warmup_steps: int) -> float:
    """Linear warmup base_lr * s / W for s < W, then MiniMind's cosine over the remaining T - W steps."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(f"warmup_steps must be in [0, total_steps={total_steps}), got {warmup_steps}")
    if not 0 <= current_step <= total_steps:
        raise ValueError(f"current_step must be in [0, total_steps={total_steps}], got {current_step}")
    if current_step < warmup_steps:
        return base_lr * current_step / warmup_steps
    return cosine_lr(current_step - warmup_steps, total_steps - warmup_steps, base_lr)
