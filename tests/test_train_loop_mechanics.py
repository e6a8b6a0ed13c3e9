"""Lesson 14 alignment tests: every check of ``course.checks.lesson14``, for each implementation.

pytest collects ``test_lesson14`` (student and reference by default; see tests/conftest.py).
As a script it prints the seed lesson's mechanics report for your impl/ and exits non-zero on a
TODO or a mismatch:

    python tests/test_train_loop_mechanics.py [--impl student|reference]
"""
from __future__ import annotations

import argparse
import sys

import pytest

from course.checks import get_lesson, load_impl
from course.checks.framework import CheckFailure, expect_equal
from course.checks.lesson14 import mechanics_report

LESSON = get_lesson("14")


@pytest.mark.parametrize("check_name", [c.name for c in LESSON.checks])
def test_lesson14(graded, check_name):
    graded(LESSON, check_name)


def test_mechanics_report_matches_the_seed(impl_module, impl_name):
    """The script's report: zero lr diffs, scaled_loss 2.0, optimizer steps at [4, 8]."""
    try:
        lines = mechanics_report(impl_module(LESSON))
    except NotImplementedError as exc:
        if impl_name == "reference":
            raise
        pytest.skip(f"TODO: {exc}")
    expected = [f"lr_step_{s}_diff=0.000000000000" for s in (0, 1, 5, 10, 19, 20)] + [
        "scaled_loss=2.000000", "optimizer_step_micro_steps=[4, 8]"]
    expect_equal("mechanics report lines", lines, expected)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=["student", "reference"], default="student")
    args = parser.parse_args(argv)
    try:
        lines = mechanics_report(load_impl(LESSON, args.impl))
        print("\n".join(lines))
        test_mechanics_report_matches_the_seed(lambda lesson: load_impl(lesson, args.impl), args.impl)
    except NotImplementedError as exc:
        print(f"train_loop_mechanics=TODO: {exc}", file=sys.stderr)
        return 1
    except CheckFailure as exc:
        print(f"train_loop_mechanics=failed\n{exc}", file=sys.stderr)
        return 1
    print("train_loop_mechanics=passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
