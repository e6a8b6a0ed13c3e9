"""The one grading engine: pytest, the CLI and the notebooks all call these functions.

A *check* is a function ``check(impl) -> None`` that takes the module under test (the student's
file, the reference, or any directory laid out like ``impl/``) and raises ``CheckFailure`` with an
ACTUAL vs EXPECTED message when the implementation is wrong. A stub that still raises
``NotImplementedError`` is reported as TODO, never as a failure.
"""
from __future__ import annotations

import importlib.util
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
STUDENT_DIR = REPO_ROOT / "impl"
REFERENCE_DIR = REPO_ROOT / "course" / "reference"
IMPL_CHOICES = ("student", "reference")

PASS, FAIL, TODO = "PASS", "FAIL", "TODO"


class CheckFailure(AssertionError):
    """An implementation gave a wrong answer; the message says what and where."""


@dataclass(frozen=True)
class Check:
    name: str
    exercise: str
    run: Callable[[ModuleType], None]
    doc: str = ""


@dataclass(frozen=True)
class Exercise:
    name: str      # the function or class the student writes
    section: str   # where the lesson explains it, e.g. "14 §5.1"


@dataclass
class Lesson:
    lesson_id: str
    title: str
    module_path: str            # relative to an impl dir, e.g. "core/train_loop.py"
    lesson_file: str            # relative to course/lessons
    exercises: list[Exercise]
    checks: list[Check] = field(default_factory=list)

    def check(self, exercise: str):
        """Decorator: register ``fn`` as a check of ``exercise`` (its docstring explains it)."""
        names = [e.name for e in self.exercises]
        if exercise not in names:
            raise ValueError(f"exercise must be one of {names}, got {exercise!r}")

        def register(fn):
            self.checks.append(Check(fn.__name__, exercise, fn, (fn.__doc__ or "").strip()))
            return fn
        return register

    def section_of(self, exercise: str) -> str:
        return next(e.section for e in self.exercises if e.name == exercise)


@dataclass
class CheckResult:
    check: str
    exercise: str
    status: str
    message: str = ""
    seconds: float = 0.0


# --- loading the implementation under test -------------------------------------------------

def impl_root(impl: str = "student", impl_dir: Optional[str] = None) -> Path:
    if impl_dir is not None:
        root = Path(impl_dir).expanduser().resolve()
        if not root.is_dir():
            raise ValueError(f"--impl-dir {str(impl_dir)!r} is not a directory")
        return root
    if impl not in IMPL_CHOICES:
        raise ValueError(f"impl must be one of {IMPL_CHOICES}, got {impl!r}")
    return STUDENT_DIR if impl == "student" else REFERENCE_DIR


def load_module(path: Path, label: str) -> ModuleType:
    """Import a file under a unique name so student, reference and mutants never collide."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (an implementation directory needs it)")
    name = f"_course_impl_{label}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def load_impl(lesson: Lesson, impl: str = "student", impl_dir: Optional[str] = None) -> ModuleType:
    root = impl_root(impl, impl_dir)
    return load_module(root / lesson.module_path, impl if impl_dir is None else "dir")


def module_from_source(source: str, label: str, filename: str) -> ModuleType:
    """Build a module from source text (used for the mistake catalogue's mutants)."""
    module = ModuleType(f"_course_mutant_{label}")
    module.__file__ = filename
    sys.modules[module.__name__] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


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
