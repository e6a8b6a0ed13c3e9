"""Lesson notebooks: build nbgrader sources from jupytext files and generate the student release.

The source of truth is ``notebooks/lessons/<assignment>.py`` (jupytext ``py:percent``, nbgrader
metadata in the ``# %%`` headers). A code cell whose whole text is ``# exercise: NAME`` becomes the
exercise's solution cell: the signature and TODO docstring of ``impl/``'s stub, then the body of
the reference solution between ``### BEGIN SOLUTION`` / ``### END SOLUTION`` (private helpers and
UPPER_CASE constants it uses are nested inside). A class exercise keeps the stub's class header and
docstring and gets one such region per method of the reference. The notebook never holds a
hand-made copy of a solution.

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
    "15": LessonNotebook("15", "15_checkpoint_resume"),
    "16": LessonNotebook("16", "16_token_weighted_training_session"),
}


def get_notebook(lesson_id: str) -> LessonNotebook:
    if lesson_id not in NOTEBOOKS:
        raise ValueError(f"lesson must be one of {sorted(NOTEBOOKS)}, got {lesson_id!r}")
    return NOTEBOOKS[lesson_id]


# --- solution cells from the reference -------------------------------------------------------

def _definitions(source: str) -> dict[str, ast.stmt]:
    """Module-level functions, classes and single-name assignments of ``source``, by name."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = node
    return found


def _lines(source: str, first: int, last: int) -> str:
    """1-based inclusive line range of ``source``."""
    return "\n".join(source.splitlines()[first - 1:last])


def _docstring_end(node, where: str) -> int:
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        raise ValueError(f"{where}: {node.name} needs a docstring")
    return first.end_lineno


def _has_docstring(node) -> bool:
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def _start(node) -> int:
    """First line of a definition, its decorators included."""
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _header_end(node, source: str) -> int:
    """Last line of a method's header: its docstring, else the line that closes its signature."""
    if _has_docstring(node):
        return node.body[0].end_lineno
    lines = source.splitlines()
    signature = [node.lineno] + [n.end_lineno for n in ast.walk(node.args) if hasattr(n, "end_lineno")]
    if node.returns is not None:
        signature.append(node.returns.end_lineno)
    end = max(signature)
    while not lines[end - 1].split("#")[0].rstrip().endswith(":"):
        end += 1
    return end


def _module_helpers(node, definitions: dict[str, ast.stmt]) -> list[str]:
    """Private module-level functions and UPPER_CASE constants ``node`` uses, directly or through each
    other, in file order (a solution cell nests them, the notebook has no reference module)."""
    def is_helper(name):
        return name in definitions and (name.startswith("_") or name.isupper()) and \
            isinstance(definitions[name], (ast.FunctionDef, ast.Assign))

    wanted, todo = set(), [node]
    while todo:
        used = {n.id for n in ast.walk(todo.pop()) if isinstance(n, ast.Name)}
        for helper in sorted(used - wanted):
            if is_helper(helper):
                wanted.add(helper)
                todo.append(definitions[helper])
    return [n for n in definitions if n in wanted]


def _solution_body(node, body_start: int, source: str, definitions: dict[str, ast.stmt], indent: str) -> list[str]:
    """The helpers ``node`` uses (indented to its body) and its body from line ``body_start`` on."""
    body = [textwrap.indent(_lines(source, _start(definitions[h]), definitions[h].end_lineno), indent) + "\n"
            for h in _module_helpers(node, definitions)]
    body.append(_lines(source, body_start, node.end_lineno))
    return [f"{indent}### BEGIN SOLUTION", *body, f"{indent}### END SOLUTION"]


def _same_signature(name: str, stub, reference) -> None:
    if ast.dump(stub.args) != ast.dump(reference.args):
        raise ValueError(f"{name}: the impl stub and the reference have different signatures")


def _function_solution(stub, stub_source: str, reference, reference_source: str, definitions) -> str:
    _same_signature(stub.name, stub, reference)
    header = _lines(stub_source, stub.lineno, _docstring_end(stub, "impl stub"))
    body = _solution_body(reference, _docstring_end(reference, "reference") + 1, reference_source, definitions, "    ")
    return "\n".join([header, *body])


def _class_solution(stub, stub_source: str, reference, reference_source: str, definitions) -> str:
    """The stub's class header and docstring; then every method of the reference, in its order, with
    the stub's header (signature and docstring) where the stub has the method and the reference's
    header where it does not, each body between solution markers. The release keeps a class whose
    methods raise NotImplementedError, like the stub in ``impl/``."""
    stub_methods = {n.name: n for n in stub.body if isinstance(n, ast.FunctionDef)}
    members = reference.body[1:] if _has_docstring(reference) else reference.body
    odd = [type(m).__name__ for m in members if not isinstance(m, ast.FunctionDef)]
    if odd:
        raise ValueError(f"{reference.name}: the reference class may hold only methods (each gets solution "
                         f"markers inside), found {odd}")
    missing = sorted(set(stub_methods) - {m.name for m in members})
    if missing:
        raise ValueError(f"{reference.name}: the impl stub has methods {missing} the reference lacks")
    parts = [_lines(stub_source, _start(stub), _docstring_end(stub, "impl stub"))]
    for method in members:
        where = f"{reference.name}.{method.name}"
        if method.name in stub_methods:
            _same_signature(where, stub_methods[method.name], method)
            head = stub_methods[method.name]
            header = _lines(stub_source, _start(head), _header_end(head, stub_source))
        else:
            header = _lines(reference_source, _start(method), _header_end(method, reference_source))
        body = _solution_body(method, _header_end(method, reference_source) + 1, reference_source, definitions,
                              "        ")
        parts.append("\n".join([header, *body]))
    return "\n\n".join(parts)


def solution_cell(name: str, stub_source: str, reference_source: str) -> str:
    """The stub's signature and docstring around the reference body, inside solution markers.

    A function keeps one solution region (private helpers it calls are nested inside); a class gets
    one region per method (see ``_class_solution``).
    """
    stubs, references = _definitions(stub_source), _definitions(reference_source)
    for where, definitions in (("impl stub", stubs), ("reference", references)):
        if not isinstance(definitions.get(name), (ast.FunctionDef, ast.ClassDef)):
            raise ValueError(f"exercise {name!r} has no function or class in the {where} module")
    stub, reference = stubs[name], references[name]
    if type(stub) is not type(reference):
        raise ValueError(f"{name}: a {type(stub).__name__} in the impl stub, a {type(reference).__name__} "
                         "in the reference")
    build = _class_solution if isinstance(stub, ast.ClassDef) else _function_solution
    return build(stub, stub_source, reference, reference_source, references)


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
