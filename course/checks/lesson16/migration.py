"""Lesson 16 checks of ``migrate_train_state``: legacy (micro-batch) states to global semantics."""
from __future__ import annotations

from course.protocol.types import GLOBAL_SEMANTICS

from ..framework import check, expect_equal, expect_raises, fail
from .checks import rule


# --- migrate_train_state -------------------------------------------------------------------

LEGACY = {"epoch": 1, "step": 7, "batch_size": 2, "accum_steps": 4, "sample_count": 40, "model": {"w": 1},
          "optimizer": {"s": 2}}
# Lesson 15's stage assembly at the end of an epoch: 160 samples in micro-batches of 6 is 27 micro-steps; with
# accum 4 the tail flush applied micro-steps 25-27 before the save.
LEGACY_EPOCH_END = {"epoch": 0, "step": 27, "batch_size": 6, "accum_steps": 4, "sample_count": 160}
# the keys a message may name: the bad one must come first
LEGACY_KEYS = ("batch_size_semantics", "batch_size", "sample_count", "accum_steps", "step", "epoch")


GLOBAL_STATE = {"batch_size_semantics": GLOBAL_SEMANTICS, "global_batch_size": 8, "accum_steps": 4, "epoch": 0,
                "update_step_in_epoch": 3, "sample_position": 24}


@check("migrate_train_state", objective="migration")
def migrate_legacy_state_to_global_semantics(impl):
    """Legacy micro-batch 2 x accum 4, 7 micro-steps done -> global 8, update 1 (the last boundary), 3 dropped;
    the checkpoint's other keys come along; a state already in global semantics comes back as it was."""
    migrated = impl.migrate_train_state(dict(LEGACY))
    expected = {"batch_size_semantics": GLOBAL_SEMANTICS, "global_batch_size": 8, "accum_steps": 4, "epoch": 1,
                "update_step_in_epoch": 1, "sample_position": 8, "dropped_microsteps": 3}
    with rule("a legacy batch_size was the MICRO-batch: the global batch is the samples of one "
              "legacy update (micro-batch x accum_steps); a step inside the epoch resumes at its "
              "last update boundary"):
        expect_equal("migrated fields", {k: migrated.get(k) for k in expected}, expected)
    with rule("the migrated state keeps the checkpoint's other keys (model, optimizer, ...)"):
        expect_equal("model / optimizer carried over", (migrated.get("model"), migrated.get("optimizer")),
                     (LEGACY["model"], LEGACY["optimizer"]))
    at_boundary = impl.migrate_train_state(dict(LEGACY, step=8))
    with rule("a step on an update boundary (step % accum_steps == 0) resumes there and drops nothing"):
        expect_equal("legacy step 8 = exactly 2 updates: (update_step_in_epoch, dropped_microsteps)",
                     (at_boundary["update_step_in_epoch"], at_boundary["dropped_microsteps"]), (2, 0))
    with rule("a state already in global semantics needs no migration: it comes back equal"):
        expect_equal("migrate_train_state(global state)", impl.migrate_train_state(dict(GLOBAL_STATE)), GLOBAL_STATE)


@check("migrate_train_state")
def migrate_leaves_its_input_and_names_the_old_keys(impl):
    """The input dict is never modified (a global state comes back as a copy); a migrated legacy state drops the
    legacy keys batch_size and step; its migration_note says where it resumes: "boundary" inside an epoch,
    "start of the next epoch" at its end."""
    original = dict(LEGACY)
    migrated = impl.migrate_train_state(original)
    with rule("migrate_train_state returns a new dict: the caller's state stays as it was"):
        expect_equal("the input state after migrate_train_state", original, LEGACY)
    with rule("the legacy keys batch_size (a micro-batch) and step (micro-steps) are removed: under global "
              "semantics their meaning changed"):
        expect_equal("legacy keys batch_size / step left in the migrated state",
                     [k for k in ("batch_size", "step") if k in migrated], [])
    with rule('the migration_note of a state inside an epoch says it resumes at the last update "boundary"'):
        expect_equal('"boundary" in migration_note (legacy step 7 of 20)',
                     "boundary" in str(migrated.get("migration_note", "")), True)
    epoch_end = impl.migrate_train_state(dict(LEGACY_EPOCH_END))
    with rule('the migration_note of an epoch-end state says it resumes at the "start of the next epoch"'):
        expect_equal('"start of the next epoch" in migration_note (epoch end)',
                     "start of the next epoch" in str(epoch_end.get("migration_note")), True)
    state = dict(GLOBAL_STATE)
    result = impl.migrate_train_state(state)
    with rule("a global state comes back as an equal COPY: the caller's dict is never modified, not even "
              "through the result"):
        expect_equal("migrate_train_state(global state) is the input dict", result is state, False)
        result["epoch"] = 7
        expect_equal("the input state after the caller changed the result's epoch to 7", state, GLOBAL_STATE)


