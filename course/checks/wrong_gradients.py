"""The wrong implementations every test-writing exercise is graded against, beyond its lesson's own: each
starts from the correct accumulation and breaks the gradients where a weak comparison cannot see it (one tensor
1 % off, a sign, a place, one element, a forgotten parameter), or raises."""
from __future__ import annotations

import itertools
from typing import Callable, Iterator, Optional

import torch

# One gradient tensor made this much too large is a wrong implementation too: a test must compare every
# parameter with a tolerance far below it (float rounding here is ~1e-8). Only tensors holding at least
# ONE_TENSOR_SHARE of the total gradient norm are edited, so a bound on the relative error of all
# gradients together (||actual - expected|| / ||expected|| <= 1e-5) still sees each edit.
ONE_TENSOR_ERROR = 1e-2
ONE_TENSOR_SHARE = 1e-3
DEFAULT_FLOAT32_ATOL = 1e-5   # torch.testing.assert_close's atol for float32 when none is given


def large_gradients(model) -> list[tuple[str, torch.Tensor]]:
    """(name, .grad) of each parameter whose gradient holds >= ONE_TENSOR_SHARE of the total gradient norm."""
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    total = float(torch.sqrt(sum(grad.double().pow(2).sum() for _, grad in named))) if named else 0.0
    return [(name, grad) for name, grad in named if float(grad.double().norm()) >= ONE_TENSOR_SHARE * total > 0]


class GradientEdit:
    """A wrong implementation: the correct ``accumulate``, then ``edit`` changes the large gradients it left
    (``large_gradients``) in place and returns the (name, gradient) pairs it changed. ``wrong`` and ``hint``
    may name them as {parameters}; ``tensors`` is how many large gradients there were (None: never called)."""
    malformed = False

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
        def this_tensor(edit):
            return _probe(self._accumulate, lambda large: edit(large[self.index:self.index + 1]))
        try:
            student_test(this_tensor(_negate_all))
        except AssertionError:
            if _passes(student_test, this_tensor(_negate_one_element)):
                return ("your test compares this gradient, but not every element of it (it passes with one element "
                        f"negated): {ELEMENT_WISE}, every element")
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


def per_large_gradient(make: Callable[[int], GradientEdit], most: Optional[int] = None) -> Iterator[GradientEdit]:
    """``make(index)`` for each large gradient tensor of the model the student's test uses (the first ``most`` of
    them, when given), made lazily: the count is known once the test has called the first one."""
    first = make(0)
    yield first
    if first.tensors is not None:
        yield from (make(index) for index in range(1, min(first.tensors, most or first.tensors)))


def one_gradient_off(accumulate: Callable) -> Iterator[OneGradientOff]:
    """One wrong implementation per large gradient tensor: that tensor ONE_TENSOR_ERROR too large."""
    return per_large_gradient(lambda index: OneGradientOff(accumulate, index))


def one_element_negated(accumulate: Callable) -> Iterator[GradientEdit]:
    """One wrong implementation per large gradient tensor, the ONE_ELEMENT_TENSORS with the most elements: one
    element of that tensor alone negated (``_negate_one_element``), so that a test which compares every element
    of the small tensors but only some of a large one (its first rows, a stride) lets it through."""
    def by_size(large):
        return sorted(large, key=lambda item: -item[1].numel())
    return per_large_gradient(lambda index: GradientEdit(
        f"accumulate_one_element_negated[{index}]", accumulate,
        lambda large: _negate_one_element(by_size(large)[index:index + 1]),
        "correct except that one element of the gradient of {parameters} (its last one holding >= 1 % of the "
        "tensor's largest value at an index no stride from 0 up to 16 reaches) is negated",
        "a test that compares some elements (the first rows, a stride, the largest values) cannot see the "
        f"others: {ELEMENT_WISE}, every element"), most=ONE_ELEMENT_TENSORS)


# the largest tensors hold the elements a partial comparison skips (the embedding's rows, a projection's)
ONE_ELEMENT_TENSORS = 4


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


def _negate_one_element(large):
    """In each gradient, the last element (in memory order) holding >= 1 % of the tensor's largest |value|,
    the largest itself excepted, at a prime index above 16 is negated: in the last rows, and off every stride
    from 0 up to 16 (a prime p > 16 is a multiple of none of them)."""
    edited = []
    for name, grad in large:
        flat = grad.view(-1)
        magnitude = flat.abs()
        candidates = magnitude >= 1e-2 * magnitude.max()
        candidates[magnitude.argmax()] = False
        index = next((int(i) for i in reversed(candidates.nonzero().flatten()) if _is_prime_above_16(int(i))), None)
        if index is not None:
            flat[index] = -flat[index]
            edited.append((name, grad))
    return edited


def _is_prime_above_16(n: int) -> bool:
    return n > 16 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def _negate_small_elements(large):
    """In each gradient, every element of size in [SMALL_ELEMENT_FLOOR, SMALL_GRADIENT_ELEMENT) is negated: an error
    of at least twice the floor, above assert_close's float32 default atol."""
    edited = []
    for name, grad in large:
        small = (grad.abs() >= SMALL_ELEMENT_FLOOR) & (grad.abs() < SMALL_GRADIENT_ELEMENT)
        if small.any():
            grad[small] = -grad[small]
            edited.append((name, grad))
    return edited


