"""A simulated class, to try the class grader and to measure it: correct, wrong and hanging submissions of a
lesson, through either route.

* correct: the reference, and its catalogued equivalent forms (``EQUIVALENTS``: each must pass every check);
* wrong: the catalogued mistakes (``MISTAKES``), one after another;
* hanging: the reference with an endless loop: at the end of the module (the file route: it never imports), or in
  a cell the student added after the setup cell (the notebook route: that cell runs into its time limit, and
  nbgrader grades the rest).

The file route writes ``FOLDER/<student>/<module>.py``. The notebook route makes ``FOLDER`` an nbgrader course
directory (the course's ``nbgrader_config.py``, the lesson released into it, so that its gradebook knows the
assignment) and writes each student's notebook to ``submitted/<student>/<lesson>/<lesson>.ipynb``: the released
notebook with every solution cell answered by the variant's functions.
"""
from __future__ import annotations

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


def roster(lesson: Lesson, students: int, shares: dict[str, float]) -> list[tuple[str, str, str, str]]:
    """(student, kind, label, source) of ``students`` simulated submissions, ``shares`` of each kind (rounded,
    at least one of a kind with a share), each kind cycling through its variants."""
    found = variants(lesson)
    counts = {kind: max(1, round(students * share)) for kind, share in shares.items() if share > 0}
    counts[max(counts, key=counts.get)] += students - sum(counts.values())
    rows = []
    for kind, count in counts.items():
        pool = cycle(found[kind])
        rows += [(kind, *next(pool)) for _ in range(count)]
    return [(f"s{index:03d}-{kind}", kind, label, source) for index, (kind, label, source) in enumerate(rows)]


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
    with tempfile.TemporaryDirectory() as scratch:
        for student, _, label, source in rows:
            if label not in notebooks:
                solved = nbformat.read(build_source(lesson, Path(scratch) / label, reference_source=source),
                                       as_version=4)
                notebooks[label] = answered(release, solved, [ENDLESS_LOOP] if label == HANGING else [])
            path = folder / "submitted" / student / lesson.name / f"{lesson.name}.ipynb"
            path.parent.mkdir(parents=True)
            nbformat.write(notebooks[label], path)
    return [row[:3] for row in rows]
