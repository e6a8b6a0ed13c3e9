"""The one grading engine: pytest, the CLI and the notebooks all call these functions.

A *check* is a function ``check(impl) -> None`` that takes the module under test (the student's
file, the reference, or any directory laid out like ``impl/``) and raises ``CheckFailure`` with an
ACTUAL vs EXPECTED message when the implementation is wrong. A stub that still raises
``NotImplementedError`` is reported as TODO, never as a failure.
"""
from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional

from course.implementations import (REFERENCE_DIR, REPO_ROOT, STUDENT_DIR, load_implementation,
                                    module_from_source)

PASS, FAIL, TODO = "PASS", "FAIL", "TODO"


class CheckFailure(AssertionError):
    """An implementation gave a wrong answer; the message says what and where."""


@dataclass(frozen=True)
class Check:
    name: str
    exercise: str
    run: Callable[[ModuleType], None]
    doc: str = ""
    hidden: bool = False          # notebooks: graded in the exercise's hidden grade cell
    uses: tuple[str, ...] = ()    # other exercises the check calls (its grade cell follows them)


@dataclass(frozen=True)
class Exercise:
    name: str               # the function or class the student writes
    section: str            # where the lesson explains it, e.g. "14 §5.1"
    points: int = 1         # notebook points of its visible grade cell
    hidden_points: int = 0  # notebook points of its hidden grade cell (0: the exercise has no hidden checks)
    optional: bool = False  # an extension: graded only with ``check --all``, never in the exit code or the points


@dataclass(frozen=True)
class Mistake:
    """A typical wrong implementation: the reference with ``old`` replaced by ``new`` (once).
    ``caught_by`` names the check that must FAIL; an accepted equivalent has none and must PASS."""
    lesson: str
    name: str
    description: str
    old: str
    new: str
    caught_by: str
    module_file: str

    def source(self) -> str:
        original = (REFERENCE_DIR / self.module_file).read_text(encoding="utf-8")
        count = original.count(self.old)
        if count != 1:
            raise ValueError(f"mistake {self.name!r}: its 'old' snippet occurs {count} times in "
                             f"{self.module_file}, expected exactly once (did the reference change?)")
        return original.replace(self.old, self.new)

    def build(self) -> ModuleType:
        return module_from_source(self.source(), f"{self.lesson}_{self.name}",
                                  f"<mistake {self.name}: {self.module_file}>")


@dataclass
class Lesson:
    """One lesson, described once: its texts, stub, reference, checks, mistake catalogue, notebook
    grading and labs. Every file a lesson needs is derived from ``lesson_id``, ``slug`` and ``module``
    (see ``files``); ``python -m course new-lesson`` writes their skeletons."""
    lesson_id: str
    slug: str               # e.g. "lr_grad_accum_amp": lesson text and notebook are "<id>_<slug>"
    title: str
    module: str             # the exercise module, e.g. "train_loop": impl/train_loop.py
    exercises: list[Exercise]
    labs: tuple[str, ...] = ()          # scripts under labs/
    notebook_mistake: str = ""          # a catalogued mistake only a hidden check catches (autograde test)
    report: Optional[Callable[[ModuleType], list[str]]] = None   # ``python -m course align`` lines
    checks: list[Check] = field(default_factory=list)
    mistakes: list[Mistake] = field(default_factory=list)
    equivalents: list[Mistake] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.lesson_id}_{self.slug}"

    @property
    def module_file(self) -> str:
        return f"{self.module}.py"

    @property
    def lesson_file(self) -> str:
        return f"{self.name}.md"

    def files(self) -> dict[str, Path]:
        """Every file the lesson needs, by role, as absolute paths."""
        return {
            "lesson text (en)": REPO_ROOT / "course" / "lessons" / self.lesson_file,
            "lesson text (zh)": REPO_ROOT / "course" / "lessons" / "zh" / self.lesson_file,
            "stub": STUDENT_DIR / self.module_file,
            "reference": REFERENCE_DIR / self.module_file,
            "checks": REPO_ROOT / "course" / "checks" / f"lesson{self.lesson_id}.py",
            "test": REPO_ROOT / "tests" / f"test_lesson{self.lesson_id}_{self.module}.py",
            "notebook": REPO_ROOT / "notebooks" / "lessons" / f"{self.name}.py",
            **{f"lab {lab}": REPO_ROOT / "labs" / lab for lab in self.labs},
        }

    def load(self, impl: str = "student", impl_dir: Optional[str] = None) -> ModuleType:
        """The lesson's module from impl/ ("student"), the reference, or a submission directory."""
        return load_implementation(self.module_file, impl, impl_dir)

    def exercise(self, name: str) -> Exercise:
        names = [e.name for e in self.exercises]
        if name not in names:
            raise ValueError(f"exercise must be one of {names}, got {name!r}")
        return self.exercises[names.index(name)]

    def check(self, exercise: str, *, hidden: bool = False, uses: tuple[str, ...] = ()):
        """Decorator: register ``fn`` as a check of ``exercise`` (its docstring explains it)."""
        for name in (exercise, *uses):
            self.exercise(name)

        def register(fn):
            self.checks.append(Check(fn.__name__, exercise, fn, (fn.__doc__ or "").strip(), hidden, tuple(uses)))
            return fn
        return register

    def mistake(self, name: str, description: str, old: str, new: str, caught_by: Callable) -> None:
        """Catalogue a wrong variant of the reference that the check ``caught_by`` must FAIL."""
        self.mistakes.append(Mistake(self.lesson_id, name, description, old, new, caught_by.__name__,
                                     self.module_file))

    def equivalent(self, name: str, description: str, old: str, new: str) -> None:
        """Catalogue an algebraically equivalent variant of the reference that must PASS every check."""
        self.equivalents.append(Mistake(self.lesson_id, name, description, old, new, "", self.module_file))

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


