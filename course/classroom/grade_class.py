"""``python -m course grade-class LESSON SUBMISSIONS_DIR``: grade every submission of a class, in parallel,
confined, resumable, into nbgrader's gradebook and plain files, with a report.

SUBMISSIONS_DIR is an nbgrader course directory's ``submitted/`` folder (the notebook route:
``<student>/<assignment>/<assignment>.ipynb``) or a folder of submission folders laid out like ``impl/`` (the file
route: ``<student>/<module>.py``). Each submission is graded by a confined fork of a warm pool
(``course.classroom.pool``, ``course.classroom.confinement``); its result is written to
``OUT/submissions/<student>.json`` under a key made of the submission's files, the grader's code and the
settings, so a rerun grades only the submissions whose key changed: the new ones, and all of them after a
change to the lesson's grader. The notebook route also records each result in nbgrader's gradebook
(``course.classroom.gradebook``). ``OUT/grades.csv`` and ``OUT/report.md`` sum up the class.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from course.checks import get_lesson
from course.checks.assignments import scored_cells
from course.checks.framework import PASS, Lesson
from course.checks.notebook import statuses_printed
from course.implementations import REPO_ROOT
from course.input_errors import InputError

from .confinement import Outcome
from .pool import FILES, NOTEBOOK, Settings, grade_shard
from .inside import TIMEOUT_KEY, runs

RESULTS = "submissions"        # OUT/submissions/<student>.json
GRADES_CSV = "grades.csv"


@dataclasses.dataclass(frozen=True)
class Submission:
    student: str
    path: Path     # the student's folder (files) or notebook (notebook route)
    digest: str    # of every file the student handed in


def _digest_of_files(paths: Iterable[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]


def find_route(lesson: Lesson, folder: Path) -> str:
    """FILES or NOTEBOOK, from what ``folder`` holds; an InputError naming SUBMISSIONS_DIR if neither."""
    if not folder.is_dir():
        raise InputError(f"SUBMISSIONS_DIR {str(folder)!r} is not a directory")
    if any(folder.glob(f"*/{lesson.name}/{lesson.name}.ipynb")):
        return NOTEBOOK
    if any(folder.glob(f"*/{lesson.module_file}")):
        return FILES
    raise InputError(f"SUBMISSIONS_DIR {str(folder)!r} holds no submission of lesson {lesson.lesson_id}: expected "
                     f"<student>/{lesson.name}/{lesson.name}.ipynb (nbgrader's submitted/) or "
                     f"<student>/{lesson.module_file} (folders laid out like impl/)")


def find_submissions(lesson: Lesson, folder: Path, route: str) -> list[Submission]:
    """Every student's submission, by student id: each folder of SUBMISSIONS_DIR (for notebooks, each with the
    lesson's assignment folder)."""
    found = []
    for student in sorted(p for p in folder.iterdir() if p.is_dir()):
        if route == NOTEBOOK:
            assignment = student / lesson.name
            notebook = assignment / f"{lesson.name}.ipynb"
            if notebook.is_file():
                found.append(Submission(student.name, notebook, _digest_of_files(_files_under(assignment), assignment)))
        else:
            found.append(Submission(student.name, student, _digest_of_files(_files_under(student), student)))
    return found


def grader_digest(lesson: Lesson, extra: bytes = b"") -> str:
    """The grading code's version: every module of the course package but other lessons' graders, torch's and
    Python's versions, and ``extra`` (the notebook route: the source notebook with the hidden tests)."""
    others = {f"lesson{lesson_id}" for lesson_id in _lesson_ids()} - {f"lesson{lesson.lesson_id}"}
    package = REPO_ROOT / "course"
    files = [p for p in package.rglob("*.py") if not others & set(p.relative_to(package).parts)]
    digest = hashlib.sha256(_digest_of_files(files, package).encode())
    digest.update(f"torch {metadata.version('torch')} python {platform.python_version()}".encode())
    digest.update(extra)
    return digest.hexdigest()


def _lesson_ids() -> list[str]:
    from course.checks import LESSONS
    return list(LESSONS)


def result_key(submission: Submission, grader: str, settings: Settings) -> str:
    limits = settings.limits
    text = f"{submission.digest} {grader} {limits} {settings.cell_timeout}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --- turning an outcome into points ----------------------------------------------------------------------

