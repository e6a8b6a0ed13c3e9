"""``python -m course grade-class LESSON SUBMISSIONS_DIR``: grade every submission of a class, in parallel,
confined, resumable, into nbgrader's gradebook and plain files, with a report.

SUBMISSIONS_DIR holds one folder per student: an nbgrader course directory's ``submitted/`` folder (the notebook
route: ``<student>/<assignment>/<assignment>.ipynb``) or folders laid out like ``impl/`` (the file route:
``<student>/<module>.py``); the route is decided per submission. Each submission is graded by a confined fork of a
warm pool (``course.classroom.pool``, ``course.classroom.confinement``); its result is written to
``OUT/submissions/<student>.json`` under a key made of the submission's files, the grader's code and the settings,
so a rerun grades only the submissions whose key changed: the new ones, and all of them after a change to the
lesson's grader. The notebook route also records each result in nbgrader's gradebook
(``course.classroom.gradebook``). ``OUT/grades.csv`` and ``OUT/report.md`` sum up the class.

A submission is hostile input: whatever is wrong with one (an unreadable notebook, bad nbgrader metadata, a
symlink or a FIFO, files too large, a name that is not UTF-8, a malformed or forged answer, a crash while its
result is recorded) scores that submission 0 with a one-line reason, and the run goes on.
"""
from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import json
import os
import platform
import re
import stat
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from course.checks import get_lesson
from course.checks.assignments import scored_cells
from course.checks.framework import PASS, Lesson
from course.checks.notebook import statuses_printed
from course.implementations import REPO_ROOT
from course.input_errors import InputError

from .confinement import Outcome, not_final, probe
from .inside import HIDDEN_KEY, RUN_KEY, TIMEOUT_KEY, runs
from .pool import FILES, NOTEBOOK, Job, Settings, grade_shard
from .report import cells_that_raised, check_messages, write_report
from .compare import add_class_flags

