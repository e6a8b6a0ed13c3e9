"""The one grading engine: pytest, the CLI and the notebooks all call these functions.

A *check* is a function ``check(impl) -> None`` that takes the module under test (the student's
file, the reference, or any directory laid out like ``impl/``) and raises ``CheckFailure`` with an
ACTUAL vs EXPECTED message when the implementation is wrong. A stub that still raises
``NotImplementedError`` is reported as TODO, never as a failure.
"""
from __future__ import annotations

import math
import re
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping, Optional, Sequence

from course.implementations import load_implementation
from course.layout import lesson_files

from .catalogue import Mistake
from .hints import validate as validate_hints

PASS, FAIL, TODO = "PASS", "FAIL", "TODO"


class CheckFailure(AssertionError):
    """An implementation gave a wrong answer; the message says what and where."""


CORE, HARDENING, OPTIONAL = "core", "hardening", "optional"   # the tiers a check or an exercise's result is in


@dataclass(frozen=True)
class Check:
    name: str
    exercise: str
    run: Callable[[ModuleType], None]
    doc: str = ""
    hidden: bool = False          # notebooks: graded in the exercise's hidden grade cell
    uses: tuple[str, ...] = ()    # other exercises the check calls (its grade cell follows them)
    slow: bool = False            # one of the lesson's slowest: parallel grading starts it first
    objective: str = ""           # the lesson objective it grades (Lesson.objectives); "" = the hardening tier

    @property
    def tier(self) -> str:
        """CORE: it grades one of the lesson's objectives (exit code, points); HARDENING: a convention beyond
        them (argument validation, exception types, warnings), graded only by ``check --all``, 0 points."""
        return CORE if self.objective else HARDENING


@dataclass(frozen=True)
class Exercise:
    name: str               # the function or class the student writes
    section: str            # where the lesson explains it, e.g. "14 §5.1"
    points: int = 1         # notebook points of its visible grade cell
    hidden_points: int = 0  # notebook points of its hidden grade cell (0: the exercise has no hidden checks)
    optional: bool = False  # an extension: graded only with ``check --all``, never in the exit code or the points

    @property
    def section_number(self) -> str:
        """The number of the lesson section it is in ("14 §5.4" -> "5.4"): its answer's number too."""
        return self.section.split("§")[1]


CHECK_MARK = "course_check"   # the attribute ``check`` sets on a check function


def check(exercise: str, *, objective: str = "", hidden: bool = False, uses: tuple[str, ...] = (),
          slow: bool = False):
    """Decorator: mark ``fn`` as a check of ``exercise`` (its docstring explains it; ``objective``: the lesson
    objective it grades, none for a hardening check; ``hidden``: graded in the notebook's hidden cell; ``uses``:
    other exercises it calls; ``slow``: one of the lesson's slowest, started first when checks run in
    parallel). The lesson's descriptor collects the marked functions of its check modules with ``checks_in``."""
    def mark(fn):
        setattr(fn, CHECK_MARK, Check(fn.__name__, exercise, fn, (fn.__doc__ or "").strip(), hidden, tuple(uses),
                                      slow, objective))
        return fn
    return mark


def checks_in(*modules: ModuleType) -> list[Check]:
    """The checks defined in ``modules``, module by module in definition order (the order they run)."""
    return [getattr(value, CHECK_MARK) for module in modules for value in vars(module).values()
            if hasattr(value, CHECK_MARK) and getattr(value, "__module__", None) == module.__name__]


