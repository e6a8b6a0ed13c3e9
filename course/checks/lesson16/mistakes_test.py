"""Lesson 16's catalogue for the student's test ``test_token_weighted_matches_global_batch``: the reference test
(course/reference/train_session.py) with one edit each, which the test-writing check must fail, and an equivalent
test it must pass. ``mistakes`` splices them into the lesson's catalogue."""
from __future__ import annotations

from ..catalogue import equivalent, mistake
from ..student_tests import COMPARE_EVERY_PARAMETER, assert_gradients, weak_comparisons
from .test_writing import token_weighted_test_passes_correct_and_fails_wrong

TEST_MISTAKES = [
    *weak_comparisons("test_token_weighted_matches_global_batch", "1e-5",
                      token_weighted_test_passes_correct_and_fails_wrong,
                      "    accumulate_token_weighted(model, micro_batches)\n"),
    mistake("test_equal_counts", "every sample fully valid: 30 targets per micro-batch, the mean of means is right",
        "test_token_weighted_matches_global_batch",
        "cuts = ((16, 15), (9, 3), (2, 2), (2, 0))", "cuts = ((16, 16),) * 4",
        token_weighted_test_passes_correct_and_fails_wrong, rule="make the counts unequal"),
    mistake("test_one_micro_batch", "K = 1: one micro-batch's count is the global count",
        "test_token_weighted_matches_global_batch", "cuts = ((16, 15), (9, 3), (2, 2), (2, 0))", "cuts = ((16, 15),)",
        token_weighted_test_passes_correct_and_fails_wrong, rule="(or K = 1)"),
    mistake("test_target_counts_unshifted", "the global-batch target divides by labels != -100 (no shift)",
        "test_token_weighted_matches_global_batch",
        "/ shifted_target_count(labels)).backward()", "/ int((labels != -100).sum())).backward()",
        token_weighted_test_passes_correct_and_fails_wrong, rule="NLL sum / valid targets of the whole global batch"),
]

TEST_EQUIVALENTS = [
    equivalent("test_oracle_gradients", "the target from course.runs.global_batch_gradients (the same one "
        "backward) instead of computing it in the test",
        "test_token_weighted_matches_global_batch",
        COMPARE_EVERY_PARAMETER + assert_gradients("1e-5"),
        "    from course.runs import global_batch_gradients\n"
        "    oracle, _, _ = global_batch_gradients(masked_micro_batches(cuts))\n"
        "    for name, param in model.named_parameters():\n"
        "        assert torch.allclose(param.grad, oracle[name], rtol=1e-5, atol=1e-6), name\n"),
]
