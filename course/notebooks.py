"""Lesson notebooks: build nbgrader sources from jupytext files and generate the student release.

The source of truth is ``notebooks/lessons/<assignment>.py`` (jupytext ``py:percent``, nbgrader
metadata in the ``# %%`` headers). A code cell whose whole text is ``# exercise: NAME`` becomes the
exercise's solution cell: the signature and TODO docstring of ``impl/``'s stub, then the body of
the reference solution between ``### BEGIN SOLUTION`` / ``### END SOLUTION`` (private helpers it
calls are nested inside), so the notebook never holds a hand-made copy of a solution.

    python -m course release            # every lesson: notebooks/source/ and notebooks/release/

Adding a lesson's notebook = one jupytext file + one entry in ``NOTEBOOKS``.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .checks import get_lesson
from .checks.framework import REFERENCE_DIR, REPO_ROOT, STUDENT_DIR

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
EXERCISE_CELL = re.compile(r"^# exercise: (\w+)\s*$")


@dataclass(frozen=True)
class LessonNotebook:
    lesson_id: str
    assignment: str   # nbgrader assignment name, also the notebook's file name

    @property
    def jupytext_path(self) -> Path:
        return NOTEBOOKS_DIR / "lessons" / f"{self.assignment}.py"

    def source_path(self, course_dir: Path) -> Path:
        return Path(course_dir) / "source" / self.assignment / f"{self.assignment}.ipynb"

    def release_path(self, course_dir: Path) -> Path:
        return Path(course_dir) / "release" / self.assignment / f"{self.assignment}.ipynb"


NOTEBOOKS: dict[str, LessonNotebook] = {
    "14": LessonNotebook("14", "14_lr_grad_accum_amp"),
}


def get_notebook(lesson_id: str) -> LessonNotebook:
    if lesson_id not in NOTEBOOKS:
        raise ValueError(f"lesson must be one of {sorted(NOTEBOOKS)}, got {lesson_id!r}")
    return NOTEBOOKS[lesson_id]


# --- solution cells from the reference -------------------------------------------------------

def _functions(source: str) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}


def _lines(source: str, first: int, last: int) -> str:
    """1-based inclusive line range of ``source``."""
    return "\n".join(source.splitlines()[first - 1:last])


def _docstring_end(node: ast.FunctionDef, where: str) -> int:
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        raise ValueError(f"{where}: {node.name} needs a docstring")
    return first.end_lineno


def _private_helpers(name: str, functions: dict[str, ast.FunctionDef]) -> list[str]:
    """Private module-level functions ``name`` calls, directly or through each other, in file order."""
    wanted, todo = set(), [name]
    while todo:
        used = {n.id for n in ast.walk(functions[todo.pop()]) if isinstance(n, ast.Name)}
        for helper in sorted(used - wanted):
            if helper.startswith("_") and helper in functions:
                wanted.add(helper)
                todo.append(helper)
    return [n for n in functions if n in wanted]


def solution_cell(name: str, stub_source: str, reference_source: str) -> str:
    """The stub's signature and docstring around the reference body, inside solution markers."""
    stubs, references = _functions(stub_source), _functions(reference_source)
    for where, functions in (("impl stub", stubs), ("reference", references)):
        if name not in functions:
            raise ValueError(f"exercise {name!r} has no function in the {where} module")
    stub, reference = stubs[name], references[name]
    if ast.dump(stub.args) != ast.dump(reference.args):
        raise ValueError(f"{name}: the impl stub and the reference have different signatures")
    header = _lines(stub_source, stub.lineno, _docstring_end(stub, "impl stub"))
    body = [textwrap.indent(_lines(reference_source, references[h].lineno, references[h].end_lineno), "    ")
            + "\n" for h in _private_helpers(name, references)]
    body.append(_lines(reference_source, _docstring_end(reference, "reference") + 1, reference.end_lineno))
    return "\n".join([header, "    ### BEGIN SOLUTION", *body, "    ### END SOLUTION"])


# --- building the nbgrader source notebook ----------------------------------------------------

def build_source(notebook: LessonNotebook, course_dir: Path = NOTEBOOKS_DIR,
                 reference_source: Optional[str] = None) -> Path:
    """Write ``course_dir/source/<assignment>/<assignment>.ipynb``; returns its path.

    ``reference_source`` replaces the reference module's text (tests build a submission with a
    catalogued mistake this way).
    """
    import jupytext
    import nbformat

    lesson = get_lesson(notebook.lesson_id)
    stub_source = (STUDENT_DIR / lesson.module_path).read_text(encoding="utf-8")
    if reference_source is None:
        reference_source = (REFERENCE_DIR / lesson.module_path).read_text(encoding="utf-8")
    nb = jupytext.read(notebook.jupytext_path, fmt="py:percent")
    nb.metadata.pop("jupytext", None)
    exercises = {e.name for e in lesson.exercises}
    for index, cell in enumerate(nb.cells):
        match = EXERCISE_CELL.match(cell.source) if cell.cell_type == "code" else None
        if match:
            if match.group(1) not in exercises:
                raise ValueError(f"{notebook.jupytext_path.name}: cell {index} names {match.group(1)!r}, "
                                 f"not an exercise of lesson {lesson.lesson_id} {sorted(exercises)}")
            cell.source = solution_cell(match.group(1), stub_source, reference_source)
        # Stable ids keep the generated notebooks identical from build to build.
        cell.id = cell.metadata.get("nbgrader", {}).get("grade_id", f"cell-{index:02d}")
    path = notebook.source_path(course_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return path


def generate_release(notebook: LessonNotebook, course_dir: Path = NOTEBOOKS_DIR) -> Path:
    """``nbgrader generate_assignment`` in ``course_dir`` (which holds nbgrader_config.py)."""
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", notebook.assignment,
                           "--force"], cwd=course_dir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment {notebook.assignment} failed:\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    return notebook.release_path(course_dir)


def release_all(course_dir: Path = NOTEBOOKS_DIR, lesson_ids: Optional[list[str]] = None) -> list[Path]:
    """Rebuild the source and the release of every (or the named) lesson notebook."""
    if not (Path(course_dir) / "nbgrader_config.py").is_file():
        raise ValueError(f"course_dir {str(course_dir)!r} has no nbgrader_config.py (use notebooks/ or a copy)")
    paths = []
    for lesson_id in lesson_ids or sorted(NOTEBOOKS):
        notebook = get_notebook(lesson_id)
        build_source(notebook, course_dir)
        paths.append(generate_release(notebook, course_dir))
    return paths


def show_and_save(fig, name: str, folder: str = "figures") -> Path:
    """Save ``fig`` as ``folder/name.png`` (next to the notebook) and show it inline."""
    import matplotlib.pyplot as plt

    path = Path(folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.show()
    return path
