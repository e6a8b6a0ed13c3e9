"""Lesson 14's test-writing exercise: the student's ``test_accumulation_matches_big_batch`` must pass the
correct accumulation and fail each wrong one below."""
from __future__ import annotations

from course.runs import accumulate_gradients, in_float64

from ..framework import check
from ..student_tests import WrongImplementation, grade_student_test


def _micro_batch_loss(model, input_ids, labels):
    out = model(input_ids, labels=labels)
    return out.loss + out.aux_loss


def accumulate_without_dividing(model, micro_batches, accumulation_steps):
    for input_ids, labels in micro_batches:
        _micro_batch_loss(model, input_ids, labels).backward()


def accumulate_dividing_twice(model, micro_batches, accumulation_steps):
    for input_ids, labels in micro_batches:
        (_micro_batch_loss(model, input_ids, labels) / accumulation_steps / accumulation_steps).backward()


def accumulate_zeroing_every_micro_batch(model, micro_batches, accumulation_steps):
    for input_ids, labels in micro_batches:
        model.zero_grad(set_to_none=True)
        (_micro_batch_loss(model, input_ids, labels) / accumulation_steps).backward()


def accumulate_first_micro_batch_only(model, micro_batches, accumulation_steps):
    input_ids, labels = micro_batches[0]
    _micro_batch_loss(model, input_ids, labels).backward()


def accumulate_dividing_by_micro_batch_size(model, micro_batches, accumulation_steps):
    for input_ids, labels in micro_batches:
        (_micro_batch_loss(model, input_ids, labels) / len(input_ids)).backward()


WRONG_ACCUMULATIONS = (
    WrongImplementation("accumulate_without_dividing", "backpropagates each micro-batch loss undivided (K times the "
                        "gradient)", "its gradient is K times too large; with K = 1 dividing by K changes nothing: "
                        "use K >= 2 "
                        "micro-batches",
                        accumulate_without_dividing),
    WrongImplementation("accumulate_dividing_twice", "backpropagates loss / K / K (1/K of the gradient)",
                        "its gradient is 1/K of the right one; with K = 1 the extra division changes nothing",
                        accumulate_dividing_twice),
    WrongImplementation("accumulate_zeroing_every_micro_batch", "zero_grad before every backward: only the last "
                        "micro-batch's gradient / K is left", "use K >= 2 micro-batches and compare every parameter's "
                        "gradient", accumulate_zeroing_every_micro_batch),
    WrongImplementation("accumulate_first_micro_batch_only", "backpropagates the first micro-batch's loss alone: the "
                        "right size, the wrong samples", "if every micro-batch holds the same samples, one of them "
                        "has the big batch's gradient: use different samples; and a tolerance near float rounding",
                        accumulate_first_micro_batch_only),
    WrongImplementation("accumulate_dividing_by_micro_batch_size", "divides each loss by the micro-batch size "
                        "len(input_ids) instead of K", "with micro-batches of exactly K samples the two divisors "
                        "are equal: pick a micro-batch size different from K", accumulate_dividing_by_micro_batch_size),
)


@check("test_accumulation_matches_big_batch", objective="accumulation_test", slow=True)
def accumulation_test_passes_correct_and_fails_wrong(impl):
    """Your test passes the correct accumulation (course/runs/accumulation.py, and the same in float64) and
    raises AssertionError on each of 5 wrong ones: no division by K, division by K twice, zero_grad every
    micro-batch, the first micro-batch only, division by the micro-batch size; on one gradient tensor 1 % off
    (each large tensor in turn); on 5 that keep every norm and sum: all gradients negated, one negated, two
    swapped, each tensor's elements shifted, the small elements negated; on one element of one tensor negated
    (each large tensor in turn); on the smallest gradient zeroed; and it fails (any exception) on a parameter left without a gradient and on an implementation that
    raises."""
    grade_student_test("test_accumulation_matches_big_batch", impl.test_accumulation_matches_big_batch,
                       (accumulate_gradients, in_float64(accumulate_gradients)), WRONG_ACCUMULATIONS,
                       "a correct accumulation differs from one big batch by float rounding (~1e-8 here, other "
                       "orders and float64 differ in other bits): compare with a tolerance, e.g. "
                       "torch.testing.assert_close(rtol=1e-4, atol=1e-6), against ONE backward of the whole batch's "
                       "mean loss, on a dense model (an MoE's aux loss of a big batch is not the mean of its "
                       "micro-batches' aux losses)")
