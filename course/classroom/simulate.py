"""A simulated class, to try the class grader and to measure it: correct, wrong and hanging submissions of a
lesson, through either route.

* correct: the reference, and its catalogued equivalent forms (``EQUIVALENTS``: each must pass every check);
* wrong: the catalogued mistakes (``MISTAKES``), one after another;
* hanging: the reference with an endless loop: at the end of the module (the file route: it never imports), or in
  a cell the student added after the setup cell (the notebook route: that cell runs into its time limit, and
  nbgrader grades the rest).

Students who write the same variant do not hand in the same text: each one's local names are its own
(``own_names``: ``total`` becomes ``total_s003``), so that no two submissions, and none of them and the reference,
are identical (the class's tampering flags, ``course.classroom.tampering``), as with code of different people.

The file route writes ``FOLDER/<student>/<module>.py``. The notebook route makes ``FOLDER`` an nbgrader course
directory (the course's ``nbgrader_config.py``, the lesson released into it, so that its gradebook knows the
assignment) and writes each student's notebook to ``submitted/<student>/<lesson>/<lesson>.ipynb``: the released
notebook with every solution cell answered by the variant's functions.
"""
from __future__ import annotations

import ast
import shutil
import tempfile
from itertools import cycle
from pathlib import Path

from course.checks.assignments import build_source, release_all, release_path
from course.checks.framework import Lesson
from course.implementations import REFERENCE_DIR
from course.layout import NOTEBOOKS_DIR

from .pool import FILES

KINDS = ("correct", "wrong", "hanging")
ENDLESS_LOOP = "while True:   # a student's endless loop\n    pass\n"


HANGING = "endless_loop"


def variants(lesson: Lesson) -> dict[str, list[tuple[str, str]]]:
    """kind -> [(label, module source)] of the simulated submissions."""
    reference = (REFERENCE_DIR / lesson.module_file).read_text(encoding="utf-8")
    return {"correct": [("reference", reference)] + [(m.name, m.source()) for m in lesson.equivalents],
            "wrong": [(m.name, m.source()) for m in lesson.mistakes],
            "hanging": [(HANGING, reference)]}


def own_names(source: str, suffix: str) -> str:
    """``source`` with the local variables of every function renamed ``NAME_SUFFIX`` (parameters, globals, class
    attributes and attributes keep their names: callers and checks see the same functions). Comments go, as
    ``ast.unparse`` writes it."""
    tree = ast.parse(source)
    done = set()
    for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        if id(function) in done:   # nested in one renamed already, with it
            continue
        inner = list(ast.walk(function))
        done |= {id(n) for n in inner}
        kept = {a.arg for n in inner if isinstance(n, ast.arguments)
                for a in n.posonlyargs + n.args + n.kwonlyargs + [n.vararg, n.kwarg] if a is not None}
        kept |= {name for n in inner if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
        kept |= {t.id for n in inner if isinstance(n, ast.ClassDef) for s in n.body for t in ast.walk(s)
                 if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        local = {n.id for n in inner if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - kept
        for node in inner:
            if isinstance(node, ast.Name) and node.id in local:
                node.id = f"{node.id}_{suffix}"
    return ast.unparse(tree) + "\n"


def answered_as(student: str, notebook):
    """A simulated student's copy of an answered notebook: every solution cell with its own local names."""
    import nbformat
    copy = nbformat.from_dict(notebook)
    for cell in copy.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = own_names(cell.source, student.split("-")[0])
    return copy


def roster(lesson: Lesson, students: int, shares: dict[str, float]) -> list[tuple[str, str, str, str]]:
    """(student, kind, label, source) of ``students`` simulated submissions, ``shares`` of each kind (rounded,
    at least one of a kind with a share), each kind cycling through its variants (its local names made the
    student's, in the file route's source)."""
    found = variants(lesson)
    counts = {kind: max(1, round(students * share)) for kind, share in shares.items() if share > 0}
    counts[max(counts, key=counts.get)] += students - sum(counts.values())
    rows = []
    for kind, count in counts.items():
        pool = cycle(found[kind])
        rows += [(kind, *next(pool)) for _ in range(count)]
    return [(f"s{index:03d}-{kind}", kind, label, own_names(source, f"s{index:03d}"))
            for index, (kind, label, source) in enumerate(rows)]


def answered(release, solved, extra_cells=()):
    """``release`` (a notebook) with every solution cell answered as in ``solved``, and ``extra_cells`` (sources)
    added after the setup cell, as a student may add cells."""
    import nbformat
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in solved.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.from_dict(release)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    setup = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    nb.cells[setup + 1:setup + 1] = [nbformat.v4.new_code_cell(source) for source in extra_cells]
    return nb


def write_class(lesson: Lesson, folder: Path, route: str, students: int,
                shares: dict[str, float]) -> list[tuple[str, str, str]]:
    """Write the simulated class into ``folder``; returns (student, kind, label) of each submission."""
    folder = Path(folder)
    rows = roster(lesson, students, shares)
    if route == FILES:
        for student, _, label, source in rows:
            (folder / student).mkdir(parents=True)
            hang = "\n" + ENDLESS_LOOP if label == HANGING else ""
            (folder / student / lesson.module_file).write_text(source + hang, encoding="utf-8")
        return [row[:3] for row in rows]
    import nbformat
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(NOTEBOOKS_DIR / "nbgrader_config.py", folder / "nbgrader_config.py")
    release_all(folder, [lesson.lesson_id])
    release = nbformat.read(release_path(lesson, folder), as_version=4)
    notebooks = {}
    sources = {label: source for kind in variants(lesson).values() for label, source in kind}
    with tempfile.TemporaryDirectory() as scratch:
        for student, _, label, _ in rows:
            if label not in notebooks:   # the variant as written (its names are made the student's below)
                solved = nbformat.read(build_source(lesson, Path(scratch) / label, reference_source=sources[label]),
                                       as_version=4)
                notebooks[label] = answered(release, solved, [ENDLESS_LOOP] if label == HANGING else [])
            path = folder / "submitted" / student / lesson.name / f"{lesson.name}.ipynb"
            path.parent.mkdir(parents=True)
            nbformat.write(answered_as(student, notebooks[label]), path)
    return [row[:3] for row in rows]