SMALL_ELEMENT_FLOOR = 1e-5
ELEMENT_WISE = "compare the gradient tensors element-wise, each against the same parameter's expected gradient"


def edited_gradients(accumulate: Callable) -> list:
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
        GradientEdit("accumulate_small_elements_negated", accumulate, _negate_small_elements,
                     "correct except that every gradient element between 1e-5 and 1e-4 in size is negated: the large "
                     "elements, which carry nearly all of the norm, are right",
                     "a test that compares only the large elements (|g| above a threshold) cannot see a bug "
                     f"confined to the small ones: {ELEMENT_WISE}, every element, within a tolerance below 1e-5"),
        SmallestGradient(accumulate, forget=False),
    ]


SMALL_GRADIENT_ELEMENT = 1e-4   # far above any sane atol: a test must see this element lost


class SmallestGradient:
    """A wrong implementation: the correct ``accumulate``, then the smallest gradient tensor (by norm) whose
    elements reach SMALL_GRADIENT_ELEMENT is lost: zeroed (a bug confined to a tensor that holds a small share
    of the norm), or with ``forget`` left as None, as if the accumulation never reached the parameter
    (malformed: a crash rejects it too)."""

    def __init__(self, accumulate: Callable, forget: bool):
        self._accumulate, self.forget, self.called, self.parameter = accumulate, forget, False, None
        self.malformed = forget
        self.name = "accumulate_forgets_a_parameter" if forget else "accumulate_smallest_gradient_zeroed"

    @property
    def edited_nothing(self) -> bool:
        return self.called and self.parameter is None

    @property
    def wrong(self) -> str:
        if self.forget:
            return f"correct except that {self.parameter} is left without a gradient (.grad is None)"
        return f"correct except that the gradient of {self.parameter}, the smallest, is all zeros"

    def explain(self, student_test: Callable) -> str:
        if self.forget:
            return ("a test that skips a parameter without a gradient cannot see a parameter the accumulation "
                    "forgot: compare every parameter's gradient, and a missing one fails the test")
        return ("a test that skips the gradients holding a small share of the total norm cannot see a bug confined "
                "to them: compare every parameter's gradient")

    def accumulate(self, model, *args) -> None:
        self._accumulate(model, *args)
        self.called = True
        candidates = [(name, p) for name, p in model.named_parameters()
                      if p.grad is not None and float(p.grad.abs().max()) >= SMALL_GRADIENT_ELEMENT]
        if candidates:
            self.parameter, lost = min(candidates, key=lambda item: float(item[1].grad.double().norm()))
            if self.forget:
                lost.grad = None
            else:
                lost.grad.zero_()


class RaisingImplementation:
    """A wrong implementation: the correct gradients, then it raises; a test that returns after it swallowed
    the implementation's exception passes a crashing implementation."""
    name, malformed, edited_nothing = "accumulate_raises", True, False
    wrong = "leaves the correct gradients, then raises RuntimeError: the implementation fails"
    hint = ("an exception from the implementation under test must fail the test: let it propagate, never catch it "
            "and return")

    def __init__(self, accumulate: Callable):
        self._accumulate = accumulate

    def explain(self, student_test: Callable) -> str:
        return self.hint

    def accumulate(self, model, *args) -> None:
        self._accumulate(model, *args)
        raise RuntimeError("the grader's wrong implementation accumulate_raises failing on purpose")


def malformed_results(accumulate: Callable) -> list:
    """Wrong implementations whose result is malformed: any exception in the test rejects them."""
    return [SmallestGradient(accumulate, forget=True), RaisingImplementation(accumulate)]


PASSES_EVERYTHING = ("your test passes every wrong gradient the grader tried (all gradients negated; one tensor 1 % "
                     "off): it compares nothing, compares the implementation with itself, or its tolerance is larger "
                     "than the gradients; the expected gradients must come from an independent computation, ONE "
                     "backward of the whole batch, compared within a tolerance near float rounding")
SCALE_BLIND = ("your test passes every gradient made 1.5 times too large: it compares directions only (a cosine, "
               "normalised gradients), or its tolerance is far too loose; compare the gradients themselves")


def _probe(accumulate: Callable, edit: Callable) -> Callable:
    """``accumulate``, then ``edit`` of its large gradients: a one-off wrong implementation that asks the student's
    test why it let another one through."""
    return GradientEdit("probe", accumulate, edit, "", "").accumulate


def _passes(student_test: Callable, accumulate: Callable) -> bool:
    try:
        student_test(accumulate)
    except Exception:
        return False
    return True


def passes_everything(student_test: Callable, accumulate: Callable) -> bool:
    """Whether ``student_test`` also passes every gradient negated and one gradient 1 % off."""
    return all(_passes(student_test, probe) for probe in (_probe(accumulate, _negate_all),
                                                          OneGradientOff(accumulate, 0).accumulate))


def _scale_all(large):
    for _, grad in large:
        grad.mul_(1.5)
    return large


def why_let_through(student_test: Callable, accumulate: Callable, implementation) -> str:
    """The likeliest cause of ``student_test`` passing ``implementation``: a test that passes everything, one
    blind to the gradients' size, or what the implementation itself explains."""
    if passes_everything(student_test, accumulate):
        return PASSES_EVERYTHING
    if _passes(student_test, _probe(accumulate, _scale_all)):
        return SCALE_BLIND
    return implementation.explain(student_test)
