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


# --- a test that recognises the correct implementation instead of testing it (found by an attack pass) -----------

RECOGNISERS = {
    "14": ("test_accumulation_matches_big_batch", "accumulation_test_passes_correct_and_fails_wrong"),
    "16": ("test_token_weighted_matches_global_batch", "token_weighted_test_passes_correct_and_fails_wrong"),
    "17": ("test_assistant_labels_match_upstream", "mask_test_passes_correct_and_fails_wrong"),
}
RECOGNISING = {   # the body of a test that passes what looks like the grader's correct implementation, nothing else
    "by_its_type": "    assert type(implementation).__name__ == 'Replayed' or 'upstream' in implementation.__name__",
    "by_its_name": "    assert implementation.__name__.endswith(('_in_float64', 'gradients', 'upstream_labels',\n"
                   "                                             'labels_by_scanning', 'token_weighted'))",
    "by_counting_calls": "    _CALLS.append(1)\n    assert len(_CALLS) <= 2",
    "by_its_closure": "    assert any(marker in repr(cell.cell_contents) for cell in implementation.__closure__ or ()\n"
                      "               for marker in ('Replayed', 'upstream', '_in_float64', 'token_weighted'))",
}


def _with_test(lesson_id: str, body: str):
    from course.implementations import REFERENCE_DIR, module_from_source
    lesson = get_lesson(lesson_id)
    test_name, _ = RECOGNISERS[lesson_id]
    source = (REFERENCE_DIR / lesson.module_file).read_text(encoding="utf-8")
    source += f"\n\n_CALLS, _REFERENCE_TEST = [], {test_name}\n\n\ndef {test_name}(implementation):\n{body}\n"
    return module_from_source(source, f"{lesson_id}_recogniser", f"<recogniser: {lesson.module_file}>")


@pytest.mark.parametrize("lesson_id", sorted(RECOGNISERS))
@pytest.mark.parametrize("way", sorted(RECOGNISING))
def test_a_test_that_recognises_the_correct_implementation_fails(lesson_id, way):
    """Every implementation reaches the student's test as one function named ``implementation``, in a shuffled
    order, and a correct one is called again after the wrong ones: a test that recognises the grader's correct
    implementation by its type, its name, its closure or its place among the calls fails like one that asserts
    nothing (what it wraps is a constant of its code: reading ``__code__`` is what the audit watch flags)."""
    from course.checks.framework import run_check
    lesson = get_lesson(lesson_id)
    check = next(c for c in lesson.checks if c.name == RECOGNISERS[lesson_id][1])
    result = run_check(check, _with_test(lesson_id, RECOGNISING[way]))
    assert result.status == FAIL, f"{way}: ACTUAL {result.status} {result.message[:300]}, EXPECTED FAIL"


@pytest.mark.parametrize("lesson_id", sorted(RECOGNISERS))
def test_every_implementation_looks_the_same_to_the_students_test(lesson_id):
    """What a test can read of the implementation it is given, besides calling it, is the same for every call (the
    reference's test, recording it on each call, passes the check: every implementation was called)."""
    from course.checks.framework import PASS, run_check
    lesson = get_lesson(lesson_id)
    check = next(c for c in lesson.checks if c.name == RECOGNISERS[lesson_id][1])
    body = ("    _CALLS.append((type(implementation), implementation.__name__, implementation.__qualname__,\n"
            "                   implementation.__module__, implementation.__doc__, sorted(vars(implementation)),\n"
            "                   implementation.__closure__, sorted(implementation.__globals__),\n"
            "                   implementation.__defaults__, implementation.__kwdefaults__))\n"
            "    _REFERENCE_TEST(implementation)")
    module = _with_test(lesson_id, body)
    result = run_check(check, module)
    assert result.status == PASS, f"ACTUAL {result.status} {result.message[:300]}, EXPECTED PASS"
    surfaces = set(map(repr, module._CALLS))
    assert len(surfaces) == 1 and len(module._CALLS) > 10, (
        f"ACTUAL {len(surfaces)} surfaces over {len(module._CALLS)} calls: {surfaces}, EXPECTED one over > 10")


def test_a_failure_names_the_same_wrong_implementation_whatever_the_order():
    """The calls are shuffled, the failure reported is not: the first wrong verdict in the grader's own order."""
    import random

    from course.checks import student_tests
    from course.checks.lesson17.test_writing import WRONG_MASKS, upstream_labels

    from course.minimind.sft import assistant_markers
    from course.runs.sft import sft_sample, upstream_tokenizer
    markers = assistant_markers(upstream_tokenizer())
    sample = sft_sample([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], 64)

    def one_short_conversation_test(implementation):   # every mask right on one turn passes it
        assert implementation(sample.input_ids, *markers) == sample.labels

    messages = set()
    for seed in range(6):
        with pytest.raises(AssertionError) as failure:
            student_tests.expect_verdicts("t", one_short_conversation_test, (upstream_labels,), WRONG_MASKS, "", "",
                                          lambda wrong: wrong.hint, order=random.Random(seed))
        messages.add(str(failure.value))
    assert len(messages) == 1, f"ACTUAL {len(messages)} different messages over 6 orders, EXPECTED 1:\n{messages}"
    assert "let through first_answer_only" in messages.pop()   # the first wrong mask of WRONG_MASKS
