"""Lesson 18 lab: where one training step's time goes, by torch.profiler.

    python labs/lesson18_profile_step.py                                       # the tiny model on the CPU
    python labs/lesson18_profile_step.py --hidden_size 256 --num_hidden_layers 4
    python labs/lesson18_profile_step.py --device cuda --dtype bfloat16        # CUDA kernels too

One warm-up step, then one step of a fresh model (random token ids, no padding) under ``torch.profiler``, its
three phases labelled with ``record_function``: forward, backward, optimizer.step. It prints the operators'
table (self time: each operator without the ones it called), each phase's share, the matmuls that ran and their
FLOPs as the profiler counts them next to ``flops_per_token`` (``--impl``'s lesson 18 §5.1) times the step's
tokens, and saves a trace that https://ui.perfetto.dev (or chrome://tracing) opens and a figure of the slowest
operators. The counts and FLOPs are exact; the times are this machine's, now.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from course.experiments.figures import save_lab_figure  # noqa: E402
from course.experiments.step_timing import (DTYPES, TrainingStep, add_step_arguments, exit_on_todo,  # noqa: E402
                                            lesson18_impl, step_shape, training_step)
from course.implementations import add_impl_arguments  # noqa: E402
from course.minimind import MiniMindConfig  # noqa: E402
from course.runs.threads import cpu_threads  # noqa: E402

PHASES = ("forward", "backward", "optimizer.step")
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
TABLE_ROWS = 12


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_impl_arguments(parser, "step_costs.py (flops_per_token)", default="reference")
    add_step_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("out/lesson18/profile_step.png"),
                        help="the figure; the trace goes beside it as <name>_trace.json")
    return parser.parse_args(argv)


def labelled_step(step: TrainingStep) -> None:
    """One training step, as TrainingStep runs it, with its phases named in the profile."""
    with record_function("forward"):
        with step.autocast_ctx:
            out = step.model(step.input_ids, labels=step.input_ids)
            loss = out.loss + out.aux_loss
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer.step"):
        step.optimizer.step()
        step.optimizer.zero_grad(set_to_none=True)


def profile_step(step: TrainingStep, device: str):
    step()   # warm-up: the first call allocates and picks kernels
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, with_flops=True) as prof:
        labelled_step(step)
        if device == "cuda":
            torch.cuda.synchronize()
    return prof


def plot(events, title: str, out: Path) -> None:
    slowest = sorted((e for e in events if e.key not in PHASES), key=lambda e: e.self_cpu_time_total)[-TABLE_ROWS:]
    fig, ax = plt.subplots(figsize=(9, 5))
    labels = [e.key if len(e.key) <= 48 else f"{e.key[:22]}...{e.key[-23:]}" for e in slowest]   # distinct names
    ax.barh(range(len(slowest)), [e.self_cpu_time_total / 1e3 for e in slowest], tick_label=labels,
            color=["tab:orange" if e.key in MATMULS else "tab:blue" for e in slowest])
    ax.set(xlabel="self CPU time (ms)", title=title)
    ax.grid(axis="x", alpha=0.3)
    save_lab_figure(fig, out)


@cpu_threads()
def main(argv=None) -> int:
    args = parse_args(argv)
    impl = lesson18_impl(args)
    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers)
    flops = exit_on_todo(lambda: impl.flops_per_token(config, args.seq_len, training=True), impl)
    step = training_step(config, batch_size=args.batch_size, seq_len=args.seq_len, device=args.device,
                         dtype=DTYPES[args.dtype])
    print(f"model: hidden {config.hidden_size}, {config.num_hidden_layers} layers, {step.params:,} parameters; "
          f"batch {args.batch_size} x {args.seq_len} tokens on {args.device}, {args.dtype}")
    prof = profile_step(step, args.device)
    events = prof.key_averages()
    sort_by = "self_device_time_total" if args.device == "cuda" else "self_cpu_time_total"
    print(events.table(sort_by=sort_by, row_limit=TABLE_ROWS))
    by_name = {e.key: e for e in events}
    step_ms = sum(by_name[p].cpu_time_total for p in PHASES) / 1e3
    print(f"phases (CPU time on {torch.get_num_threads()} thread(s), measured): " + ", ".join(
        f"{p} {by_name[p].cpu_time_total / 1e3:.1f} ms ({by_name[p].cpu_time_total / 1e3 / step_ms:.0%})"
        for p in PHASES))
    matmuls = [by_name[name] for name in MATMULS if name in by_name]
    counted = sum(e.flops for e in matmuls)
    print("matmuls: " + ", ".join(f"{e.key} {e.count} calls" for e in matmuls))
    print(f"time in matmuls: {sum(e.self_cpu_time_total for e in matmuls) / 1e3 / step_ms:.0%} of the step's CPU "
          f"time (measured)")
    tokens = args.batch_size * args.seq_len   # positions the model runs, the last of each row included
    print(f"matmul FLOPs the profiler counted: {counted:,}; flops_per_token(training) x {tokens} positions = "
          f"{flops * tokens:,}; the difference {flops * tokens - counted:,} is what no aten::mm ran "
          f"(the fused attention kernel's, which the profiler does not count)")
    trace = args.out.with_name(args.out.stem + "_trace.json")
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    print(f"trace: {trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    plot(events, f"Lesson 18: one training step's slowest operators (self CPU time)\n"
                 f"{step_shape(config, args)}; matmuls in orange", args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
