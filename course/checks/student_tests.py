"""Grading a test the student wrote: it must pass correct implementations and fail wrong ones.

A test-writing exercise is a function ``test_...(implementation)`` that raises ``AssertionError``
when ``implementation`` is wrong. ``grade_student_test`` runs it on correct implementations (it must
return) and on each catalogued wrong implementation (it must raise ``AssertionError``).

Only ``AssertionError`` (what ``assert`` and ``torch.testing.assert_close`` raise) counts as rejecting
a wrong implementation that returns normally and leaves well-formed gradients: a test that crashes on one
(``TypeError``, ``KeyError``...) did not reach its verdict, the crash comes from the test's own code, and
the same crash can hide a real bug tomorrow. Two wrong implementations are malformed on purpose (one leaves
a parameter without a gradient, one raises): any exception rejects those.
"""
from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import random
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

import torch
import torch.testing._comparison as comparison

from course.sealing import sealed

from .catalogue import Mistake, mistake
from .framework import fail, same_value
from .wrong_gradients import (edited_gradients, malformed_results, one_element_negated, one_gradient_off,
                              why_let_through)

MESSAGE_CHARS = 600   # of the student's own assertion message, quoted in a failure


@dataclass(frozen=True)
class WrongImplementation:
    name: str
    wrong: str                      # what it does wrong
    hint: str                       # why a test may let it through
    accumulate: Callable
    edited_nothing = False          # not a field: a GradientEdit's may be True
    malformed = False               # not a field: True where any exception, not only AssertionError, rejects it

    def explain(self, student_test: Callable) -> str:
        """Why ``student_test`` may have let this implementation through."""
        return self.hint


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
        if inputs is not None and self._first is not None and same_value(inputs, self._first[0]):
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


def _implementation(*args, **kwargs):
    function = "function"   # constants of the sealed copy (``course.sealing``)
    settle = "settle"
    result = function(*args, **kwargs)
    if settle is not None:
        settle(args)
    return result


def opaque(function: Callable, settle: Optional[Callable] = None) -> Callable:
    """``function`` as the student's test receives it: a new function named ``implementation`` whatever it wraps,
    with no closure and no globals, so that a test can tell implementations apart only by what they compute (what
    it wraps is reached only through its ``__code__``, a read the audit watch flags). ``settle(args)`` runs after
    each call that returns (for the gradients: fresh tensors, whatever the implementation did in place)."""
    return sealed(_implementation, "implementation", function=function, settle=settle)


def fresh_gradients(args) -> None:
    """Every gradient an accumulation left, replaced by a copy: an edit in place leaves no trace (a version
    count, a shared storage) a test could recognise a wrong implementation by."""
    model = args[0] if args else None
    for param in (model.parameters() if isinstance(model, torch.nn.Module) else ()):
        if param.grad is not None:
            param.grad = param.grad.detach().clone()


@dataclass
class _Candidate:
    implementation: Callable          # what the student's test is given, behind ``opaque``
    wrong: Optional[object] = None    # its WrongImplementation; None for a correct one
    ran: bool = False
    failure: Optional[tuple] = None   # the first wrong verdict: (what, actual, expected, hint), hint a callable


class _Lazy:
    """An iterator of wrong implementations, each made once the one before it ran (course/checks/
    wrong_gradients.py learns from the first how many tensors the test's model has)."""

    def __init__(self, iterator: Iterator):
        self.iterator, self.made, self.done = iterator, [], False

    def next(self) -> Optional[_Candidate]:
        candidate = next((_Candidate(w.accumulate, w) for w in self.iterator), None)
        if candidate is None:
            self.done = True
        else:
            self.made.append(candidate)
        return candidate

    def rest(self) -> list[_Candidate]:
        made = len(self.made)
        while not self.done and self.next() is not None:
            pass
        return self.made[made:]

    def in_order(self) -> Iterator[_Candidate]:
        """Every candidate in the order made, making the rest as it goes."""
        position = 0
        while position < len(self.made) or (not self.done and self.next() is not None):
            yield self.made[position]
            position += 1


