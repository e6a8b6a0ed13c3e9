"""The mistake catalogue: wrong (and equivalent) variants of a reference function, each one small edit.

A ``Mistake`` names the function it edits ("train_one_epoch", or "SkipBatchSampler.__iter__" for a
method) and replaces its ``old`` snippet, which must occur exactly once INSIDE that function, with
``new``. Scoping the edit to one function keeps an unrelated change elsewhere in the reference from
moving or staling the entry; ``verify`` reports every entry whose edit no longer applies, with the
reference line nearest to what it looks for (``python -m course mistakes NN --verify``).
"""
from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Callable, Optional

from course.implementations import REFERENCE_DIR, module_from_source


class MistakeDoesNotApply(ValueError):
    """A catalogue entry's edit no longer fits the reference (it changed since the entry was written)."""


def function_lines(source: str, function: str) -> tuple[int, int]:
    """First and last line (1-based, decorators included) of ``function`` in ``source``: a module-level
    function or class ("name") or a method ("Class.method")."""
    body, node = ast.parse(source).body, None
    for part in function.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            raise MistakeDoesNotApply(f"no function or class {function!r} (missing {part!r})")
        body = node.body
    return min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno


def nearest_line(lines: list[str], snippet: str, first: int = 1) -> str:
    """The line of ``lines`` (numbered from ``first``) most like the first non-blank line of ``snippet``."""
    wanted = next((line.strip() for line in snippet.splitlines() if line.strip()), "")
    scores = [(difflib.SequenceMatcher(None, wanted, line.strip()).ratio(), number, line.rstrip())
              for number, line in enumerate(lines, start=first)]
    if not scores:
        return "(the function is empty)"
    _, number, line = max(scores)
    return f"line {number}: {line.strip()!r}"


@dataclass(frozen=True)
class Mistake:
    """The reference with ``old`` replaced by ``new`` once, inside ``function``. ``caught_by`` names the
    check that must FAIL it; an accepted equivalent has none and must PASS every check. ``lesson`` and
    ``module_file`` are filled in by the lesson whose catalogue lists it."""
    name: str
    description: str
    function: str
    old: str
    new: str
    caught_by: str = ""
    rule: str = ""          # words the failure's hint must contain: it names this mistake's rule, not another's
    lesson: str = ""
    module_file: str = ""

    def source(self, original: Optional[str] = None) -> str:
        """The reference file with the edit; ``original``: apply it to this text instead (another edit's)."""
        if original is None:
            original = (REFERENCE_DIR / self.module_file).read_text(encoding="utf-8")
        try:
            first, last = function_lines(original, self.function)
        except MistakeDoesNotApply as exc:
            raise MistakeDoesNotApply(f"mistake {self.name!r}: {self.module_file} has {exc}") from None
        lines = original.splitlines(keepends=True)
        body = "".join(lines[first - 1:last])
        count = body.count(self.old)
        if count != 1:
            raise MistakeDoesNotApply(
                f"mistake {self.name!r}: its 'old' snippet occurs {count} times in {self.function} "
                f"({self.module_file} lines {first}-{last}), expected exactly once; nearest "
                f"{nearest_line(lines[first - 1:last], self.old, first)}")
        return "".join(lines[:first - 1]) + body.replace(self.old, self.new) + "".join(lines[last:])

    def build(self) -> ModuleType:
        return module_from_source(self.source(), f"{self.lesson}_{self.name}",
                                  f"<mistake {self.name}: {self.module_file}>")

    def bound(self, lesson_id: str, module_file: str) -> "Mistake":
        return replace(self, lesson=lesson_id, module_file=module_file)


def mistake(name: str, description: str, function: str, old: str, new: str, caught_by: Callable,
            rule: str = "") -> Mistake:
    """A wrong variant of ``function`` in the reference that the check ``caught_by`` must FAIL; ``rule``: words
    the failure's ``hint:`` must contain (it leads the student to this mistake's rule)."""
    return Mistake(name, description, function, old, new, caught_by.__name__, rule)


def equivalent(name: str, description: str, function: str, old: str, new: str) -> Mistake:
    """An algebraically equivalent variant of ``function`` in the reference that must PASS every check."""
    return Mistake(name, description, function, old, new)


def verify(entries) -> list[str]:
    """One line per entry whose edit no longer applies (empty when every edit applies)."""
    problems = []
    for entry in entries:
        try:
            entry.source()
        except MistakeDoesNotApply as exc:
            problems.append(str(exc))
    return problems
