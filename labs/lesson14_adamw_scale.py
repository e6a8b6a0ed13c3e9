"""AdamW and a constant factor on the gradient: what dividing the loss by K changes, and what it does not.

    python labs/lesson14_adamw_scale.py

On the course's tiny model (CPU, fp32, the built-in corpus), with K micro-batches per update:
  1. gradient norms at init: one micro-batch, the sum of K (the raw loss), the mean of K (loss / K);
  2. AdamW trained with loss / K and with the raw loss (every gradient exactly K times larger:
     K = 4 is a power of two), without clipping and with upstream's clip 1.0;
  3. upstream's tail update: r leftover micro-steps, each divided by K. With the optimizer's history
     fixed (after 1 and after --history updates of --history_batch_size samples), how much of the tail's
     own gradient reaches the update, compared with dividing by r.
     Clipping is off there, to isolate AdamW.
"""
from __future__ import annotations

import argparse
import copy
import math

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model
from course.runs.threads import cpu_threads
from lesson14_trace_pretrain_step import positive_int  # labs/ is on sys.path when a lab runs

NO_CLIP = math.inf


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accumulation_steps", type=positive_int, default=4, help="K")
    parser.add_argument("--batch_size", type=positive_int, default=8)
    parser.add_argument("--max_length", type=positive_int, default=64)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--grad_clip", type=float, default=1.0)
    parser.add_argument("--updates", type=positive_int, default=5, help="updates of the loss / K vs raw-loss runs")
    parser.add_argument("--tail", type=positive_int, default=2, help="r, leftover micro-steps of the tail")
    parser.add_argument("--history", type=positive_int, default=100, help="updates before the later tail")
    parser.add_argument("--history_batch_size", type=positive_int, default=2,
                        help="samples per history update (they only fill AdamW's moments: small is enough)")
    args = parser.parse_args(argv)
    if args.tail >= args.accumulation_steps:
        parser.error(f"--tail must be < --accumulation_steps ({args.accumulation_steps}), got {args.tail}")
    return args


def backward_window(model, batches, divisor: float) -> None:
    """Accumulate the gradients of ``batches``, each micro-batch's loss divided by ``divisor``."""
    for input_ids, labels in batches:
        out = model(input_ids, labels=labels)
        ((out.loss + out.aux_loss) / divisor).backward()


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def grad_vector(model) -> torch.Tensor:
    return flat(p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters())


def micro_batch_grads(model, batches) -> list[torch.Tensor]:
    grads = []
    for batch in batches:
        backward_window(model, [batch], 1.0)
        grads.append(grad_vector(model))
        model.zero_grad(set_to_none=True)
    return grads


def train(windows, divisor: float, grad_clip: float, lr: float) -> torch.Tensor:
    """The tiny model trained one update per window; returns its final parameters as one vector."""
    model = tiny_model(LoopScenario("adamw scale lab"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for window in windows:
        backward_window(model, window, divisor)
        if grad_clip != NO_CLIP:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return flat(model.parameters())


def tail_contribution_ratio(model, optimizer, tail_batches, k: int) -> float:
    """||update(g * r/K) - update(0)|| / ||update(g) - update(0)||, g the tail's mean gradient, same history."""
    grads = micro_batch_grads(model, tail_batches)
    mean_grad = torch.stack(grads).mean(0)
    moved = {}
    for scale in (0.0, len(tail_batches) / k, 1.0):
        trial_model, trial_optimizer = copy.deepcopy((model, optimizer))
        before = flat(trial_model.parameters())
        offset = 0
        for p in trial_model.parameters():
            p.grad = (scale * mean_grad[offset:offset + p.numel()]).view_as(p).clone()
            offset += p.numel()
        trial_optimizer.step()
        moved[scale] = flat(trial_model.parameters()) - before
    shrunk, full = (moved[s] - moved[0.0] for s in (len(tail_batches) / k, 1.0))
    return (shrunk.norm() / full.norm()).item()


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main(argv=None) -> None:
    args = parse_args(argv)
    k, r = args.accumulation_steps, args.tail
    batches = tiny_batches(args.batch_size, args.max_length, k * args.updates, seed=42)
    windows = [batches[i * k:(i + 1) * k] for i in range(args.updates)]
    model = tiny_model(LoopScenario("adamw scale lab"))
    print(f"tiny model: {sum(p.numel() for p in model.parameters()):,} parameters; K={k} micro-batches of "
          f"{args.batch_size}, length {args.max_length}; AdamW lr {args.learning_rate}, eps 1e-08")

    grads = micro_batch_grads(model, windows[0])
    single = sum(g.norm() for g in grads).item() / k
    summed = torch.stack(grads).sum(0).norm().item()
    print(f"gradient norm at init: one micro-batch {single:.4f} (average of {k}), mean of {k} (loss / K) "
          f"{summed / k:.4f}, sum of {k} (raw loss) {summed:.4f}")
    print(f"sum / one micro-batch = {summed / single:.2f}, between sqrt(K) = {math.sqrt(k):.2f} and K = {k}")
    print(f"clip {args.grad_clip} multiplies the sum by {min(1.0, args.grad_clip / (summed + 1e-6)):.4f} "
          f"and the mean by {min(1.0, args.grad_clip / (summed / k + 1e-6)):.4f}")

    start = flat(model.parameters())
    for clip, label in ((NO_CLIP, "no clipping"), (args.grad_clip, f"clip {args.grad_clip}")):
        mean_run = train(windows, k, clip, args.learning_rate)
        raw_run = train(windows, 1.0, clip, args.learning_rate)
        gap, moved = mean_run - raw_run, mean_run - start
        print(f"{label:>12}: after {args.updates} updates, ||theta(loss/K) - theta(raw loss)|| = "
              f"{(gap.norm() / moved.norm()).item():.2%} of ||theta(loss/K) - theta_0||; largest weight gap "
              f"{gap.abs().max().item():.2e}, largest weight move {moved.abs().max().item():.2e}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    history = tiny_batches(args.history_batch_size, args.max_length, args.history, seed=43)
    tail = windows[0][:r]
    ratios = {}
    for done, batch in enumerate(history, start=1):
        backward_window(model, [batch], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if done in (1, args.history):
            ratios[done] = tail_contribution_ratio(model, optimizer, tail, k)
    print(f"tail of r={r} of K={k} (gradient x r/K = {r / k}): share of the tail's own gradient that reaches "
          + ", ".join(f"update {done + 1}: {ratio:.3f}" for done, ratio in ratios.items()))


if __name__ == "__main__":
    main()
