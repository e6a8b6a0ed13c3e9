"""A warm pool: one process imports torch and the lesson, grades the reference once (the oracle's runs are then
cached in its memory), and forks a confined grader per submission, ``--jobs`` at a time.

``grade_shard`` runs such a pool as a child process (``python -m course.classroom.pool``) on the submissions it
is given and yields each one's outcome as soon as it is graded; the command-line grader runs one shard on this
machine, a Dask worker one per task (``course.classroom.engines``). Only file paths reach the pool, never a
submission's contents: a grader is a fork of the pool and could read whatever the pool holds in memory.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Sequence

from course.checks import get_lesson
from course.implementations import REFERENCE_DIR, REPO_ROOT

from .confinement import Limits, Outcome, outcome, start_confined
from .inside import execute_notebook, grade_files

FILES, NOTEBOOK = "files", "notebook"   # the two routes (README, "Two routes, same grading")
READY = "ready"
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class Settings:
    """How every submission of a run is graded; part of each result's cache key."""
    limits: Limits
    cell_timeout: float   # the notebook route's limit per cell; 0: the course's (nbgrader's Execute.timeout[_func])
    jobs: int = 1         # submissions graded at once by one pool


def _work(lesson, route: str, work: Path) -> dict:
    """The grader's work: the files in ``work``, or the one notebook there."""
    if route == FILES:
        return grade_files(lesson, work)
    [notebook] = work.glob("*.ipynb")
    return execute_notebook(json.loads(notebook.read_text(encoding="utf-8")))


def _warm_up(lesson, route: str) -> None:
    """Import and compute, once, what every grader needs: the reference's checks (the oracle's runs) and, for
    notebooks, the released notebook's cells (IPython, the setup cell's imports)."""
    import torch
    torch.set_num_threads(1)   # the tiny models' fastest, and a pool with no thread pool can fork safely
    grade_files(lesson, REFERENCE_DIR)
    if route == NOTEBOOK:
        with contextlib.redirect_stdout(sys.stderr):
            execute_notebook(json.loads(lesson.files()["notebook release"].read_text(encoding="utf-8")))


def serve(lesson_id: str, route: str, jobs_file: Path, settings: Settings) -> None:
    """The pool's main loop: warm up, then grade every job of ``jobs_file`` ([{"id", "input", "private"}]),
    printing each id on the protocol stream (the original stdout) once its outcome is in its private folder."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)   # what warm-up and the graders print is no protocol line
    import ctypes
    import signal
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)   # the grade-class run gone: so is its pool
    lesson = get_lesson(lesson_id)
    start = time.monotonic()
    _warm_up(lesson, route)
    protocol.write(json.dumps({READY: round(time.monotonic() - start, 2)}) + "\n")
    protocol.flush()
    pending = json.loads(jobs_file.read_text(encoding="utf-8"))
    pending.reverse()
    running = {}
    while pending or running:
        while pending and len(running) < settings.jobs:
            job = pending.pop()
            private = Path(job["private"])
            work = private / "work"
            source = Path(job["input"])
            if source.is_dir():
                shutil.copytree(source, work, symlinks=True)
            else:
                work.mkdir(parents=True)
                shutil.copy(source, work / source.name)
            task = functools.partial(_work, lesson, route, work)
            running[start_confined(task, work, private, settings.limits)] = job["id"]
        pid, _ = os.wait()   # each keeper ends by its own time limit
        if pid in running:
            protocol.write(json.dumps(running.pop(pid)) + "\n")
            protocol.flush()


def grade_shard(lesson_id: str, route: str, inputs: Sequence[tuple[str, Path]], settings: Settings
                ) -> Iterator[tuple[str, Outcome]]:
    """(id, outcome) of each (id, input path) as it is graded by a warm pool started for them: the input is a
    submission's folder (files) or its sanitized notebook."""
    # a killed pool's graders die a moment later (PDEATHSIG) and may still write here while it is removed: an
    # interrupted run must end with its resume message, not with the cleanup's "directory not empty"
    with tempfile.TemporaryDirectory(prefix="grade-class-", ignore_cleanup_errors=True) as spool_name:
        spool = Path(spool_name)
        privates = {student: spool / f"{index:05d}" for index, (student, _) in enumerate(inputs)}
        jobs_file = spool / "jobs.json"
        jobs = [{"id": student, "input": str(Path(path).resolve()), "private": str(privates[student])}
                for student, path in inputs]
        jobs_file.write_text(json.dumps(jobs), encoding="utf-8")
        limits = settings.limits
        command = [sys.executable, "-m", "course.classroom.pool", lesson_id, route, str(jobs_file),
                   "--jobs", str(settings.jobs), "--timeout", str(limits.seconds), "--memory-mb",
                   str(limits.memory_mb)]
        command += [] if limits.confined else ["--unconfined"]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        pool = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, cwd=spool,
                                text=True)
        try:
            for line in pool.stdout:
                message = json.loads(line)
                if isinstance(message, dict):   # the pool is warm
                    continue
                private = privates[message]
                yield message, outcome(private, limits)
                shutil.rmtree(private, ignore_errors=True)
            if pool.wait() != 0:
                raise RuntimeError(f"the grading pool exited {pool.returncode} (its error is above)")
        finally:
            if pool.poll() is None:
                pool.kill()
                pool.wait()
            pool.stdout.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m course.classroom.pool", description=__doc__)
    parser.add_argument("lesson")
    parser.add_argument("route", choices=[FILES, NOTEBOOK])
    parser.add_argument("jobs_file", type=Path)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--unconfined", action="store_true")
    args = parser.parse_args(argv)
    limits = Limits(args.timeout, args.memory_mb, confined=not args.unconfined)
    serve(args.lesson, args.route, args.jobs_file, Settings(limits, 0.0, args.jobs))


if __name__ == "__main__":
    main()