RESULTS = "submissions"        # OUT/submissions/<student>.json
GRADES_CSV = "grades.csv"
MAX_SUBMISSION_MB = 64         # all of a submission's files; a larger one is refused before anything is read
MAX_SUBMISSION_FILES = 1000
HIDDEN_MARK = "[hidden test]"  # what stands in the outputs for a line of a hidden test
_SURROGATES = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` without lone surrogates (a name that is not UTF-8, an escape in a JSON answer): writable as UTF-8."""
    return _SURROGATES.sub("\ufffd", text)


def cleaned(value):
    """A JSON value with every string ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cleaned(v) for v in value]
    return value


def shown_name(name: str) -> str:
    """A folder name as text: bytes that are not UTF-8 shown as \\xNN escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclasses.dataclass(frozen=True)
class Submission:
    student: str
    path: Path       # the student's folder (files) or notebook (notebook route)
    route: str       # FILES or NOTEBOOK; "" when refused
    digest: str      # of every file the student handed in
    problem: str = ""   # why it is refused before grading (it scores 0)


class Refused(Exception):
    """A submission that cannot be graded; the message is its one-line reason."""


def _scan(folder: Path) -> list[Path]:
    """Every file under ``folder``, refusing (``Refused``) symlinks, special files, names that are not UTF-8 and
    more than MAX_SUBMISSION_MB or MAX_SUBMISSION_FILES: from the directory entries alone, nothing opened."""
    files, total = [], 0
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root, name)
            relative = path.relative_to(folder).as_posix()
            if shown_name(relative) != relative:
                raise Refused(f"a file name is not UTF-8: {shown_name(relative)!r}")
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise Refused(f"holds a symlink, refused: {relative}")
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise Refused(f"holds a special file (a FIFO, socket or device), refused: {relative}")
            files.append(path)
            total += path.lstat().st_size
    if len(files) > MAX_SUBMISSION_FILES or total > MAX_SUBMISSION_MB << 20:
        raise Refused(f"{len(files)} files of {total / (1 << 20):.0f} MiB: more than {MAX_SUBMISSION_FILES} files "
                      f"or {MAX_SUBMISSION_MB} MiB, refused unread")
    return sorted(files)


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file, never through a symlink, a FIFO or past MAX_SUBMISSION_MB."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SUBMISSION_MB << 20:
            raise Refused(f"{path.name} is no longer a regular file of a size it may have")
        return handle.read(MAX_SUBMISSION_MB << 20)


def _digest_of_files(paths: Iterable[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        data = read_regular(path)
        digest.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def submission_of(lesson: Lesson, student: Path, notebooks: bool) -> Submission:
    """The submission in a student's folder, by the route its contents take: the lesson's notebook where
    ``notebooks`` (SUBMISSIONS_DIR is an nbgrader course's submitted/), else the lesson's module; or refused."""
    name = shown_name(student.name)
    try:
        if name != student.name:
            raise Refused("its folder name is not UTF-8")
        if student.is_symlink():
            raise Refused("the student's folder is a symlink, refused")
        notebook = student / lesson.name / f"{lesson.name}.ipynb"
        has_notebook = os.path.lexists(notebook)
        if has_notebook and notebooks:
            files = _scan(student / lesson.name)
            if notebook not in files:
                raise Refused(f"{lesson.name}/{notebook.name} is not a regular file")
            return Submission(name, notebook, NOTEBOOK, _digest_of_files(files, notebook.parent))
        if os.path.lexists(student / lesson.module_file):
            files = _scan(student)
            if student / lesson.module_file not in files:
                raise Refused(f"{lesson.module_file} is not a regular file")
            return Submission(name, student, FILES, _digest_of_files(files, student))
        if has_notebook:
            raise Refused(f"a notebook, but SUBMISSIONS_DIR is not an nbgrader course's submitted/ folder (no "
                          f"nbgrader_config.py beside it) and there is no {lesson.module_file}")
        raise Refused(f"holds neither {lesson.name}/{lesson.name}.ipynb nor {lesson.module_file}")
    except Refused as why:
        return Submission(name, student, "", "", str(why))
    except OSError as exc:
        return Submission(name, student, "", "", f"cannot be read: {exc.strerror or exc}")


def find_submissions(lesson: Lesson, folder: Path, notebooks: bool = False) -> list[Submission]:
    """Every student's submission, one per folder of SUBMISSIONS_DIR (by name)."""
    return [submission_of(lesson, Path(entry.path), notebooks)
            for entry in sorted(os.scandir(folder), key=lambda e: e.name) if entry.is_dir()]


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
    files = submission.digest if submission.route else f"refused: {submission.problem}"   # until its problem is gone
    text = f"{submission.route} {files} {grader} {limits} {settings.cell_timeout} {settings.every_cell}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --- turning an outcome into points ----------------------------------------------------------------------

def file_route_result(lesson: Lesson, result: Outcome) -> dict:
    """Points per grade cell of the notebook, from the checks the submission passed: a cell scores its points
    when every check it runs passed (what its grade cell would score)."""
    answer, problem = result.answer or {}, result.problem
    checks = answer.get("checks", {})
    well_formed = isinstance(checks, dict) and all(isinstance(row, dict) for row in checks.values()) and \
        isinstance(answer.get("import_error", ""), str)
    if not well_formed:
        checks, problem = {}, problem or "answered a malformed result (not the checks' statuses)"
    statuses = {name: row.get("status") for name, row in checks.items()}
    cells = {grade_id: float(points) if all(statuses.get(name) == PASS for name in names) else 0.0
             for grade_id, points, names in scored_cells(lesson)}
    if not problem and answer.get("import_error"):
        problem = f"does not import: {answer['import_error']}"
    messages = {name: str(row.get("message", "")) for name, row in checks.items() if row.get("status") != PASS}
    return {"cells": cells, "checks": {name: str(status) for name, status in statuses.items()}, "problem": problem,
            "messages": messages}


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


def _text(value) -> str:
    if isinstance(value, list):
        return "".join(str(v) for v in value)
    return str(value)


def _json_or_empty(value) -> dict:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _output(raw: dict) -> Optional[dict]:
    """One recorded output rebuilt from its allowed fields in nbformat's shape, or None where it has none."""
    kind = raw.get("output_type")
    if kind == "stream":
        return {"output_type": "stream", "name": "stderr" if raw.get("name") == "stderr" else "stdout",
                "text": _text(raw.get("text", ""))}
    if kind == "error":
        traceback = raw.get("traceback")
        return {"output_type": "error", "ename": _text(raw.get("ename", "")), "evalue": _text(raw.get("evalue", "")),
                "traceback": [_text(line) for line in traceback] if isinstance(traceback, list) else []}
    if kind in ("display_data", "execute_result"):
        data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
        data = {str(mime): (_json_or_empty(value) if mime.endswith("json") else _text(value))
                for mime, value in data.items()}
        output = {"output_type": kind, "data": data, "metadata": _json_or_empty(raw.get("metadata", {}))}
        if kind == "execute_result":
            count = raw.get("execution_count")
            output["execution_count"] = count if isinstance(count, int) and not isinstance(count, bool) else None
        return output
    return None


def _scrub(value, hidden_lines: list[str]):
    """``value`` (an output) with each of ``hidden_lines`` replaced by HIDDEN_MARK in every text it holds."""
    if isinstance(value, str):
        for line in hidden_lines:
            value = value.replace(line, HIDDEN_MARK)
        return value
    if isinstance(value, dict):
        return {k: v if k in ("output_type", "name") else _scrub(v, hidden_lines) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, hidden_lines) for v in value]
    return value


def notebook_outputs(notebook, answer: Optional[dict], hidden_lines: list[str]) -> Optional[list]:
    """The answer's outputs per cell, each rebuilt in nbformat's shape and with every line of a hidden test
    replaced by HIDDEN_MARK (what a cell printed never carries them into feedback); None for a malformed answer."""
    cells = (answer or {}).get("cells")
    if not isinstance(cells, list) or len(cells) != len(notebook["cells"]):
        return None
    outputs = []
    for cell, raw in zip(notebook["cells"], cells):
        if raw is None or not runs(cell):
            outputs.append(None)
            continue
        if not isinstance(raw, list):
            return None
        rebuilt = [o for o in (_output(r) for r in raw if isinstance(r, dict)) if o is not None]
        outputs.append(_scrub(rebuilt, hidden_lines))
    return outputs


# --- the notebook a grader runs -----------------------------------------------------------------------------

@dataclasses.dataclass
class Graded:
    """A notebook submission as its grader gets it: the sanitized notebook (hidden tests restored: what nbgrader
    scores), the job (the notebook without the hidden tests; those sent apart) and the lines to scrub."""
    sanitized: object
    job: Job
    hidden_lines: list


def notebook_job(course, lesson: Lesson, submission: Submission, settings: Settings) -> Graded:
    """The job of a notebook submission: nbgrader's sanitizing (locked and grade cells from the gradebook, hidden
    tests included), then each hidden test region cut out of the copy the grader runs, to be asked for when its
    cell runs. Raises what nbgrader raises for a notebook it cannot sanitize."""
    import nbformat
    from nbgrader.preprocessors import ClearHiddenTests
    read_regular(submission.path)   # a regular file of a size it may have, before nbformat opens it
    with warnings.catch_warnings():   # nbformat's about a student's notebook (duplicate cell ids...): no verdict
        warnings.simplefilter("ignore")
        notebook = course.sanitized(lesson.name, submission.student, submission.path)
    for cell in notebook.cells if settings.every_cell else ():   # --every-cell: the show-only cells run too
        cell.metadata[RUN_KEY] = True
    clear = ClearHiddenTests(config=course.config)
    graded_copy = copy.deepcopy(notebook)
    hidden, lines = {}, []
    for index, cell in enumerate(graded_copy.cells):
        if cell.cell_type == "code":
            cell.metadata[TIMEOUT_KEY] = settings.cell_timeout or course.cell_timeout_of(cell)
        full = cell.source
        if cell.cell_type == "code" and clear._remove_hidden_test_region(cell):
            hidden[index] = full
            cell.metadata[HIDDEN_KEY] = True
            lines += [line.strip() for line in full.splitlines()
                      if len(line.strip()) >= 8 and line.strip() not in cell.source]
    files = {submission.path.name: nbformat.writes(graded_copy).encode("utf-8")}
    return Graded(notebook, Job(submission.student, NOTEBOOK, files, hidden), sorted(set(lines), key=len,
                                                                                     reverse=True))


def files_job(submission: Submission) -> Job:
    files = {p.relative_to(submission.path).as_posix(): read_regular(p) for p in _scan(submission.path)}
    return Job(submission.student, FILES, files)


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
    temporary.write_text(json.dumps(cleaned(data), indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(temporary, path)


def cached_result(out_dir: Path, student: str, key: str) -> Optional[dict]:
    path = out_dir / RESULTS / f"{student}.json"
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and result.get("key") == key else None


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


def _course_of(lesson: Lesson, folder: Path):
    """The nbgrader course whose submitted/ folder SUBMISSIONS_DIR is, or None where it is no course's; an
    InputError where it is one that cannot grade the lesson (the instructor's setup, not a submission)."""
    from .gradebook import CONFIG_FILE, NbgraderCourse
    if not (folder.resolve().parent / CONFIG_FILE).is_file():
        return None
    course = NbgraderCourse(folder.resolve().parent)
    if course.submitted.resolve() != folder.resolve():
        raise InputError(f"SUBMISSIONS_DIR {str(folder)!r} is not the course's submitted folder ({course.submitted})")
    if not course.has_source(lesson.name, lesson.name):
        raise InputError(f"SUBMISSIONS_DIR: the gradebook of {course.course_dir} does not know {lesson.name}: run "
                         f"python -m course release {lesson.lesson_id} --course-dir {course.course_dir}")
    return course


def run_class(run: ClassRun, say: Callable[[str], None] = print) -> dict:
    """Grade the class; returns {"out_dir", "results": [per submission], "graded", "cached"}. Every argument is
    checked (an InputError naming it) before anything is written."""
    lesson = get_lesson(run.lesson_id)
    folder = Path(run.submissions_dir)
    if not folder.is_dir():
        raise InputError(f"SUBMISSIONS_DIR {str(folder)!r} is not a directory")
    out_dir = Path(run.out_dir) if run.out_dir else default_out_dir(lesson, folder)
    if out_dir.resolve().is_relative_to(folder.resolve()):
        raise InputError(f"--out {str(out_dir)!r} is inside SUBMISSIONS_DIR: a submission could be mistaken for it")
    course = _course_of(lesson, folder) if any(folder.glob(f"*/{lesson.name}/{lesson.name}.ipynb")) else None
    submissions = find_submissions(lesson, folder, notebooks=course is not None)
    if not any(s.route or not s.problem.startswith("holds neither") for s in submissions):
        raise InputError(f"SUBMISSIONS_DIR {str(folder)!r} holds no submission of lesson {lesson.lesson_id}: expected "
                         f"<student>/{lesson.name}/{lesson.name}.ipynb (nbgrader's submitted/) or "
                         f"<student>/{lesson.module_file} (folders laid out like impl/)")
    settings = run.settings
    hidden = b""   # the notebook route's hidden tests and cell limits are the course's
    if course is not None:
        from .gradebook import CONFIG_FILE
        source = course.course_dir / course.coursedir.source_directory / lesson.name / f"{lesson.name}.ipynb"
        hidden = (source.read_bytes() if source.is_file() else b"") + (course.course_dir / CONFIG_FILE).read_bytes()
    grader = grader_digest(lesson, hidden)
    keys = {s.student: result_key(s, grader, settings) for s in submissions}
    results = {s.student: cached_result(out_dir, s.student, keys[s.student]) for s in submissions}
    pending = [s for s in submissions if results[s.student] is None]
    sandbox = probe().describe()
    routes = {route: sum(s.route == route for s in submissions) for route in (NOTEBOOK, FILES)}
    say(f"lesson {lesson.lesson_id}: {len(submissions)} submissions ({routes[NOTEBOOK]} notebooks, {routes[FILES]} "
        f"file folders, {sum(not s.route for s in submissions)} refused), {len(submissions) - len(pending)} already "
        f"graded, {len(pending)} to grade with {settings.jobs} at a time"
        + (f" on Dask ({run.scheduler})" if run.scheduler else "") + f"; {sandbox}; results in {out_dir}")
    progress = Progress(len(submissions), len(submissions) - len(pending), say)
    max_points = float(lesson.points)
    for row in _grade(lesson, course, pending, run, settings):
        result = {"student": row["student"], "route": row.get("route", ""), "points": 0.0, "max_points": max_points,
                  "cells": {}, "checks": {}, "problem": "", "seconds": 0.0, "max_rss_mb": 0.0, "cpu_seconds": 0.0,
                  "limits_hit": [], "retried": "", "wrote_stderr": False, "stderr": "", "flags": [],
                  "sandbox": sandbox, **row}
        result["points"] = sum(score or 0.0 for score in result["cells"].values())
        if not_final(result["problem"]):   # the machinery's failure, not the submission's: graded again next run
            result["problem"] += " (not final: the next run grades it again)"
        else:
            result["key"] = keys[result["student"]]
        result = cleaned(result)
        _write_json(out_dir / RESULTS / f"{result['student']}.json", result)
        results[result["student"]] = result
        progress(result)
    ordered = [results[s.student] for s in submissions]
    source = course.course_dir / course.coursedir.source_directory / lesson.name / f"{lesson.name}.ipynb" \
        if course is not None else None
    for result in add_class_flags(lesson, submissions, ordered, source):   # static + identical; run's flags kept
        _write_json(out_dir / RESULTS / f"{result['student']}.json", result)
    write_grades_csv(out_dir / GRADES_CSV, ordered, [grade_id for grade_id, *_ in scored_cells(lesson)])
    report = write_report(lesson, ordered, out_dir, settings.every_cell)
    say(f"graded {len(pending)}, reused {len(submissions) - len(pending)}: {out_dir / GRADES_CSV}, {report}")
    return {"out_dir": out_dir, "results": ordered, "graded": len(pending), "cached": len(submissions) - len(pending)}


def _zero(lesson: Lesson) -> dict:
    return {grade_id: 0.0 for grade_id, *_ in scored_cells(lesson)}


def _grade(lesson: Lesson, course, pending: list[Submission], run: ClassRun, settings: Settings) -> Iterator[dict]:
    """The result row of each pending submission, as it is graded (and, notebooks, recorded in the gradebook):
    a refused one at once, the others as their graders answer."""
    notebooks: dict[str, Graded] = {}
    refused: list[dict] = []

    def jobs() -> Iterator[Job]:
        for submission in pending:
            try:
                if not submission.route:
                    raise Refused(submission.problem)
                if submission.route == NOTEBOOK:
                    graded = notebook_job(course, lesson, submission, settings)
                    notebooks[submission.student] = graded
                    yield graded.job
                else:
                    yield files_job(submission)
            except Exception as exc:   # a notebook nbgrader cannot sanitize, a file gone: this submission's 0
                why = str(exc) if isinstance(exc, Refused) else f"cannot be graded: {type(exc).__name__}: {exc}"
                refused.append({"student": submission.student, "route": submission.route, "cells": _zero(lesson),
                                "problem": " ".join(why.split())[:500]})

    if run.scheduler:
        from .engines import dask_shards
        outcomes = dask_shards(run.scheduler, lesson.lesson_id, list(jobs()), settings, run.shard_size)
    else:
        outcomes = grade_shard(lesson.lesson_id, jobs(), settings, [r for r in (FILES, NOTEBOOK)
                                                                     if any(s.route == r for s in pending)])
    for student, result in outcomes:
        yield from refused
        refused.clear()
        graded = notebooks.pop(student, None)
        try:
            row = _notebook_row(course, lesson, student, graded, result) if graded else file_route_result(lesson,
                                                                                                           result)
        except Exception as exc:   # recording it failed: this submission's 0, with why
            row = {"cells": _zero(lesson), "checks": {},
                   "problem": f"its result could not be recorded: {type(exc).__name__}: {exc}"[:500]}
        yield {"student": student, "route": NOTEBOOK if graded else FILES, **row, "seconds": round(result.seconds, 2),
               "max_rss_mb": round(result.max_rss_mb, 1), "cpu_seconds": round(result.cpu_seconds, 2),
               "limits_hit": result.limits_hit, "retried": result.retried, "flags": result.flags,
               "wrote_stderr": bool(result.stderr.strip()), "stderr": result.stderr[-2000:]}
    yield from refused


def _notebook_row(course, lesson: Lesson, student: str, graded: Graded, result: Outcome) -> dict:
    """Record the notebook's outputs in the gradebook as autograde would (stopped outputs where the answer is
    missing or malformed); the row of points, checks and problem."""
    notebook = graded.sanitized
    problem = result.problem
    outputs = notebook_outputs(notebook, cleaned(result.answer), graded.hidden_lines) if not problem else None
    if outputs is None:
        problem = problem or "answered malformed outputs (not one list of outputs per cell)"
        outputs = stopped_outputs(notebook, problem)
    sources = [c.source for c in notebook.cells]
    try:
        cells = course.record(lesson.name, student, lesson.name, sources, outputs)
    except Exception as exc:   # nbgrader could not take these outputs: the gradebook gets this submission's 0
        problem = f"nbgrader could not record its outputs ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        outputs = stopped_outputs(notebook, problem)
        cells = course.record(lesson.name, student, lesson.name, sources, outputs)
    return {"cells": cells, "checks": notebook_checks(notebook, outputs), "problem": problem,
            "messages": check_messages(notebook, outputs), "cells_raised": cells_that_raised(notebook, outputs)}


def write_grades_csv(path: Path, results: list[dict], grade_ids: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "points", "max_points", "problem", "seconds", "max_rss_mb", *grade_ids])
        for r in results:
            writer.writerow([r["student"], f"{r['points']:g}", f"{r['max_points']:g}", r["problem"], r["seconds"],
                             r["max_rss_mb"], *(f"{r['cells'].get(g) or 0:g}" for g in grade_ids)])
