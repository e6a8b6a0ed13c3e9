"""Warm pools: in each slot's sandbox one process imports torch and the lesson and grades the reference once (the
oracle's runs are then cached in its memory), then forks a keeper per submission (``course.classroom.confinement``).

``grade_shard`` starts ``--jobs`` slots (``python -m course.classroom.pool`` in a bubblewrap sandbox each) for the
submissions it is given and yields each one's outcome as soon as it is graded; the command-line grader runs one shard
on this machine, a Dask worker one per task (``course.classroom.engines``). The pool itself never reads a
submission: its keeper (a fork) does, from the protocol stream, so that no later grader (another fork of the pool)
finds an earlier submission in its memory. A submission whose grading timed out while it was starved of CPU, or
whose sandbox died, is graded once more (at the end of the queue) before its result is final.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Iterable, Iterator, Optional

from course.checks import get_lesson
from course.implementations import REFERENCE_DIR

from .confinement import (SANDBOX_FAILED, SCRATCH, GraderCgroup, Limits, Outcome, load_suspect, make_undumpable,
                          outcome_of, probe, run_keeper, sandbox_command, sandbox_environment, wipe)
from .inside import execute_notebook, grade_files

FILES, NOTEBOOK = "files", "notebook"   # the two routes (README, "Two routes, same grading")
READY = "ready"
WARM_UP_SECONDS = 600   # a pool that is not warm by then is broken
ANSWER_GRACE_SECONDS = 60   # past a submission's limit, a keeper that has not answered is given up on
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class Settings:
    """How every submission of a run is graded; part of each result's cache key."""
    limits: Limits
    cell_timeout: float   # the notebook route's limit per cell; 0: the course's (nbgrader's Execute.timeout[_func])
    jobs: int = 1         # submissions graded at once (slots)
    every_cell: bool = False   # the notebook route runs the show-only cells too (figures, hardening, extensions)


@dataclasses.dataclass(frozen=True)
class Job:
    """One submission to grade: its files (relative path -> bytes: a module folder, or the one notebook as its
    grader runs it) and, notebooks, the hidden cells' sources (cell index -> source), sent only once its grader
    is running and handed over one at a time."""
    id: str
    route: str
    files: dict
    hidden: dict = dataclasses.field(default_factory=dict)


# --- inside the sandbox -------------------------------------------------------------------------------------------

def _work(lesson, route: str, scratch: Path, hidden_source) -> dict:
    """The grader's work: the module in ``scratch``, or the one notebook there."""
    if route == FILES:
        return grade_files(lesson, scratch)
    [notebook] = scratch.glob("*.ipynb")
    return execute_notebook(json.loads(notebook.read_text(encoding="utf-8")), hidden_source)


def _warm_up(lesson, routes: list[str]) -> None:
    """Import and compute, once, what every grader needs: the reference's checks (the oracle's runs) and, for
    notebooks, the released notebook's cells (IPython, the setup cell's imports)."""
    import torch
    torch.set_num_threads(1)   # the tiny models' fastest, and a pool with no thread pool can fork safely
    grade_files(lesson, REFERENCE_DIR)
    if NOTEBOOK in routes:
        with contextlib.redirect_stdout(sys.stderr):
            execute_notebook(json.loads(lesson.files()["notebook release"].read_text(encoding="utf-8")))


def _read_line(fd: int) -> bytes:
    """One line of the protocol stream, read a byte at a time: nothing after it is read (the keeper's)."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            return b""
        line += byte
    return bytes(line)


def serve(lesson_id: str, routes: list[str], scratch: Path, limits: Limits, cgroup_fds: list[int]) -> None:
    """The pool's main loop: warm up, then for each job header on stdin fork a keeper that grades it and answers
    on the protocol stream (the original stdout); report each keeper's end."""
    make_undumpable()
    # a submission's files in the scratch folder must never be importable by the pool or a keeper (trusted code)
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != scratch.resolve()]
    os.chdir("/")
    protocol = os.dup(1)
    os.dup2(2, 1)   # what warm-up and the graders print is no protocol line
    import ctypes
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)   # the run gone: so is its pool
    lesson = get_lesson(lesson_id)
    start = time.monotonic()
    _warm_up(lesson, routes)
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(protocol, (json.dumps({READY: round(time.monotonic() - start, 2)}) + "\n").encode())
    while line := _read_line(0):
        header = json.loads(line)
        work = functools.partial(_work, lesson, header["route"], scratch)
        pid = os.fork()
        if pid == 0:
            run_keeper(header, work, scratch, limits, cgroup_fds, protocol)
        _, status = os.waitpid(pid, 0)
        os.write(protocol, (json.dumps({"done": header["id"], "exit": os.waitstatus_to_exitcode(status)}) + "\n")
                 .encode())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m course.classroom.pool", description=__doc__)
    parser.add_argument("lesson")
    parser.add_argument("routes", help="comma-separated routes to warm up for")
    parser.add_argument("limits", help="the Limits as JSON")
    parser.add_argument("--scratch", type=Path, default=SCRATCH)
    parser.add_argument("--cgroup-fds", default="", help="comma-separated descriptors of cgroup.procs files")
    args = parser.parse_args(argv)
    limits = Limits(**json.loads(args.limits))
    serve(args.lesson, args.routes.split(","), args.scratch, limits,
          [int(fd) for fd in args.cgroup_fds.split(",") if fd])