def expect_verdicts(test_name: str, student_test: Callable, correct: Iterable[Callable], wrong: Iterable,
                    correct_hint: str, crash_hint: str, why_let_through: Callable, settle: Optional[Callable] = None,
                    order: Optional[random.Random] = None) -> None:
    """``student_test(c)`` returns for every ``c`` in ``correct``; ``student_test(w.accumulate)`` raises
    ``AssertionError`` for every ``w`` in ``wrong`` (any exception when ``w.malformed``); an iterator in ``wrong``
    gives wrong implementations made lazily. Each reaches the test behind ``opaque``, in an ``order`` shuffled
    each time (a test cannot know which call is the correct one), and a correct one runs again after the wrong
    ones. A failure names the first wrong verdict in the order given, whichever call found one first; its hint:
    ``correct_hint`` when a correct implementation failed an assertion, ``crash_hint`` when the test crashed on it,
    ``why_let_through(w)`` when it let ``w`` through. A stub's NotImplementedError propagates (TODO)."""
    order = order or random.SystemRandom()
    hints = {"correct": correct_hint, "crash": crash_hint}
    slots = [_Candidate(c) for c in correct] + [
        _Lazy(w) if isinstance(w, collections.abc.Iterator) else _Candidate(w.accumulate, w) for w in wrong]
    lazy = [slot for slot in slots if isinstance(slot, _Lazy)]

    def run(candidates: list[_Candidate]) -> bool:
        """Runs ``candidates`` in a shuffled order until one gets a wrong verdict; whether none did."""
        order.shuffle(candidates)
        return all(_judge(test_name, student_test, candidate, hints, settle) for candidate in candidates)

    first_made = [candidate for group in lazy for candidate in [group.next()] if candidate is not None]
    plain = [slot for slot in slots if isinstance(slot, _Candidate)]
    correct_ones = plain[:len(correct)]
    if (run(plain + first_made) and run([c for group in lazy for c in group.rest()])
            and (not correct_ones or _judge(test_name, student_test, order.choice(correct_ones), hints, settle,
                                            again=True))):
        return
    for candidate in (c for slot in slots for c in (slot.in_order() if isinstance(slot, _Lazy) else [slot])):
        if not candidate.ran:
            _judge(test_name, student_test, candidate, hints, settle)
        if candidate.failure is not None:
            what, actual, expected, hint = candidate.failure
            fail(what, actual, expected, f"hint: {hint(why_let_through)}")
    raise AssertionError("a wrong verdict was found but not reported")   # unreachable: a failure was recorded


def _judge(test_name: str, student_test: Callable, candidate: _Candidate, hints: dict, settle: Optional[Callable],
           again: bool = False) -> bool:
    """Runs ``student_test`` on ``candidate`` (``again``: a correct one once more) and records a wrong verdict;
    whether the verdict was right. A stub's NotImplementedError propagates."""
    wrong, candidate.ran = candidate.wrong, True
    name = candidate.implementation.__name__ + (", called again after the wrong ones" if again else "")
    try:
        student_test(opaque(candidate.implementation, settle))
    except NotImplementedError:
        raise
    except AssertionError as exc:
        if wrong is None:
            candidate.failure = (f"{test_name} rejects a CORRECT implementation ({name})", _short(exc),
                                 "the test returns (passes)", lambda _: hints["correct"])
        return wrong is not None
    except Exception as exc:
        if wrong is None:
            candidate.failure = (f"{test_name} crashed on a CORRECT implementation ({name})", _short(exc),
                                 "the test returns (passes)", lambda _: hints["crash"])
        elif not wrong.malformed:
            candidate.failure = (f"{test_name} crashed on the wrong implementation {wrong.name} instead of failing "
                                 f"an assertion", _short(exc), "AssertionError (assert / torch.testing.assert_close)",
                                 lambda _: "a test states its verdict with an assertion; a crash is a bug in the test "
                                           "itself")
        return candidate.failure is None
    if wrong is None or wrong.edited_nothing:
        return True
    candidate.failure = (f"your test let through {wrong.name}: {wrong.wrong}", "the test returned (passed)",
                         "AssertionError (the test fails on this implementation)", lambda why: why(wrong))
    return False


def grade_student_test(test_name: str, student_test: Callable, correct: Sequence[Callable],
                       wrong: Sequence[WrongImplementation], correct_hint: str) -> None:
    """A test of gradient accumulation: ``expect_verdicts`` on ``correct`` and on ``wrong``,
    ``one_gradient_off(correct[0])``, ``edited_gradients(correct[0])``, ``one_element_negated(correct[0])`` (after
    the edits whose hints name a blindness to signs or places) and ``malformed_results(correct[0])``."""
    def tested(implementation: Callable) -> None:   # the student's test on a probe, as on the graded ones
        student_test(opaque(implementation, fresh_gradients))

    with plain_tensor_comparisons():
        replayed = Replayed(correct[0])
        expect_verdicts(test_name, student_test, (replayed, *correct[1:]),
                        [*wrong, one_gradient_off(replayed), *edited_gradients(replayed),
                         one_element_negated(replayed), *malformed_results(replayed)],
                        correct_hint, "the implementation's contract is in its docstring "
                        "(course/runs/accumulation.py); run your test on it by hand",
                        lambda implementation: f"{why_let_through(tested, replayed, implementation)}. And does "
                        "the test assert on every parameter's gradient, with a tolerance near float rounding?",
                        settle=fresh_gradients)


# --- mistakes both test-writing exercises share ------------------------------------------------------

COMPARE_EVERY_PARAMETER = "    for (name, param), expected in zip(model.named_parameters(), big.parameters()):\n"


