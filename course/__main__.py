import sys

from .cli import main
from .runs.threads import cpu_threads

with cpu_threads():  # the graded runs are the tiny models' (course/runs/threads.py); OMP_NUM_THREADS overrides
    sys.exit(main())
