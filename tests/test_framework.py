"""The grader's scalar comparison: what it lets through decides what every numeric check can reject."""
from __future__ import annotations

import math

import pytest

from course.checks.framework import CheckFailure, expect_close

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("actual, expected, rtol, atol, passes", [
    (1.0, 1.0, 0.0, 0.0, True),
    (1.0 + 1e-9, 1.0, 1e-6, 0.0, True),
    (1.1, 1.0, 1e-6, 0.0, False),
    (1e-7, 0.0, 0.0, 1e-6, True),
    (INF, INF, 1e-6, 0.0, True),
    (-INF, -INF, 1e-6, 0.0, True),
    (12.3, INF, 1e-6, 0.0, False),    # a skipped update's grad norm is inf: any finite value is wrong
    (0.0, INF, 1e-6, 0.0, False),
    (-INF, INF, 1e-6, 0.0, False),
    (INF, 1.0, 1e-6, 0.0, False),
    (NAN, INF, 1e-6, 0.0, False),
    (NAN, 1.0, 1e-6, 0.0, False),
    (1.0, NAN, 1e-6, 0.0, False),
    (None, None, 1e-6, 0.0, True),
    (None, 1.0, 1e-6, 0.0, False),
    (1.0, None, 1e-6, 0.0, False),
])
def test_expect_close(actual, expected, rtol, atol, passes):
    try:
        expect_close("value", actual, expected, rtol=rtol, atol=atol)
        outcome = True
    except CheckFailure:
        outcome = False
    assert outcome == passes, (f"expect_close(ACTUAL {actual!r}, EXPECTED {expected!r}, rtol={rtol}, atol={atol}) "
                               f"{'passed' if outcome else 'failed'}; it must {'pass' if passes else 'fail'}")
