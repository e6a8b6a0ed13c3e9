"""Lesson 14's hardening checks of ``train_one_epoch``'s arguments (lesson 14 §5.7): each bad one (or the first of
two, in the stated order) raises ValueError naming it before the loader is touched; the boundaries are valid."""
from __future__ import annotations

from course.runs import epoch_batches, training_objects
from course.runs.scenarios import LOOP_BASE

from ..framework import check, expect_equal, expect_raises, fail
from .loop_hints import hint


class UntouchedLoader:
    """A loader that records whether anything iterated it: argument checks come before any work."""

    def __init__(self, batches):
        self.batches, self.iterated = batches, False

    def __iter__(self):
        self.iterated = True
        return iter(self.batches)


# The parameter names of train_one_epoch that an error message may name (the bad one must come first).
TRAIN_ARGUMENTS = ("accumulation_steps", "iters", "epochs", "epoch", "start_step")


@check("train_one_epoch")
def train_one_epoch_rejects_bad_arguments(impl):
    """K, iters or epochs <= 0, epoch outside [0, epochs), start_step outside [0, iters]: ValueError
    naming the argument (first; of two bad ones, the first in that order), raised before the loader is iterated."""
    objects = training_objects(LOOP_BASE)
    good = dict(device="cpu", epoch=0, epochs=1, iters=6, base_lr=5e-4, accumulation_steps=4, grad_clip=1.0)
    bad = [(dict(accumulation_steps=0), "accumulation_steps"), (dict(accumulation_steps=-1), "accumulation_steps"),
           (dict(iters=0), "iters"), (dict(epochs=0), "epochs"), (dict(epochs=-1), "epochs"),
           (dict(epoch=1), "epoch"), (dict(epoch=-1), "epoch"), (dict(start_step=7), "start_step"),
           (dict(start_step=-1), "start_step"),
           # two bad arguments: the first in the stated order is the one to name
           (dict(accumulation_steps=0, iters=0), "accumulation_steps"), (dict(iters=-1, epochs=0), "iters"),
           (dict(epochs=0, epoch=-1), "epochs"), (dict(epoch=2, start_step=-1), "epoch")]
    for changes, argument in bad:
        call = f"train_one_epoch(..., {', '.join(f'{k}={v}' for k, v in changes.items())})"
        loader = UntouchedLoader(epoch_batches(LOOP_BASE, 0))
        expect_raises(call, lambda: impl.train_one_epoch(objects.model, loader, objects.optimizer,
                                                         **{**good, **changes}), ValueError, argument, TRAIN_ARGUMENTS)
        with hint("check every argument before touching the loader: no work, not even iter(loader), before "
                  "the argument checks" if loader.iterated else ""):
            expect_equal(f"{call}: loader iterated before the ValueError", loader.iterated, False)


@check("train_one_epoch")
def train_one_epoch_accepts_boundary_arguments(impl):
    """K = 1, iters = 1, epochs = 1, epoch = epochs - 1, start_step = 0 or iters are valid: an empty loader
    then runs nothing and returns []."""
    objects = training_objects(LOOP_BASE)
    good = dict(device="cpu", epoch=0, epochs=1, iters=1, base_lr=5e-4, accumulation_steps=1, grad_clip=1.0)
    for changes in (dict(), dict(start_step=1), dict(epochs=3, epoch=2), dict(iters=6, accumulation_steps=8,
                                                                              start_step=6)):
        call = f"train_one_epoch(loader=[], {', '.join(f'{k}={v}' for k, v in {**good, **changes}.items())})"
        try:
            records = impl.train_one_epoch(objects.model, [], objects.optimizer, **{**good, **changes})
        except ValueError as exc:
            fail(call, f"ValueError: {exc}", "[] (valid arguments at their boundaries)")
        expect_equal(call, records, [])