@dataclass(frozen=True)
class Lesson:
    """One lesson, described once and complete (``course/checks/lessonNN/__init__.py``): its texts, stub,
    reference, exercises, checks, mistake catalogue, notebook grading and labs. Every file a lesson needs is
    derived from ``lesson_id``, ``slug`` and ``module`` (see ``files``); ``python -m course new-lesson``
    writes their skeletons."""
    lesson_id: str
    slug: str               # e.g. "lr_grad_accum_amp": lesson text and notebook are "<id>_<slug>"
    title: str
    module: str             # the exercise module, e.g. "train_loop": impl/train_loop.py
    exercises: Sequence[Exercise]
    objectives: Mapping[str, str] = field(default_factory=dict)  # id -> what the lesson teaches, one line each
    checks: Sequence[Check] = ()        # checks_in(the lesson's check modules)
    mistakes: Sequence[Mistake] = ()    # wrong variants, each FAILS the check it names
    equivalents: Sequence[Mistake] = ()  # equivalent variants, each PASSES every check
    equivalent_mutants: Mapping[str, str] = field(default_factory=dict)  # mutant key -> why no check can fail it
    hints: Mapping[str, tuple[str, ...]] = field(default_factory=dict)   # exercise -> its hint ladder (hints.py)
    labs: tuple[str, ...] = ()          # scripts under labs/
    notebook_mistake: str = ""          # a catalogued mistake only a hidden check catches (autograde test)
    report: Optional[Callable[[ModuleType], list[str]]] = None   # ``python -m course align`` lines

    def __post_init__(self):
        """Bind the catalogue to this lesson and refuse a descriptor whose parts do not fit together."""
        def bound(entries):
            return tuple(m.bound(self.lesson_id, self.module_file) for m in entries)
        for name, value in (("exercises", tuple(self.exercises)), ("checks", tuple(self.checks)),
                            ("mistakes", bound(self.mistakes)), ("equivalents", bound(self.equivalents)),
                            ("labs", tuple(self.labs))):
            object.__setattr__(self, name, value)
        for c in self.checks:
            for name in (c.exercise, *c.uses):
                self.exercise(name)
        self._validate_tiers()
        validate_hints(self.lesson_id, self.hints, self.exercises)
        names = [c.name for c in self.checks]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"lesson {self.lesson_id}: check names must be unique, {doubled} repeat")
        unknown = [(m.name, m.caught_by) for m in self.mistakes if m.caught_by not in names]
        if unknown:
            raise ValueError(f"lesson {self.lesson_id}: mistakes caught by no check of the lesson: {unknown}")

    def _validate_tiers(self) -> None:
        """A core check grades an objective the lesson lists; an extension's checks name none (optional)."""
        unknown = [(c.name, c.objective) for c in self.checks if c.objective and c.objective not in self.objectives]
        if unknown:
            raise ValueError(f"lesson {self.lesson_id}: checks name objectives it does not list: {unknown}")
        in_extensions = [c.name for c in self.checks if c.objective and self.exercise(c.exercise).optional]
        if in_extensions:
            raise ValueError(f"lesson {self.lesson_id}: checks of optional exercises name objectives: {in_extensions}")

    def tier_gaps(self) -> list[str]:
        """What a complete lesson lacks: an objective no core check grades, a core exercise with no core check
        (tests/test_lessons_complete.py; a lesson narrowed to a few checks in a test may lack them)."""
        graded = {c.objective for c in self.checks}
        return ([f"objective {o!r} is graded by no core check" for o in self.objectives if o not in graded]
                + [f"core exercise {e.name} has no core check" for e in self.core_exercises
                   if not any(c.exercise == e.name and c.tier == CORE for c in self.checks)])

    def tier_checks(self, exercise: str, tier: str) -> list[Check]:
        """The checks of ``exercise`` in ``tier`` (an optional exercise's checks are all in OPTIONAL)."""
        optional = self.exercise(exercise).optional
        return [c for c in self.checks if c.exercise == exercise
                and (OPTIONAL if optional else c.tier) == tier]

    @property
    def name(self) -> str:
        return f"{self.lesson_id}_{self.slug}"

    @property
    def module_file(self) -> str:
        """The exercise module's file name, the same in impl/, the reference and a submission directory."""
        return self.files()["stub"].name

    def files(self) -> dict[str, Path]:
        """Every file of the lesson, by role, as absolute paths (see ``lesson_files``)."""
        return lesson_files(self.lesson_id, self.slug, self.module, self.labs)

    def load(self, impl: str = "student", impl_dir: Optional[str] = None) -> ModuleType:
        """The lesson's module from impl/ ("student"), the reference, or a submission directory."""
        return load_implementation(self.module_file, impl, impl_dir)

    def exercise(self, name: str) -> Exercise:
        names = [e.name for e in self.exercises]
        if name not in names:
            raise ValueError(f"exercise must be one of {names}, got {name!r}")
        return self.exercises[names.index(name)]

    def section_of(self, exercise: str) -> str:
        return self.exercise(exercise).section

    @property
    def points(self) -> int:
        """Notebook points of the whole lesson: its core exercises (extensions score none)."""
        return sum(e.points + e.hidden_points for e in self.exercises if not e.optional)

    @property
    def core_exercises(self) -> list[Exercise]:
        return [e for e in self.exercises if not e.optional]

    @property
    def optional_exercises(self) -> list[Exercise]:
        return [e for e in self.exercises if e.optional]


@dataclass
class CheckResult:
    check: str
    exercise: str
    status: str
    message: str = ""
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)   # what the code under test warned, shown, never graded


# --- running checks ------------------------------------------------------------------------

def _todo_message(exc: NotImplementedError) -> str:
    return str(exc) or "stub still raises NotImplementedError"


def run_check(check: Check, module: ModuleType) -> CheckResult:
    """Run one check; its warnings are recorded (shown to the student on stdout), never raised or printed on
    stderr: a warning is no verdict (a check that grades warning hygiene records them itself)."""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _verdict(check, module)
    result.seconds = time.perf_counter() - start
    result.warnings = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    return result


def _verdict(check: Check, module: ModuleType) -> CheckResult:
    try:
        check.run(module)
    except NotImplementedError as exc:
        status, message = TODO, _todo_message(exc)
    except CheckFailure as exc:
        status, message = FAIL, str(exc)
    except Exception as exc:  # a crash in student code is a failure with its traceback tail
        tail = "".join(traceback.format_exception(exc)[-3:]).strip()
        status, message = FAIL, f"{check.name} raised {type(exc).__name__}: {exc}\n{tail}"
    else:
        status, message = PASS, ""
    return CheckResult(check.name, check.exercise, status, message)



