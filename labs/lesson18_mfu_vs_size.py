"""Lesson 18 lab: tokens/s and MFU against model size, where the tiny model is overhead-bound and where matmuls
take over.

    python labs/lesson18_mfu_vs_size.py                                   # hidden 32 ... 512, 2 layers, CPU
    python labs/lesson18_mfu_vs_size.py --hidden_sizes 64 256 1024 --num_hidden_layers 4
    python labs/lesson18_mfu_vs_size.py --impl student                    # your impl/step_costs.py

For each hidden size a fresh model trains ``--warmup_steps + --steps`` steps on one batch of random token ids
(no padding); ``--impl``'s lesson-18 functions measure it: ThroughputMeter (§5.2) the tokens/s after the warm-up,
flops_per_token (§5.1) its training FLOPs, mfu (§5.3) the share of the peak, here this machine's measured matmul
peak (a CPU has no datasheet number for torch's kernels). A step that costs about the same time whatever its
FLOPs is overhead-bound (Python, kernel launches, small kernels); where the time grows with the FLOPs, the
matmuls have taken over and MFU flattens. Parameters and FLOPs are exact; times, tokens/s and MFU are this
machine's measurements.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course.experiments.figures import save_lab_figure  # noqa: E402
from course.experiments.step_timing import (DTYPES, Speed, add_step_arguments, device_peak,  # noqa: E402
                                            exit_on_todo, hidden_size_argument, lesson18_impl, measure_speed,
                                            non_negative_integer, parameter_count_of)
from course.implementations import add_impl_arguments  # noqa: E402
from course.minimind import MiniMindConfig  # noqa: E402
from course.runs.threads import cpu_threads, positive_integer  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_impl_arguments(parser, "step_costs.py (ThroughputMeter, flops_per_token, mfu)", default="reference")
    add_step_arguments(parser, model=False)
    parser.add_argument("--hidden_sizes", type=hidden_size_argument, nargs="+", default=[32, 64, 128, 256, 512])
    parser.add_argument("--num_hidden_layers", type=positive_integer, default=2)
    parser.add_argument("--steps", type=positive_integer, default=2, help="measured steps per size")
    parser.add_argument("--warmup_steps", type=non_negative_integer, default=1, help="steps left out before measuring")
    parser.add_argument("--out", type=Path, default=Path("out/lesson18/mfu_vs_size.png"))
    return parser.parse_args(argv)


def plot(speeds: list[Speed], peak_source: str, title: str, out: Path) -> None:
    params = [s.params / 1e6 for s in speeds]
    fig, (time_ax, rate_ax, mfu_ax) = plt.subplots(1, 3, figsize=(16, 4.5))
    time_ax.plot([s.flops_per_token * s.tokens_per_step / 1e9 for s in speeds],
                 [s.seconds_per_step * 1e3 for s in speeds], marker="o")
    time_ax.set(xscale="log", yscale="log", xlabel="training FLOPs per step (GFLOP)", ylabel="ms per step",
                title="Step time vs its FLOPs: flat = overhead-bound")
    for ax, values in ((rate_ax, [s.tokens_per_second for s in speeds]), (mfu_ax, [100 * s.mfu for s in speeds])):
        ax.plot(params, values, marker="o")
        for speed, x, y in zip(speeds, params, values):
            ax.annotate(f"hidden {speed.label}", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    rate_ax.set(xscale="log", yscale="log", xlabel="parameters (M)", ylabel="tokens/s", title="Tokens/s")
    mfu_ax.set(xscale="log", xlabel="parameters (M)", ylabel="MFU (%)", title=f"MFU against {peak_source}")
    mfu_ax.title.set_fontsize("small")
    for ax in (time_ax, rate_ax, mfu_ax):
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    save_lab_figure(fig, out)


@cpu_threads()
def main(argv=None) -> int:
    args = parse_args(argv)
    impl = lesson18_impl(args)
    peak = device_peak(args.device, DTYPES[args.dtype])
    print(f"peak: {peak.flops_per_second / 1e9:,.1f} GFLOP/s ({peak.source})")
    print(f"{args.num_hidden_layers} layers, batch {args.batch_size} x {args.seq_len}, {args.device}, {args.dtype}")
    configs = {hidden: MiniMindConfig(hidden_size=hidden, num_hidden_layers=args.num_hidden_layers)
               for hidden in args.hidden_sizes}
    flops = exit_on_todo(lambda: {h: impl.flops_per_token(c, args.seq_len, training=True)
                                  for h, c in configs.items()}, impl)
    print(f"{'hidden':>6} {'parameters':>12} {'training FLOPs/token':>21}")
    for hidden, config in configs.items():
        print(f"{hidden:>6} {parameter_count_of(config):>12,} {flops[hidden]:>21,}")
    print(f"measured, {args.steps} steps after {args.warmup_steps} left out:")
    speeds = []
    for hidden, config in configs.items():
        speed = exit_on_todo(lambda: measure_speed(
            impl, str(hidden), config, batch_size=args.batch_size, seq_len=args.seq_len, peak=peak,
            device=args.device, dtype=DTYPES[args.dtype], steps=args.steps, warmup_steps=args.warmup_steps), impl)
        speeds.append(speed)
        print(f"  hidden {hidden}: {speed.seconds_per_step * 1e3:.1f} ms/step, {speed.tokens_per_second:,.0f} "
              f"tokens/s, MFU {speed.mfu:.1%}", flush=True)
    smallest, largest = speeds[0], speeds[-1]
    print(f"from hidden {smallest.label} to {largest.label}: FLOPs per step x"
          f"{largest.flops_per_token / smallest.flops_per_token:,.1f}")
    print(f"from hidden {smallest.label} to {largest.label}: time per step "
          f"x{largest.seconds_per_step / smallest.seconds_per_step:,.1f} (measured)")
    plot(speeds, peak.source, f"Lesson 18: tokens/s and MFU against model size ({args.num_hidden_layers} layers, "
                              f"batch {args.batch_size} x {args.seq_len}, {args.device})", args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
