"""Shared pytest wiring: choose the implementation under test and turn check results into outcomes.

    pytest                      # student (impl/) and reference
    pytest --impl reference     # only the reference
    pytest --impl-dir DIR       # a submission laid out like impl/
"""
from __future__ import annotations

import functools

import pytest

from course.checks import get_lesson
from course.checks.framework import FAIL, TODO
from course.checks.results import describe, grade_exercises


def pytest_addoption(parser):
    parser.addoption("--impl", choices=["student", "reference", "both"], default="both",
                     help="implementation(s) the exercise tests grade (default: both)")
    parser.addoption("--impl-dir", default=None, help="grade a directory laid out like impl/")


def pytest_generate_tests(metafunc):
    if "impl_name" in metafunc.fixturenames:
        config = metafunc.config
        if config.getoption("--impl-dir"):
            names = ["dir"]
        elif config.getoption("--impl") == "both":
            names = ["student", "reference"]
        else:
            names = [config.getoption("--impl")]
        metafunc.parametrize("impl_name", names)


@functools.lru_cache(maxsize=None)
def _load(lesson_id: str, impl_name: str, impl_dir):
    return get_lesson(lesson_id).load("student" if impl_name == "dir" else impl_name, impl_dir)


@pytest.fixture
def impl_module(request, impl_name):
    """A factory: ``impl_module(lesson)`` -> the module under test for that lesson."""
    impl_dir = request.config.getoption("--impl-dir")
    return lambda lesson: _load(lesson.lesson_id, impl_name, impl_dir)


@pytest.fixture
def graded(impl_module, impl_name):
    """``graded(lesson, check_name)``: run one check; TODO skips (untouched stub), FAIL fails."""
    def run(lesson, check_name: str):
        [result] = grade_exercises(lesson, impl_module(lesson), check_names=[check_name])
        problem = result.first_problem
        if result.status == TODO:
            if impl_name != "student" and impl_name != "dir":
                pytest.fail(f"the {impl_name} implementation must not raise NotImplementedError: "
                            f"{describe(problem)}", pytrace=False)
            pytest.skip(describe(problem))
        if result.status == FAIL:
            pytest.fail(describe(problem), pytrace=False)
    return run
