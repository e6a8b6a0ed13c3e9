"""Identical code, and the class's static and compare flags (``course.classroom.tampering``): an exercise of 120+
AST nodes identical to the reference's (formatting, comments and docstrings aside), or a submission whose
exercises are all identical to another student's; ``add_class_flags`` gives each result of a class both kinds.
"""
from __future__ import annotations

import ast
import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Optional

from course.implementations import REFERENCE_DIR

from .tampering import (MIN_IDENTICAL_NODES, SAME_AS_REFERENCE, SAME_AS_STUDENT, UNSCANNED, course_cell_ids,
                        course_imports, flag, parse_source, static_flags, submission_sources)


def _static_flags_or_why(path: Path, course_ids: Optional[set], allowed: frozenset) -> list[dict]:
    """``static_flags``, or one flag saying why a submission could not be scanned: never an error of the class."""
    try:
        return static_flags(path, course_ids, allowed)
    except Exception as error:   # noqa: BLE001 - one submission's text never stops the class's flags
        return [flag(UNSCANNED, "-", 0, f"could not be scanned ({type(error).__name__}): read it", "static")]



# --- identical code -----------------------------------------------------------------------------------------

def _without_docstrings(node):
    """A copy of ``node`` whose function, class and module bodies have no docstring."""
    import copy
    node = copy.deepcopy(node)
    for part in ast.walk(node):
        body = getattr(part, "body", None)
        if isinstance(part, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            part.body = body[1:] or [ast.Pass()]
    return node


def _is_stub(node) -> bool:
    """A definition still as released: its body (docstrings aside) only raises NotImplementedError or passes."""
    if isinstance(node, ast.ClassDef):
        methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        return all(_is_stub(m) for m in methods)
    body = _without_docstrings(node).body
    return all(isinstance(s, ast.Pass) or isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
               or isinstance(s, ast.Raise) and "NotImplementedError" in ast.dump(s) for s in body)


def exercise_fingerprints(sources: Iterable[tuple[str, str]], exercises: Iterable[str]
                          ) -> dict[str, tuple[str, int, str, int]]:
    """exercise -> (digest of its code, AST nodes, label, line) of every exercise the sources define and wrote (not
    stubs); a later definition replaces an earlier one, as running them would."""
    wanted, found = set(exercises), {}
    for label, source in sources:
        tree = parse_source(source)
        for node in tree.body if tree is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in wanted:
                try:   # code nested too deep to copy is compared with nothing (the static scan flags it)
                    if _is_stub(node):
                        found.pop(node.name, None)
                        continue
                    code = _without_docstrings(node)
                    text = ast.dump(code, include_attributes=False)
                except (RecursionError, MemoryError):
                    continue
                found[node.name] = (hashlib.sha256(text.encode()).hexdigest(), sum(1 for _ in ast.walk(code)),
                                    label, node.lineno)
    return found


def reference_fingerprints(lesson) -> dict[str, set[str]]:
    """exercise -> digests of the reference's code: its module's, and its notebook's solution cells' (which nest
    the helpers)."""
    from course.checks.assignments import solution_cell
    reference = (REFERENCE_DIR / lesson.module_file).read_text(encoding="utf-8")
    stub = lesson.files()["stub"].read_text(encoding="utf-8")
    names = [e.name for e in lesson.exercises]
    forms = [("reference", reference)]
    for name in names:
        try:
            forms.append((name, solution_cell(name, stub, reference)))
        except ValueError:   # an exercise the notebook does not build from the reference
            continue
    digests: dict[str, set[str]] = defaultdict(set)
    for form in forms:
        for name, (digest, *_) in exercise_fingerprints([form], names).items():
            digests[name].add(digest)
    return digests


def identical_flags(lesson, submissions: dict[str, Path], course_ids: Optional[set] = None) -> dict[str, list[dict]]:
    """student -> flags: each exercise (of at least ``MIN_IDENTICAL_NODES`` nodes) identical to the reference's,
    and a submission whose written exercises are all identical to another student's."""
    names = [e.name for e in lesson.exercises]
    reference = reference_fingerprints(lesson)
    flags: dict[str, list[dict]] = defaultdict(list)
    same: dict[tuple, list[str]] = defaultdict(list)
    where = {}
    for student, path in submissions.items():
        try:
            found = exercise_fingerprints(submission_sources(path, course_ids), names)
        except Exception:   # noqa: BLE001 - one submission's text never stops the class's flags
            continue
        for name, (digest, nodes, label, line) in found.items():
            if digest in reference.get(name, ()) and nodes >= MIN_IDENTICAL_NODES:
                flags[student].append(flag(SAME_AS_REFERENCE, label, line, f"{name} is the reference's, "
                                           "formatting, comments and docstrings aside", "compare"))
        if sum(nodes for _, nodes, *_ in found.values()) >= MIN_IDENTICAL_NODES:
            key = tuple(sorted((name, digest) for name, (digest, *_) in found.items()))
            same[key].append(student)
            where[student] = min((label, line) for _, _, label, line in found.values())
    for students in (group for group in same.values() if len(group) > 1):
        for student in students:
            others = [s for s in students if s != student]
            label, line = where[student]
            flags[student].append(flag(SAME_AS_STUDENT, label, line, f"every exercise written is identical to "
                                       f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''}", "compare"))
    return dict(flags)


def add_class_flags(lesson, submissions: list, results: list[dict], source_notebook: Optional[Path] = None
                    ) -> list[dict]:
    """Give each result (``results[i]`` of ``submissions[i]``, a graded one having a route) the static and identical
    flags of the class as it is now, beside the flags its run reported; the results whose flags changed."""
    course_ids = course_cell_ids(source_notebook) if source_notebook else None
    try:
        allowed = course_imports(json.loads(lesson.files()["notebook release"].read_text(encoding="utf-8")))
    except (OSError, ValueError):
        allowed = set()
    graded = {s.student: s.path for s in submissions if s.route}
    found = identical_flags(lesson, graded, course_ids)
    changed = []
    for submission, result in zip(submissions, results):
        fresh = _static_flags_or_why(submission.path, course_ids, allowed) + found.get(submission.student, []) \
            if submission.route else []
        kept = [f for f in result.get("flags") or [] if f.get("source") not in ("static", "compare")]
        if kept + fresh != result.get("flags"):
            result["flags"] = kept + fresh
            changed.append(result)
    return changed
