"""Lesson 18 lab: torch.compile's warm-up against its steady-state step, and the steps it takes to pay off.

    python labs/lesson18_compile_break_even.py                 # the tiny model, inductor's cache as it is
    python labs/lesson18_compile_break_even.py --cold          # a fresh, empty compile cache: a first compile
    python labs/lesson18_compile_break_even.py --hidden_size 256 --num_hidden_layers 4

The same training step (forward, backward, AdamW) of two copies of a fresh model, one eager and one wrapped in
``torch.compile``: each step timed on its own (the device synchronized around it). The compiled model's first
step traces and compiles (on a CPU, inductor writes C++ and runs the compiler: without one the lab says so and
times the eager steps alone); its later steps are the steady state. Break-even: the fewest steps after which
the compiled run has spent no more time than the eager one. Inductor caches what it compiled on disk, so a
second run of this lab compiles faster than the first (it prints the cache's hits); ``--cold`` measures a first
compile. Every time is a measurement of this machine.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from course.experiments.figures import save_lab_figure  # noqa: E402
from course.experiments.step_timing import (DTYPES, add_step_arguments, break_even_steps,  # noqa: E402
                                            compile_unavailable, step_seconds, step_shape, training_step)
from course.minimind import MiniMindConfig  # noqa: E402
from course.runs.threads import cpu_threads  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(parser)
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each model (the first included)")
    parser.add_argument("--cold", action="store_true", help="compile into a fresh, empty inductor cache")
    parser.add_argument("--out", type=Path, default=Path("out/lesson18/compile_break_even.png"))
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps must be >= 3 (a first step and a steady state of at least two), got {args.steps}")
    return args


def steady(seconds: list[float]) -> float:
    """A model's steady-state step: the median of its steps after the first."""
    return statistics.median(seconds[1:])


def plot(eager: list[float], compiled: list[float], break_even, title: str, out: Path) -> None:
    """How many seconds the compiled run is behind the eager one after n steps: measured over the timed steps,
    then a straight line at the two steady states, through zero at the break-even."""
    behind = [c - e for c, e in zip(itertools.accumulate(compiled), itertools.accumulate(eager))]
    last = max(len(behind), round(1.25 * break_even) if break_even else 4 * len(behind))
    slope = steady(compiled) - steady(eager)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(range(1, len(behind) + 1), behind, marker="o", linestyle="none", label="measured steps")
    ax.plot([len(behind), last], [behind[-1], behind[-1] + slope * (last - len(behind))],
            label=f"steady states: {steady(compiled) * 1e3:.1f} ms compiled vs {steady(eager) * 1e3:.1f} ms eager")
    ax.axhline(0, color="black", linewidth=0.8)
    if break_even:
        ax.axvline(break_even, color="gray", linestyle="--", label=f"break-even: step {break_even:,}")
    ax.set(xlabel="training step", ylabel="seconds the compiled run is behind", title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_lab_figure(fig, out)


def compiled_seconds(args, config) -> tuple[list[float], dict]:
    """The compiled copy's step times and inductor's FX graph cache hits and misses while it compiled."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache
    counters.clear()
    with fresh_cache() if args.cold else nullcontext():
        step = training_step(config, batch_size=args.batch_size, seq_len=args.seq_len, device=args.device,
                             dtype=DTYPES[args.dtype], compiled=True)
        seconds = step_seconds(step, args.steps, args.device)
    return seconds, {k: counters["inductor"][f"fxgraph_cache_{k}"] for k in ("hit", "miss")}


@cpu_threads()
def main(argv=None) -> int:
    args = parse_args(argv)
    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers)
    eager_step = training_step(config, batch_size=args.batch_size, seq_len=args.seq_len, device=args.device,
                               dtype=DTYPES[args.dtype])
    print(f"model: hidden {config.hidden_size}, {config.num_hidden_layers} layers, {eager_step.params:,} parameters; "
          f"batch {args.batch_size} x {args.seq_len} on {args.device}, {args.dtype}, "
          f"{torch.get_num_threads()} CPU thread(s); torch {torch.__version__}")
    eager = step_seconds(eager_step, args.steps, args.device)
    print(f"eager: first step {eager[0] * 1e3:.1f} ms, steady {steady(eager) * 1e3:.2f} ms per step "
          f"(median of {args.steps - 1}, measured)")
    reason = compile_unavailable(args.device)
    if reason:
        print(reason)
        return 0
    compiled, cache = compiled_seconds(args, config)
    print(f"compiled: first step {compiled[0]:.2f} s (tracing and compiling), steady {steady(compiled) * 1e3:.2f} ms "
          f"per step (measured); inductor's FX graph cache: {cache['hit']} hit(s), {cache['miss']} miss(es)"
          + (" (--cold: an empty cache)" if args.cold else " (hits: compiled before on this machine; --cold for a "
                                                            "first compile)" if cache["hit"] else ""))
    speedup = steady(eager) / steady(compiled)
    break_even = break_even_steps(compiled[0], steady(compiled), steady(eager))
    if break_even is None:
        print(f"steady compiled / eager step: {1 / speedup:.2f}: compiled steps are not faster here, so the "
              f"compile never pays off")
    else:
        print(f"steady speed-up {speedup:.2f}x; break-even after {break_even:,} steps "
              f"(first compiled step + the steady ones vs eager steps)")
    plot(eager, compiled, break_even, f"Lesson 18: torch.compile's warm-up vs its steady state\n"
                                      f"{step_shape(config, args)}", args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
