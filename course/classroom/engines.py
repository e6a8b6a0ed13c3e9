"""Grading beyond one machine on Dask distributed: the class is cut into shards, each a Dask task that grades its
submissions in a warm pool on the worker that runs it (``grade_remote_shard``), and the outcomes come back to
the command, which records them in the one gradebook as each shard finishes.

A task carries its submissions' jobs (their files, not their paths): a worker needs no view of the instructor's
disk, only this course package (the same version: its results are keyed by the grader's code) and Linux for the
confinement. ``--dask-scheduler local`` starts a ``LocalCluster`` of ``--jobs`` single-threaded workers on this
machine; any other value is the address of a running scheduler (``tcp://host:8786``), started e.g. by
dask-jobqueue on Slurm or PBS or by dask-kubernetes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Iterator, Sequence

from .confinement import Outcome
from .pool import Job, Settings, grade_shard

LOCAL = "local"


def grade_remote_shard(lesson_id: str, shard: list[Job], settings: Settings) -> list[tuple[str, dict]]:
    """A Dask task: grade the shard's jobs (they carry their files) in slots on this worker; (id, outcome as a
    dict) of each."""
    routes = sorted({job.route for job in shard})
    return [(student, dataclasses.asdict(result)) for student, result in grade_shard(lesson_id, shard, settings, routes)]


def dask_shards(scheduler: str, lesson_id: str, jobs: Sequence[Job], settings: Settings,
                shard_size: int) -> Iterator[tuple[str, Outcome]]:
    """(student, outcome) of every job, graded by Dask tasks of ``shard_size`` submissions, shard by shard as
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
        shards = [list(jobs[start:start + shard_size]) for start in range(0, len(jobs), shard_size)]
        futures = [client.submit(grade_remote_shard, lesson_id, shard, one_at_a_time, pure=False) for shard in shards]
        for future in as_completed(futures):
            for student, result in future.result():
                yield student, Outcome(**result)