# --- running checks ------------------------------------------------------------------------

def _todo_message(exc: NotImplementedError) -> str:
    return str(exc) or "stub still raises NotImplementedError"


def run_check(check: Check, module: ModuleType) -> CheckResult:
    start = time.perf_counter()
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
    return CheckResult(check.name, check.exercise, status, message, time.perf_counter() - start)


def grade(lesson: Lesson, module: ModuleType, exercises: Optional[list[str]] = None) -> list[CheckResult]:
    return [run_check(c, module) for c in lesson.checks if exercises is None or c.exercise in exercises]


def exercise_status(results: list[CheckResult]) -> str:
    statuses = {r.status for r in results}
    return FAIL if FAIL in statuses else TODO if TODO in statuses else PASS


# --- comparisons with ACTUAL vs EXPECTED messages -------------------------------------------

def fail(what: str, actual, expected, detail: str = "") -> None:
    extra = f"\n  {detail}" if detail else ""
    raise CheckFailure(f"{what}\n  ACTUAL:   {actual!r}\n  EXPECTED: {expected!r}{extra}")


def expect_equal(what: str, actual, expected) -> None:
    if actual != expected:
        fail(what, actual, expected)


def expect_close(what: str, actual: float, expected: float, *, rtol: float, atol: float = 0.0) -> None:
    """Scalar comparison: |actual - expected| <= atol + rtol * |expected|."""
    if actual is None or expected is None:
        if actual is not expected:
            fail(what, actual, expected)
        return
    if actual == expected:  # also covers matching infinities
        return
    diff = abs(actual - expected)
    if not diff <= atol + rtol * abs(expected) or math.isnan(actual) != math.isnan(expected):
        fail(what, actual, expected, f"|diff| = {diff:.3e} > tolerance (rtol={rtol:g}, atol={atol:g})")


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


def expect_raises(what: str, fn, exc_type, must_mention: str) -> None:
    """``fn()`` must raise ``exc_type`` whose message names ``must_mention`` (the bad argument)."""
    try:
        fn()
    except NotImplementedError:
        raise
    except exc_type as exc:
        if must_mention not in str(exc):
            fail(f"{what}: the error message should name {must_mention!r}", str(exc), f"...{must_mention}...")
        return
    except Exception as exc:  # wrong type of error
        fail(what, f"{type(exc).__name__}: {exc}", f"{exc_type.__name__} naming {must_mention!r}")
    fail(what, "no exception", f"{exc_type.__name__} naming {must_mention!r}")
