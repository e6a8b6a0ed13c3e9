"""The stage assembly under torchrun (``impl/train_pretrain_impl.py``, lesson 14 §8 "Several processes:
torchrun"): sync gradients only on the micro-steps that close an update, sum over ranks, check the ranks agree."""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist


def sync_only_when_closing(segment, ddp_model, begin: int, end: int, train_loop, accumulation_steps: int):
    """Hand out micro-steps begin+1..end, each inside DDP's ``no_sync()`` unless it closes an update.

    train_one_epoch (yours, with no DDP in it) runs a micro-batch's forward and backward before it asks for
    the next one, so the context held across ``yield`` spans exactly that micro-step: a non-closing
    backward only accumulates this rank's gradient, and the closing backward all-reduces the accumulated
    sum once per update (DDP then divides by the world size). Which micro-steps close is decided by your
    own should_step_optimizer and, for the segment's last micro-step, should_flush_tail (the loop flushes
    the tail when its loader ends inside a window), so the sync lands where your loop steps the optimizer.
    Upstream syncs every backward: the same gradients up to rounding, K times the communication. A GradScaler
    scales every rank's loss by the same factor, so every rank unscales the same averaged gradients and
    skips (or not) the same update.
    """
    for step, batch in enumerate(segment, start=begin + 1):
        closes = (train_loop.should_step_optimizer(step, accumulation_steps)
                  or step == end and train_loop.should_flush_tail(end, begin, accumulation_steps))
        with nullcontext() if closes else ddp_model.no_sync():
            yield batch


def sum_over_ranks(values: list[float], device) -> list[float]:
    """Each value summed over the ranks (one all-reduce for the whole list)."""
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.tolist()


def check_ranks_agree(model, epoch: int, step: int) -> None:
    """Every rank must hold the same weights at an update boundary; raise on every rank if not (a rank
    that raised alone would leave the others waiting). One sum per parameter tensor, two small all-reduces."""
    sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
    low, high = sums.clone(), sums.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if not torch.equal(low, high):
        raise RuntimeError(f"epoch {epoch + 1}, micro-step {step}: the ranks hold different weights (largest "
                           f"spread of a parameter sum: {float((high - low).max()):.3e}). An optimizer step ran on "
                           "gradients that were not all-reduced: does train_one_epoch step exactly where "
                           "should_step_optimizer and should_flush_tail say?")


def mean_over_ranks(closed: list[tuple[dict, float, float]], device) -> list[tuple[dict, float, float]]:
    """closed_updates' (record, loss, aux_loss) with each loss averaged over the ranks: the update's loss over
    the whole global batch, not this rank's share of it (one all-reduce)."""
    sums = sum_over_ranks([value for _, loss, aux_loss in closed for value in (loss, aux_loss)], device)
    world_size = dist.get_world_size()
    return [(record, loss / world_size, aux_loss / world_size)
            for (record, _, _), loss, aux_loss in zip(closed, sums[::2], sums[1::2])]
