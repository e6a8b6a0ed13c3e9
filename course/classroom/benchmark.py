"""``labs/bench_grade_class.py``: the class grader's numbers on a simulated class of lesson 14 notebooks (correct,
wrong, hanging: ``course.classroom.simulate``): ``python -m course grade-class`` with each ``--jobs``, against
``nbgrader autograde`` on a subset of the same submissions, and whether both give every grade cell the same score.

The simulated course limits a cell the student added to 5 s (a hanging cell's cost) and leaves the notebook's own
cells 600 s, the same for both graders (nbgrader's ``Execute.timeout_func``). nbgrader runs every submission in a
fresh kernel, one after another; grade-class forks each from a warm pool. Per submission: the run's wall time over
its submissions, start-up included. Timing belongs here, not in tests.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import zip_longest
from pathlib import Path

from course.checks import get_lesson
from course.checks.assignments import nbgrader_invocation
from course.implementations import REPO_ROOT

from .pool import NOTEBOOK
from .simulate import write_class

LESSON = get_lesson("14")
SHARES = {"correct": 0.6, "wrong": 0.35, "hanging": 0.05}
CELL_LIMITS = """

def cell_timeout(cell):   # the bench's: a cell the student added (no nbgrader metadata) gets 5 s
    return 600 if "nbgrader" in cell.metadata else 5


c.Execute.timeout_func = cell_timeout
"""


def course_copy(course: Path, destination: Path, students: list[str]) -> Path:
    """The simulated course with only ``students``' submissions (and a gradebook without results)."""
    shutil.copytree(course, destination, ignore=shutil.ignore_patterns("submitted"))
    for student in students:
        shutil.copytree(course / "submitted" / student, destination / "submitted" / student)
    return destination


def timed(command: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return time.perf_counter() - start


def scores(course: Path, students: list[str]) -> dict:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        return {s: {g.name: g.score for g in gradebook.find_submission_notebook(LESSON.name, LESSON.name, s).grades}
                for s in students}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=300)
    parser.add_argument("--jobs", type=int, nargs="+", default=[2, 1], help="grade-class runs, one per value")
    parser.add_argument("--autograde", type=int, default=6, help="submissions nbgrader autograde grades")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="bench-grade-class-") as scratch:
        course = Path(scratch) / "course"
        roster = write_class(LESSON, course, NOTEBOOK, args.students, SHARES)
        with open(course / "nbgrader_config.py", "a", encoding="utf-8") as config:
            config.write(CELL_LIMITS)
        everyone = [student for student, *_ in roster]
        print(f"{len(everyone)} lesson-14 notebooks: " + ", ".join(f"{sum(k == kind for _, k, _ in roster)} {kind}"
                                                                     for kind in SHARES), flush=True)
        by_kind = [[s for s, k, _ in roster if k == kind] for kind in SHARES]   # the subset takes turns by kind
        subset = [student for turn in zip_longest(*by_kind) for student in turn if student][:args.autograde]
        reference = course_copy(course, Path(scratch) / "autograde", subset)
        python_args, nb_env = nbgrader_invocation("autograde", LESSON.name)
        wall = timed([sys.executable, *python_args], reference, {**nb_env, "PYTHONPATH": str(REPO_ROOT)})
        per_nbgrader = wall / len(subset)
        print(f"nbgrader autograde of {len(subset)}: {wall:.0f} s wall, {per_nbgrader:.2f} s per submission",
              flush=True)
        theirs = scores(reference, subset)
        for jobs in args.jobs:
            copy = course_copy(course, Path(scratch) / f"jobs{jobs}", everyone)
            wall = timed([sys.executable, "-m", "course", "grade-class", "14", str(copy / "submitted"),
                          "--jobs", str(jobs)], REPO_ROOT, env)
            per_submission = wall / len(everyone)
            print(f"grade-class --jobs {jobs}: {wall:.0f} s wall, {per_submission:.2f} s per submission, "
                  f"{per_nbgrader / per_submission:.1f} times faster than autograde's", flush=True)
            mine = scores(copy, subset)
            differ = {s: (mine[s], theirs[s]) for s in subset if mine[s] != theirs[s]}
            print(f"--jobs {jobs}: {len(subset) - len(differ)} of {len(subset)} submissions with every grade cell's "
                  f"score equal to autograde's" + (f"; differ: {differ}" if differ else ""), flush=True)
