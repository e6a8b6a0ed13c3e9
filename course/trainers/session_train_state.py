"""Save and resume a lesson-16 training state as a lesson-15 resume checkpoint.

The checkpoint is written and read by lesson 15's ``save_checkpoint`` / ``load_checkpoint`` (atomic,
validated, ``weights_only``); the training state travels in its extra keys with
``batch_size_semantics="global"``, so ``step`` counts UPDATES of the epoch. A checkpoint without
``batch_size_semantics`` (e.g. from lesson 15's stage assembly) is a legacy state, migrated by the
implementation's ``migrate_train_state``; a legacy file without ``sample_count`` gets this run's, and one
with a different ``sample_count`` is refused (its epoch ends elsewhere). ``impl`` (lesson 16's
``train_session``) and ``checkpoint`` (lesson 15's) are the modules of the implementation the trainer
runs, the reference's unless given.
"""
from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path

from course.reference import checkpoint as reference_checkpoint
from course.reference import train_session as reference_impl

from course.protocol.types import GLOBAL_SEMANTICS, TrainingRunState, TrainingSessionState


def save_train_state(path, session, run: TrainingRunState, *, global_batch_size: int, accumulation_steps: int,
                     checkpoint=reference_checkpoint) -> Path:
    """Save run state + session state as a lesson-15 resume checkpoint, at an update boundary."""
    if session.microsteps_accumulated:
        raise ValueError(f"a training state is saved at an update boundary; microsteps_accumulated is "
                         f"{session.microsteps_accumulated}")
    run_fields = {k: v for k, v in asdict(run).items() if k not in ("epoch", "update_step_in_epoch")}
    session_state = session.state()
    # ``accum_steps``: the key lesson 15's checkpoints and migrate_train_state already use for K
    checkpoint.save_checkpoint(path, model=session.model, optimizer=session.optimizer, scaler=session.scaler,
                               epoch=run.epoch, step=run.update_step_in_epoch, batch_size_semantics=GLOBAL_SEMANTICS,
                               global_batch_size=global_batch_size, accum_steps=accumulation_steps,
                               optimizer_step=session_state.optimizer_step, lr=session_state.lr, **run_fields)
    return Path(path)


def load_train_state(path, session, *, global_batch_size: int, accumulation_steps: int, sample_count: int,
                     identity: str, impl=reference_impl,
                     checkpoint=reference_checkpoint) -> tuple[TrainingRunState, str]:
    """Resume ``session`` from a new or legacy checkpoint; returns the run state and a note on what was restored.

    ``load_checkpoint`` validates the file against model / optimizer / scaler before loading them. The
    run checks need the file's keys, so they run after it; a refusal there puts the session's model,
    optimizer and scaler back as they were before raising.
    """
    loaded = [part for part in (session.model, session.optimizer, session.scaler) if part is not None]
    before = [copy.deepcopy(part.state_dict()) for part in loaded]
    saved = checkpoint.load_checkpoint(path, model=session.model, optimizer=session.optimizer, scaler=session.scaler)
    try:
        return _run_state_of(saved, session, global_batch_size=global_batch_size, accumulation_steps=accumulation_steps,
                             sample_count=sample_count, identity=identity, impl=impl)
    except Exception:
        for part, state in zip(loaded, before):
            part.load_state_dict(state)
        raise


def _run_state_of(checkpoint: dict, session, *, global_batch_size: int, accumulation_steps: int, sample_count: int,
                  identity: str, impl) -> tuple[TrainingRunState, str]:
    if checkpoint.get("batch_size_semantics") is not None:   # a new state: ``step`` counts updates
        checkpoint["update_step_in_epoch"] = checkpoint.pop("step")
    else:   # legacy: the epoch's length tells its end from its inside; the run knows it if the file does not
        checkpoint.setdefault("sample_count", sample_count)
    state = impl.migrate_train_state(checkpoint)
    # ``accum_steps``: the train-state key for K (lesson 15's checkpoint format)
    for key, wanted in (("global_batch_size", global_batch_size), ("accum_steps", accumulation_steps)):
        if state[key] != wanted:
            raise ValueError(f"{key} of the checkpoint is {state[key]}, the run asks for {wanted}: "
                             "resume with the checkpoint's global batch and accumulation")
    if state.get("sample_count", sample_count) != sample_count:
        raise ValueError(f"sample_count of the checkpoint is {state['sample_count']}, this run reads "
                         f"{sample_count} samples: its epochs (and their ends) differ")
    if state.get("dataset_identity", identity) != identity:
        raise ValueError(f"dataset_identity of the checkpoint is {state['dataset_identity']!r}, "
                         f"this run reads {identity!r}")
    updates_per_epoch = impl.steps_per_epoch(sample_count, global_batch_size)
    global_step = state.get("global_step", state["epoch"] * updates_per_epoch + state["update_step_in_epoch"])
    session.load_state(TrainingSessionState(lr=state.get("lr", session.optimizer.param_groups[0]["lr"]),
                                            optimizer_step=state.get("optimizer_step", global_step),
                                            microsteps_accumulated=0, loss_sum=None, loss_units=0,
                                            accumulation_valid=True))
    run = TrainingRunState(epoch=state["epoch"], update_step_in_epoch=state["update_step_in_epoch"],
                           global_step=global_step, sample_position=state["sample_position"],
                           dataset_identity=identity, seed=state.get("seed", 42),
                           base_lr=state.get("base_lr", TrainingRunState.base_lr),
                           total_steps=state.get("total_steps", 0))
    note = state.get("migration_note", f"resumed at update {run.update_step_in_epoch} of epoch {run.epoch}")
    return run, note
