"""How many CPU threads torch uses in the course's runs and trainers: one, unless told otherwise.

The course's models are tiny (hidden size 48, a few layers): each kernel is too small to split, so a second
thread adds synchronisation and no speed, and on a busy machine a thread that waits for a core stalls the
others at every kernel. One thread is faster (lesson 14 notes §5 and the README give the measurements).
``--threads N`` on a trainer, else ``OMP_NUM_THREADS`` when set, overrides it. CPU results depend on the
thread count (kernels split reductions by thread), so the oracle's disk cache keys an entry by
``torch.get_num_threads()``: the count set here while the run computes.
"""
from __future__ import annotations

import argparse
import contextlib
import os

import torch

TINY_MODEL_THREADS = 1


def positive_integer(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return int(value)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=positive_integer, default=None, metavar="N",
                        help=f"CPU threads for torch (default: OMP_NUM_THREADS when set, else {TINY_MODEL_THREADS}: "
                             "the tiny models run fastest on one thread)")


def thread_count(requested: int | None = None) -> int:
    """``requested``, else OMP_NUM_THREADS's (first) count when set, else TINY_MODEL_THREADS."""
    if requested is None:
        omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
        requested = positive_integer(omp) if omp else TINY_MODEL_THREADS
    return requested


@contextlib.contextmanager
def cpu_threads(requested: int | None = None):
    """torch.set_num_threads(thread_count(requested)) inside the block (yields the count), the previous
    count after it: a run called in-process leaves its caller's setting alone."""
    before = torch.get_num_threads()
    torch.set_num_threads(thread_count(requested))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