@check("migrate_train_state")
def migrate_rejects_bad_states(impl):
    """Unknown semantics, bad legacy values, a missing batch_size or sample_count, or a step past the epoch's end
    raise ValueError naming the key."""
    expect_raises("batch_size_semantics='micro'",
                  lambda: impl.migrate_train_state(dict(GLOBAL_STATE, batch_size_semantics="micro")), ValueError,
                  "batch_size_semantics", arguments=LEGACY_KEYS)
    with rule("legacy values must be ints (a bool is not one, though Python's bool subclasses int): "
              "batch_size, sample_count and accum_steps >= 1, step and epoch >= 0; a bad one is a ValueError "
              "naming that key first"):
        for key, bad in (("accum_steps", 0), ("batch_size", 0), ("sample_count", 0), ("step", -1), ("epoch", -1),
                         ("batch_size", "2"), ("accum_steps", 2.0), ("batch_size", True), ("accum_steps", True),
                         ("step", False)):
            expect_raises(f"legacy {key}={bad!r}", lambda: impl.migrate_train_state(dict(LEGACY, **{key: bad})),
                          ValueError, key, arguments=LEGACY_KEYS)
    with rule("batch_size and sample_count have no default: a legacy state without one is a ValueError naming it"):
        for key in ("batch_size", "sample_count"):
            expect_raises(f"legacy without {key} (it has no default)",
                          lambda: impl.migrate_train_state({k: v for k, v in LEGACY.items() if k != key}), ValueError,
                          key, arguments=LEGACY_KEYS)
    with rule("a step past the epoch's end (ceil(sample_count / batch_size) micro-steps) is a ValueError naming "
              "step"):
        expect_raises("legacy step 28 > ceil(160 / 6) = 27",
                      lambda: impl.migrate_train_state(dict(LEGACY_EPOCH_END, step=28)), ValueError, "step",
                      arguments=LEGACY_KEYS)


def migrated_or_fail(impl, state: dict, fields: tuple, expected: tuple) -> dict:
    """``migrate_train_state(state)``; a ValueError there fails with ACTUAL vs EXPECTED (the state is valid)."""
    try:
        return impl.migrate_train_state(dict(state))
    except ValueError as exc:
        fail(f"migrate_train_state({state}): {fields}", f"ValueError: {exc}", expected)


@check("migrate_train_state", objective="migration", hidden=True)
def migrate_resumes_an_epoch_end_at_the_next_epoch(impl):
    """step == ceil(sample_count / batch_size) was saved after the epoch's tail flush: resume at update 0 of the
    next epoch with nothing dropped; one micro-step earlier is mid-epoch."""
    fields = ("epoch", "update_step_in_epoch", "sample_position", "dropped_microsteps", "global_batch_size")
    with rule("the epoch has as many micro-steps as micro-batches (a partial last one counts): "
              "ceil(sample_count / batch_size); step equal to it is the epoch's end, resumed at "
              "update 0 of the next epoch"):
        migrated = migrated_or_fail(impl, LEGACY_EPOCH_END, fields, (1, 0, 0, 0, 24))
    got = tuple(migrated.get(k) for k in fields)
    if got != (1, 0, 0, 0, 24):
        fail(f"legacy epoch 0, step 27, micro-batch 6 x accum 4, 160 samples: {fields}", got, (1, 0, 0, 0, 24),
             "hint: 27 = ceil(160 / 6) is the epoch's last micro-step and the tail flush applied micro-steps 25-27; "
             "resuming at update 6 with 3 dropped trains samples 144-159 twice")
    mid = impl.migrate_train_state(dict(LEGACY_EPOCH_END, step=26))
    with rule("a step before the epoch's end resumes at its last update boundary, step // accum_steps"):
        expect_equal("legacy step 26 of 27: (epoch, update_step_in_epoch, dropped_microsteps)",
                     (mid["epoch"], mid["update_step_in_epoch"], mid["dropped_microsteps"]), (0, 6, 2))


@check("migrate_train_state")
def migrate_fills_documented_legacy_defaults(impl):
    """A legacy state without epoch, step or accum_steps takes epoch 0, step 0, accum_steps 1."""
    fields = ("epoch", "update_step_in_epoch", "accum_steps", "global_batch_size", "dropped_microsteps")
    with rule("a legacy state may lack epoch, step and accum_steps: they default to 0, 0 and 1 "
              "(only batch_size and sample_count are required)"):
        migrated = migrated_or_fail(impl, {"batch_size": 4, "sample_count": 40}, fields, (0, 0, 1, 4, 0))
        expect_equal(f"legacy {{batch_size: 4, sample_count: 40}} only: {fields}",
                     tuple(migrated.get(k) for k in fields), (0, 0, 1, 4, 0))


@check("migrate_train_state", objective="migration", hidden=True)
def migrate_handles_legacy_boundaries(impl):
    """Legacy states at the edges of their range: one-sample micro-batches and epochs, accum_steps 1 (no micro-step
    is ever dropped), step 0, a window longer than the epoch, the epoch's end with and without a partial window."""
    fields = ("epoch", "update_step_in_epoch", "sample_position", "dropped_microsteps", "global_batch_size")
    # (batch_size, sample_count, accum_steps, step, epoch) -> fields: every key given (defaults are §4.5's)
    cases = [((1, 1, 1, 0, 0), (0, 0, 0, 0, 1)),
             ((1, 1, 1, 1, 0), (1, 0, 0, 0, 1)),                 # the epoch's end
             ((3, 10, 1, 3, 2), (2, 3, 9, 0, 3)),
             ((3, 10, 1, 4, 2), (3, 0, 0, 0, 3)),
             ((2, 40, 4, 0, 3), (3, 0, 0, 0, 8)),
             ((4, 10, 8, 2, 0), (0, 0, 0, 2, 32)),
             ((4, 10, 8, 3, 0), (1, 0, 0, 0, 32)),
             ((5, 40, 2, 8, 1), (2, 0, 0, 0, 10))]
    for values, expected in cases:
        state = dict(zip(("batch_size", "sample_count", "accum_steps", "step", "epoch"), values))
        with rule("only step == the epoch's micro-step count (ceil(sample_count / batch_size)) is the "
                  "epoch's end (next epoch, update 0); every smaller step resumes at its last update "
                  "boundary, step // accum_steps, and drops step % accum_steps micro-steps"):
            migrated = migrated_or_fail(impl, state, fields, expected)
            expect_equal(f"migrate_train_state({state}): {fields}", tuple(migrated.get(k) for k in fields), expected)
