"""The lesson-16 session under DistributedDataParallel (gloo on CPU).

Each rank holds part of the global batch. Token weighting across ranks needs two things:

* ``normalization_units`` is the valid-token count of the WHOLE update: every rank counts its
  own micro-batches on the host and one ``all_reduce(SUM)`` per update adds them up;
* DDP averages gradients over ranks (divides by ``world_size``), so each rank's loss is multiplied
  by ``world_size`` to turn that mean back into the sum the token weighting needs.

``TrainingSession`` itself is unchanged: it runs the non-final micro-steps inside ``no_sync()``,
so gradients are all-reduced once per update (that saves communication; it is not a correctness fix).
The demonstration update is lesson 16's tiny update (``course.runs.session``): 4 micro-batches of 2 samples holding
29, 10, 2 and 1 valid targets, spread evenly over 1, 2 or 4 ranks.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from course.reference.train_session import TrainingSession
from course.runs import SESSION_SCENARIO, grads_of, masked_micro_batches, run_update, tiny_model
from course.runs.distributed import free_port, process_group

from course.protocol.text import naive_mean_step, token_weighted_step

def all_reduce_units(local_units: int) -> int:
    """The update's unit count over all ranks: one all-reduce per update, never per micro-step."""
    total = torch.tensor([local_units], dtype=torch.long)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return int(total)


def world_scaled(step_fn, world_size: int):
    """Wrap a step function so DDP's gradient MEAN over ranks becomes the SUM token weighting needs."""
    def scaled(model, batch):
        output = step_fn(model, batch)
        return replace(output, loss=output.loss * world_size)
    return scaled


def ddp_update_gradients(rank: int, world_size: int) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's share of one update, token-weighted and naive: the all-reduced gradient of each."""
    batches = masked_micro_batches()
    if len(batches) % world_size:
        raise ValueError(f"world_size must divide the {len(batches)} micro-batches of the update, got {world_size}")
    per_rank = len(batches) // world_size
    mine = batches[rank * per_rank:(rank + 1) * per_rank]
    local_units = sum(b.loss_units for b in mine)
    setups = {  # name -> (normalization_units, step_fn)
        "token_weighted": (all_reduce_units(local_units), world_scaled(token_weighted_step, world_size)),
        "naive_mean": (len(mine), naive_mean_step),   # lesson 14: loss / K per rank, DDP's mean over ranks
    }
    results = {}
    for name, (units, step_fn) in setups.items():
        model = DistributedDataParallel(tiny_model(SESSION_SCENARIO))   # same seed on every rank
        session = TrainingSession(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=len(mine))
        captured: dict = {}

        def capture(model=model, captured=captured):
            captured.update(grads_of(model.module))
            return True   # abort the step: only the gradient is compared
        run_update(session, mine, units=units, step_fn=step_fn, before_update=capture)
        results[name] = captured
    return results


def _spawned_rank(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with process_group("gloo", rank=rank, world_size=world_size):
        torch.save(ddp_update_gradients(rank, world_size), Path(out_dir) / f"rank{rank}.pt")


def spawn_ddp_update(world_size: int = 2) -> list[dict]:
    """Run ``ddp_update_gradients`` in ``world_size`` spawned gloo processes; each rank's result."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_spawned_rank, args=(world_size, free_port(), out_dir), nprocs=world_size, join=True)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
