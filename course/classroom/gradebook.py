"""nbgrader stays the gradebook: the notebook route's submissions are sanitized and scored by nbgrader's own code.

``NbgraderCourse.sanitized`` is what ``nbgrader autograde`` executes: the submission with its outputs cleared and
the locked and grade cells (hidden tests included) restored from the gradebook, by autograde's own sanitizing
preprocessors. ``NbgraderCourse.record`` then runs nbgrader's ``Autograde`` converter on the submission with
one change: its ``Execute`` preprocessor is ``ReplayExecution``, which puts back the outputs a confined grader
recorded instead of starting a kernel. Everything else is autograde's: the student and the submission (with its
timestamp) in ``gradebook.db``, every grade cell scored from its outputs (``SaveAutoGrades``), late penalties,
the autograded notebook under ``autograded/``. ``nbgrader generate_feedback`` and ``nbgrader export`` read
those as they read autograde's.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Optional

from course.input_errors import InputError

CONFIG_FILE = "nbgrader_config.py"
_EXECUTED: dict[tuple[str, str], tuple[list[str], list]] = {}   # (student, notebook) -> (sources, outputs)


def _preprocessor_base():
    from nbgrader.preprocessors import NbGraderPreprocessor
    return NbGraderPreprocessor


def replay_execution_class():
    """nbgrader's ``Execute`` stand-in (a class, built on first use: nbgrader is imported only by this route)."""
    import nbformat

    class ReplayExecution(_preprocessor_base()):
        """Give each code cell the outputs its confined grader recorded, for a notebook that is still the one
        it ran (the same cell sources)."""

        def preprocess(self, nb, resources):
            key = (resources["nbgrader"]["student"], resources["nbgrader"]["notebook"])
            sources, outputs = _EXECUTED.pop(key)
            if [cell.source for cell in nb.cells] != sources:
                raise ValueError(f"{key}: the notebook changed since it was graded")
            for count, (cell, cell_outputs) in enumerate(zip(nb.cells, outputs), 1):
                if cell.cell_type == "code" and cell_outputs is not None:
                    cell.outputs = [nbformat.from_dict(output) for output in cell_outputs]
                    cell.execution_count = count
            return nb, resources

    return ReplayExecution


class NbgraderCourse:
    """An nbgrader course directory (the folder holding ``nbgrader_config.py``) and its gradebook."""

    def __init__(self, course_dir: Path):
        from nbgrader.apps import NbGraderAPI
        from nbgrader.converters import Autograde
        from nbgrader.coursedir import CourseDirectory
        from nbgrader.preprocessors import Execute
        from traitlets.config.loader import PyFileConfigLoader

        self.course_dir = Path(course_dir).resolve()
        if not (self.course_dir / CONFIG_FILE).is_file():
            raise InputError(f"SUBMISSIONS_DIR: {self.course_dir} holds no {CONFIG_FILE}: notebooks are graded in an "
                             "nbgrader course directory's submitted/ folder")
        config = PyFileConfigLoader(CONFIG_FILE, path=str(self.course_dir)).load_config()
        config.CourseDirectory.root = str(self.course_dir)
        replay = replay_execution_class()
        steps = {name: config.Autograde.get(name, Autograde.class_traits()[name].default())
                 for name in ("sanitize_preprocessors", "autograde_preprocessors")}   # the course's, else autograde's
        config.Autograde.autograde_preprocessors = [replay if p is Execute else p
                                                    for p in steps["autograde_preprocessors"]]
        self.config = config
        self.coursedir = CourseDirectory(config=config)
        database = self.coursedir.db_url.removeprefix("sqlite:///")
        if database != self.coursedir.db_url and not Path(database).is_file():   # opening it would create it
            raise InputError(f"SUBMISSIONS_DIR: the course {self.course_dir} has no gradebook ({database}): run "
                             "python -m course release --course-dir with it first")
        self.api = NbGraderAPI(coursedir=self.coursedir, config=config)
        self.api.log.setLevel(logging.ERROR)   # autograde's INFO lines, one per copied file, are no progress
        self.sanitizers = [pp(config=config) for pp in steps["sanitize_preprocessors"]]
        self.cell_timeout = float(config.Execute.get("timeout", Execute.class_traits()["timeout"].default()))
        self.timeout_func = config.Execute.get("timeout_func")

    def cell_timeout_of(self, cell) -> Optional[float]:
        """A cell's limit as autograde's kernel client sets it (nbclient: ``timeout_func``, else ``timeout``;
        None: no limit)."""
        timeout = self.timeout_func(cell) if self.timeout_func is not None else self.cell_timeout
        return timeout if timeout and timeout > 0 else None

    @property
    def submitted(self) -> Path:
        return self.course_dir / self.coursedir.submitted_directory

    def _resources(self, assignment: str, student: str, notebook: str) -> dict:
        return {"nbgrader": {"student": student, "assignment": assignment, "notebook": notebook,
                             "db_url": self.coursedir.db_url}}

    def has_source(self, assignment: str, notebook: str) -> bool:
        """Whether the gradebook knows the notebook (``nbgrader generate_assignment`` registered it)."""
        from nbgrader.api import Gradebook, MissingEntry
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gradebook:
            try:
                gradebook.find_notebook(notebook, assignment)
            except MissingEntry:
                return False
        return True

    def sanitized(self, assignment: str, student: str, path: Path):
        """The submitted notebook as autograde executes it (a NotebookNode)."""
        import nbformat
        nb = nbformat.read(path, as_version=4)
        resources = self._resources(assignment, student, path.stem)
        for preprocessor in self.sanitizers:
            nb, resources = preprocessor.preprocess(nb, resources)
        return nb

    def record(self, assignment: str, student: str, notebook: str, sources: list[str], outputs: list) -> dict:
        """Autograde the submission with the recorded ``outputs`` of the cells of ``sources`` (its sanitized
        notebook); returns {grade cell: score} as the gradebook now holds them."""
        from nbgrader.api import Gradebook
        from sqlalchemy.exc import SAWarning
        _EXECUTED[(student, notebook)] = (sources, outputs)
        try:
            with warnings.catch_warnings():
                # nbgrader's gradebook adds a new submission in a way SQLAlchemy 2 warns about (autograde prints the
                # same warnings); the rows are written all the same
                warnings.simplefilter("ignore", SAWarning)
                result = self.api.autograde(assignment, student, force=True, create=True)
        finally:
            _EXECUTED.pop((student, notebook), None)
        if not result["success"]:
            raise RuntimeError(f"nbgrader autograde of {student} failed:\n{result.get('error') or result['log']}")
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gradebook:
            graded = gradebook.find_submission_notebook(notebook, assignment, student)
            return {grade.name: grade.score for grade in graded.grades}
