"""Lesson 14: learning rate, gradient accumulation, mixed precision and clipping - the descriptor.

The checks live beside it (``checks`` the four small functions, ``loop`` train_one_epoch with its failures' hints
in ``loop_hints``, ``loop_arguments`` its argument rules, ``test_writing`` the student's test, ``extensions`` the
optional §10), the mistake catalogue in ``mistakes``.
"""
from __future__ import annotations

from ..framework import Exercise, Lesson, checks_in
from . import checks, equivalent_mutants, extensions, hints, loop, loop_arguments, mistakes, test_writing

LESSON = Lesson(
    lesson_id="14",
    slug="lr_grad_accum_amp",
    title="Learning rate, gradient accumulation and mixed precision",
    module="train_loop",
    exercises=[
        Exercise("cosine_lr", "14 §5.1", points=1),
        Exercise("scale_loss_for_accumulation", "14 §5.2", points=1),
        Exercise("should_step_optimizer", "14 §5.3", points=1),
        Exercise("should_flush_tail", "14 §5.4", points=1),
        # visible: schedule, update_order, tail_flush, records; hidden: overflow_skip, no_host_sync
        Exercise("train_one_epoch", "14 §5.5", points=5, hidden_points=3),
        Exercise("test_accumulation_matches_big_batch", "14 §5.6", points=3),
        # Extensions: fix upstream (§10). Optional: graded by ``check 14 --all``, never in the exit code or points.
        Exercise("accumulation_divisor", "14 §10.1", optional=True),
        Exercise("lr_per_update", "14 §10.2", optional=True),
        Exercise("update_cadence_due", "14 §10.2", optional=True),
        Exercise("adamw_param_groups", "14 §10.3", optional=True),
        Exercise("warmup_cosine_lr", "14 §10.4", optional=True),
    ],
    # What the lesson teaches (§3 lists them): every core check grades one; argument rules, types and warnings
    # are the hardening tier (checks without an objective, graded by ``check 14 --all``).
    objectives={
        "schedule": "every micro-step runs at get_lr of its global micro-step (epoch * iters + step of "
                    "epochs * iters: across epochs and resumes), written into every param group before its forward",
        "loss_scaling": "each micro-step backpropagates (loss + aux_loss) / K, still in the autograd graph",
        "update_cadence": "one optimizer update per closed window of K micro-steps, counted from micro-step 1",
        "update_order": "an update is unscale -> clip the true gradient to grad_clip -> step -> scaler update -> "
                        "clear the gradients, and the run matches the oracle's",
        "tail_flush": "a partial window left when the epoch (or the loader) ends gets its update once, and only then",
        "overflow_skip": "an enabled GradScaler skips an update whose gradients overflow (weights and AdamW state "
                         "stay put, the record says so); scaler=None skips nothing",
        "no_host_sync": "nothing inside the loop waits for the device: no host sync per micro-step, with or "
                        "without an enabled GradScaler",
        "batch_to_device": "each micro-batch, input_ids and labels, is sent to device before its forward pass",
        "records": "one record per micro-step run: its step, lr, unscaled loss, aux_loss, whether an update closed "
                   "there (skipped or a tail flush) and the pre-clip norm (None without an update)",
        "accumulation_test": "your test proves accumulation equals one big batch: it passes correct code and "
                             "fails wrong code",
    },
    checks=checks_in(checks, loop, loop_arguments, test_writing, extensions),
    mistakes=mistakes.MISTAKES,
    equivalents=mistakes.EQUIVALENTS,
    equivalent_mutants=equivalent_mutants.EQUIVALENT_MUTANTS,
    hints=hints.HINTS,
    labs=("lesson14_trace_pretrain_step.py", "lesson14_adamw_scale.py", "lesson14_predictions.py",
          "bench_lesson14_grader.py", "bench_lesson14_streaming.py", "lesson14_fix_upstream.py"),
    notebook_mistake="clip_before_unscale",
    report=checks.mechanics_report,
)
