"""Lesson 16 lab: token-weighted accumulation under DDP equals the single-process global batch.

    torchrun --standalone --nproc_per_node 2 labs/lesson16_ddp_token_weighted.py

Two gloo processes on the CPU each train half of one global batch (micro-batches with 29, 10, 2
and 1 valid targets) through ``TrainingSession``. Rank 0 compares the all-reduced gradients with
one single-process backward of the whole global batch: token-weighted (all-reduced unit count,
loss x world_size) vs lesson 14's ``loss / K`` averaged by DDP.
"""
from __future__ import annotations

import argparse

import torch

from course.trainers.session_ddp import ddp_update_gradients
from course.runs.distributed import process_group
from course.runs import global_batch_gradients, masked_micro_batches
from course.runs.threads import cpu_threads


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.flatten() for _, g in sorted(grads.items())]).double()


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    with process_group("gloo") as (rank, world_size):
        results = ddp_update_gradients(rank, world_size)
        if rank == 0:
            expected = flat(global_batch_gradients(masked_micro_batches())[0])
            print(f"world_size={world_size}, backend=gloo; reference: one backward of the global batch")
            for name, grads in results.items():
                got = flat(grads)
                cosine = float(torch.nn.functional.cosine_similarity(got, expected, dim=0))
                print(f"{name:>15}: max |grad diff| = {float((got - expected).abs().max()):.3e}, "
                      f"cosine = {cosine:.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
