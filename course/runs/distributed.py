"""Joining and leaving a torch.distributed process group, shared by the stage assembly under torchrun
(``impl/train_pretrain_impl.py``) and lesson 16's DDP demonstration (``course.trainers.session_ddp``)."""
from __future__ import annotations

import gc
import socket
from contextlib import contextmanager

import torch.distributed as dist


@contextmanager
def process_group(backend: str, **init_kwargs):
    """Join the process group for the block (``init_kwargs`` default to torchrun's environment variables);
    free every DDP object before leaving it.

    ``DistributedDataParallel`` sits in reference cycles, so its reducer (which holds the process
    group) outlives the function that built it until the cycle collector runs. Left to interpreter
    shutdown, that teardown aborts now and then (``terminate called without an active exception``,
    SIGABRT); collecting while the interpreter is alive, then destroying the group, does not.
    """
    dist.init_process_group(backend, **init_kwargs)
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        gc.collect()
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for a rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
