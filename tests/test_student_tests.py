"""A weak student test fails the test-writing grader with a message that names WHY: the wrong
implementation it let through and the cause (a sign, a place, an untested tensor, assert_close's atol)."""
from __future__ import annotations

import pytest

from mistake_results import mistake_result

from course.checks import get_lesson
from course.checks.framework import FAIL

# catalogued weakening of the reference test -> what its failure message must say
WHY = {
    "test_compares_norms_per_parameter": ("accumulate_gradient_ascent", "cannot see a sign"),
    "test_abs_values": ("accumulate_gradient_ascent", "cannot see a sign"),
    "test_compares_sums": ("accumulate_elements_shifted", "cannot see where its values are"),
    "test_assert_close_defaults": ("accumulate_one_gradient_off", "atol 1e-05 (torch.testing.assert_close's "
                                   "float32 default) is larger than this gradient's 1% error"),
    "test_skips_vectors": ("accumulate_one_gradient_off", "does not compare"),
    "test_rtol_one_percent": ("accumulate_one_gradient_off[0]", "with a tolerance that lets a 1% error through"),
    "test_largest_element_only": ("accumulate_small_elements_negated", "only the large elements"),
    "test_large_elements_only": ("accumulate_small_elements_negated", "only the large elements"),
    "test_first_rows_only": ("accumulate_one_element_negated", "cannot see the others"),
    "test_first_elements_only": ("accumulate_one_element_negated", "cannot see the others"),
    "test_strided_elements": ("accumulate_one_element_negated", "cannot see the others"),
    "test_skips_missing_gradients": ("accumulate_forgets_a_parameter", "a missing one fails the test"),
    "test_skips_small_gradients": ("accumulate_one_gradient_off", "does not compare"),
    "test_swallows_errors": ("accumulate_raises", "must fail the test: let it propagate"),
    "test_cosine_only": ("made 1.5 times too large", "compares directions only"),
    "test_tolerance_far_too_loose": ("passes every wrong gradient the grader tried", "tolerance is larger than the "
                                     "gradients"),
    "test_asserts_nothing": ("passes every wrong gradient the grader tried", "compares the implementation with "
                             "itself"),
}


@pytest.mark.parametrize("lesson_id", ["14", "16"])
@pytest.mark.parametrize("name", sorted(WHY))
def test_weak_comparison_fails_with_its_cause(lesson_id, name):
    lesson = get_lesson(lesson_id)
    weak = next(m for m in lesson.mistakes if m.name == name)
    result = mistake_result(weak)
    assert result.status == FAIL
    for expected in WHY[name]:
        assert expected in result.message, f"{name}: {expected!r} not in the message:\n{result.message}"


def _gradients(model):
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _accumulation_inputs():
    from course.runs import LoopScenario, tiny_batches, tiny_model
    scenario = LoopScenario("replay", hidden_size=32, num_hidden_layers=1, max_length=16)
    input_ids, labels = tiny_batches(4, scenario.max_length, 1, seed=3)[0]
    return (lambda: tiny_model(scenario)), list(zip(input_ids.split(2), labels.split(2)))


def test_a_replayed_accumulation_equals_running_it_and_reruns_on_any_other_input():
    """The grader replays the correct accumulation for a test that calls it again on the same inputs: the
    replay must leave bit-identical gradients and RNG state, and anything else must run for real."""
    import torch

    from course.checks.student_tests import Replayed

    calls = []

    def counted(model, micro_batches, k):   # divides by k whatever the micro-batch count, like a wrong one may
        calls.append(k)
        for input_ids, labels in micro_batches:
            out = model(input_ids, labels=labels)
            ((out.loss + out.aux_loss) / k).backward()

    build, micro_batches = _accumulation_inputs()
    replayed = Replayed(counted)
    first = build()
    replayed(first, micro_batches, 2)
    rng_after_first = torch.get_rng_state()
    expected = _gradients(first)

    again = build()
    replayed(again, micro_batches, 2)
    assert len(calls) == 1, f"the same inputs ran {len(calls)} times, EXPECTED 1 (replayed)"
    for actual, want in zip(_gradients(again), expected):
        assert torch.equal(actual, want), "a replay must give the first call's gradients bit for bit"
    assert torch.equal(torch.get_rng_state(), rng_after_first), "a replay must leave the RNG where running does"

    other_weights = build()
    with torch.no_grad():
        next(other_weights.parameters()).mul_(1.5)
    pending = build()
    pending(*micro_batches[0]).logits.sum().backward()   # a gradient already there: grads add up in another order
    hooked = build()
    hooked.model.norm.weight.register_hook(lambda grad: grad * 2)
    evaluating = build().eval()
    for label, model, batches, k in [("other weights", other_weights, micro_batches, 2),
                                     ("other micro-batches", build(), micro_batches[::-1], 2),
                                     ("another K", build(), micro_batches, 3),
                                     ("a pending gradient", pending, micro_batches, 2),
                                     ("a gradient hook", hooked, micro_batches, 2),
                                     ("eval mode", evaluating, micro_batches, 2)]:
        before = len(calls)
        replayed(model, batches, k)
        assert len(calls) == before + 1, f"{label}: replayed, EXPECTED a real run"


def test_plain_tensor_comparisons_compare_as_assert_close_does_and_restore_it():
    """While a student's test runs, assert_close skips its DTensor import; on plain tensors it must pass and fail
    exactly as outside, and leave torch as it found it, even when the test raises."""
    import torch
    import torch.testing._comparison as comparison

    from course.checks.student_tests import plain_tensor_comparisons

    expected, close, off = torch.ones(3), torch.ones(3) + 1e-7, torch.tensor([1.0, 1.0, 1.01])

    def verdict(actual):
        try:
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
        except AssertionError as exc:
            return str(exc)
        return "passed"

    outside = [verdict(close), verdict(off)]
    saved = comparison._HAS_DTENSOR
    with pytest.raises(AssertionError):
        with plain_tensor_comparisons():
            inside = [verdict(close), verdict(off)]
            torch.testing.assert_close(off, expected)
    assert inside == outside, f"ACTUAL {inside} EXPECTED {outside} (the same verdicts and messages)"
    assert outside[0] == "passed" and outside[1] != "passed"
    assert comparison._HAS_DTENSOR is saved, "the DTensor flag must be restored after an assertion escapes"