def file_route_result(lesson: Lesson, result: Outcome) -> dict:
    """Points per grade cell of the notebook, from the checks the submission passed: a cell scores its points
    when every check it runs passed (what its grade cell would score)."""
    answer = result.answer or {}
    checks = {name: row["status"] for name, row in answer.get("checks", {}).items()}
    cells = {grade_id: float(points) if all(checks.get(name) == PASS for name in names) else 0.0
             for grade_id, points, names in scored_cells(lesson)}
    problem = result.problem or (f"does not import: {answer['import_error']}" if "import_error" in answer else "")
    return {"cells": cells, "checks": checks, "problem": problem}


def stopped_outputs(notebook, problem: str) -> list:
    """The outputs of a notebook whose grader was stopped: an error in every cell it would have run, so that every
    grade cell scores 0 (a grade cell with no output scores full points)."""
    error = {"output_type": "error", "ename": "GradingStopped", "evalue": problem, "traceback": [problem]}
    return [[error] if runs(cell) else None for cell in notebook["cells"]]


def notebook_checks(notebook, outputs: list) -> dict[str, str]:
    """check -> status from what the grade cells printed."""
    printed = "".join(o.get("text", "") for cell, cell_outputs in zip(notebook["cells"], outputs)
                      if cell.get("metadata", {}).get("nbgrader", {}).get("grade") for o in cell_outputs or ()
                      if o.get("output_type") == "stream")
    return statuses_printed(printed)


# --- the run ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ClassRun:
    """One grade-class run's inputs, as the command line gave them."""
    lesson_id: str
    submissions_dir: Path
    out_dir: Optional[Path]
    settings: Settings
    scheduler: Optional[str] = None   # a Dask scheduler address, "local" for a LocalCluster, None: this machine
    shard_size: int = 16


def default_out_dir(lesson: Lesson, submissions_dir: Path) -> Path:
    return submissions_dir.resolve().parent / "grade-class" / lesson.name


