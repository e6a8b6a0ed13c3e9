"""Lesson 18: where a training step's time and memory go - the descriptor.

The checks live beside it (``checks`` flops_per_token, ``throughput`` ThroughputMeter and mfu, ``memory``
training_state_bytes and activation_bytes, ``syncs`` RunningLoss, ``extensions`` the optional §10.1), the mistake
catalogue in ``mistakes``. A core check names the objective below that it grades; the checks without one are the
hardening tier (argument rules and conventions, graded by ``check 18 --all`` only). Every expected value is a
measurement of the real model or of a fake device (course/runs/step_costs.py, course/runs/fake_device.py).
"""
from __future__ import annotations

from ..framework import Exercise, Lesson, checks_in
from . import checks, equivalent_mutants, extensions, hints, memory, mistakes, syncs, throughput

LESSON = Lesson(
    lesson_id="18",
    slug="time_and_memory",
    title="Where a training step's time and memory go",
    module="step_costs",
    exercises=[
        Exercise("flops_per_token", "18 §5.1", points=2, hidden_points=1),
        Exercise("ThroughputMeter", "18 §5.2", points=2, hidden_points=1),
        Exercise("mfu", "18 §5.3", points=1),
        Exercise("training_state_bytes", "18 §5.4", points=1, hidden_points=1),
        Exercise("activation_bytes", "18 §5.4", points=2),
        Exercise("RunningLoss", "18 §5.5", points=1, hidden_points=1),
        # The extension (§10.1): recent upstream's per-forward RoPE check moved out of the forward. Graded by
        # ``check 18 --all``, never in the exit code or the points.
        Exercise("without_rope_sync", "18 §10.1", optional=True),
    ],
    # What the lesson teaches: every core check grades one; argument rules and conventions are the hardening tier
    # (checks without an objective, graded by ``check 18 --all``).
    objectives={
        "flops": "the FLOPs of one token are those FlopCounterMode counts on the real model: 2 per weight of every "
                 "matmul it passes (the active experts and the router, the lm_head tied or not, no embedding "
                 "lookup) plus attention's 4 x T x hidden per layer; a training step 3x the forward",
        "throughput": "tokens/s is the tokens of the last window of steps after the warm-up over their time, each "
                      "clock read after a device sync",
        "mfu": "MFU is the FLOP/s achieved (FLOPs per token x tokens/s) as a fraction of the device's peak",
        "state_memory": "the training state is each parameter once at its dtype, a gradient per trained one and "
                        "AdamW's two moments and step count: the tensors' nbytes after a step, autocast or not",
        "activation_memory": "the bytes autograd saves for backward grow as batch x seq_len with fused attention, "
                             "layer by layer, the norms and the loss in float32: what saved_tensors_hooks records",
        "sync_free_logging": "the running loss stays on the device, detached and in float32, with one host sync "
                             "per logged mean",
    },
    checks=checks_in(checks, throughput, memory, syncs, extensions),
    mistakes=mistakes.MISTAKES,
    equivalents=mistakes.EQUIVALENTS,
    equivalent_mutants=equivalent_mutants.EQUIVALENT_MUTANTS,
    hints=hints.HINTS,
    labs=("lesson18_profile_step.py", "lesson18_host_sync_cost.py", "lesson18_compile_break_even.py",
          "lesson18_mfu_vs_size.py", "bench_lesson18_mfu.py", "bench_lesson18_gpu.py"),
    notebook_mistake="experts_at_intermediate_size",
)
