"""The nbgrader assignments: build each lesson's source notebook and its student release.

The source of truth is ``notebooks/lessons/<lesson>.py`` (jupytext ``py:percent``): prose, the setup
cell, experiments, and one code cell ``# exercise: NAME`` per exercise. Everything graded is
generated from the lesson's descriptor (``course/checks/lessonNN/__init__.py``):

* the exercise cell becomes the solution cell: the signature and TODO docstring of ``impl/``'s stub,
  then the reference's body between ``### BEGIN SOLUTION`` / ``### END SOLUTION`` (private helpers
  and UPPER_CASE constants it uses nested inside; a class gets one region per method);
* after it come its grade cells: ``test_NAME`` runs the exercise's visible checks for
  ``Exercise.points``, ``hidden_NAME`` its hidden checks for ``Exercise.hidden_points`` (between
  ``### BEGIN/END HIDDEN TESTS``, after one visible check so that the release fails it too). A grade
  cell whose checks call other exercises (``uses``) waits until those exercises are defined. An
  optional exercise (an extension) gets one locked, ungraded cell ``check_NAME`` instead: it runs the
  checks and shows PASS / FAIL but scores nothing.

    python -m course release            # every lesson: notebooks/source/ and notebooks/release/

nbgrader runs as ``sys.executable -m nbgrader`` with the interpreter's bin directory first on PATH:
it shells out to helpers (``alembic``) that an unactivated virtual environment does not put on PATH.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

from course.layout import NOTEBOOKS_DIR, WORKSPACE_DIR

from . import LESSONS, get_lesson
from .framework import CORE, HARDENING, OPTIONAL, Lesson
from .hints import notebook_cell

EXERCISE_CELL = re.compile(r"^# exercise: (\w+)\s*$")


def in_course_dir(path: Path, course_dir: Path) -> Path:
    """A notebook path of ``Lesson.files()`` (under notebooks/) inside another nbgrader course directory."""
    return Path(course_dir) / path.relative_to(NOTEBOOKS_DIR)


def source_path(lesson: Lesson, course_dir: Path) -> Path:
    return in_course_dir(lesson.files()["notebook source"], course_dir)


def release_path(lesson: Lesson, course_dir: Path) -> Path:
    return in_course_dir(lesson.files()["notebook release"], course_dir)


def nbgrader_invocation(*args: str) -> tuple[list[str], dict]:
    """(the arguments after ``python``, the environment) of ``nbgrader ARGS`` run by this interpreter, its
    helper programs found on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return ["-m", "nbgrader", *args], dict(os.environ, PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))


