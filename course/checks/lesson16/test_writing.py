"""Lesson 16's test-writing exercise: the student's ``test_token_weighted_matches_global_batch`` must pass
the correct token weighting and fail each wrong one below."""
from __future__ import annotations

from course.protocol.text import shifted_target_count, token_nll_sum
from course.runs import accumulate_token_weighted, in_float64

from ..framework import check
from ..student_tests import WrongImplementation, grade_student_test


# --- test_token_weighted_matches_global_batch: the student's test against wrong accumulations --


def _backward_nll_sums(model, micro_batches, divisors):
    """Backpropagate each micro-batch's NLL sum divided by its divisor."""
    for (input_ids, labels), divisor in zip(micro_batches, divisors):
        (token_nll_sum(model(input_ids).logits, labels) / divisor).backward()


def accumulate_mean_of_means(model, micro_batches):
    k = len(micro_batches)
    _backward_nll_sums(model, micro_batches, [max(shifted_target_count(lab), 1) * k for _, lab in micro_batches])


def accumulate_counting_masked_targets(model, micro_batches):
    total = sum(lab[..., 1:].numel() for _, lab in micro_batches)
    _backward_nll_sums(model, micro_batches, [total] * len(micro_batches))


def accumulate_by_own_count(model, micro_batches):
    _backward_nll_sums(model, micro_batches, [max(shifted_target_count(lab), 1) for _, lab in micro_batches])


def accumulate_counting_unshifted(model, micro_batches):
    total = sum(int((lab != -100).sum()) for _, lab in micro_batches)
    _backward_nll_sums(model, micro_batches, [total] * len(micro_batches))


WRONG_TOKEN_WEIGHTINGS = (
    WrongImplementation("accumulate_mean_of_means", "lesson 14's loss / K: each micro-batch's mean NLL / K, so a "
                        "target in a sparse micro-batch weighs more", "with equal valid-target counts per "
                        "micro-batch (or K = 1) the mean of means IS the global mean: make the counts unequal",
                        accumulate_mean_of_means),
    WrongImplementation("accumulate_counting_masked_targets", "N counts every shifted position, -100 included",
                        "without masked (-100) targets the two counts are equal: mask some",
                        accumulate_counting_masked_targets),
    WrongImplementation("accumulate_by_own_count", "divides each micro-batch's NLL sum by its own count (K times "
                        "the mean-of-means gradient)", "with K = 1 one count is the global count: use K >= 2",
                        accumulate_by_own_count),
    WrongImplementation("accumulate_counting_unshifted", "N counts labels != -100 without the shift (position 0 "
                        "is never a target)", "if position 0 of every sample is masked the two counts agree: keep "
                        "valid labels at the start of some samples", accumulate_counting_unshifted),
)


@check("test_token_weighted_matches_global_batch", objective="test_writing", slow=True)
def token_weighted_test_passes_correct_and_fails_wrong(impl):
    """Your test passes the correct token-weighted accumulation (course/runs/accumulation.py, and the same in
    float64) and raises AssertionError on each of 4 wrong ones: the mean of micro-batch means, a count with the
    masked targets, each micro-batch by its own count, a count without the shift; on one gradient tensor 1 % off
    (each large tensor in turn); on 5 that keep every norm and sum: all gradients negated, one negated, two
    swapped, each tensor's elements shifted, the small elements negated; on one element of one tensor negated
    (each large tensor in turn); on the smallest gradient zeroed; and it fails (any exception) on a parameter left without a gradient and on an implementation that
    raises."""
    grade_student_test("test_token_weighted_matches_global_batch", impl.test_token_weighted_matches_global_batch,
                       (accumulate_token_weighted, in_float64(accumulate_token_weighted)), WRONG_TOKEN_WEIGHTINGS,
                       "a correct accumulation differs from one global-batch backward by float rounding (~1e-8 "
                       "here, float64 in other bits): compare with a tolerance, e.g. torch.testing.assert_close("
                       "rtol=1e-5, atol=1e-6), against ONE backward of the NLL sum / valid targets of the whole "
                       "global batch")
