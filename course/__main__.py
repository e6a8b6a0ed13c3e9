import atexit
import os
import sys

# One CPU thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py's TINY_MODEL_THREADS), set before
# torch starts: torch then starts no thread pool, and grading can fork its workers (course/checks/parallel.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from .cli import main  # noqa: E402 - after the thread count is set
from .runs.threads import cpu_threads  # noqa: E402

with cpu_threads():  # the graded runs are the tiny models' (course/runs/threads.py); OMP_NUM_THREADS overrides
    code = main()
# Done: the exit handlers run and the output is flushed, then the process ends without the interpreter's
# teardown of torch's modules (~0.4 s of a 3 s grading run; the commands leave no thread or open file behind).
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code or 0)
