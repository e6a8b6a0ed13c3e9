import os
import sys

# One CPU thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py's TINY_MODEL_THREADS), set before
# torch starts: torch then starts no thread pool, and grading can fork its workers (course/checks/parallel.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from .cli import main  # noqa: E402 - after the thread count is set
from .runs.threads import cpu_threads  # noqa: E402

with cpu_threads():  # the graded runs are the tiny models' (course/runs/threads.py); OMP_NUM_THREADS overrides
    sys.exit(main())
