"""Lesson 17 lab: token-weighted accumulation vs the mean of micro-batch means, on real SFT masks.

    python labs/lesson17_mask_vs_mean_of_means.py

Upstream's ``SFTDataset`` reads the built-in chat corpus (``labs/data/sft_tiny.jsonl``, or ``--data-path``) with
upstream's tokenizer, its random system prompts and think-block removal drawn from a seeded generator, and the
loader's shuffled order cuts it into global batches (not sorted by length): how unequal are the assistant tokens of
an update's K micro-batches on their own? Then three copies of the tiny model train ``--updates`` AdamW updates
on the same global batches (``course/experiments/token_weighting.py``, shared with lesson 16's lab): one backward
of the whole global batch (the truth), lesson 16's reference session with token weighting, and the same session
fed upstream's objective, each micro-batch's mean / K. It prints the assistant targets per micro-batch, the weight
one target gets under loss / K, the gradient cosine and the drift, and saves a plot (CPU, offline).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course.experiments.token_weighting import (SFT_SETUP, VARIANTS, Setup, add_setup_arguments,  # noqa: E402
                                                compare, draw_comparison)
from course.input_errors import refusing_input_errors  # noqa: E402
from course.reference import train_session as lesson16  # noqa: E402
from course.runs.sft import SFT_TINY_CORPUS, sft_dataset  # noqa: E402
from course.experiments.figures import save_lab_figure  # noqa: E402
from course.runs.threads import cpu_threads  # noqa: E402

def plot(history: dict, out: Path) -> None:
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.5))
    counts = axes[0]
    for update, units in enumerate(history["units"], start=1):
        counts.scatter([update] * len(units), units, s=18, color="tab:blue")
    counts.set(xlabel="optimizer update", ylabel="assistant targets of one micro-batch", yscale="symlog",
               title="How unequal the masks of an update's micro-batches are")
    counts.grid(alpha=0.3)
    draw_comparison(axes[1:], history)
    fig.suptitle("Lesson 17: token-weighted vs the mean of micro-batch means (loss / K) on SFT masks")
    save_lab_figure(fig, out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_setup_arguments(parser, SFT_SETUP)
    parser.add_argument("--data-path", type=Path, default=SFT_TINY_CORPUS, help="an SFT jsonl (conversations)")
    parser.add_argument("--out", type=Path, default=Path("out/lesson17/mask_vs_mean_of_means.png"))
    return parser


@refusing_input_errors   # a bad --data-path: one line naming the file (and line), exit code 2
@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.updates < 1 or args.global_batch % args.accumulation_steps:
        raise SystemExit("--updates must be >= 1 and --global-batch divisible by --accumulation-steps")
    setup = Setup(**{k: v for k, v in vars(args).items() if k not in ("out", "data_path")}, sort_by_targets=False)
    dataset = sft_dataset(setup.max_seq_len, seed=setup.seed, path=args.data_path)
    print(f"{len(dataset)} conversations of {args.data_path.name}, max_length {setup.max_seq_len}, upstream's "
          f"tokenizer; {setup.updates} updates of {setup.global_batch} samples in K = {setup.accumulation_steps} "
          f"micro-batches, in the loader's order")
    history = compare(lesson16, setup, dataset)
    print("assistant targets per micro-batch:")
    for update, units in enumerate(history["units"], start=1):
        print(f"  update {update:2d}: {units}, N = {sum(units)}")
    flat = [n for units in history["units"] for n in units]
    print(f"micro-batches without an assistant target: {flat.count(0)} of {len(flat)}")
    ratios = [(max(units) / min(units), update, units) for update, units in enumerate(history["units"], start=1)
              if min(units)]
    ratio, update, units = max(ratios)
    print(f"under loss / K one target of the sparsest micro-batch weighs {ratio:.1f} times one of the densest "
          f"(update {update}: {max(units)} vs {min(units)} targets); token weighting gives each 1/N")
    for variant in VARIANTS[1:]:
        print(f"{variant:>15}: update 1 cosine {history['cosine'][variant][0]:.4f}, max |grad diff| = "
              f"{history['max_diff'][variant][0]:.3e}; lowest cosine {min(history['cosine'][variant]):.4f}; "
              f"drift after {setup.updates} updates {history['drift'][variant][-1]:.2e}")
    plot(history, args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
