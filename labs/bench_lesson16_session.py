"""Lesson 16 benchmark: gradient agreement, the session's cost, and the check command's time.

    python labs/bench_lesson16_session.py

1. max |grad diff| of token-weighted accumulation (and of naive loss / K) vs one global-batch
   backward, fp32, on lesson 16's tiny update (micro-batches with 29, 10, 2, 1 valid targets);
2. time of a ``TrainingSession`` loop vs lesson 14's reference ``train_one_epoch`` on the same
   UNMASKED workload (median of ``--repeats`` timed runs each);
3. median wall time of ``python -m course check 16 --impl reference`` (``--check-runs`` processes).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

from course.protocol.text import TextBatch, naive_mean_step, token_weighted_step
from course.reference import train_session as ref
from course.reference.train_loop import cosine_lr, train_one_epoch
from course.runs import (LoopScenario, global_batch_gradients, grads_of, masked_micro_batches, new_session,
                         run_update, tiny_batches, tiny_model)

WORKLOAD = LoopScenario("bench: unmasked, 24 micro-batches, K=4", hidden_size=64, num_hidden_layers=2,
                        max_length=48, batch_size=4, iters=24)


def grad_diffs() -> dict:
    batches = masked_micro_batches()
    expected, _, _ = global_batch_gradients(batches)
    diffs = {}
    for name, units, step_fn in (("token_weighted", None, None), ("naive_loss_over_k", len(batches), naive_mean_step)):
        session = new_session(ref, len(batches))
        captured: dict = {}
        kwargs = {"step_fn": step_fn} if step_fn is not None else {}
        run_update(session, batches, units=units, before_update=lambda: captured.update(grads_of(session.model)) or True,
                   **kwargs)
        diffs[name] = max(float((captured[n] - g).abs().max()) for n, g in expected.items())
    return diffs


def unmasked_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    batches = tiny_batches(WORKLOAD.batch_size, WORKLOAD.max_length, WORKLOAD.iters, 42)
    return [(x, x.clone()) for x, _ in batches]   # labels = inputs: every target counts


def time_lesson14(batches) -> float:
    model = tiny_model(WORKLOAD)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    start = time.perf_counter()
    train_one_epoch(model, batches, optimizer, device="cpu", epoch=0, epochs=1, iters=len(batches), base_lr=5e-4,
                    accumulation_steps=WORKLOAD.accumulation_steps, grad_clip=1.0)
    return time.perf_counter() - start


def time_session(batches) -> float:
    """The same work through TrainingSession: model loss per micro-batch, lesson 14's lr, one readback at the end."""
    model = tiny_model(WORKLOAD)
    session = ref.TrainingSession(model, torch.optim.AdamW(model.parameters(), lr=5e-4),
                                  accumulation_steps=WORKLOAD.accumulation_steps)
    k = WORKLOAD.accumulation_steps
    start = time.perf_counter()
    losses = []
    for first in range(0, len(batches), k):
        window = [TextBatch(x, y, ref.count_loss_units(y)) for x, y in batches[first:first + k]]
        units = sum(b.loss_units for b in window)
        for i, batch in enumerate(window):
            lr = cosine_lr(first + i + 1, len(batches), 5e-4)
            report = session.train_step(batch, ref.TrainingStepOptions(lr=lr, clip_grad_norm=1.0, normalization_units=units,
                                                                       force_update=i == len(window) - 1),
                                        token_weighted_step)
        losses.append(report.loss_sum)
    torch.stack(losses).tolist()
    return time.perf_counter() - start


def check_time(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "course", "check", "16", "--impl", "reference"], check=True,
                       capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per loop (median reported)")
    parser.add_argument("--check-runs", type=int, default=3, help="CLI check processes to time (0 = skip)")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    results = {"grad_diff": grad_diffs()}
    for name, value in results["grad_diff"].items():
        print(f"max |grad diff| vs one global-batch backward (fp32), {name}: {value:.3e}")
    batches = unmasked_batches()
    time_lesson14(batches), time_session(batches)   # warm-up
    plain, session = [], []
    for _ in range(args.repeats):   # interleaved, so machine load hits both loops alike
        plain.append(time_lesson14(batches))
        session.append(time_session(batches))
    results["time_ratio"] = statistics.median(session) / statistics.median(plain)
    print(f"TrainingSession loop {statistics.median(session) * 1e3:.1f} ms vs lesson-14 train_one_epoch "
          f"{statistics.median(plain) * 1e3:.1f} ms ({WORKLOAD.iters} micro-batches, unmasked): "
          f"ratio {results['time_ratio']:.3f}")
    if args.check_runs:
        times = check_time(args.check_runs)
        results["check_seconds"] = statistics.median(times)
        print(f"python -m course check 16 --impl reference: median {results['check_seconds']:.2f} s "
              f"over {len(times)} runs {[round(t, 2) for t in times]}")
    return results


if __name__ == "__main__":
    main()
