"""Lesson 16: token-weighted accumulation and the single-step TrainingSession - the descriptor.

The checks live beside it (``checks`` the counting functions, ``session``, ``session_updates`` and
``session_runtime`` the TrainingSession, ``session_hardening`` its conventions, ``migration`` migrate_train_state, ``test_writing`` the student's test),
the mistake catalogue in ``mistakes``. A core check names the objective below that it grades; the checks without
one are the hardening tier (lesson 16 §4.5: argument rules and conventions, graded by ``check 16 --all`` only).
"""
from __future__ import annotations

from ..framework import Exercise, Lesson, checks_in
from . import (checks, equivalent_mutants, hints, migration, mistakes, session, session_hardening, session_runtime,
               session_updates, test_writing)

LESSON = Lesson(
    lesson_id="16",
    slug="token_weighted_training_session",
    title="Token-weighted gradient accumulation and the single-step TrainingSession",
    module="train_session",
    exercises=[
        Exercise("count_loss_units", "16 §4.1", points=1),
        Exercise("split_global_batch", "16 §4.2", points=1),
        Exercise("steps_per_epoch", "16 §4.2", points=1),
        Exercise("TrainingSession", "16 §4.3", points=3, hidden_points=4),
        Exercise("test_token_weighted_matches_global_batch", "16 §4.4", points=2),
        Exercise("migrate_train_state", "16 §5.4", points=1, hidden_points=1),
    ],
    objectives={
        "loss_units": "a micro-batch's loss units are its real targets: shifted labels that are not -100",
        "global_batch": "a global batch is cut into micro-batches in order (a short tail too); an epoch has "
                        "ceil(samples / global batch) updates",
        "token_weighting": "each micro-step backpropagates loss * gradient_units / normalization_units: the update's "
                           "gradient equals one backward of the whole global batch, its report the batch's totals",
        "update_boundary": "one optimizer step per update (the K-th micro-step, or force_update), at the update's "
                           "lr in every param group, after_update after it, each update starting clean",
        "clipping": "the update is clipped to clip_grad_norm; the reported norm is the gradient's before clipping",
        "failure_safety": "an error (later calls refused until reset_accumulation) or a before_update abort never "
                          "lets half an update through",
        "mixed_precision": "under autocast and an enabled GradScaler: unscale before clip, an overflow skips the "
                           "step, reported and not counted, without after_update",
        "on_device": "loss totals stay detached tensors on the device: no host sync on a micro-step that does not "
                     "close the update",
        "resume": "state() and load_state() carry the lr and optimizer_step across a checkpoint at an update "
                  "boundary",
        "migration": "a legacy micro-batch train state migrates to global-batch semantics at its last update "
                     "boundary, or at the next epoch once its epoch has ended",
        "test_writing": "your test proves token-weighted accumulation equals one global-batch backward",
    },
    checks=checks_in(checks, session, session_hardening, session_updates, session_runtime, migration, test_writing),
    mistakes=mistakes.MISTAKES,
    equivalents=mistakes.EQUIVALENTS,
    equivalent_mutants=equivalent_mutants.EQUIVALENT_MUTANTS,
    hints=hints.HINTS,
    labs=("lesson16_mean_of_means.py", "lesson16_token_weighted_accumulation.py", "lesson16_ddp_token_weighted.py",
          "bench_lesson16_session.py", "lesson16_predictions.py"),
    notebook_mistake="clip_before_unscale",
)
