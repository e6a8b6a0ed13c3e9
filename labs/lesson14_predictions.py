"""The answers to lesson 14 §3's predictions, measured on the oracle (course.minimind's train_epoch).

    python labs/lesson14_predictions.py

Each block runs upstream-faithful code on the course's tiny model (CPU, fp32 unless it says otherwise)
and prints what the prediction asked for:
  1. the schedule's rate at s = 0 and s = T, and the rates the loop's first and last micro-steps use;
  2. which micro-steps close an update in an epoch of 10 micro-steps with K = 4;
  3. a resume at start_step == iters (6 micro-batches, K = 4, so 6 % 4 != 0): does the tail flush run?
  4. an enabled GradScaler whose only window overflows: the weights, the AdamW step count, the scale;
  5. the rate each optimizer.step runs with, the tail flush included;
  6. an enabled GradScaler, one window: the norm recorded and the norm the step uses, unscaling before the
     clip (the oracle's order) and clipping the still-scaled gradients first.
"""
from __future__ import annotations

import torch

from course.minimind import get_lr
from course.runs import LoopScenario, epoch_batches, run_oracle_epoch, training_objects
from course.runs.threads import cpu_threads

BASE = LoopScenario("dense, 1 epoch, K=4", epochs=1)


def run_epoch(scenario: LoopScenario, epoch: int = 0):
    """One oracle epoch of ``scenario`` on fresh training objects: (objects, records, lr at each optimizer.step,
    parameters before, parameters after)."""
    objects = training_objects(scenario)
    before = {n: p.detach().clone() for n, p in objects.model.named_parameters()}
    step_lrs = []
    objects.optimizer.register_step_pre_hook(lambda opt, args, kwargs: step_lrs.append(opt.param_groups[0]["lr"]))
    start = scenario.start_step if epoch == scenario.start_epoch else 0
    records = run_oracle_epoch(scenario, objects, epoch, epoch_batches(scenario, epoch), start)
    after = {n: p.detach().clone() for n, p in objects.model.named_parameters()}
    return objects, records, step_lrs, before, after


def unchanged(before: dict, after: dict) -> bool:
    return all(torch.equal(before[n], after[n]) for n in before)


def adamw_steps(optimizer) -> int:
    """AdamW's step count (0 when no step ever ran, so the optimizer holds no state)."""
    return max((int(state["step"]) for state in optimizer.state.values()), default=0)


def closed_steps(records) -> list[int]:
    return [r["step"] for r in records if r["update_closed"]]


def gradient_norm(params) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))


def clip_orders(scenario: LoopScenario):
    """One window of ``scenario`` backpropagated through its enabled GradScaler, then unscaled and clipped in
    both orders: unscale -> clip (the oracle's) and clip -> unscale. Returns the scale and, per order, (the norm
    clip_grad_norm_ returns, the norm of the gradients an optimizer step would then use)."""
    objects = training_objects(scenario)
    params = [p for p in objects.model.parameters()]
    for input_ids, labels in epoch_batches(scenario, 0):
        out = objects.model(input_ids, labels=labels)
        objects.scaler.scale((out.loss + out.aux_loss) / scenario.accumulation_steps).backward()
    scaled = [p.grad.clone() for p in params]
    scale = objects.scaler.get_scale()
    objects.scaler.unscale_(objects.optimizer)
    right = float(torch.nn.utils.clip_grad_norm_(params, scenario.grad_clip)), gradient_norm(params)
    for p, g in zip(params, scaled):
        p.grad = g.clone()
    recorded = float(torch.nn.utils.clip_grad_norm_(params, scenario.grad_clip))
    for p in params:
        p.grad.mul_(1.0 / scale)          # what unscale_ does to each gradient, now after the clip
    return scale, right, (recorded, gradient_norm(params))


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main() -> None:
    base_lr, total = 5e-4, 20
    print("1. schedule, base_lr 5e-4, T = 20 micro-steps:")
    print(f"   get_lr(s=0) = {get_lr(0, total, base_lr):.8f}, get_lr(s=T) = {get_lr(total, total, base_lr):.8f}")
    _, records, _, _, _ = run_epoch(BASE.with_(name="dense, 1 epoch of 20 micro-batches, K=4", iters=total))
    print(f"   the loop's micro-steps run s = {records[0]['step']}..{records[-1]['step']}: first lr "
          f"{records[0]['lr']:.8f}, last lr {records[-1]['lr']:.8f}")

    print("2. an epoch of 10 micro-steps, K = 4:")
    objects, records, _, _, _ = run_epoch(BASE.with_(name="dense, 1 epoch of 10 micro-batches, K=4", iters=10))
    print(f"   updates close at micro-steps {closed_steps(records)} (tail flush at "
          f"{[r['step'] for r in records if r['tail_flush']]}); AdamW step count {adamw_steps(objects.optimizer)}")

    print("3. resume at start_step = iters = 6, K = 4 (6 % 4 = 2):")
    objects, records, step_lrs, before, after = run_epoch(BASE.with_(name="dense, resume at 6 of 6", start_step=6))
    print(f"   micro-steps run {len(records)}, optimizer steps {len(step_lrs)}, "
          f"weights unchanged {unchanged(before, after)}")

    print("4. enabled GradScaler('cpu'), 4 micro-batches, K = 4, inf gradient in micro-step 2:")
    scenario = BASE.with_(name="enabled GradScaler, 4 micro-batches, K=4, overflow in micro-step 2", iters=4,
                          scaler_enabled=True, overflow_at_backward=2)
    objects, records, _, before, after = run_epoch(scenario)
    last = records[-1]
    print(f"   micro-step {last['step']}: update_closed={last['update_closed']} "
          f"overflow_skipped={last['overflow_skipped']} grad_norm={float(last['grad_norm'])}")
    print(f"   scale 65536.0 -> {objects.scaler.get_scale()}; weights unchanged {unchanged(before, after)}; "
          f"AdamW step count {adamw_steps(objects.optimizer)}")

    print("5. the lr each optimizer.step runs with, 2 epochs x 6 micro-batches, K = 4 (T = 12):")
    scenario = LoopScenario("dense, 2 epochs, K=4, 6 micro-batches per epoch (tail of 2)")
    _, records, step_lrs, _, _ = run_epoch(scenario)
    by_step = {r["step"]: r["lr"] for r in records}
    for step, lr in zip(closed_steps(records), step_lrs):
        print(f"   epoch 0 update at micro-step {step}: lr {lr:.8f} (lr of micro-step {step}: {by_step[step]:.8f})")

    print("6. enabled GradScaler('cpu'), 4 micro-batches, K = 4, grad_clip = 1.0, no overflow:")
    scale, right, wrong = clip_orders(BASE.with_(name="enabled GradScaler, 4 micro-batches, K=4", iters=4,
                                                 scaler_enabled=True))
    print(f"   scale {scale}")
    # digits that every CPU's kernels print alike (course/doc_outputs.py)
    print(f"   unscale -> clip: norm recorded {right[0]:.4f}, norm the step uses {right[1]:.4f}")
    print(f"   clip -> unscale: norm recorded {wrong[0]:.1f}, norm the step uses {wrong[1]:.3e}")


if __name__ == "__main__":
    main()