# --- the trusted side: slots and their scheduling ------------------------------------------------------------------

class SlotFailed(Exception):
    """A slot's pool died or stopped answering (its submission in flight is answered for by the caller)."""


class Slot:
    """One sandbox with a warm pool, grading one submission at a time."""

    def __init__(self, index: int, lesson_id: str, routes: list[str], limits: Limits, private: Path):
        enforcement = probe()
        self.index, self.limits = index, limits
        self.cgroup = GraderCgroup.create(f"grade-class-{os.getpid()}-{index}-{time.monotonic_ns()}", limits) \
            if enforcement.cgroups else None
        fds = self.cgroup.procs_descriptors() if self.cgroup else []
        sandboxed = enforcement.bwrap is not None
        scratch = SCRATCH if sandboxed else private / f"scratch-{index}-{time.monotonic_ns()}"   # a slot's own
        if not sandboxed:
            scratch.mkdir(mode=0o700)
        pool_limits = dataclasses.replace(limits, confined=sandboxed)
        command = [sys.executable, "-m", "course.classroom.pool", lesson_id, ",".join(routes),
                   json.dumps(dataclasses.asdict(pool_limits)), "--scratch", str(scratch),
                   "--cgroup-fds", ",".join(map(str, fds))]
        env = dict(sandbox_environment(), HOME=str(scratch), TMPDIR=str(scratch), MPLCONFIGDIR=str(scratch))
        if sandboxed:
            command = sandbox_command(enforcement.bwrap, command, limits.scratch_mb)
            env = {}   # bwrap sets the sandbox's environment
        self.log_path = private / f"pool-{index}.log"
        with open(self.log_path, "wb") as log:
            for fd in fds:
                os.set_inheritable(fd, True)
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                            pass_fds=fds, env=env, cwd=scratch if not sandboxed else None,
                                            start_new_session=True)
        for fd in fds:
            os.close(fd)
        self.own_scratch = None if sandboxed else scratch   # the sandbox's tmpfs ends with it; this one does not
        os.set_blocking(self.process.stdin.fileno(), False)
        self.incoming, self.outgoing = bytearray(), bytearray()
        self.job: Optional[Job] = None
        self.since = time.monotonic()
        self.ready = False
        self.answer: Optional[dict] = None
        self.done = False   # the keeper has ended: the pool reads the next job

    @property
    def busy(self) -> bool:
        return self.job is not None or not self.ready

    def start(self, job: Job) -> None:
        files = json.dumps({name: base64.b64encode(data).decode() for name, data in job.files.items()}).encode()
        hidden = json.dumps({str(index): source for index, source in job.hidden.items()}).encode()
        header = json.dumps({"id": job.id, "route": job.route, "files": len(files), "hidden": len(hidden)})
        if self.cgroup:
            self.cgroup.reset()
        self.outgoing += header.encode() + b"\n" + files + hidden
        self.job, self.answer, self.done, self.since = job, None, False, time.monotonic()

    def flush(self) -> None:
        """Write what the pipe takes now of the job in flight."""
        try:
            written = os.write(self.process.stdin.fileno(), self.outgoing)
        except BlockingIOError:
            return
        except OSError as exc:
            raise SlotFailed(f"its pool stopped reading ({exc})") from None
        del self.outgoing[:written]

    def messages(self) -> list[dict]:
        """The protocol lines that have arrived; SlotFailed at the pool's end."""
        chunk = os.read(self.process.stdout.fileno(), 1 << 20)
        if not chunk:
            raise SlotFailed(f"its pool ended (exit {self.process.wait()}): {self.log_tail()}")
        self.incoming += chunk
        *lines, rest = bytes(self.incoming).split(b"\n")
        self.incoming[:] = rest
        return [json.loads(line) for line in lines if line.strip()]

    def overdue(self) -> bool:
        limit = WARM_UP_SECONDS if not self.ready else self.limits.seconds + ANSWER_GRACE_SECONDS
        return time.monotonic() - self.since > limit

    def log_tail(self) -> str:
        try:
            return " | ".join(self.log_path.read_bytes()[-1500:].decode(errors="replace").strip().splitlines()[-6:])
        except OSError:
            return ""

    def measured(self, raw: dict) -> dict:
        """The keeper's report with the cgroup's measures of the submission."""
        if self.cgroup:
            peak, cpu, hit = self.cgroup.measure()
            self.cgroup.kill_all()
            raw = dict(raw, max_rss_mb=peak or raw.get("max_rss_mb", 0.0), cpu_seconds=cpu, limits_hit=hit)
        return raw

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        if self.own_scratch is not None:
            with contextlib.suppress(OSError):
                wipe(self.own_scratch)
                self.own_scratch.rmdir()
        if self.cgroup:
            for _ in range(50):   # the sandbox's last processes leave the cgroup a moment after bwrap's end
                self.cgroup.remove()
                if not any(d.exists() for d in self.cgroup.dirs.values()):
                    break
                time.sleep(0.02)


