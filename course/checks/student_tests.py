"""Grading a test the student wrote: it must pass correct implementations and fail wrong ones.

A test-writing exercise is a function ``test_...(implementation)`` that raises ``AssertionError``
when ``implementation`` is wrong. ``grade_student_test`` runs it on correct implementations (it must
return) and on each catalogued wrong implementation (it must raise ``AssertionError``).

Only ``AssertionError`` (what ``assert`` and ``torch.testing.assert_close`` raise) counts as rejecting
a wrong implementation. Every wrong implementation here returns normally and leaves well-formed
gradients, so a test that crashes on one (``TypeError``, ``KeyError``...) did not reach its verdict:
the crash comes from the test's own code, and the same crash can hide a real bug tomorrow.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .framework import fail

MESSAGE_CHARS = 600   # of the student's own assertion message, quoted in a failure


@dataclass(frozen=True)
class WrongImplementation:
    name: str
    wrong: str                      # what it does wrong
    hint: str                       # why a test may let it through
    accumulate: Callable


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."


def grade_student_test(test_name: str, student_test: Callable, correct: Sequence[Callable],
                       wrong: Sequence[WrongImplementation], correct_hint: str) -> None:
    """``student_test(c)`` returns for every ``c`` in ``correct``; ``student_test(w.accumulate)`` raises
    ``AssertionError`` for every ``w`` in ``wrong``. A stub's NotImplementedError propagates (TODO)."""
    for implementation in correct:
        try:
            student_test(implementation)
        except NotImplementedError:
            raise
        except AssertionError as exc:
            fail(f"{test_name} rejects a CORRECT implementation ({implementation.__name__})", _short(exc),
                 "the test returns (passes)", f"hint: {correct_hint}")
        except Exception as exc:
            fail(f"{test_name} crashed on a CORRECT implementation ({implementation.__name__})", _short(exc),
                 "the test returns (passes)", "hint: the implementation's contract is in its docstring "
                 "(course/runs/accumulation.py); run your test on it by hand")
    for implementation in wrong:
        try:
            student_test(implementation.accumulate)
        except NotImplementedError:
            raise
        except AssertionError:
            continue
        except Exception as exc:
            fail(f"{test_name} crashed on the wrong implementation {implementation.name} instead of failing "
                 f"an assertion", _short(exc), "AssertionError (assert / torch.testing.assert_close)",
                 "hint: a test states its verdict with an assertion; a crash is a bug in the test itself")
        fail(f"your test let through {implementation.name}: {implementation.wrong}",
             "the test returned (passed)", "AssertionError (the test fails on this implementation)",
             f"hint: {implementation.hint}. And does the test assert on every parameter's gradient, with a "
             "tolerance near float rounding?")
