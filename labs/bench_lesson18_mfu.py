"""Lesson 18 bench: eager and compiled MFU of the tiny model and of a ~26 M MiniMind.

    python labs/bench_lesson18_mfu.py                            # CPU, fp32: a few minutes with the compiles
    python labs/bench_lesson18_mfu.py --configs tiny --no-compile  # seconds
    python labs/bench_lesson18_mfu.py --device cuda --dtype bfloat16 --batch_size 16 --seq_len 512

Configs (course/experiments/step_timing.py): ``tiny``, the course's model (hidden 48, 2 layers), and ``26m``,
upstream's MiniMind2-Small shape (hidden 512, 8 layers, FFN 1408: 26.9 M parameters). Each trains
``--warmup_steps + --steps`` steps of a fresh model on one batch of random token ids, eager and wrapped in
``torch.compile`` (its compile falls in the warm-up); ``--impl``'s lesson-18 functions give its tokens/s
(ThroughputMeter), FLOPs per token and MFU, against the GPU's datasheet bf16 peak (course/runs/peak_flops.py) or,
on a CPU, this machine's measured matmul peak. Every time, tokens/s and MFU is a measurement of this machine.
"""
from __future__ import annotations

import argparse
import sys

import torch

from course.experiments.step_timing import (CONFIGS, DTYPES, add_step_arguments, compile_unavailable, device_peak,
                                            exit_on_todo, lesson18_impl, measure_speed)
from course.implementations import add_impl_arguments
from course.minimind import MiniMindConfig
from course.runs.threads import cpu_threads, positive_integer


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_impl_arguments(parser, "step_costs.py (ThroughputMeter, flops_per_token, mfu)", default="reference")
    add_step_arguments(parser, batch_size=4, seq_len=256, model=False)
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--steps", type=positive_integer, default=3, help="measured steps")
    parser.add_argument("--warmup_steps", type=positive_integer, default=2,
                        help="steps left out (the compile among them)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="eager only")
    return parser.parse_args(argv)


def bench(impl, args) -> list[dict]:
    """Every config eager (and compiled where it can be): one dict per measurement, one printed line each."""
    peak = device_peak(args.device, DTYPES[args.dtype])
    print(f"peak: {peak.flops_per_second / 1e12:,.3f} TFLOP/s ({peak.source}); batch {args.batch_size} x "
               f"{args.seq_len}, {args.device}, {args.dtype}, torch {torch.__version__}", flush=True)
    modes = [False]
    if args.compile:
        reason = compile_unavailable(args.device)
        if reason:
            print(reason, flush=True)
        else:
            modes.append(True)
    rows = []
    for name in args.configs:
        config = MiniMindConfig(**CONFIGS[name])
        for compiled in modes:
            speed = exit_on_todo(lambda: measure_speed(
                impl, name, config, batch_size=args.batch_size, seq_len=args.seq_len, peak=peak,
                device=args.device, dtype=DTYPES[args.dtype], compiled=compiled, steps=args.steps,
                warmup_steps=args.warmup_steps), impl)
            mode = "compiled" if compiled else "eager"
            rows.append({"config": name, "mode": mode, "params": speed.params,
                         "flops_per_token": speed.flops_per_token, "tokens_per_second": speed.tokens_per_second,
                         "mfu": speed.mfu, "peak_flops_per_second": peak.flops_per_second, "peak": peak.source})
            print(f"{name:>5} {mode:>8}: {speed.params:>11,} parameters, {speed.flops_per_token:>12,} training "
                       f"FLOPs/token, {speed.seconds_per_step * 1e3:8.1f} ms/step, "
                       f"{speed.tokens_per_second:>10,.0f} tokens/s, MFU {speed.mfu:.1%}", flush=True)
    return rows


@cpu_threads()
def main(argv=None) -> int:
    args = parse_args(argv)
    bench(lesson18_impl(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