def _write_json(path: Path, data: dict) -> None:
    """Atomically: an interrupted run leaves a result whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(temporary, path)


def cached_result(out_dir: Path, student: str, key: str) -> Optional[dict]:
    path = out_dir / RESULTS / f"{student}.json"
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return result if result.get("key") == key else None


class Progress:
    """One line per graded submission: counts, rate and the time left at that rate."""

    def __init__(self, total: int, cached: int, say: Callable[[str], None]):
        self.total, self.done, self.graded, self.say = total, cached, 0, say
        self.start = time.monotonic()

    def __call__(self, result: dict) -> None:
        self.done += 1
        self.graded += 1
        elapsed = time.monotonic() - self.start
        rate = self.graded / elapsed
        left = (self.total - self.done) / rate if rate else 0.0
        problem = f" ({result['problem'][:80]})" if result["problem"] else ""
        self.say(f"[{self.done}/{self.total}] {result['student']}: {result['points']:g}/{result['max_points']:g} "
                 f"points{problem} | {rate * 60:.1f}/min, ETA {_duration(left)}")


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def run_class(run: ClassRun, say: Callable[[str], None] = print) -> dict:
    """Grade the class; returns {"out_dir", "results": [per submission], "graded", "cached"}. Every argument is
    checked (an InputError naming it) before anything is written."""
    from .report import write_report
    lesson = get_lesson(run.lesson_id)
    folder = Path(run.submissions_dir)
    route = find_route(lesson, folder)
    course = None
    settings = run.settings
    if route == NOTEBOOK:
        from .gradebook import CONFIG_FILE, NbgraderCourse
        course = NbgraderCourse(folder.resolve().parent)
        if course.submitted.resolve() != folder.resolve():
            raise InputError(f"SUBMISSIONS_DIR {str(folder)!r} is not the course's submitted folder "
                             f"({course.submitted})")
        if not course.has_source(lesson.name, lesson.name):
            raise InputError(f"SUBMISSIONS_DIR: the gradebook of {course.course_dir} does not know {lesson.name}: run "
                             f"python -m course release {lesson.lesson_id} --course-dir {course.course_dir}")
    out_dir = Path(run.out_dir) if run.out_dir else default_out_dir(lesson, folder)
    if out_dir.resolve().is_relative_to(folder.resolve()):
        raise InputError(f"--out {str(out_dir)!r} is inside SUBMISSIONS_DIR: a submission could be mistaken for it")
    submissions = find_submissions(lesson, folder, route)
    hidden = b""   # the notebook route's hidden tests and cell limits are the course's
    if course is not None:
        source = course.course_dir / course.coursedir.source_directory / lesson.name / f"{lesson.name}.ipynb"
        hidden = (source.read_bytes() if source.is_file() else b"") + (course.course_dir / CONFIG_FILE).read_bytes()
    grader = grader_digest(lesson, hidden)
    keys = {s.student: result_key(s, grader, settings) for s in submissions}
    results = {s.student: cached_result(out_dir, s.student, keys[s.student]) for s in submissions}
    pending = [s for s in submissions if results[s.student] is None]
    say(f"lesson {lesson.lesson_id}, {route} route: {len(submissions)} submissions, {len(submissions) - len(pending)} "
        f"already graded, {len(pending)} to grade with {settings.jobs} at a time"
        + (f" on Dask ({run.scheduler})" if run.scheduler else "") + f"; results in {out_dir}")
    progress = Progress(len(submissions), len(submissions) - len(pending), say)
    for result in _grade(lesson, route, course, pending, run, settings, out_dir):
        result["key"] = keys[result["student"]]
        _write_json(out_dir / RESULTS / f"{result['student']}.json", result)
        results[result["student"]] = result
        progress(result)
    ordered = [results[s.student] for s in submissions]
    write_grades_csv(out_dir / GRADES_CSV, ordered, [grade_id for grade_id, *_ in scored_cells(lesson)])
    report = write_report(lesson, ordered, out_dir)
    say(f"graded {len(pending)}, reused {len(submissions) - len(pending)}: {out_dir / GRADES_CSV}, {report}")
    return {"out_dir": out_dir, "results": ordered, "graded": len(pending), "cached": len(submissions) - len(pending)}


def _grade(lesson: Lesson, route: str, course, pending: list[Submission], run: ClassRun, settings: Settings,
           out_dir: Path) -> Iterator[dict]:
    """The result of each pending submission, as it is graded (and, notebooks, recorded in the gradebook)."""
    if not pending:
        return
    spool = out_dir / "spool"   # the sanitized notebooks the graders run (hidden tests included): removed after
    sanitized = {}
    inputs = []
    for submission in pending:
        if route == NOTEBOOK:
            import nbformat
            notebook = course.sanitized(lesson.name, submission.student, submission.path)
            sanitized[submission.student] = notebook
            graded_copy = nbformat.from_dict(notebook)
            for cell in graded_copy.cells:   # --cell-timeout, else the course's limit of each cell
                cell.metadata[TIMEOUT_KEY] = settings.cell_timeout or course.cell_timeout_of(cell)
            path = spool / submission.student / submission.path.name
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(graded_copy, path)
            inputs.append((submission.student, path))
        else:
            inputs.append((submission.student, submission.path))
    max_points = float(lesson.points)
    if run.scheduler:
        from .engines import dask_shards
        outcomes = dask_shards(run.scheduler, lesson.lesson_id, route, inputs, settings, run.shard_size)
    else:
        outcomes = grade_shard(lesson.lesson_id, route, inputs, settings)
    for student, result in outcomes:
        if route == NOTEBOOK:
            notebook = sanitized.pop(student)
            outputs = result.answer["cells"] if result.answer else stopped_outputs(notebook, result.problem)
            cells = course.record(lesson.name, student, lesson.name, [c.source for c in notebook.cells], outputs)
            row = {"cells": cells, "checks": notebook_checks(notebook, outputs), "problem": result.problem}
            (spool / student / f"{lesson.name}.ipynb").unlink()
            (spool / student).rmdir()
        else:
            row = file_route_result(lesson, result)
        points = sum(score or 0.0 for score in row["cells"].values())
        yield {"student": student, "route": route, "points": points, "max_points": max_points, **row,
               "seconds": round(result.seconds, 2), "max_rss_mb": round(result.max_rss_mb, 1),
               "wrote_stderr": bool(result.stderr.strip()), "stderr": result.stderr[-2000:]}
    if spool.is_dir() and not any(spool.iterdir()):
        spool.rmdir()


def write_grades_csv(path: Path, results: list[dict], grade_ids: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "points", "max_points", "problem", "seconds", "max_rss_mb", *grade_ids])
        for r in results:
            writer.writerow([r["student"], f"{r['points']:g}", f"{r['max_points']:g}", r["problem"], r["seconds"],
                             r["max_rss_mb"], *(f"{r['cells'].get(g) or 0:g}" for g in grade_ids)])
