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

import contextlib
import itertools
import sys
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.testing._comparison as comparison

from .catalogue import Mistake, mistake
from .framework import fail

MESSAGE_CHARS = 600   # of the student's own assertion message, quoted in a failure
# One gradient tensor made this much too large is a wrong implementation too: a test must compare every
# parameter with a tolerance far below it (float rounding here is ~1e-8). Only tensors holding at least
# ONE_TENSOR_SHARE of the total gradient norm are edited, so a bound on the relative error of all
# gradients together (||actual - expected|| / ||expected|| <= 1e-5) still sees each edit.
ONE_TENSOR_ERROR = 1e-2
ONE_TENSOR_SHARE = 1e-3
DEFAULT_FLOAT32_ATOL = 1e-5   # torch.testing.assert_close's atol for float32 when none is given


@dataclass(frozen=True)
class WrongImplementation:
    name: str
    wrong: str                      # what it does wrong
    hint: str                       # why a test may let it through
    accumulate: Callable
    edited_nothing = False          # not a field: a GradientEdit's may be True

    def explain(self, student_test: Callable) -> str:
        """Why ``student_test`` may have let this implementation through."""
        return self.hint


def large_gradients(model) -> list[tuple[str, torch.Tensor]]:
    """(name, .grad) of each parameter whose gradient holds >= ONE_TENSOR_SHARE of the total gradient norm."""
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    total = float(torch.sqrt(sum(grad.double().pow(2).sum() for _, grad in named))) if named else 0.0
    return [(name, grad) for name, grad in named if float(grad.double().norm()) >= ONE_TENSOR_SHARE * total > 0]


class GradientEdit:
    """A wrong implementation: the correct ``accumulate``, then ``edit`` changes the large gradients it left
    (``large_gradients``) in place and returns the (name, gradient) pairs it changed. ``wrong`` and ``hint``
    may name them as {parameters}; ``tensors`` is how many large gradients there were (None: never called)."""

    def __init__(self, name: str, accumulate: Callable, edit: Callable, wrong: str, hint: str):
        self.name, self._accumulate, self._edit, self._wrong, self._hint = name, accumulate, edit, wrong, hint
        self.tensors, self.edited = None, []

    @property
    def edited_nothing(self) -> bool:
        """Called on a model with nothing to edit (e.g. no two gradients of one shape): it was not wrong."""
        return self.tensors is not None and not self.edited

    @property
    def parameters(self) -> str:
        return " and ".join(name for name, _ in self.edited) or "?"

    @property
    def wrong(self) -> str:
        return self._wrong.format(parameters=self.parameters)

    @property
    def hint(self) -> str:
        return self._hint.format(parameters=self.parameters)

    def explain(self, student_test: Callable) -> str:
        return self.hint

    def accumulate(self, model, *args) -> None:
        self._accumulate(model, *args)
        large = large_gradients(model)
        self.tensors, self.edited = len(large), self._edit(large)


class OneGradientOff(GradientEdit):
    """The ``index``-th large gradient made ONE_TENSOR_ERROR too large."""

    def __init__(self, accumulate: Callable, index: int):
        super().__init__(f"accumulate_one_gradient_off[{index}]", accumulate, self._scale,
                         f"correct except that the gradient of {{parameters}} is {ONE_TENSOR_ERROR:.0%} too large",
                         "compare EVERY parameter's gradient (not one tensor, a norm or a sum), with a tolerance "
                         f"far below {ONE_TENSOR_ERROR:.0%}")
        self.index, self.size = index, None    # size: the largest |element| of the edited gradient

    def _scale(self, large):
        edited = large[self.index:self.index + 1]
        for _, grad in edited:
            self.size = float(grad.abs().max())
            grad.mul_(1 + ONE_TENSOR_ERROR)
        return edited

    def explain(self, student_test: Callable) -> str:
        """Why ``student_test`` let this through: run again with the same gradient negated (an error of 200 %),
        it either still passes (the test does not compare this gradient) or fails (the tolerance hides 1 %)."""
        negated = GradientEdit(self.name, self._accumulate,
                               lambda large: _negate_all(large[self.index:self.index + 1]), "", "")
        try:
            student_test(negated.accumulate)
        except AssertionError:
            if self.size * ONE_TENSOR_ERROR >= DEFAULT_FLOAT32_ATOL:
                return (f"your test compares this gradient, with a tolerance that lets a {ONE_TENSOR_ERROR:.0%} "
                        f"error through: choose one far below {ONE_TENSOR_ERROR:.0%}, far above float rounding")
            return (f"your test compares this gradient, but atol {DEFAULT_FLOAT32_ATOL:.0e} "
                    "(torch.testing.assert_close's float32 default) is larger than this gradient's "
                    f"{ONE_TENSOR_ERROR:.0%} error "
                    f"~{self.size * ONE_TENSOR_ERROR:.1e} (its elements are up to ~{self.size:.1e}): set atol "
                    "relative to the gradient scale, far below the smallest error to catch, or bound the relative "
                    "error of all gradients together")
        except Exception:
            return self.hint
        return (f"your test does not compare {self.parameters}'s gradient element-wise (it passes it negated "
                f"too): {self.hint}")


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


