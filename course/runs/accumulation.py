"""Correct gradient accumulations, the implementations that the test-writing exercises test.

Lesson 14 §5.6 and lesson 16 §4.4 ask for a test that takes an accumulation function as its
argument and proves it gives the gradient of one big batch. These are the correct versions: run
your test on them by hand (it must pass), e.g. ``test_accumulation_matches_big_batch(accumulate_gradients)``.
The grader also runs your test on wrong versions, each of which it must reject.
"""
from __future__ import annotations

import copy

from course.protocol.text import shifted_target_count, token_nll_sum


def accumulate_gradients(model, micro_batches, accumulation_steps: int) -> None:
    """Lesson 14's accumulation: ``model(input_ids, labels=labels)`` on each ``(input_ids, labels)`` of
    ``micro_batches``, backward of ``(out.loss + out.aux_loss) / accumulation_steps``.

    ``micro_batches`` holds exactly ``accumulation_steps`` micro-batches. The summed gradients are left
    in each parameter's ``.grad`` (added to what is there; a fresh model has none); no optimizer step.
    For micro-batches of equal size whose every target counts (no padding), that is the gradient of
    the mean loss of all of them as one batch.
    """
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    if len(micro_batches) != accumulation_steps:
        raise ValueError(f"micro_batches must hold accumulation_steps={accumulation_steps} micro-batches, "
                         f"got {len(micro_batches)}")
    for input_ids, labels in micro_batches:
        out = model(input_ids, labels=labels)
        ((out.loss + out.aux_loss) / accumulation_steps).backward()


def accumulate_token_weighted(model, micro_batches) -> None:
    """Lesson 16's accumulation: each ``(input_ids, labels)`` of ``micro_batches`` backpropagates
    ``token_nll_sum(model(input_ids).logits, labels) / N``, where N counts the valid shifted targets
    (``labels[..., 1:] != -100``) of ALL the micro-batches, counted before the first backward.

    The summed gradients are left in ``.grad`` (added to what is there); no optimizer step. That is the
    gradient of the global batch's mean NLL over its valid targets, however unequally the valid
    targets are spread over the micro-batches. ``ValueError`` if no micro-batch has a valid target.
    """
    total_targets = sum(shifted_target_count(labels) for _, labels in micro_batches)
    if total_targets < 1:
        raise ValueError(f"micro_batches must hold at least one valid target (labels[..., 1:] != -100), "
                         f"got {total_targets}")
    for input_ids, labels in micro_batches:
        (token_nll_sum(model(input_ids).logits, labels) / total_targets).backward()


def in_float64(accumulate):
    """``accumulate`` run on a float64 copy of the model; the gradients come back in the model's dtype.

    A correct accumulation whose gradients differ from ``accumulate``'s in the last bits only: a test
    must accept both, so its tolerance cannot be bitwise (float sums in another order differ too).
    """
    def accumulate_in_float64(model, micro_batches, *args):
        wide = copy.deepcopy(model).double()
        wide.zero_grad(set_to_none=True)
        as_double = [tuple(t.double() if t.is_floating_point() else t for t in batch) for batch in micro_batches]
        accumulate(wide, as_double, *args)
        for param, wide_param in zip(model.parameters(), wide.parameters()):
            if wide_param.grad is None:
                continue
            grad = wide_param.grad.to(param.dtype)
            param.grad = grad if param.grad is None else param.grad + grad
    accumulate_in_float64.__name__ = f"{accumulate.__name__}_in_float64"
    return accumulate_in_float64