# --- comparisons with ACTUAL vs EXPECTED messages -------------------------------------------

def fail(what: str, actual, expected, detail: str = "") -> None:
    extra = f"\n  {detail}" if detail else ""
    raise CheckFailure(f"{what}\n  ACTUAL:   {actual!r}\n  EXPECTED: {expected!r}{extra}")


def expect_equal(what: str, actual, expected) -> None:
    if actual != expected:
        fail(what, actual, expected)


def expect_type(what: str, value, *types: type, detail: str = "") -> None:
    """``type(value)`` is exactly one of ``types``: a bool for an int, an int for a bool or a 0-dim tensor for a
    float fails, although each compares equal."""
    if type(value) not in types:
        fail(f"{what}: type", f"{type(value).__name__} {value!r}", " or ".join(t.__name__ for t in types), detail)


def expect_close(what: str, actual: float, expected: float, *, rtol: float, atol: float = 0.0) -> None:
    """Scalar comparison: |actual - expected| <= atol + rtol * |expected|."""
    if actual is None or expected is None:
        if actual is not expected:
            fail(what, actual, expected)
        return
    if actual == expected:  # also covers matching infinities
        return
    diff = abs(actual - expected)
    # an infinite expected value allows an infinite tolerance: only the same infinity matches it
    if not diff <= atol + rtol * abs(expected) or math.isinf(expected) or math.isnan(actual) != math.isnan(expected):
        fail(what, actual, expected, f"|diff| = {diff:.3e} > tolerance (rtol={rtol:g}, atol={atol:g})")


def same_value(a, b) -> bool:
    """Bit-identical values: tensors of the same dtype, shape and device with equal elements, dicts with the same
    keys, lists and tuples of the same type and length, item by item; anything else of the same type and equal."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.device == b.device and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def expect_tensor_close(what: str, actual, expected, *, rtol: float, atol: float) -> None:
    """Tensor comparison that reports the worst element: its index, both values, the diff."""
    import torch
    if tuple(actual.shape) != tuple(expected.shape):
        fail(f"{what}: shape", tuple(actual.shape), tuple(expected.shape))
    if actual.dtype == expected.dtype and actual.device == expected.device and torch.equal(actual, expected):
        return   # identical bits pass any tolerance; the aligned reference takes this path
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    diff = (actual - expected).abs()
    allowed = atol + rtol * expected.abs()
    bad = ~(diff <= allowed)
    if bad.any():
        excess = torch.where(bad, diff - allowed, torch.zeros_like(diff)).nan_to_num(nan=math.inf)
        idx = tuple(int(i) for i in torch.unravel_index(excess.argmax(), diff.shape))
        fail(f"{what}: {int(bad.sum())} of {diff.numel()} elements differ; worst at index {idx}",
             float(actual[idx]), float(expected[idx]),
             f"max |diff| = {float(diff.nan_to_num(nan=math.inf).max()):.3e} (rtol={rtol:g}, atol={atol:g})")


def expect_tensors_close(what: str, actual: dict, expected: dict, *, rtol: float, atol: float) -> None:
    """Every named tensor of ``expected`` (a state_dict, parameters, gradients) against ``actual``."""
    missing = sorted(set(expected) - set(actual))
    if missing:
        fail(f"{what}: tensors missing", sorted(actual), f"also {missing}")
    for name, want in expected.items():
        expect_tensor_close(f"{what}: {name}", actual[name], want, rtol=rtol, atol=atol)


def first_named(message: str, arguments) -> Optional[str]:
    """The argument of ``arguments`` that ``message`` names first (as a whole word), or None."""
    found = [(m.start(), name) for name in arguments for m in [re.search(rf"\b{re.escape(name)}\b", message)] if m]
    return min(found)[1] if found else None


def expect_raises(what: str, fn, exc_type, must_mention: str, arguments=()) -> None:
    """``fn()`` must raise ``exc_type`` whose message names ``must_mention`` (the bad argument); given the
    call's ``arguments`` (parameter names), the bad one must be the first the message names, so an error
    raised later by a check of another argument (``step must be in [1, iters=0]``) does not pass for it."""
    try:
        fn()
    except NotImplementedError:
        raise
    except exc_type as exc:
        if must_mention not in str(exc):
            fail(f"{what}: the error message should name {must_mention!r}", str(exc), f"...{must_mention}...")
        first = first_named(str(exc), arguments)
        if arguments and first != must_mention:
            fail(f"{what}: the error should be about {must_mention!r}, the bad argument, but names {first!r} first",
                 str(exc), f"{must_mention} must ...",
                 f"hint: check {must_mention} itself, before the arguments that depend on it")
        return
    except Exception as exc:  # wrong type of error
        fail(what, f"{type(exc).__name__}: {exc}", f"{exc_type.__name__} naming {must_mention!r}")
    fail(what, "no exception", f"{exc_type.__name__} naming {must_mention!r}")
