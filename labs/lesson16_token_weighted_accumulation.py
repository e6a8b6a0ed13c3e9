"""Lesson 16 lab: naive ``loss / K`` vs token-weighted accumulation vs the true full batch.

    python labs/lesson16_token_weighted_accumulation.py

The comparison itself (three copies of the tiny MiniMind: full batch, token-weighted, naive) lives in
``course/experiments/token_weighting.py``, shared with the lesson 16 notebook; this lab runs it on
the reference ``TrainingSession``, prints the numbers and saves a PNG.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course.experiments.token_weighting import (VARIANTS, Setup, add_setup_arguments, compare,  # noqa: E402
                                                draw_comparison)
from course.reference import train_session as reference  # noqa: E402
from course.experiments.figures import save_lab_figure  # noqa: E402
from course.runs.threads import cpu_threads  # noqa: E402


def plot(history: dict, out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    draw_comparison(axes, history)
    fig.suptitle("Lesson 16: naive loss/K vs token-weighted accumulation (padded tiny corpus)")
    save_lab_figure(fig, out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_setup_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("out/lesson16/token_weighted_accumulation.png"))
    return parser


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.updates < 1 or args.global_batch % args.accumulation_steps:
        raise SystemExit("--updates must be >= 1 and --global-batch divisible by --accumulation-steps")
    setup = Setup(**{k: v for k, v in vars(args).items() if k != "out"})
    history = compare(reference, setup)
    print(f"valid targets per micro-batch in update 1: {history['units'][0]}")
    print(f"update 1, same weights: naive loss gap = {history['loss_gap'][0]:.3e}")
    for v in VARIANTS[1:]:
        print(f"{v:>15}: update 1 cosine = {history['cosine'][v][0]:.4f}, max |grad diff| = "
              f"{history['max_diff'][v][0]:.3e}; mean cosine over {args.updates} updates = "
              f"{sum(history['cosine'][v]) / args.updates:.4f}; drift after {args.updates} updates = "
              f"{history['drift'][v][-1]:.3e}")
    plot(history, args.out)
    print(f"saved {args.out}")
    return history


if __name__ == "__main__":
    main()
