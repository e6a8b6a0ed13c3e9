"""Lesson 18's prepared GPU run, the cuda-marked tests of every lesson first: one script, one JSON of numbers.

    python labs/bench_lesson18_gpu.py --out out/lesson18_gpu.json                 # a CUDA machine: ~5 minutes
    python labs/bench_lesson18_gpu.py --device cpu --skip-tests --quick --out /tmp/gpu.json   # its CPU side

1. ``python -m pytest -m cuda``: the tests every lesson marks as needing a GPU (their last line, exit code);
2. eager vs compiled MFU of the ~26 M config (``26m``) and the tiny one in bf16 (labs/bench_lesson18_mfu.py),
   against the GPU's dense bf16 datasheet peak (course/runs/peak_flops.py);
3. the course loop's overhead: lesson 14's reference ``train_one_epoch`` against a bare loop making the same
   updates (forward, loss / K, backward, clip, step, zero_grad) on the same device-resident batches, alternated
   over rounds (goal: at most 1.02x);
4. a per-micro-step ``.item()``: the same training steps logged with ``loss.item()`` each vs lesson 18's
   ``RunningLoss`` (one sync per round), for the tiny and the 26m config.
Every number goes to ``--out`` with the device's name, torch's version and the date; ``--quick`` shrinks every
measurement to seconds (the test of the CPU side), ``--device cpu`` runs it without a GPU (fp32 unless --dtype).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import torch

from bench_lesson18_mfu import bench  # labs/ is on sys.path when a lab runs
from course.experiments.step_timing import CONFIGS, DTYPES, lesson18_impl, logging_seconds, training_step, wait
from course.implementations import REPO_ROOT, load_implementation
from course.minimind import MiniMindConfig, get_lr
from course.runs.threads import add_threads_argument, cpu_threads

TEST_TIMEOUT_SECONDS = 300   # so that the whole script fits in one 10-minute device run


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_threads_argument(parser)
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", choices=list(DTYPES), default=None,
                        help="autocast dtype (default: bfloat16 on CUDA, float32 on the CPU)")
    parser.add_argument("--out", type=Path, default=Path("out/lesson18_gpu.json"))
    parser.add_argument("--skip-tests", action="store_true", help="leave out step 1 (python -m pytest -m cuda)")
    parser.add_argument("--quick", action="store_true", help="the tiny config and a few steps everywhere: seconds")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine (its CPU side: "
                     "--device cpu --skip-tests --quick)")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    return args


def cuda_tests() -> dict:
    """``python -m pytest -m cuda`` from the repository root: exit code, last line, seconds. A test module whose
    imports this machine lacks (the notebook tools, say) is reported and skipped, not a stop."""
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
                               "--continue-on-collection-errors", "-rfE", "--tb=short"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=TEST_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return {"returncode": None, "summary": f"timed out after {TEST_TIMEOUT_SECONDS} s",
                "seconds": TEST_TIMEOUT_SECONDS}
    lines = proc.stdout.strip().splitlines()
    return {"returncode": proc.returncode, "summary": lines[-1] if lines else proc.stderr.strip()[-500:],
            "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))],
            "seconds": round(time.perf_counter() - started, 1), "output_tail": proc.stdout[-12000:]}


def bare_epoch(model, batches, optimizer, autocast_ctx, accumulation_steps: int, grad_clip: float,
               base_lr: float) -> None:
    """The updates lesson 14's loop makes over one epoch of ``batches`` (a multiple of K), and nothing else: the
    same lr (upstream's get_lr), loss / K, backward, clip, step, zero_grad; no records, no GradScaler calls."""
    for step, (input_ids, labels) in enumerate(batches, start=1):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(step, len(batches), base_lr)
        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = (out.loss + out.aux_loss) / accumulation_steps
        loss.backward()
        if step % accumulation_steps == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def loop_overhead(args, config_name: str, micro_steps: int, rounds: int, accumulation_steps: int = 4) -> dict:
    """Seconds per micro-step of the reference train_one_epoch and of bare_epoch, alternated ``rounds`` times
    after one warm-up round each; their ratio of medians."""
    step = training_step(MiniMindConfig(**CONFIGS[config_name]), batch_size=args.batch_size, seq_len=args.seq_len,
                         device=args.device, dtype=DTYPES[args.dtype])
    batches = [(step.input_ids, step.input_ids)] * micro_steps
    reference = load_implementation("train_loop.py", "reference")
    loops = {
        "reference": lambda: reference.train_one_epoch(
            step.model, batches, step.optimizer, device=args.device, epoch=0, epochs=1, iters=micro_steps,
            base_lr=1e-4, accumulation_steps=accumulation_steps, grad_clip=1.0, autocast_ctx=step.autocast_ctx),
        "bare": lambda: bare_epoch(step.model, batches, step.optimizer, step.autocast_ctx, accumulation_steps, 1.0,
                                   base_lr=1e-4),
    }
    seconds = {name: [] for name in loops}
    for round_index in range(rounds + 1):
        for name, run in loops.items():
            wait(args.device)
            started = time.perf_counter()
            run()
            wait(args.device)
            if round_index:   # round 0 warms up
                seconds[name].append((time.perf_counter() - started) / micro_steps)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {"config": config_name, "micro_steps": micro_steps, "rounds": rounds, "seconds_per_micro_step": seconds,
            "ratio_reference_to_bare": median["reference"] / median["bare"],
            "ratio_of_fastest_rounds": min(seconds["reference"]) / min(seconds["bare"])}


def item_costs(args, impl, config_names, steps: int, rounds: int) -> list[dict]:
    rows = []
    for name in config_names:
        step = training_step(MiniMindConfig(**CONFIGS[name]), batch_size=args.batch_size, seq_len=args.seq_len,
                             device=args.device, dtype=DTYPES[args.dtype])
        seconds = logging_seconds(impl, step, steps=steps, rounds=rounds, device=args.device)
        median = {way: statistics.median(values) for way, values in seconds.items()}
        rows.append({"config": name, "steps": steps, "rounds": rounds, "seconds_per_step": seconds,
                     "item_cost_per_step": median["item_every_step"] - median["running_loss"],
                     "item_cost_fastest_rounds": min(seconds["item_every_step"]) - min(seconds["running_loss"])})
    return rows


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()


@cpu_threads()
def main(argv=None) -> int:
    args = parse_args(argv)
    quick = args.quick
    args.batch_size, args.seq_len = (2, 32) if quick else (16, 512)
    configs = ["tiny"] if quick else ["tiny", "26m"]
    results = {"device": device_name(args.device), "torch": torch.__version__, "dtype": args.dtype,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "batch": [args.batch_size, args.seq_len]}
    print(f"{results['device']}, torch {results['torch']}, {results['date']}", flush=True)
    if not args.skip_tests:
        results["cuda_tests"] = cuda_tests()
        print(f"1. python -m pytest -m cuda: exit {results['cuda_tests']['returncode']}, "
              f"{results['cuda_tests']['summary']} ({results['cuda_tests']['seconds']} s)", flush=True)
    impl = lesson18_impl(Namespace(impl="reference", impl_dir=None))
    print("2. MFU, eager vs compiled:", flush=True)
    mfu_args = Namespace(device=args.device, dtype=args.dtype, configs=configs, batch_size=args.batch_size,
                         seq_len=args.seq_len, steps=2 if quick else 10, warmup_steps=1 if quick else 3,
                         compile=not quick)
    results["mfu"] = bench(impl, mfu_args)
    overhead = loop_overhead(args, configs[-1], micro_steps=4 if quick else 40, rounds=1 if quick else 9)
    results["loop_overhead"] = overhead
    print(f"3. reference train_one_epoch / bare loop, {overhead['config']}: "
          f"{overhead['ratio_reference_to_bare']:.3f}x of the medians, {overhead['ratio_of_fastest_rounds']:.3f}x of "
          f"the fastest rounds (goal <= 1.02x)", flush=True)
    results["item_cost"] = item_costs(args, impl, configs, steps=2 if quick else 20, rounds=1 if quick else 9)
    for row in results["item_cost"]:
        print(f"4. {row['config']}: loss.item() every step costs {row['item_cost_per_step'] * 1e6:+.1f} µs per step "
              f"(medians), {row['item_cost_fastest_rounds'] * 1e6:+.1f} µs (fastest rounds)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"numbers: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
