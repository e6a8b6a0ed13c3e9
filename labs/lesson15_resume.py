"""Interrupt and resume a tiny MiniMind run; measure what upstream's resume pitfalls cost.

    python labs/lesson15_resume.py                      # prints the measurements, writes out/resume_lab.png
    python labs/lesson15_resume.py --epochs 3 --iters 10 --stop_epoch 1 --stop_step 8   # longer curves

Every run is the oracle loop (``course.minimind``) on the CPU in fp32, with the same data and seed.
Side by side, after an interruption at an update boundary:
  exact       the lesson-15 reference: fp32 weights, AdamW moments, scaler, counters  -> bitwise
  fp16        upstream's resume file: the weights rounded to fp16                      -> drift
  no_adam     weights restored, AdamW restarted with empty moments                       -> drift
  tail_save   upstream's save at step == iters, BEFORE the epoch's tail flush          -> a lost update
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from course.experiments.resume import draw_loss_curves, drift, resume_runs, upstream_file  # noqa: E402
from course.implementations import load_implementation  # noqa: E402
from course.minimind.trainer_utils import lm_checkpoint  # noqa: E402
from course.runs import LoopScenario, save_objects, train_until, training_objects  # noqa: E402
from course.runs.threads import cpu_threads
from lesson14_trace_pretrain_step import positive_int  # noqa: E402 - labs/ is on sys.path when a lab runs

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE = load_implementation("checkpoint.py", "reference")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=positive_int, default=2)
    parser.add_argument("--iters", type=positive_int, default=6, help="micro-batches per epoch")
    parser.add_argument("--accumulation_steps", type=positive_int, default=4)
    parser.add_argument("--batch_size", type=positive_int, default=2)
    parser.add_argument("--stop_epoch", type=int, default=0, help="interrupt in this epoch (0-based) ...")
    parser.add_argument("--stop_step", type=positive_int, default=4, help="... after this micro-step")
    parser.add_argument("--out", default=str(REPO_ROOT / "out" / "resume_lab.png"))
    args = parser.parse_args(argv)
    if not 0 <= args.stop_epoch < args.epochs:
        parser.error(f"--stop_epoch must be in [0, {args.epochs}), got {args.stop_epoch}")
    if args.stop_step > args.iters or args.stop_step % args.accumulation_steps:
        parser.error(f"--stop_step must be a multiple of --accumulation_steps ({args.accumulation_steps}) "
                     f"and <= --iters ({args.iters}), got {args.stop_step}")
    if args.epochs < 2:
        parser.error(f"--epochs must be >= 2: the tail-flush pitfall resumes into a next epoch, got {args.epochs}")
    if args.iters % args.accumulation_steps == 0:
        parser.error("--iters must not be a multiple of --accumulation_steps: the tail-flush pitfall needs a tail")
    return args


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main(argv=None) -> int:
    args = parse_args(argv)
    scenario = LoopScenario("resume lab", epochs=args.epochs, iters=args.iters, batch_size=args.batch_size,
                            accumulation_steps=args.accumulation_steps)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        objects, _ = train_until(scenario, args.stop_epoch, args.stop_step)
        path = tmp / "resume.pth"
        start = time.perf_counter()
        save_objects(REFERENCE, path, objects, args.stop_epoch, args.stop_step)
        save_s = time.perf_counter() - start
        size = path.stat().st_size
        fresh = training_objects(scenario)
        start = time.perf_counter()
        REFERENCE.load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer, scaler=fresh.scaler)
        load_s = time.perf_counter() - start
        model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
        lm_checkpoint(model.config, model=model, optimizer=optimizer, epoch=args.stop_epoch, step=args.stop_step,
                      save_dir=str(tmp), scaler=scaler)
        fp16_size = upstream_file(tmp, scenario).stat().st_size
    runs = resume_runs(REFERENCE, scenario, args.stop_epoch, args.stop_step, "exact (lesson 15 reference)")
    straight = runs["uninterrupted"]
    updates_in_file, updates_done = runs["tail_updates"]

    params = sum(p.numel() for p in objects.model.parameters())
    print(f"tiny model: {params / 1e6:.3f} M parameters (hidden {scenario.hidden_size}, "
          f"{scenario.num_hidden_layers} layers, vocab 6400); {args.epochs} epochs x {args.iters} micro-batches, "
          f"K={args.accumulation_steps}; interrupted at epoch {args.stop_epoch} step {args.stop_step}")
    print(f"resume checkpoint: {size / 1e6:.2f} MB (fp32 weights + 2 AdamW moments), save {save_s * 1e3:.0f} ms, "
          f"load {load_s * 1e3:.0f} ms; upstream's fp16 resume file: {fp16_size / 1e6:.2f} MB")
    print(f"saved before the tail flush: AdamW updates in the file = {updates_in_file}, "
          f"done in memory = {updates_done}")
    final_loss = straight.records[-1]["loss"]
    for name, result in runs["resumed"].items():
        print(f"{name:<40} max |param - uninterrupted| = {drift(result, straight):.3e}, "
              f"final loss {result.records[-1]['loss']:.6f} (uninterrupted {final_loss:.6f})")

    fig, axes = plt.subplots(1, 2, figsize=(14, 5), layout="constrained")
    draw_loss_curves(*axes, runs, args.iters, args.stop_epoch * args.iters + args.stop_step)
    fig.suptitle("Interrupt and resume a tiny MiniMind run: exact resume vs upstream pitfalls")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"figure: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
