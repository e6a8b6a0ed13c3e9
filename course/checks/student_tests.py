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

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from .catalogue import Mistake, mistake
from .framework import fail

MESSAGE_CHARS = 600   # of the student's own assertion message, quoted in a failure
# One gradient tensor made this much too large is a wrong implementation too: a test must compare every
# parameter with a tolerance far below it (float rounding here is ~1e-8). Only tensors holding at least
# ONE_TENSOR_SHARE of the total gradient norm are perturbed, so a bound on the relative error of all
# gradients together (||actual - expected|| / ||expected|| <= 1e-5) still sees each perturbation.
ONE_TENSOR_ERROR = 1e-2
ONE_TENSOR_SHARE = 1e-3


@dataclass(frozen=True)
class WrongImplementation:
    name: str
    wrong: str                      # what it does wrong
    hint: str                       # why a test may let it through
    accumulate: Callable


class OneGradientOff:
    """The correct ``accumulate``, then the gradient of the ``index``-th large parameter tensor of the model
    it was given scaled by ``1 + ONE_TENSOR_ERROR``. ``tensors`` records how many qualify (None: never called)."""

    def __init__(self, accumulate: Callable, index: int):
        self.index, self.name, self.tensors, self.parameter = index, f"accumulate_one_gradient_off[{index}]", None, "?"
        self.hint = ("compare EVERY parameter's gradient (not one tensor, a norm or a sum), with a tolerance far "
                     f"below {ONE_TENSOR_ERROR:.0%}")
        self._accumulate = accumulate

    @property
    def wrong(self) -> str:
        return f"correct except that the gradient of {self.parameter} is {ONE_TENSOR_ERROR:.0%} too large"

    def accumulate(self, model, *args) -> None:
        self._accumulate(model, *args)
        named = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
        total = float(torch.sqrt(sum(p.grad.double().pow(2).sum() for _, p in named))) if named else 0.0
        large = [(name, p) for name, p in named if float(p.grad.double().norm()) >= ONE_TENSOR_SHARE * total > 0]
        self.tensors = len(large)
        if self.index < len(large):
            self.parameter, param = large[self.index]
            param.grad.mul_(1 + ONE_TENSOR_ERROR)


def one_gradient_off(accumulate: Callable) -> Iterator[OneGradientOff]:
    """One wrong implementation per large gradient tensor of the model the student's test uses, made
    lazily: the count is known once the test has called the first one."""
    index = 0
    while True:
        wrong = OneGradientOff(accumulate, index)
        yield wrong
        index += 1
        if wrong.tensors is None or index >= wrong.tensors:
            return


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."


def grade_student_test(test_name: str, student_test: Callable, correct: Sequence[Callable],
                       wrong: Sequence[WrongImplementation], correct_hint: str) -> None:
    """``student_test(c)`` returns for every ``c`` in ``correct``; ``student_test(w.accumulate)`` raises
    ``AssertionError`` for every ``w`` in ``wrong`` and in ``one_gradient_off(correct[0])``. A stub's
    NotImplementedError propagates (TODO)."""
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
    for implementation in itertools.chain(wrong, one_gradient_off(correct[0])):
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


# --- mistakes both test-writing exercises share ------------------------------------------------------

COMPARE_EVERY_PARAMETER = "    for (name, param), expected in zip(model.named_parameters(), big.parameters()):\n"


def assert_gradients(rtol: str) -> str:
    """The last line of both reference tests: every parameter's gradient against the big batch's."""
    return (f"        torch.testing.assert_close(param.grad, expected.grad, rtol={rtol}, atol=1e-6,\n"
            '                                   msg=lambda detail: f"gradient of {name}: {detail}")\n')


def weak_comparisons(function: str, rtol: str, check: Callable) -> list[Mistake]:
    """The weakenings of a reference test's last lines (``function`` ends by comparing every parameter's
    gradient with ``assert_close(rtol=rtol, atol=1e-6)``); each must FAIL ``check``."""
    comparison = COMPARE_EVERY_PARAMETER + assert_gradients(rtol)
    return [
        mistake("test_asserts_nothing", "the test compares nothing: every implementation passes", function,
                assert_gradients(rtol), "        pass\n", check),
        mistake("test_one_parameter_only", "compares the gradient of the first parameter only (the embedding)",
                function, comparison, comparison + "        break\n", check),
        mistake("test_gradient_norm_only", "compares the norm of all gradients together, not the gradients", function,
                comparison,
                "    norms = [torch.stack([p.grad.norm() for p in m.parameters()]).norm() for m in (model, big)]\n"
                f"    torch.testing.assert_close(norms[0], norms[1], rtol={rtol}, atol=1e-6)\n", check),
        mistake("test_rtol_one_percent", "rtol=1e-2: a gradient 1 % off in one tensor passes", function,
                f"rtol={rtol}, atol=1e-6,", "rtol=1e-2, atol=1e-6,", check),
        mistake("test_tolerance_far_too_loose", "atol=1.0: larger than the gradients themselves", function,
                f"rtol={rtol}, atol=1e-6,", f"rtol={rtol}, atol=1.0,", check),
    ]
