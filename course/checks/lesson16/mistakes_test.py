"""Lesson 16's catalogue for the student's test ``test_token_weighted_matches_global_batch``: the reference test
(course/reference/train_session.py) with one edit each, which the test-writing check must fail, and an equivalent
test it must pass. ``mistakes`` splices them into the lesson's catalogue."""
from __future__ import annotations

from dataclasses import replace

from ..catalogue import equivalent, mistake
from ..student_tests import COMPARE_EVERY_PARAMETER, assert_gradients, weak_comparisons
from .test_writing import token_weighted_test_passes_correct_and_fails_wrong

# the words of the hint each weakening of the student's test gets (course/checks/wrong_gradients.py computes it)
WEAK_COMPARISON_RULES = {
    "test_swallows_errors": "let it propagate",
    "test_largest_element_only": "compares some elements",
    "test_first_rows_only": "compares some elements",
    "test_strided_elements": "not every element of it",
    "test_cosine_only": "compares directions only",
    "test_skips_missing_gradients": "skips a parameter without a gradient",
    "test_skips_small_gradients": "compare EVERY parameter's gradient",
    "test_asserts_nothing": "it compares nothing",
    "test_one_parameter_only": "compare EVERY parameter's gradient",
    "test_gradient_norm_only": "not one tensor, a norm or a sum",
    "test_rtol_one_percent": "lets a 1% error through",
    "test_tolerance_far_too_loose": "its tolerance is larger than the gradients",
    "test_assert_close_defaults": "float32 default",
    "test_compares_norms_per_parameter": "cannot see a sign",
    "test_compares_sums": "cannot see where its values are",
    "test_abs_values": "cannot see a sign",
    "test_skips_vectors": "compare EVERY parameter's gradient",
    "test_large_elements_only": "only the large elements",
}

TEST_MISTAKES = [
    *(replace(weak, rule=WEAK_COMPARISON_RULES[weak.name])
      for weak in weak_comparisons("test_token_weighted_matches_global_batch", "1e-5",
                                   token_weighted_test_passes_correct_and_fails_wrong,
                                   "    accumulate_token_weighted(model, micro_batches)\n")),
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
