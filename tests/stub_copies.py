"""An untouched copy of impl/, whatever the student has already solved.

Tests of the TODO path (the CLI's table, ``align``, the stage assembly) must not depend on the state of
the student's impl/: they grade this copy instead, in which every exercise's body is the stub's
``raise NotImplementedError`` naming its lesson section, and everything else (glue, docstrings) is
impl/'s own.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

from course.checks import LESSONS
from course.implementations import STUDENT_DIR


def todo_body(node, name: str, section: str) -> list:
    """``node``'s docstring (if any) followed by the stub's raise naming ``section`` (e.g. "14 §5.1")."""
    raise_todo = ast.parse(f'raise NotImplementedError("{name}: TODO - see lesson {section}")').body
    docstring = node.body[:1] if ast.get_docstring(node) is not None else []
    return docstring + raise_todo


def untouched_impl(destination: Path) -> Path:
    """impl/ copied to ``destination`` with every exercise of every lesson reset to its stub; returns it."""
    shutil.copytree(STUDENT_DIR, destination, ignore=shutil.ignore_patterns("__pycache__"))
    for lesson in LESSONS.values():
        path = destination / lesson.module_file
        tree = ast.parse(path.read_text(encoding="utf-8"))
        sections = {e.name: e.section for e in lesson.exercises}
        for node in tree.body:
            if getattr(node, "name", None) not in sections:
                continue
            section = sections[node.name]
            if isinstance(node, ast.ClassDef):
                for method in node.body:
                    if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        method.body = todo_body(method, f"{node.name}.{method.name}", section)
            else:
                node.body = todo_body(node, node.name, section)
        path.write_text(ast.unparse(tree) + "\n", encoding="utf-8")
    return destination
