"""Lesson 16 checks of the counting functions: ``count_loss_units``, ``split_global_batch``, ``steps_per_epoch``.

The oracle of a session update is ONE backward of the whole global batch with the loss
``sum of NLL / valid tokens of the global batch``. Accumulating micro-batches reorders float sums,
so gradients are compared with ``atol=1e-6`` (measured difference ~1e-8; the ``loss / K`` mistake
differs by ~1e-1). Everything else (counts, flags, step positions) is compared exactly.
The DDP check lives in pytest only (tests/test_lesson16_train_session.py), it spawns processes.
"""
from __future__ import annotations

import torch

from ..framework import check, expect_equal, expect_raises, fail

GRAD_ATOL, GRAD_RTOL = 1e-6, 1e-5

# --- count_loss_units ----------------------------------------------------------------------


@check("count_loss_units")
def count_loss_units_sees_the_shift(impl):
    """Counts labels[..., 1:] != -100: position 0 is never a target, -100 anywhere never counts."""
    cases = [
        ([[5, 6, -100, -100], [-100, 7, 8, 9]], 4),     # unshifted count would be 5
        ([[1, 2, 3, 4, 5]], 4),
        ([[-100, -100, -100]], 0),
        ([[7]], 0),                                      # one position: nothing to predict
        ([3, -100, 4, 5], 2),                            # a single sequence [seq]
        ([[9, 9, 9], [9, -100, -100], [9, 9, -100]], 3),
    ]
    for labels, expected in cases:
        got = impl.count_loss_units(torch.tensor(labels))
        if not isinstance(got, int):
            fail(f"count_loss_units({labels}) type", type(got).__name__, "int (a host-side count)")
        expect_equal(f"count_loss_units({labels})", got, expected)


@check("count_loss_units", hidden=True)
def count_loss_units_rejects_bad_labels(impl):
    """A 0-dim tensor or float labels raise ValueError naming labels."""
    expect_raises("count_loss_units(tensor(3))", lambda: impl.count_loss_units(torch.tensor(3)), ValueError, "labels")
    expect_raises("count_loss_units(float labels)", lambda: impl.count_loss_units(torch.ones(2, 4)), ValueError,
                  "labels")


# --- split_global_batch / steps_per_epoch --------------------------------------------------

@check("split_global_batch")
def split_global_batch_micro_sizes(impl):
    """8 samples, global 8 / accum 4 -> four micro-batches of 2, in order; short tails split over what remains."""
    cases = [((list(range(8)), 8, 4), [[0, 1], [2, 3], [4, 5], [6, 7]]),
             ((list(range(5)), 8, 4), [[0, 1], [2, 3], [4]]),
             ((list(range(3)), 8, 4), [[0, 1], [2]]),
             ((list(range(6)), 6, 1), [[0, 1, 2, 3, 4, 5]]),
             ((list(range(6)), 6, 6), [[0], [1], [2], [3], [4], [5]])]
    for (samples, global_batch, accum), expected in cases:
        got = [list(m) for m in impl.split_global_batch(samples, global_batch, accum)]
        expect_equal(f"split_global_batch({samples}, global_batch_size={global_batch}, accumulation_steps={accum})",
                     got, expected)


@check("split_global_batch", hidden=True)
def split_global_batch_fails_fast(impl):
    """global % accum != 0, sizes < 1, empty or oversized sample lists raise ValueError naming the argument."""
    expect_raises("split_global_batch(8 samples, 8, 3)", lambda: impl.split_global_batch(list(range(8)), 8, 3),
                  ValueError, "accumulation_steps")
    expect_raises("split_global_batch(.., 0, 1)", lambda: impl.split_global_batch([1], 0, 1), ValueError,
                  "global_batch_size")
    expect_raises("split_global_batch(.., 4, 0)", lambda: impl.split_global_batch([1], 4, 0), ValueError,
                  "accumulation_steps")
    expect_raises("split_global_batch([], 4, 2)", lambda: impl.split_global_batch([], 4, 2), ValueError, "samples")
    expect_raises("split_global_batch(9 samples, 8, 4)", lambda: impl.split_global_batch(list(range(9)), 8, 4),
                  ValueError, "samples")


@check("steps_per_epoch")
def steps_per_epoch_is_ceil(impl):
    """ceil(samples / global batch): a short tail is one more update."""
    for count, global_batch, expected in [(160, 8, 20), (161, 8, 21), (20, 8, 3), (7, 8, 1), (0, 8, 0), (8, 1, 8)]:
        expect_equal(f"steps_per_epoch({count}, {global_batch})", impl.steps_per_epoch(count, global_batch), expected)
    expect_raises("steps_per_epoch(10, 0)", lambda: impl.steps_per_epoch(10, 0), ValueError, "global_batch_size")
    expect_raises("steps_per_epoch(-1, 8)", lambda: impl.steps_per_epoch(-1, 8), ValueError, "sample_count")
