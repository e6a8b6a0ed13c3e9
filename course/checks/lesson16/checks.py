"""Lesson 16 checks of the counting functions: ``count_loss_units``, ``split_global_batch``, ``steps_per_epoch``.

The oracle of a session update is ONE backward of the whole global batch with the loss
``sum of NLL / valid tokens of the global batch``. Accumulating micro-batches reorders float sums,
so gradients are compared with ``atol=1e-6`` (measured difference ~1e-8; the ``loss / K`` mistake
differs by ~1e-1). Everything else (counts, flags, step positions) is compared exactly.
The DDP check lives in pytest only (tests/test_lesson16_train_session.py), it spawns processes.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..framework import CheckFailure, check, expect_equal, expect_raises, expect_type, fail

GRAD_ATOL, GRAD_RTOL = 1e-6, 1e-5


@contextmanager
def rule(text: str):
    """A failure inside names the rule it broke (``hint: <text>``), unless it already carries a computed hint."""
    try:
        yield
    except CheckFailure as exc:
        if "hint:" in str(exc):
            raise
        raise CheckFailure(f"{exc}\n  hint: the rule: {text}") from None

# --- count_loss_units ----------------------------------------------------------------------


def count_hint(labels: torch.Tensor, got) -> str:
    """The cause a wrong count of ``labels``' targets points at: masked targets counted, or the shift forgotten."""
    if got == int((labels != -100).sum()):
        return "hint: counted labels != -100 without the shift: position 0 is never a target (labels[..., 1:])"
    if got in (labels[..., 1:].numel(), labels.numel()):
        return "hint: counted masked targets too: a label of -100 (padding, prompt) is no target"
    if got == int((labels[..., 1:] > 0).sum()):
        return "hint: only -100 marks a non-target: a label 0 (token id 0) is a target too"
    return ""


@check("count_loss_units", objective="loss_units")
def count_loss_units_sees_the_shift(impl):
    """Counts labels[..., 1:] != -100: position 0 is never a target, -100 anywhere never counts, a label 0 (token id
    0) counts."""
    cases = [
        ([[5, 6, -100, -100], [-100, 7, 8, 9]], 4),     # unshifted count would be 5
        ([[1, 2, 3, 4, 5]], 4),
        ([[-100, -100, -100]], 0),
        ([[7]], 0),                                      # one position: nothing to predict
        ([3, -100, 4, 5], 2),                            # a single sequence [seq]
        ([[9, 9, 9], [9, -100, -100], [9, 9, -100]], 3),
        ([[4, -100, 6, -100, 8, -100]], 2),              # masked every other position (unmasked prompt/answer)
        ([[1, 0, 5, 0, -100]], 3),                       # token id 0 (the pad id) is a target like any other
    ]
    for labels, expected in cases:
        labels = torch.tensor(labels)
        got = impl.count_loss_units(labels)
        if got != expected:   # an equal count passes whatever its type (a Python int: the hardening tier)
            fail(f"count_loss_units({labels.tolist()})", got, expected,
                 count_hint(labels, got) or "hint: the rule: a target is a label at position >= 1 "
                 "(labels[..., 1:]) that is not -100, along the last dimension")


@check("count_loss_units")
def count_loss_units_returns_a_python_int(impl):
    """The count is a Python int, a number on the host that the run driver sums before the first micro-step: not
    a 0-dim tensor, and not a bool."""
    for labels in ([[5, 6, -100, -100], [-100, 7, 8, 9]], [[7]]):
        expect_type(f"count_loss_units({labels})", impl.count_loss_units(torch.tensor(labels)), int,
                    detail="hint: the rule: return a Python int (int(tensor.sum())): a host-side count")


@check("count_loss_units")
def count_loss_units_rejects_bad_labels(impl):
    """A 0-dim tensor, and labels of every float dtype (float16, bfloat16, float32, float64), complex or bool
    raise ValueError naming labels."""
    not_token_ids = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.bool)
    for what, labels in (("tensor(3)", torch.tensor(3)),
                         *((f"{dtype} labels", torch.ones(2, 4, dtype=dtype)) for dtype in not_token_ids)):
        with rule("labels hold integer token ids: a 0-dim tensor and a float, complex or bool dtype (a mask is "
                  "not labels) are a ValueError naming labels"):
            expect_raises(f"count_loss_units({what})", lambda: impl.count_loss_units(labels), ValueError, "labels",
                          arguments=("labels",))


# --- split_global_batch / steps_per_epoch --------------------------------------------------

SPLIT_ARGUMENTS = ("samples", "global_batch_size", "accumulation_steps")