def _negate_all(large):
    for _, grad in large:
        grad.neg_()
    return large


def _negate_last(large):
    return _negate_all(large[-1:])


def _swap_same_shape(large):
    """Swaps the first two gradients of one shape (and different values) in the model's order."""
    for (first_name, first), (second_name, second) in itertools.combinations(large, 2):
        if first.shape == second.shape and not torch.equal(first, second):
            held = first.clone()
            first.copy_(second)
            second.copy_(held)
            return [(first_name, first), (second_name, second)]
    return []


def _shift_elements(large):
    for _, grad in large:
        grad.copy_(grad.flatten().roll(1).view_as(grad))
    return large


ELEMENT_WISE = "compare the gradient tensors element-wise, each against the same parameter's expected gradient"


def edited_gradients(accumulate: Callable) -> list[GradientEdit]:
    """Wrong implementations that keep what a weak comparison looks at (each tensor's norm, sum, mean or
    absolute values; the norm or sum of all gradients) and break the gradients themselves."""
    return [
        GradientEdit("accumulate_gradient_ascent", accumulate, _negate_all,
                     "every large gradient negated (gradient ascent): the right norms and absolute values, the wrong "
                     "direction", f"a norm, an absolute value or a square cannot see a sign: {ELEMENT_WISE}"),
        GradientEdit("accumulate_one_gradient_negated", accumulate, _negate_last,
                     "correct except that the gradient of {parameters} is negated: every norm right",
                     f"a norm (of one tensor or of all) cannot see a sign: {ELEMENT_WISE}"),
        GradientEdit("accumulate_gradients_swapped", accumulate, _swap_same_shape,
                     "the gradients of {parameters} (the same shape) swapped: every value right, on the wrong "
                     "parameter", "a total over all parameters (norm, sum) cannot see which parameter a gradient "
                     f"landed on: {ELEMENT_WISE}"),
        GradientEdit("accumulate_elements_shifted", accumulate, _shift_elements,
                     "each gradient tensor's elements shifted by one place: every tensor's norm, sum, mean and "
                     "values right, in the wrong places", "a norm, sum, mean, max or the sorted values of a tensor "
                     f"cannot see where its values are: {ELEMENT_WISE}"),
    ]


class Replayed:
    """``accumulate``, replayed: a call whose inputs equal the first call's bit for bit (the model's class,
    config, mode, weights and buffers, none of them with gradients or hooks; the micro-batches, the other
    arguments, the CPU RNG state) gets the first call's gradients and RNG state instead of running again.
    ``accumulate`` is deterministic, so the result is the same; the grader runs the student's test on ~20
    implementations built on the correct one, and a test builds the same model and batches every time."""

    def __init__(self, accumulate: Callable):
        self.accumulate, self.__name__, self._first = accumulate, accumulate.__name__, None

    def __call__(self, model, micro_batches, *args) -> None:
        inputs = _replayable_inputs(model, micro_batches, args)
        if inputs is not None and self._first is not None and _same(inputs, self._first[0]):
            for param, grad in zip(model.parameters(), self._first[1]):
                param.grad = None if grad is None else grad.clone()
            torch.set_rng_state(self._first[2])
            return
        self.accumulate(model, micro_batches, *args)
        if inputs is not None and self._first is None:
            grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
            self._first = (inputs, grads, torch.get_rng_state())


