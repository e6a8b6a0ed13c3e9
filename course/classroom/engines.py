"""Grading beyond one machine on Dask distributed: the class is cut into shards, each a Dask task that grades its
submissions in a warm pool on the worker that runs it (``grade_remote_shard``), and the outcomes come back to
the command, which records them in the one gradebook as each shard finishes.

A task carries its submissions' files, not their paths: a worker needs no view of the instructor's disk, only
this course package (the same version: its results are keyed by the grader's code) and Linux for the
confinement. ``--dask-scheduler local`` starts a ``LocalCluster`` of ``--jobs`` single-threaded workers on this
machine; any other value is the address of a running scheduler (``tcp://host:8786``), started e.g. by
dask-jobqueue on Slurm or PBS or by dask-kubernetes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from .confinement import Outcome
from .pool import Settings, grade_shard

LOCAL = "local"


def _payload(path: Path) -> dict[str, bytes]:
    """relative name -> bytes of a submission's files (a folder's, or the one notebook)."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def grade_remote_shard(lesson_id: str, route: str, shard: list[tuple[str, dict[str, bytes]]],
                       settings: Settings) -> list[tuple[str, dict]]:
    """A Dask task: write the shard's submissions into a scratch folder of the worker and grade them there;
    (student, outcome as a dict) of each."""
    with tempfile.TemporaryDirectory(prefix="grade-class-shard-") as scratch:
        inputs = []
        for student, files in shard:
            folder = Path(scratch) / student
            for name, data in files.items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(data)
            notebook = len(files) == 1 and next(iter(files)).endswith(".ipynb")
            inputs.append((student, folder / next(iter(files)) if notebook else folder))
        return [(student, dataclasses.asdict(result))
                for student, result in grade_shard(lesson_id, route, inputs, settings)]


def dask_shards(scheduler: str, lesson_id: str, route: str, inputs: Sequence[tuple[str, Path]], settings: Settings,
                shard_size: int) -> Iterator[tuple[str, Outcome]]:
    """(student, outcome) of every input, graded by Dask tasks of ``shard_size`` submissions, shard by shard as
    they finish."""
    from dask.distributed import Client, LocalCluster, as_completed
    with contextlib.ExitStack() as stack:
        if scheduler == LOCAL:
            # LocalCluster's silence_logs quiets distributed only until it closes and then restores the level it
            # found (INFO): an in-process comm that closes a moment later logs "Batched Comm Closed" and its
            # traceback on the command's stderr. The level it finds is WARNING, so that is what it restores.
            logging.getLogger("distributed").setLevel(logging.WARNING)
            cluster = stack.enter_context(LocalCluster(n_workers=settings.jobs, threads_per_worker=1, processes=False,
                                                       dashboard_address=None))
            client = stack.enter_context(Client(cluster))
        else:
            client = stack.enter_context(Client(scheduler))
        one_at_a_time = dataclasses.replace(settings, jobs=1)   # a task grades its shard on one of a worker's threads
        shards = [list(inputs[start:start + shard_size]) for start in range(0, len(inputs), shard_size)]
        futures = [client.submit(grade_remote_shard, lesson_id, route,
                                 [(student, _payload(path)) for student, path in shard], one_at_a_time, pure=False)
                   for shard in shards]
        for future in as_completed(futures):
            for student, result in future.result():
                yield student, Outcome(**result)
