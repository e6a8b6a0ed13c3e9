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
