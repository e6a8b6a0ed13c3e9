"""Lesson 15: checkpoint and exact resume - the descriptor.

The checks live beside it (``checks`` shared helpers and SkipBatchSampler, ``saving``, ``loading``,
``resume``), the mistake catalogue in ``mistakes``.
"""
from __future__ import annotations

from ..framework import Exercise, Lesson, checks_in
from . import checks, equivalent_mutants, hints, loading, mistakes, resume, saving

LESSON = Lesson(
    lesson_id="15",
    slug="checkpoint_resume",
    title="Checkpoint and exact resume",
    module="checkpoint",
    exercises=[
        Exercise("SkipBatchSampler", "15 §5.1", points=2, hidden_points=1),
        Exercise("save_checkpoint", "15 §5.2", points=2, hidden_points=2),
        Exercise("load_checkpoint", "15 §5.3", points=2, hidden_points=2),
        Exercise("resume_position", "15 §5.4", points=2, hidden_points=1),
    ],
    objectives={
        "skip_batches": "a resumed epoch skips exactly the micro-batches already trained, in the same order, "
                        "the last partial batch kept",
        "full_state": "a checkpoint holds what an exact resume needs (fp32 weights, optimizer and scaler state, "
                      "counters, world size, model config) and loading restores it bit for bit",
        "atomic_save": "a save that fails halfway leaves the previous checkpoint intact",
        "update_boundary": "checkpoints are taken at update boundaries: a save with gradients pending refuses",
        "unwrap": "the saved weights are the model's own (DDP and torch.compile wrappers unwrapped); under DDP "
                  "one rank writes",
        "refuse_foreign": "loading refuses a file it cannot resume from exactly (weights only, fp16 weights, "
                          "another model or optimizer) before changing anything",
        "world_size": "a checkpoint from another world size rescales its step",
        "exact_resume": "stop at an update boundary, save, load into fresh objects, continue: bitwise the "
                        "uninterrupted run",
    },
    checks=checks_in(checks, saving, loading, resume),
    mistakes=mistakes.MISTAKES,
    equivalents=mistakes.EQUIVALENTS,
    equivalent_mutants=equivalent_mutants.EQUIVALENT_MUTANTS,
    hints=hints.HINTS,
    labs=("lesson15_resume.py", "lesson15_checkpoint_size.py", "lesson15_predictions.py"),
    notebook_mistake="non_atomic_write",
)