@check("split_global_batch", objective="global_batch")
def split_global_batch_micro_sizes(impl):
    """8 samples, global 8 / accum 4 -> four micro-batches of 2, in order; short tails split over what remains,
    down to a tail of one sample."""
    cases = [((list(range(8)), 8, 4), [[0, 1], [2, 3], [4, 5], [6, 7]]),
             ((list(range(5)), 8, 4), [[0, 1], [2, 3], [4]]),
             ((list(range(3)), 8, 4), [[0, 1], [2]]),
             ((["only"], 8, 4), [["only"]]),                  # a tail of one sample
             ((["only"], 1, 1), [["only"]]),                  # the smallest global batch
             ((list(range(6)), 6, 1), [[0, 1, 2, 3, 4, 5]]),
             ((list(range(6)), 6, 6), [[0], [1], [2], [3], [4], [5]]),
             ((list(range(9)), 12, 3), [[0, 1, 2, 3], [4, 5, 6, 7], [8]])]
    for (samples, global_batch, accum), expected in cases:
        what = f"split_global_batch({samples!r}, global_batch_size={global_batch}, accumulation_steps={accum})"
        try:
            got = impl.split_global_batch(samples, global_batch, accum)
        except ValueError as exc:   # the arguments are valid
            fail(what, f"ValueError: {exc}", expected, "hint: the rule: a short global batch, down to one sample, is "
                 "split over what remains; only an empty or oversized samples list is refused")
        with rule("micro-batches of global_batch_size / accumulation_steps samples, in order; a short global batch "
                  "is split over what remains (the last micro-batch may be smaller, one sample is a valid tail)"):
            expect_equal(f"{what}, each micro-batch as a list", [list(micro) for micro in got], expected)


@check("split_global_batch")
def split_global_batch_returns_lists(impl):
    """Any sequence of samples (a tuple, a range) gives a list of lists, as a list does."""
    for samples in (tuple(range(6)), range(6)):
        got = impl.split_global_batch(samples, 6, 3)
        kinds = (type(got).__name__, sorted({type(micro).__name__ for micro in got}))
        with rule("always a list of lists, whatever sequence samples is: list(samples) before slicing"):
            expect_equal(f"split_global_batch({samples!r}, 6, 3): (its type, its micro-batches' types)", kinds,
                         ("list", ["list"]))


@check("split_global_batch")
def split_global_batch_fails_fast(impl):
    """global % accum != 0, sizes < 1, empty or oversized sample lists raise ValueError naming the argument."""
    cases = [((list(range(8)), 8, 3), "accumulation_steps"), ((list(range(4)), 6, 4), "accumulation_steps"),
             (([1], 0, 1), "global_batch_size"), (([1], -2, 2), "global_batch_size"),
             (([1], 4, 0), "accumulation_steps"), (([1], 4, -1), "accumulation_steps"),
             (([], 4, 2), "samples"), ((list(range(9)), 8, 4), "samples")]
    for (samples, global_batch, accum), bad in cases:
        expect_raises(f"split_global_batch({len(samples)} samples, {global_batch}, {accum})",
                      lambda: impl.split_global_batch(samples, global_batch, accum), ValueError, bad,
                      arguments=SPLIT_ARGUMENTS)


@check("steps_per_epoch", objective="global_batch")
def steps_per_epoch_is_ceil(impl):
    """ceil(samples / global batch): a short tail is one more update."""
    for count, global_batch, expected in [(160, 8, 20), (161, 8, 21), (20, 8, 3), (7, 8, 1), (0, 8, 0), (8, 1, 8),
                                          (1, 1, 1), (9, 8, 2)]:
        with rule("one update per global batch, and the short last global batch is an update too (round up)"):
            expect_equal(f"steps_per_epoch({count}, {global_batch})", impl.steps_per_epoch(count, global_batch),
                         expected)


@check("steps_per_epoch")
def steps_per_epoch_is_exact_for_any_int(impl):
    """Integer arithmetic: counts above 2**53, which a float division rounds, come out exact."""
    for count, global_batch, expected in [(2 ** 53 + 1, 1, 2 ** 53 + 1), (2 ** 60 + 1, 2 ** 30, 2 ** 30 + 1)]:
        with rule("round up in integer arithmetic (-(-a // b)): a float division (math.ceil(a / b)) rounds counts "
                  "above 2**53"):
            expect_equal(f"steps_per_epoch({count}, {global_batch})", impl.steps_per_epoch(count, global_batch),
                         expected)


@check("steps_per_epoch")
def steps_per_epoch_rejects_bad_arguments(impl):
    """sample_count < 0 and global_batch_size < 1 (0 or negative) raise ValueError naming the argument."""
    for (count, global_batch), bad in (((10, 0), "global_batch_size"), ((10, -8), "global_batch_size"),
                                       ((-1, 8), "sample_count")):
        with rule("sample_count < 0 is a ValueError naming sample_count; global_batch_size < 1 (0 or negative) one "
                  "naming global_batch_size"):
            expect_raises(f"steps_per_epoch({count}, {global_batch})",
                          lambda: impl.steps_per_epoch(count, global_batch), ValueError, bad,
                          arguments=("sample_count", "global_batch_size"))
