"""Running a lesson's checks in forked worker processes.

Importing torch and the student's module is most of what a grading run costs; forked workers inherit both
and share the checks out (each takes the next one when it is free, slow ones first). A check's result is the
same in a worker as in-process: every check seeds what it draws and reads no state another check left.

Forking is used only where it is safe: on Linux, in a single-threaded process (no Jupyter kernel, no
pytest-xdist worker: forking a process with other threads can deadlock the child), with torch on one
intra-op thread and CUDA not initialised. Anywhere else the checks run one after another, in-process.
"""
from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import Sequence

import torch

from .framework import FAIL, Check, CheckResult, run_check

MAX_JOBS = 4       # more workers than this rarely help: the slowest checks take ~1 s each
_INDEX = struct.Struct("!I")


def default_jobs() -> int:
    """Worker processes for a grading run: the CPU cores this process may use, at most MAX_JOBS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return max(1, min(MAX_JOBS, cores))


def can_fork() -> bool:
    if not sys.platform.startswith("linux") or torch.get_num_threads() != 1 or torch.cuda.is_initialized():
        return False
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:")) == 1


def run_checks(checks: Sequence[Check], module, jobs: int = 1) -> list[CheckResult]:
    """``run_check`` of each check on ``module``, in the given order; with ``jobs`` > 1 (and where forking is
    safe) in up to ``jobs`` forked workers."""
    if jobs <= 1 or len(checks) < 2 or not can_fork():
        return [run_check(check, module) for check in checks]
    results: list = [None] * len(checks)
    for index, result in _run_forked(checks, module, min(jobs, len(checks))):
        results[index] = result
    for index, check in enumerate(checks):
        if results[index] is None:
            results[index] = CheckResult(check.name, check.exercise, FAIL,
                                         f"{check.name}: the worker process running it died (a crash in native "
                                         f"code, or os._exit): run python -m course check --jobs 1 to see it")
    return results


def _run_forked(checks: Sequence[Check], module, jobs: int):
    """(index, CheckResult) pairs from ``jobs`` forked workers pulling check indices from one pipe."""
    order = sorted(range(len(checks)), key=lambda i: not checks[i].slow)
    tasks_read, tasks_write = os.pipe()
    os.write(tasks_write, b"".join(_INDEX.pack(i) for i in order))   # a few bytes: fits the pipe's buffer
    os.close(tasks_write)
    sys.stdout.flush()
    sys.stderr.flush()
    workers = []
    try:
        for _ in range(jobs):
            results_read, results_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(results_read)
                _work(checks, module, tasks_read, results_write)
            os.close(results_write)
            workers.append((pid, results_read))
        for pid, results_read in workers:
            with os.fdopen(results_read, "rb") as stream:
                while True:
                    try:
                        yield pickle.load(stream)
                    except EOFError:
                        break
    finally:
        os.close(tasks_read)
        for pid, _ in workers:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _work(checks: Sequence[Check], module, tasks_read: int, results_write: int) -> None:
    """A worker: run the next check until none is left, then exit without running the parent's exit handlers."""
    code = 0
    try:
        with os.fdopen(results_write, "wb") as stream:
            while len(data := os.read(tasks_read, _INDEX.size)) == _INDEX.size:   # a read this small is atomic
                index = _INDEX.unpack(data)[0]
                pickle.dump((index, run_check(checks[index], module)), stream)
                stream.flush()
    except BaseException:   # noqa: B036 - a worker must reach os._exit, whatever happened
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
