"""Student stubs and reference solutions expose the same API, and untouched stubs say TODO."""
from __future__ import annotations

import ast
import inspect

import pytest

from course.checks import LESSONS
from course.implementations import REFERENCE_DIR, STUDENT_DIR, load_module

LESSON_LIST = sorted(LESSONS.values(), key=lambda lesson: lesson.lesson_id)


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.lesson_id)
def test_stub_and_reference_signatures_match(lesson):
    stub = load_module(STUDENT_DIR / lesson.module_file, f"sig_stub_{lesson.lesson_id}")
    reference = load_module(REFERENCE_DIR / lesson.module_file, f"sig_ref_{lesson.lesson_id}")
    for exercise in lesson.exercises:
        for side, module in (("stub", stub), ("reference", reference)):
            assert hasattr(module, exercise.name), f"{side} {lesson.module_file} lacks {exercise.name}"
        expected = inspect.signature(getattr(reference, exercise.name))
        actual = inspect.signature(getattr(stub, exercise.name))
        assert str(actual) == str(expected), (
            f"{exercise.name}\n  ACTUAL (stub):      {actual}\n  EXPECTED (reference): {expected}")


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.lesson_id)
def test_untouched_stubs_raise_todo_naming_the_section(lesson):
    """Every exercise in impl/ is still a stub: docstring says TODO, body raises NotImplementedError
    whose message names the lesson section (a filled-in stub here means a solution leaked into impl/)."""
    tree = ast.parse((STUDENT_DIR / lesson.module_file).read_text(encoding="utf-8"))
    nodes = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for exercise in lesson.exercises:
        node = nodes.get(exercise.name)
        assert node is not None, f"impl/{lesson.module_file} lacks {exercise.name}"
        raises = [ast.unparse(n) for n in ast.walk(node) if isinstance(n, ast.Raise)
                  and "NotImplementedError" in ast.unparse(n)]
        assert raises, f"{exercise.name} in impl/{lesson.module_file} no longer raises NotImplementedError"
        section = exercise.section.split()[-1]  # e.g. "§5.1"
        assert any(section in r for r in raises), (
            f"{exercise.name}: NotImplementedError should name section {exercise.section}; found {raises}")
        doc = ast.get_docstring(node) or ""
        assert "TODO" in doc and section in doc, f"{exercise.name}: docstring should say TODO and {section}"
