"""The README's main job, timed: wall and CPU seconds, tokens/s, and what it learned.

    python labs/bench_main_job.py               # one run of: python impl/train_pretrain_impl.py --impl reference
    python labs/bench_main_job.py --repeats 3   # the median of three

The goal is at most 100 s wall on an idle 2-core machine, ending at a validation loss of at most 1.1 with a
readable sample (tests/test_stage_assembly.py checks those claims in every suite run; the time is measured
here, not in a test). Run it on an idle machine: a second busy process slows a one-thread job by 10-30 %.
"""
from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from course.implementations import REPO_ROOT

COMMAND = ["impl/train_pretrain_impl.py", "--impl", "reference"]


def one_run(out_dir: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *COMMAND, "--out_dir", out_dir], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = proc.stdout.replace("\r", "\n").splitlines()
    val = [line for line in lines if re.fullmatch(r"update \d+: val_loss [\d.]+", line)]
    sample = [line for line in lines if re.fullmatch(r"update \d+ sample: .+", line)]
    rate = next(line.split(" tokens/s")[0] for line in lines if "tokens/s in train_one_epoch" in line)
    return {"wall": wall, "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "tokens_per_second": rate, "first": val[0], "last": val[-1], "sample": sample[-1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    runs = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as out_dir:
            runs.append(one_run(out_dir))
        run = runs[-1]
        print(f"run {i + 1}: {run['wall']:.1f} s wall, {run['cpu']:.1f} s CPU, {run['tokens_per_second']} tokens/s "
              f"in train_one_epoch; {run['first']} -> {run['last']}; {run['sample']}", flush=True)
    print(f"median: {statistics.median(r['wall'] for r in runs):.1f} s wall, "
          f"{statistics.median(r['cpu'] for r in runs):.1f} s CPU (goal: at most 100 s wall, idle 2-core machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
