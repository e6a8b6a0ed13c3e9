"""Lesson 15: checkpoint and exact resume - the descriptor.

The checks live beside it (``checks`` shared helpers and SkipBatchSampler, ``saving`` and ``saving_boundary``,
``loading`` and ``loading_topology``, ``resume``), the mistake catalogue in ``mistakes``.
"""
from __future__ import annotations

from ..framework import Exercise, Lesson, checks_in
from . import checks, equivalent_mutants, hints, loading, loading_topology, mistakes, resume, saving, saving_boundary

LESSON = Lesson(
    lesson_id="15",
    slug="checkpoint_resume",
    title="Checkpoint and exact resume",
    module="checkpoint",
    exercises=[
        # the points follow the objectives each grade cell grades (visible | hidden)
        Exercise("SkipBatchSampler", "15 §5.1", points=1, hidden_points=1),  # skip_batches | a reshuffled order
        Exercise("save_checkpoint", "15 §5.2", points=2, hidden_points=3),   # full_state, unwrap |
        #                                          atomic_save (the crash, the directory and fsync), update_boundary,
        #                                          one_writer
        Exercise("load_checkpoint", "15 §5.3", points=2, hidden_points=2),   # full_state, safe_load |
        #                                          refuse_foreign, world_size (the whole GradScaler: full_state)
        Exercise("resume_position", "15 §5.4", points=2, hidden_points=1),   # exact_resume | with a GradScaler
    ],
    objectives={
        "skip_batches": "a resumed epoch yields exactly the batches not yet trained, in the epoch's order, the last "
                        "short batch kept, len counting them, the order read afresh on every pass",
        "full_state": "a checkpoint holds what an exact resume needs (fp32 weights, optimizer and scaler state, "
                      "epoch, step, world size, model config, the caller's extras) and loading restores it bit "
                      "for bit",
        "atomic_save": "the new file is written beside the target, fsync'd, then renamed onto it: a save that fails "
                       "halfway leaves the previous checkpoint whole",
        "update_boundary": "a save while gradients are pending (a non-zero gradient on any parameter) is refused and "
                           "writes nothing",
        "unwrap": "the saved weights are the model's own: DDP and torch.compile wrappers unwrapped",
        "one_writer": "under torch.distributed only rank 0 writes, recording the world size",
        "safe_load": "loading never runs code from the file (weights_only=True)",
        "refuse_foreign": "loading refuses, before changing anything, a file an exact resume cannot start from: "
                          "weights only, fp16 weights, another model's shapes or config, another optimizer's "
                          "state, an empty scaler state for an enabled scaler",
        "world_size": "a checkpoint from another world size returns its step rescaled as upstream does: "
                      "step * saved // current",
        "exact_resume": "resume_position continues where the checkpoint stopped (after an epoch's end at the next "
                        "epoch's start); stop, save, load into fresh objects, continue: bitwise the uninterrupted "
                        "run",
    },
    checks=checks_in(checks, saving, saving_boundary, loading, loading_topology, resume),
    mistakes=mistakes.MISTAKES,
    equivalents=mistakes.EQUIVALENTS,
    equivalent_mutants=equivalent_mutants.EQUIVALENT_MUTANTS,
    hints=hints.HINTS,
    labs=("lesson15_resume.py", "lesson15_checkpoint_size.py", "lesson15_predictions.py"),
    notebook_mistake="non_atomic_write",
)