def _starved(outcome: Outcome) -> bool:
    """Whether the failure may come from the machine's load: a timeout during which the grader got less than half
    the CPU it could have used (a busy loop gets it all), a cell timeout of that kind, or a sandbox that died."""
    if load_suspect(outcome.problem):
        return not outcome.problem.startswith("timed out") or outcome.cpu_seconds < 0.5 * outcome.seconds
    try:
        cells = zip(outcome.answer.get("cells", []), outcome.answer.get("seconds", []), outcome.answer.get("cpu", []))
        return any(o.get("ename") == "CellTimeoutError" and cpu < 0.5 * wall
                   for outputs, wall, cpu in cells for o in outputs or [] if isinstance(o, dict))
    except (AttributeError, TypeError):
        return False


def grade_shard(lesson_id: str, jobs: Iterable[Job], settings: Settings, routes: list[str]
                ) -> Iterator[tuple[str, Outcome]]:
    """(id, outcome) of each job as it is graded, by ``settings.jobs`` slots started for them."""
    limits = settings.limits
    queue = deque()
    source = iter(jobs)
    retried: dict[str, str] = {}
    slots: list[Slot] = []
    with tempfile.TemporaryDirectory(prefix="grade-class-") as private_name:
        private = Path(private_name)   # 0700: the pools' logs, and their scratch folders when unconfined
        try:
            while True:
                if len(slots) < settings.jobs and (queue or (job := next(source, None)) is not None):
                    if not queue:
                        queue.append(job)
                    slots.append(Slot(len(slots), lesson_id, routes, limits, private))
                    continue
                for slot in slots:
                    if slot.ready and slot.job is None:
                        job = queue.popleft() if queue else next(source, None)
                        if job is not None:
                            slot.start(job)
                if not any(slot.busy for slot in slots) and not queue:
                    break
                for failed, why in _step(slots):
                    finished = failed.job
                    if not failed.ready and finished is None:
                        raise RuntimeError(f"a grading sandbox could not start: {why}")
                    index = failed.index
                    failed.close()
                    slots[index] = Slot(index, lesson_id, routes, limits, private)
                    if finished is not None:
                        outcome = Outcome(None, f"{SANDBOX_FAILED} died or stopped answering ({why})",
                                          time.monotonic() - failed.since, 0.0, "")
                        yield from _settle(finished, outcome, retried, queue)
                for slot in slots:
                    if slot.done and slot.job is not None:
                        finished, raw = slot.job, slot.answer
                        slot.job, slot.answer = None, None
                        outcome = outcome_of(slot.measured(raw), limits)
                        if raw.get("slot_unclean"):   # what its grader left could reach the next: a new sandbox
                            slot.close()
                            slots[slot.index] = Slot(slot.index, lesson_id, routes, limits, private)
                        yield from _settle(finished, outcome, retried, queue)
        finally:
            for slot in slots:
                slot.close()


def _settle(job: Job, outcome: Outcome, retried: dict, queue: deque) -> Iterator[tuple[str, Outcome]]:
    """Yield the job's outcome, or queue it once more if its failure may come from load."""
    if job.id not in retried and _starved(outcome):
        retried[job.id] = outcome.problem or "a cell timed out while the grader was starved of CPU"
        queue.append(job)
        return
    outcome.retried = retried.pop(job.id, "")
    yield job.id, outcome


def _step(slots: list[Slot]) -> list[tuple[Slot, str]]:
    """One round of I/O with every slot: write what is pending, read what came, check the clocks; the slots that
    failed, with why."""
    writing = [s for s in slots if s.outgoing]
    readable, writable, _ = select.select([s.process.stdout for s in slots], [s.process.stdin for s in writing],
                                          [], 0.2)
    failed = []
    for slot in slots:
        try:
            if slot.process.stdin in writable:
                slot.flush()
            if slot.process.stdout in readable:
                for message in slot.messages():
                    if READY in message:
                        slot.ready, slot.since = True, time.monotonic()
                    elif "outcome" in message:
                        slot.answer = message["outcome"]
                    elif "done" in message:
                        if slot.answer is None:
                            raise SlotFailed(f"its keeper ended (exit {message.get('exit')}) without an answer")
                        slot.done = True
            if slot.overdue():
                raise SlotFailed("it did not answer in time" if slot.ready else
                                 f"its pool was not warm after {WARM_UP_SECONDS} s: {slot.log_tail()}")
        except SlotFailed as exc:
            failed.append((slot, str(exc)))
    return failed


if __name__ == "__main__":
    main()