def nbgrader(course_dir: Path, *args: str, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
    """``nbgrader ARGS`` in ``course_dir`` (see ``nbgrader_invocation``)."""
    python_args, env = nbgrader_invocation(*args)
    return subprocess.run([sys.executable, *python_args], cwd=course_dir, env=env, capture_output=True, text=True,
                          timeout=timeout)


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


# --- grade cells from the descriptor -------------------------------------------------------------

def _nbgrader_metadata(grade_id: str, *, solution: bool = False, points: int = 0) -> dict:
    meta = {"grade": points > 0, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if points:
        meta["points"] = points
    return meta


def _comment(text: str) -> str:
    return "\n".join(textwrap.wrap(text, width=108, initial_indent="# ", subsequent_indent="# "))


def _run_checks(lesson_id: str, names: list[str]) -> str:
    call = f'run_checks(globals(), "{lesson_id}", ' + ", ".join(f'"{n}"' for n in names) + ")"
    return "\n".join(textwrap.wrap(call, width=110, subsequent_indent=" " * 11, break_long_words=False,
                                    break_on_hyphens=False))


def _summary(checks) -> str:
    return " ".join(c.doc.split("\n\n")[0].replace("\n", " ").strip() for c in checks)


def _points(points: int) -> str:
    return f"{points} point{'s' if points != 1 else ''}"


def grade_cells(lesson: Lesson) -> list[tuple[set, str, str, int]]:
    """(exercises it needs, grade_id, source, points) of every grade cell, in exercise order."""
    cells = []
    for exercise in lesson.exercises:
        if exercise.optional:
            cells.append(optional_check_cell(lesson, exercise.name, lesson.tier_checks(exercise.name, OPTIONAL)))
            continue
        mine = lesson.tier_checks(exercise.name, CORE)
        visible, hidden = [c for c in mine if not c.hidden], [c for c in mine if c.hidden]
        if not visible or exercise.points < 1:
            raise ValueError(f"lesson {lesson.lesson_id}: exercise {exercise.name} needs a visible check and "
                             f"points >= 1 (has {len(visible)} visible checks, points={exercise.points})")
        if bool(hidden) != (exercise.hidden_points > 0):
            raise ValueError(f"lesson {lesson.lesson_id}: exercise {exercise.name} has {len(hidden)} hidden checks "
                             f"and hidden_points={exercise.hidden_points}: both or neither")
        needs = {exercise.name, *(u for c in visible for u in c.uses)}
        source = "\n".join([_comment(f"{_points(exercise.points)}: {_summary(visible)}"),
                            _run_checks(lesson.lesson_id, [c.name for c in visible])])
        cells.append((needs, f"test_{exercise.name}", source, exercise.points))
        if hidden:
            guard = visible[0]
            needs = {exercise.name, *guard.uses, *(u for c in hidden for u in c.uses)}
            source = "\n".join([
                _comment(f"{_points(exercise.hidden_points)}, hidden (the tests run when the notebook is graded; "
                         f"the visible line keeps an unsolved exercise at 0): {_summary(hidden)}"),
                _run_checks(lesson.lesson_id, [guard.name]), "### BEGIN HIDDEN TESTS",
                _run_checks(lesson.lesson_id, [c.name for c in hidden]), "### END HIDDEN TESTS"])
            cells.append((needs, f"hidden_{exercise.name}", source, exercise.hidden_points))
        hardening = lesson.tier_checks(exercise.name, HARDENING)
        if hardening:
            cells.append(optional_check_cell(lesson, exercise.name, hardening, HARDENING))
    return cells


def checks_called(cell_source: str) -> list[str]:
    """Check names passed to ``run_checks(globals(), lesson, *names)`` in a grade cell's source."""
    return [arg.value for node in ast.walk(ast.parse(cell_source)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "run_checks" for arg in node.args[2:]]


def scored_cells(lesson: Lesson) -> list[tuple[str, int, list[str]]]:
    """(grade_id, points, the checks it runs) of every grade cell that scores points: a cell scores its points
    exactly when all its checks pass."""
    return [(grade_id, points, checks_called(source)) for _, grade_id, source, points in grade_cells(lesson)
            if points]


def optional_check_cell(lesson: Lesson, exercise: str, checks, tier: str = OPTIONAL) -> tuple[set, str, str, int]:
    """An extension's cell ``check_NAME``, or a core exercise's hardening cell ``check_NAME_hardening``: locked,
    not graded (0 points; nbgrader has no optional points, and ``validate`` fails a 0-point grade cell that
    errors), running the checks so the student and the feedback see PASS / FAIL. Whether a check is hidden
    does not matter here: nothing is scored."""
    if not checks:
        raise ValueError(f"lesson {lesson.lesson_id}: optional exercise {exercise} needs checks")
    what = ("Hardening (argument rules and conventions beyond the lesson's objectives)" if tier == HARDENING
            else "Optional")
    source = "\n".join([_comment(f"{what}, not scored (python -m course check {lesson.lesson_id} --all grades it "
                                  f"too): {_summary(checks)}"),
                         _run_checks(lesson.lesson_id, [c.name for c in checks])])
    grade_id = f"check_{exercise}" + ("_hardening" if tier == HARDENING else "")
    return {exercise, *(u for c in checks for u in c.uses)}, grade_id, source, 0


# --- building the nbgrader source notebook -----------------------------------------------------

def build_source(lesson: Lesson, course_dir: Path = NOTEBOOKS_DIR, reference_source: Optional[str] = None) -> Path:
    """Write ``course_dir/source/<lesson>/<lesson>.ipynb``; returns its path.

    ``reference_source`` replaces the reference module's text (tests build a submission with a
    catalogued mistake this way).
    """
    import jupytext
    import nbformat

    files = lesson.files()
    stub_source = files["stub"].read_text(encoding="utf-8")
    if reference_source is None:
        reference_source = files["reference"].read_text(encoding="utf-8")
    nb = jupytext.read(files["notebook"], fmt="py:percent")
    nb.metadata.pop("jupytext", None)
    exercises = [e.name for e in lesson.exercises]
    pending, seen, cells = grade_cells(lesson), set(), []
    for index, cell in enumerate(nb.cells):
        cells.append(cell)
        match = EXERCISE_CELL.match(cell.source) if cell.cell_type == "code" else None
        if not match:
            # Stable ids keep the generated notebooks identical from build to build.
            cell.id = cell.metadata.get("nbgrader", {}).get("grade_id", f"cell-{index:02d}")
            continue
        name = match.group(1)
        if name not in exercises or name in seen:
            raise ValueError(f"{files['notebook'].name}: cell {index} names {name!r}; each exercise of lesson "
                             f"{lesson.lesson_id} {exercises} needs exactly one exercise cell")
        seen.add(name)
        cell.source = solution_cell(name, stub_source, reference_source)
        cell.metadata["nbgrader"] = _nbgrader_metadata(name, solution=True)
        cell.id = name
        if name in lesson.hints:
            hint = nbformat.v4.new_markdown_cell(
                notebook_cell(lesson.lesson_id, name, lesson.exercise(name).section_number))
            hint.id = f"hints-{name}"
            cells.append(hint)
        for needs, grade_id, source, points in [p for p in pending if p[0] <= seen]:
            grade = nbformat.v4.new_code_cell(source, metadata={"nbgrader": _nbgrader_metadata(grade_id, points=points)})
            grade.id = grade_id
            cells.append(grade)
        pending = [p for p in pending if not p[0] <= seen]
    if pending:
        raise ValueError(f"{files['notebook'].name}: no exercise cell for {sorted(set(exercises) - seen)}")
    nb.cells = cells
    path = source_path(lesson, course_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return path


def notebook_lessons() -> list[Lesson]:
    """Every lesson with a notebook source in notebooks/lessons/."""
    return [lesson for _, lesson in sorted(LESSONS.items()) if lesson.files()["notebook"].is_file()]


def generate_release(assignment: str, course_dir: Path = NOTEBOOKS_DIR, register: bool = True) -> None:
    """``nbgrader generate_assignment ASSIGNMENT`` (a lesson's name, or a glob of them) in ``course_dir`` (which
    holds nbgrader_config.py); ``register``: the course's gradebook records it (else ``--no-db``: files only)."""
    proc = nbgrader(course_dir, "generate_assignment", assignment, "--force", *([] if register else ["--no-db"]))
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment {assignment} failed:\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")


def holds_work(notebook: Path) -> bool:
    """Whether a release notebook holds someone's work: a cell was run, or an exercise cell no longer raises
    ``NotImplementedError()`` (as generated, none was run and every exercise cell still raises)."""
    import nbformat

    cells = nbformat.read(notebook, as_version=4).cells
    return any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count")) for c in cells) or any(
        "raise NotImplementedError()" not in c.source for c in cells
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution"))


def release_all(course_dir: Path = NOTEBOOKS_DIR, lesson_ids: Optional[list[str]] = None,
                overwrite_work: bool = False) -> list[Path]:
    """Rebuild the source and the release of every (or the named) lesson notebook. The named lessons are the ones
    given: the course's gradebook registers them (``nbgrader export`` lists only those); every notebook at once is
    the course's own rebuild, registered nowhere. A release that holds work (``holds_work``: a student did the
    exercises in it) is refused before anything is written, unless ``overwrite_work``."""
    if not (Path(course_dir) / "nbgrader_config.py").is_file():
        raise ValueError(f"course_dir {str(course_dir)!r} has no nbgrader_config.py (use notebooks/ or a copy)")
    lessons = [get_lesson(i) for i in lesson_ids] if lesson_ids else notebook_lessons()
    worked = [release_path(lesson, course_dir) for lesson in lessons
              if release_path(lesson, course_dir).is_file() and holds_work(release_path(lesson, course_dir))]
    if worked and not overwrite_work:
        raise ValueError(f"{', '.join(str(p) for p in worked)} hold work (cells were run or exercises written) that "
                         f"a release would erase: python -m course workspace copies it to {WORKSPACE_DIR}, where "
                         f"nothing is regenerated; --overwrite-work releases over it anyway")
    for lesson in lessons:
        build_source(lesson, course_dir)
    sources = {folder.name for folder in (Path(course_dir) / "source").iterdir() if folder.is_dir()}
    register = bool(lesson_ids)
    if sources == {lesson.name for lesson in lessons}:   # one nbgrader start (~3 s) for all: it globs the id
        generate_release("*", course_dir, register)
    else:
        for lesson in lessons:
            generate_release(lesson.name, course_dir, register)
    return [release_path(lesson, course_dir) for lesson in lessons]


def workspace_path(lesson: Lesson) -> Path:
    """Where ``python -m course workspace`` puts a student's copy of the lesson's release notebook."""
    return WORKSPACE_DIR / lesson.files()["notebook release"].name


def copy_to_workspace(lesson: Lesson) -> tuple[Path, bool]:
    """Copy the lesson's release notebook (with whatever work it holds) into the workspace, never over a copy
    that is there: (the copy's path, whether it was written now)."""
    target = workspace_path(lesson)
    if target.exists():
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(lesson.files()["notebook release"].read_bytes())
    return target, True
