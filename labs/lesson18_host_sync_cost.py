"""Lesson 18 lab: what one host sync costs on the device at hand.

    python labs/lesson18_host_sync_cost.py                  # the CPU: a sync waits for nothing
    python labs/lesson18_host_sync_cost.py --device cuda    # a GPU: each .item() drains the queue

Two measurements. First the bare price of ``.item()`` on a scalar that is already computed, with nothing queued.
Then the same training steps of the tiny model logged two ways, alternated over ``--rounds`` rounds: ``loss.item()``
after every step (a sync per step: on a GPU the host waits there until every queued kernel has run, so it cannot
launch the next step's kernels meanwhile), and ``RunningLoss`` (``--impl``'s lesson 18 §5.5: the running sum stays
on the device, one ``pop_mean`` per round). The difference per step is what a per-step sync costs here. Every number
is a measurement of this machine; on a CPU expect a difference within the noise.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from course.experiments.figures import save_lab_figure  # noqa: E402
from course.experiments.step_timing import (CONFIGS, DTYPES, add_step_arguments, exit_on_todo,  # noqa: E402
                                            item_seconds, lesson18_impl, logging_seconds, training_step)
from course.implementations import add_impl_arguments  # noqa: E402
from course.minimind import MiniMindConfig  # noqa: E402
from course.runs.threads import cpu_threads, positive_integer  # noqa: E402

WAYS = {"item_every_step": "loss.item() every step", "running_loss": "RunningLoss, one pop_mean"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_impl_arguments(parser, "step_costs.py (RunningLoss)", default="reference")
    add_step_arguments(parser, model=False)
    parser.add_argument("--steps", type=positive_integer, default=5, help="training steps per round")
    parser.add_argument("--rounds", type=positive_integer, default=3, help="rounds of each way, alternated")
    parser.add_argument("--out", type=Path, default=Path("out/lesson18/host_sync_cost.png"))
    return parser.parse_args(argv)


def plot(seconds: dict[str, list[float]], item: float, title: str, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for position, (name, values) in enumerate(seconds.items()):
        ms = [s * 1e3 for s in values]
        ax.scatter([position] * len(ms), ms, color="tab:gray", zorder=3, label="a round" if position == 0 else None)
        ax.bar(position, statistics.median(ms), color=["tab:red", "tab:green"][position], alpha=0.6)
    ax.set_xticks(range(len(seconds)), [WAYS[name] for name in seconds])
    ax.set(ylabel="ms per training step (median bar, rounds as points)",
           title=f"{title}\none bare .item(): {item * 1e6:.1f} µs")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    save_lab_figure(fig, out)


@cpu_threads()
def main(argv=None) -> int:
    args = parse_args(argv)
    impl = lesson18_impl(args)
    config = MiniMindConfig(**CONFIGS["tiny"])
    step = training_step(config, batch_size=args.batch_size, seq_len=args.seq_len, device=args.device,
                         dtype=DTYPES[args.dtype])
    where = f"{args.device}" + (f", {torch.get_num_threads()} CPU thread(s)" if args.device == "cpu" else "")
    print(f"device {where}; tiny model ({step.params:,} parameters), batch {args.batch_size} x {args.seq_len}, "
          f"{args.dtype}")
    item = item_seconds(args.device)
    print(f"one .item() of a computed scalar, nothing queued: {item * 1e6:.2f} µs (measured, mean of 2000)")
    seconds = exit_on_todo(lambda: logging_seconds(impl, step, steps=args.steps, rounds=args.rounds,
                                                   device=args.device), impl)
    print(f"{args.rounds} rounds of {args.steps} steps each way, alternated (measured, median of the rounds):")
    syncs = {"item_every_step": args.steps, "running_loss": 1}
    median = {name: statistics.median(values) for name, values in seconds.items()}
    for name, value in median.items():
        print(f"  {WAYS[name]:<26} {syncs[name]:>3} sync(s) per round: {value * 1e3:.2f} ms per step "
              f"(rounds {min(seconds[name]) * 1e3:.2f}-{max(seconds[name]) * 1e3:.2f})")
    difference = median["item_every_step"] - median["running_loss"]
    print(f"a sync per step costs {difference * 1e3:+.3f} ms per step here ({difference / median['running_loss']:+.1%}"
          f" of a step); the rounds' spread is {max(max(v) - min(v) for v in seconds.values()) * 1e3:.2f} ms")
    plot(seconds, item, f"Lesson 18: a host sync per step on {args.device}, tiny model", args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
