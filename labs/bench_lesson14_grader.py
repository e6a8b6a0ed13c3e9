"""The grader's numbers: each lesson's check command against the import floor (started with lesson 14, now every
lesson), and lesson 14's reference loop's cost relative to the oracle loop.

    python labs/bench_lesson14_grader.py --repeats 5
    python labs/bench_lesson14_grader.py --repeats 3 --lessons 15 16

The floor is ``python -c "import torch, course.checks"``: what any grading run pays before a check
starts. The goal is ``check NN --impl reference`` at most 1.6 times that floor for every lesson (medians,
wall time, the oracle cache warm: the first run of a new code version fills it). ``python -m course`` ends
without the interpreter's teardown of torch (~0.4 s) that the floor command pays, so the grading work itself
is shown too: the check command against a floor that also skips it (``os._exit(0)`` after the imports).

Timing belongs here, not in tests (a loaded CI machine must not fail a test for being slow).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from course.implementations import load_implementation
from course.layout import lesson_ids
from course.runs import LoopScenario, compute_oracle, run_impl

ROOT = Path(__file__).resolve().parents[1]


def time_commands(commands: list[list[str]], repeats: int) -> list[list[float]]:
    """Wall seconds of each command, ``repeats`` times, interleaved so that machine load drifts evenly."""
    times = [[] for _ in commands]
    for _ in range(repeats):
        for cmd, bucket in zip(commands, times):
            start = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
            bucket.append(time.perf_counter() - start)
    return times


def loop_ratio(repeats: int) -> tuple[float, float, float]:
    """Median seconds of the oracle and the reference on one workload, run alternately."""
    scenario = LoopScenario("bench", epochs=1, iters=40, batch_size=4, max_length=64)
    reference = load_implementation("train_loop.py", "reference")
    oracle_t, ref_t = [], []
    runs = [(lambda: compute_oracle(scenario), oracle_t),
            (lambda: run_impl(reference.train_one_epoch, scenario), ref_t)]
    runs[0][0]()  # warm-up: allocator and thread pool, not either loop's cost
    for i in range(repeats):
        for fn, bucket in runs[::-1] if i % 2 else runs:  # alternate who goes first
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    oracle_s, ref_s = statistics.median(oracle_t), statistics.median(ref_t)
    return oracle_s, ref_s, ref_s / oracle_s


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lessons", nargs="+", choices=lesson_ids(), default=lesson_ids(),
                        help="lessons whose check command is timed (default: every lesson)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    commands = [[sys.executable, "-c", "import torch, course.checks"],
                [sys.executable, "-c", "import os, torch, course.checks; os._exit(0)"]] + [
        [sys.executable, "-m", "course", "check", lesson, "--impl", "reference"] for lesson in args.lessons]
    for cmd in commands[2:]:   # fill the oracle cache: the goal is about a warm grader
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    floor, floor_no_teardown, *checks = time_commands(commands, args.repeats)
    for what, times in (("", floor), (" without teardown (os._exit)", floor_no_teardown)):
        print(f'python -c "import torch, course.checks"{what}: median {statistics.median(times):.2f} s '
              f"(min {min(times):.2f}, max {max(times):.2f}, n={len(times)})")
    for lesson, check in zip(args.lessons, checks):
        print(f"python -m course check {lesson} --impl reference: median {statistics.median(check):.2f} s "
              f"(min {min(check):.2f}, max {max(check):.2f}, n={len(check)}); "
              f"/ import floor: {statistics.median(check) / statistics.median(floor):.2f} (goal <= 1.6); "
              f"/ floor without teardown: {statistics.median(check) / statistics.median(floor_no_teardown):.2f}")
    oracle_s, ref_s, ratio = loop_ratio(args.repeats)
    print(f"40 micro-steps, batch 4 x 64 tokens: oracle train_epoch {oracle_s:.3f} s, "
          f"reference train_one_epoch {ref_s:.3f} s, ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
