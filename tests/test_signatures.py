"""Student stubs and reference solutions expose the same API; stubs say TODO and hold no reference solution."""
from __future__ import annotations

import ast
import copy
import inspect
from pathlib import Path

import pytest
from stub_copies import untouched_impl

from course.checks import LESSONS
from course.implementations import load_module

LESSON_LIST = sorted(LESSONS.values(), key=lambda lesson: lesson.lesson_id)


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.lesson_id)
def test_stub_and_reference_signatures_match(lesson):
    stub = load_module(lesson.files()["stub"], f"sig_stub_{lesson.lesson_id}")
    reference = load_module(lesson.files()["reference"], f"sig_ref_{lesson.lesson_id}")
    for exercise in lesson.exercises:
        for side, module in (("stub", stub), ("reference", reference)):
            assert hasattr(module, exercise.name), f"{side} {lesson.module_file} lacks {exercise.name}"
        expected = inspect.signature(getattr(reference, exercise.name))
        actual = inspect.signature(getattr(stub, exercise.name))
        assert str(actual) == str(expected), (
            f"{exercise.name}\n  ACTUAL (stub):      {actual}\n  EXPECTED (reference): {expected}")


def _exercise_nodes(path: Path) -> dict:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _code_without_docstrings(node) -> str:
    """The node's code as ast.dump, docstrings left out (they differ between stub and reference by design)."""
    node = copy.deepcopy(node)
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(inner) is not None:
            inner.body = inner.body[1:] or [ast.Pass()]
    return ast.dump(ast.Module(body=node.body, type_ignores=[]))


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.lesson_id)
def test_stubs_say_todo_and_hold_no_reference_solution(lesson):
    """Independent of the student's progress, so it holds for untouched and for solved stubs alike:
    each exercise in impl/ keeps its docstring saying TODO and naming its section; where it still raises
    NotImplementedError, the message names the section; and no exercise's code is the reference's (a
    solution leaked into impl/; the reference's docstrings also lack TODO). What untouched stubs DO is
    tested on a generated untouched copy (tests/stub_copies.py, used by tests/test_cli.py)."""
    stub_nodes = _exercise_nodes(lesson.files()["stub"])
    reference_nodes = _exercise_nodes(lesson.files()["reference"])
    for exercise in lesson.exercises:
        node = stub_nodes.get(exercise.name)
        assert node is not None, f"{lesson.files()['stub']} lacks {exercise.name}"
        section = exercise.section.split()[-1]  # e.g. "§5.1"
        doc = ast.get_docstring(node) or ""
        assert "TODO" in doc and section in doc, (
            f"{exercise.name}: docstring should say TODO and {section}\n  ACTUAL: {doc[:120]!r}")
        raises = [ast.unparse(n) for n in ast.walk(node)
                  if isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n)]
        assert all(section in r for r in raises), (
            f"{exercise.name}: NotImplementedError should name section {exercise.section}\n  ACTUAL: {raises}")
        assert _code_without_docstrings(node) != _code_without_docstrings(reference_nodes[exercise.name]), (
            f"{exercise.name} in {lesson.files()['stub']} is the reference solution: a solution leaked into impl/")


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.lesson_id)
def test_untouched_copy_raises_todo_naming_the_section(lesson, tmp_path):
    """The generated untouched copy of impl/ (what tests of the TODO path grade) raises NotImplementedError
    naming the section in every exercise and keeps the stubs' signatures."""
    copy_dir = untouched_impl(tmp_path / "impl")
    module = load_module(copy_dir / lesson.module_file, f"untouched_{lesson.lesson_id}")
    stub = load_module(lesson.files()["stub"], f"sig_stub_again_{lesson.lesson_id}")
    for exercise in lesson.exercises:
        expect = str(inspect.signature(getattr(stub, exercise.name)))
        assert str(inspect.signature(getattr(module, exercise.name))) == expect, exercise.name
        nodes = _exercise_nodes(copy_dir / lesson.module_file)
        raises = [ast.unparse(n) for n in ast.walk(nodes[exercise.name]) if isinstance(n, ast.Raise)]
        assert raises and all("NotImplementedError" in r and exercise.section in r for r in raises), raises


CONTRACT_LINES = {"function": 15, "class": 30}   # DEVELOPERS.md: a contract a student can hold in their head


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.lesson_id)
def test_core_contracts_are_short(lesson):
    """A core exercise's stub docstring is at most 15 lines (a class's, with its methods' docstrings, 30):
    purpose, arguments, returns, an example, the section to read. The lesson text teaches the rest."""
    nodes = _exercise_nodes(lesson.files()["stub"])
    too_long = {}
    for exercise in lesson.core_exercises:
        node = nodes[exercise.name]
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        docs = [ast.get_docstring(n) or "" for n in ast.walk(node)
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and (n is node or kind == "class")]
        lines = sum(len(doc.splitlines()) for doc in docs)
        if lines > CONTRACT_LINES[kind]:
            too_long[exercise.name] = f"{lines} lines (at most {CONTRACT_LINES[kind]})"
    assert not too_long, f"lesson {lesson.lesson_id}: contracts too long: ACTUAL {too_long}"