def assert_gradients(rtol: str, actual: str = "param.grad", expected: str = "expected.grad",
                     tolerance: str = "rtol={rtol}, atol=1e-6") -> str:
    """The last line of both reference tests: every parameter's gradient against the big batch's (a weak
    comparison puts ``actual`` and ``expected`` in place of the gradients, another ``tolerance``)."""
    arguments = ", ".join(filter(None, (actual, expected, tolerance.format(rtol=rtol))))
    return (f"        torch.testing.assert_close({arguments},\n"
            '                                   msg=lambda detail: f"gradient of {name}: {detail}")\n')


# The words of the hint each weakening of a student's test gets (course/checks/wrong_gradients.py computes it):
# every weak_comparisons entry's rule, for both test-writing exercises.
WEAK_COMPARISON_RULES = {
    "test_swallows_errors": "let it propagate", "test_largest_element_only": "only the large elements",
    "test_first_rows_only": "compares some elements", "test_first_elements_only": "compares some elements",
    "test_strided_elements": "compares some elements", "test_cosine_only": "compares directions only",
    "test_skips_missing_gradients": "skips a parameter without a gradient",
    "test_skips_small_gradients": "compare EVERY parameter's gradient", "test_asserts_nothing": "compares nothing",
    "test_one_parameter_only": "compare EVERY parameter's gradient",
    "test_gradient_norm_only": "not one tensor, a norm or a sum", "test_rtol_one_percent": "lets a 1% error through",
    "test_tolerance_far_too_loose": "tolerance is larger than the gradients",
    "test_assert_close_defaults": "float32 default", "test_compares_norms_per_parameter": "cannot see a sign",
    "test_compares_sums": "cannot see where its values are", "test_abs_values": "cannot see a sign",
    "test_skips_vectors": "compare EVERY parameter's gradient", "test_large_elements_only": "only the large elements",
}


def weak_comparisons(function: str, rtol: str, check: Callable, call: str) -> list[Mistake]:
    """The weakenings of a reference test (``function`` calls the implementation in the line ``call``, then
    compares every parameter's gradient with ``assert_close(rtol=rtol, atol=1e-6)``); each must FAIL ``check``,
    with a hint naming its rule (WEAK_COMPARISON_RULES)."""
    comparison = COMPARE_EVERY_PARAMETER + assert_gradients(rtol)
    indented_call = "".join(f"    {line}\n" for line in call.splitlines())

    def compare_elements(select: str) -> str:
        return assert_gradients(rtol, f"param.grad{select}", f"expected.grad{select}")

    def skip_parameters(condition: str) -> str:
        return COMPARE_EVERY_PARAMETER + f"        if {condition}:\n            continue\n" + assert_gradients(rtol)
    weak = [
        mistake("test_swallows_errors", "the implementation's exceptions caught: a crashing implementation passes",
                function, call, f"    try:\n{indented_call}    except Exception:\n        return\n", check),
        mistake("test_largest_element_only", "compares each gradient's largest element only", function,
                assert_gradients(rtol), compare_elements(".flatten()[expected.grad.abs().argmax()]"), check),
        mistake("test_first_rows_only", "compares the first two rows (elements of a vector) of each gradient",
                function, assert_gradients(rtol), compare_elements("[:2]"), check),
        mistake("test_first_elements_only", "compares the first 64 elements of each gradient (all of a small "
                "one, the first rows of the embedding)", function, assert_gradients(rtol),
                compare_elements(".flatten()[:64]"), check),
        mistake("test_strided_elements", "compares every 7th element of each gradient", function,
                assert_gradients(rtol), compare_elements(".flatten()[::7]"), check),
        mistake("test_cosine_only", "compares each gradient's direction (cosine similarity 1), not its size",
                function, assert_gradients(rtol),
                assert_gradients(rtol, "torch.nn.functional.cosine_similarity(param.grad.double().flatten(), "
                                       "expected.grad.double().flatten(), dim=0)",
                                 "torch.tensor(1.0, dtype=torch.float64)"), check),
        mistake("test_skips_missing_gradients", "skips a parameter without a gradient: a forgotten parameter passes",
                function, comparison, skip_parameters("param.grad is None"), check),
        mistake("test_skips_small_gradients", "skips gradients under 1 % of the total norm (the norm weights)",
                function, comparison,
                skip_parameters("expected.grad.norm() < 1e-2 * torch.stack([p.grad.norm() for p in big.parameters()])"
                                ".norm()"), check),
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
        mistake("test_large_elements_only", "compares only the elements with |g| > 1e-4 (most of the tied "
                "embedding's gradient goes unchecked)", function, assert_gradients(rtol),
                "        large = expected.grad.abs() > 1e-4\n"
                + compare_elements("[large]"), check),
        mistake("test_skips_vectors", "compares the matrices only (param.dim() > 1): the norm weights' gradients "
                "go unchecked", function, comparison,
                COMPARE_EVERY_PARAMETER + "        if param.dim() < 2:\n            continue\n"
                + assert_gradients(rtol), check),
    ]
    return [dataclasses.replace(m, rule=WEAK_COMPARISON_RULES[m.name]) for m in weak]