def _replayable_inputs(model, micro_batches, args):
    """Everything ``accumulate``'s result depends on, or None when replaying could differ from running."""
    modules = list(model.modules())
    if any(p.grad is not None or p._backward_hooks for p in model.parameters()) or any(
            m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks for m in modules):
        return None
    state = [(name, t.detach().clone()) for name, t in (*model.named_parameters(), *model.named_buffers())]
    config = repr(sorted(vars(model.config).items())) if hasattr(model, "config") else None
    batches = [tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in batch) for batch in micro_batches]
    return (type(model), config, [m.training for m in modules], state, batches, args, torch.get_rng_state())


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.device == b.device and torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."


@contextlib.contextmanager
def plain_tensor_comparisons():
    """``torch.testing.assert_close`` without its DTensor unwrapping while the student's test runs: its first
    call imports ``torch.distributed.tensor`` (~0.8 s here, sympy included) to ask whether an argument is a
    DTensor, and a graded test compares plain tensors only; for them the comparison is the same."""
    if "torch.distributed.tensor" in sys.modules or not hasattr(comparison, "_HAS_DTENSOR"):
        yield
        return
    saved, comparison._HAS_DTENSOR = comparison._HAS_DTENSOR, False
    try:
        yield
    finally:
        comparison._HAS_DTENSOR = saved


def grade_student_test(test_name: str, student_test: Callable, correct: Sequence[Callable],
                       wrong: Sequence[WrongImplementation], correct_hint: str) -> None:
    """``student_test(c)`` returns for every ``c`` in ``correct``; ``student_test(w.accumulate)`` raises
    ``AssertionError`` for every ``w`` in ``wrong``, ``one_gradient_off(correct[0])`` and
    ``edited_gradients(correct[0])``. A stub's NotImplementedError propagates (TODO)."""
    with plain_tensor_comparisons():
        replayed = Replayed(correct[0])
        for implementation in (replayed, *correct[1:]):
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
        for implementation in itertools.chain(wrong, one_gradient_off(replayed), edited_gradients(replayed)):
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
            if implementation.edited_nothing:
                continue
            fail(f"your test let through {implementation.name}: {implementation.wrong}",
                 "the test returned (passed)", "AssertionError (the test fails on this implementation)",
                 f"hint: {implementation.explain(student_test)}. And does the test assert on every parameter's "
                 "gradient, with a tolerance near float rounding?")


# --- mistakes both test-writing exercises share ------------------------------------------------------

COMPARE_EVERY_PARAMETER = "    for (name, param), expected in zip(model.named_parameters(), big.parameters()):\n"


def assert_gradients(rtol: str, actual: str = "param.grad", expected: str = "expected.grad",
                     tolerance: str = "rtol={rtol}, atol=1e-6") -> str:
    """The last line of both reference tests: every parameter's gradient against the big batch's (a weak
    comparison puts ``actual`` and ``expected`` in place of the gradients, another ``tolerance``)."""
    arguments = ", ".join(filter(None, (actual, expected, tolerance.format(rtol=rtol))))
    return (f"        torch.testing.assert_close({arguments},\n"
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
        mistake("test_assert_close_defaults", "assert_close's float32 defaults (atol=1e-5): a 1 % error of a small "
                "gradient (norm weights, elements ~6e-4) hides under atol", function,
                assert_gradients(rtol), assert_gradients(rtol, tolerance=""), check),
        mistake("test_compares_norms_per_parameter", "compares each parameter's gradient norm: a negated gradient "
                "passes", function, assert_gradients(rtol),
                assert_gradients(rtol, "param.grad.norm()", "expected.grad.norm()"), check),
        mistake("test_compares_sums", "compares each parameter's gradient sum: its elements in another order pass",
                function, assert_gradients(rtol), assert_gradients(rtol, "param.grad.sum()", "expected.grad.sum()"),
                check),
        mistake("test_abs_values", "compares the absolute values of the gradients: a negated gradient passes",
                function, assert_gradients(rtol), assert_gradients(rtol, "param.grad.abs()", "expected.grad.abs()"),
                check),
        mistake("test_skips_vectors", "compares the matrices only (param.dim() > 1): the norm weights' gradients "
                "go unchecked", function, comparison,
                COMPARE_EVERY_PARAMETER + "        if param.dim() < 2:\n            continue\n"
                + assert_gradients(rtol), check),
    ]
