"""Lesson 18 §10.1, the optional extension: ``without_rope_sync`` takes recent upstream's RoPE check out of the
forward. ``python -m course check 18 --all`` grades it; it never changes the exit code and scores no notebook
point. The model is ``course/runs/rope_check.py::recent_upstream_model`` (course/minimind plus upstream's check);
its outputs are compared bit for bit with course/minimind's model of the same weights, its host syncs counted by
the course's counter over whole training steps (SGD: AdamW's step count is read on the host by torch itself).
"""
from __future__ import annotations

import torch

from course.minimind import MiniMindConfig, MiniMindForCausalLM
from course.runs.eager import eager
from course.runs.rope_check import lose_rope_tables, recent_upstream_model
from course.runs.step_costs import random_batch

from ..framework import check, fail, same_value
from ..host_syncs import count_host_syncs

CONFIG = dict(hidden_size=32, num_hidden_layers=1, vocab_size=64, max_position_embeddings=64)


def models(lose_tables: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(course/minimind's model, upstream's with its check) of the same weights; the second's RoPE tables zeroed
    as a meta-device init leaves them when ``lose_tables``."""
    torch.manual_seed(0)
    plain = MiniMindForCausalLM(MiniMindConfig(**CONFIG))
    torch.manual_seed(0)
    upstream = recent_upstream_model(MiniMindConfig(**CONFIG))
    if lose_tables:
        lose_rope_tables(upstream)
    return plain, upstream


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch) -> torch.Tensor:
    input_ids, labels = batch
    output = model(input_ids, labels=labels)
    output.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return output.logits.detach()


def expect_fixed_steps(impl, lose_tables: bool) -> None:
    plain, upstream = models(lose_tables)
    fixed = impl.without_rope_sync(upstream)
    optimizers = [eager(torch.optim.SGD)(m.parameters(), lr=0.1) for m in (plain, fixed)]
    batch = random_batch(MiniMindConfig(**CONFIG), 2, 12)
    for step in range(1, 4):
        calls = []
        expected = training_step(plain, optimizers[0], batch)
        with count_host_syncs(calls):
            actual = training_step(fixed, optimizers[1], batch)
        lost = ", its RoPE tables lost at init" if lose_tables else ""
        if not same_value(actual, expected):
            fail(f"without_rope_sync(recent upstream's model{lost}): step {step}'s logits equal course/minimind's",
                 "different logits", "the same bits", "hint: the rule: the fix changes no output: tables lost at "
                 "init are recomputed once, by without_rope_sync, before the check leaves the forward")
        if calls:
            fail(f"without_rope_sync(recent upstream's model{lost}): host syncs in training step {step}", calls, [],
                 "hint: the rule: no host sync in any forward: the check `freqs_cos[0, 0] == 0` runs once, in "
                 "without_rope_sync, never in the forward")


@check("without_rope_sync")
def fixed_model_steps_without_a_sync(impl):
    """After the fix, three training steps (forward, backward, SGD step) sync zero times and give course/minimind's
    logits bit for bit."""
    expect_fixed_steps(impl, lose_tables=False)


@check("without_rope_sync")
def fixed_model_recomputes_lost_tables(impl):
    """A model whose RoPE tables were zeroed (what a meta-device init leaves) before the fix: its tables are
    recomputed, so its steps give course/minimind's logits, with zero host syncs."""
    expect_fixed_steps(impl, lose_tables=True)
