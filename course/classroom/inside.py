"""What runs inside a confined grader: one submission's checks (the file route) or its notebook's cells (the
notebook route), answered as plain JSON-able data.

The notebook route executes the cells as a Jupyter kernel would, in an in-process IPython shell: magics,
``display`` and the value of a cell's last expression work, and each cell's outputs are recorded in nbformat's
shape (stdout and stderr streams, display data, the execute result, the error with its traceback). nbgrader then
scores each grade cell from those outputs exactly as after ``nbgrader autograde`` (``course.classroom.gradebook``).
A cell that runs past its time limit ends with a ``CellTimeoutError``, as nbgrader's, and the next cell runs.
The course's locked cells that only show things and score nothing (``SHOW_ONLY_PREFIXES``: the experiments'
figures, the ungraded extension and hardening checks) are not run: they are most of a notebook's run time.
"""
from __future__ import annotations

import io
import signal
import sys
import time
from pathlib import Path

from course.checks.framework import CORE, Lesson
from course.checks.results import grade_exercises

from .tampering import cell_number, is_student_cell
from .watch import checkpoint

SHOW_ONLY_PREFIXES = ("plot_", "check_")
TIMEOUT_KEY = "grade_class_timeout"   # a cell's limit in seconds, in the metadata of the copy a grader runs
HIDDEN_KEY = "grade_class_hidden"     # a cell whose source (hidden tests) the grader asks for when it runs it
RUN_KEY = "grade_class_run"           # a show-only cell the instructor has run all the same (--every-cell)
MAX_MESSAGE = 2000   # characters of a check's message kept in an answer
HIDDEN_FILENAME = "<hidden tests>"    # what a hidden cell's code is compiled as: no line of it is cached


def grade_files(lesson: Lesson, folder: Path) -> dict:
    """The lesson's core checks on the module in ``folder``: {"checks": {name: {status, seconds, message}}}, or
    the import error of a module that does not import."""
    try:
        module = lesson.load("student", str(folder))
    except Exception as exc:   # a student file that does not even import: every check fails
        return {"import_error": f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE], "checks": {}}
    checkpoint("after its import", vars(module))   # the tripwires (nothing outside a watched grader)
    results = [r for e in grade_exercises(lesson, module) if e.tier == CORE for r in e.checks]
    return {"checks": {r.check: {"status": r.status, "seconds": round(r.seconds, 3),
                                 "message": r.message[:MAX_MESSAGE]} for r in results}}


def runs(cell: dict) -> bool:
    """Whether the notebook route executes ``cell``: every code cell but the course's show-only cells (unless
    marked ``RUN_KEY``)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    show_only = meta.get("locked") and not meta.get("grade") and meta.get("grade_id", "").startswith(SHOW_ONLY_PREFIXES)
    show_only = show_only and not cell.get("metadata", {}).get(RUN_KEY)
    return cell["cell_type"] == "code" and not show_only


class CellTimeoutError(BaseException):
    """A cell ran past its limit (the name nbgrader gives the same error). A BaseException, as the
    KeyboardInterrupt nbgrader interrupts a kernel with: a check's ``except Exception`` does not swallow it."""


def execute_notebook(notebook: dict, hidden_source=None) -> dict:
    """Run the code cells of ``notebook`` (nbformat 4 as a dict) in order: {"cells": [[outputs] or None (not
    run) per cell], "seconds": [...], "cpu": [...]}. A cell's limit is its metadata's ``TIMEOUT_KEY`` (none where
    absent); a cell marked ``HIDDEN_KEY`` runs the source ``hidden_source(index)`` gives just then."""
    shell = _shell()
    outputs_of, seconds_of, cpu_of = [], [], []
    student_cells = frozenset(number for number, cell in enumerate(notebook["cells"], 1)
                              if isinstance(cell, dict) and is_student_cell(cell))

    def stop(_signum, _frame):
        raise CellTimeoutError("the cell ran past its time limit")

    signal.signal(signal.SIGALRM, stop)
    for count, cell in enumerate(notebook["cells"], 1):
        if not runs(cell):
            outputs_of.append(None)
            seconds_of.append(0.0)
            cpu_of.append(0.0)
            continue
        source = "".join(cell["source"])
        hidden = bool(cell.get("metadata", {}).get(HIDDEN_KEY))
        if hidden:
            source = hidden_source(count - 1) if hidden_source else None
        shell.outputs = outputs = []
        shell.muted = muted = student_cells if hidden else frozenset()
        start, cpu = time.perf_counter(), time.process_time()
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Stream(outputs, "stdout", muted), _Stream(outputs, "stderr", muted)
        signal.setitimer(signal.ITIMER_REAL, cell.get("metadata", {}).get(TIMEOUT_KEY) or 0)
        try:
            shell.execution_count = count
            if source is None:
                outputs.append(_error(LookupError, "the grader was not given this cell's hidden tests", []))
            elif hidden:
                _run_hidden(shell, source)
            else:
                result = shell.run_cell(source, store_history=False)
                error = result.error_before_exec or result.error_in_exec
                if error is not None and not any(o["output_type"] == "error" and o["ename"] == type(error).__name__
                                                 for o in outputs):   # a custom exception handler showed no error
                    outputs.append(_error(type(error), error, ["ERROR: An error occurred while showtraceback was "
                                                               "disabled"]))   # nbgrader's Execute adds the same
        except CellTimeoutError as exc:   # raised between IPython's own handlers
            outputs.append(_error(type(exc), exc, [f"{type(exc).__name__}: {exc}"]))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stderr = saved
        checkpoint(f"after cell {count}", shell.user_ns)   # the tripwires (nothing outside a watched grader)
        outputs_of.append(outputs)
        seconds_of.append(round(time.perf_counter() - start, 3))
        cpu_of.append(round(time.process_time() - cpu, 3))
    return {"cells": outputs_of, "seconds": seconds_of, "cpu": cpu_of}


def _run_hidden(shell, source: str) -> None:
    """A hidden test cell's source, run in the notebook's namespace without IPython's ``run_cell``, which would keep
    its text where the student's code reads it unseen (``linecache``, the shell's last execution result)."""
    try:
        exec(compile(source, HIDDEN_FILENAME, "exec"), shell.user_ns)
    except CellTimeoutError:
        raise
    except BaseException:   # noqa: B036 - as run_cell does: any exception of the cell is its error output
        shell.showtraceback()


def _error(etype, evalue, traceback: list[str]) -> dict:
    return {"output_type": "error", "ename": etype.__name__, "evalue": str(evalue), "traceback": traceback}


MUTED_NOTE = "[what the submission's code printed while this hidden test cell ran is not shown]\n"


def _student_code_running(student_cells: frozenset) -> bool:
    """Whether a frame of a student's cell (by its execution count) is on the stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if cell_number(frame.f_code.co_filename) in student_cells:
            return True
        frame = frame.f_back
    return False


class _Stream(io.TextIOBase):
    """stdout or stderr of a cell: consecutive writes join one stream output, as Jupyter shows them. ``muted``:
    what the student's code writes is left out (a hidden test cell: it could print the tests encoded)."""

    def __init__(self, outputs: list, name: str, muted: frozenset = frozenset()):
        self.outputs, self.name, self.muted = outputs, name, muted

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.muted and _student_code_running(self.muted):
            if not any(o.get("text") == MUTED_NOTE for o in self.outputs):
                self.outputs.append({"output_type": "stream", "name": "stdout", "text": MUTED_NOTE})
            return len(text)
        last = self.outputs[-1] if self.outputs else None
        if last and last["output_type"] == "stream" and last["name"] == self.name:
            last["text"] += text
        else:
            self.outputs.append({"output_type": "stream", "name": self.name, "text": text})
        return len(text)


def _shell():
    """An IPython shell whose displays, last-expression values and tracebacks become the current cell's outputs
    (``shell.outputs``), as ipykernel's become messages."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import Type
    from traitlets.config import Config

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, *args, **kwargs):
            if getattr(self.shell, "muted", None) and _student_code_running(self.shell.muted):
                return   # a hidden test cell: nothing the student's code displays
            self.shell.outputs.append({"output_type": "display_data", "data": data, "metadata": metadata or {}})

        def clear_output(self, wait=False):
            self.shell.outputs.clear()

    class ResultHook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self.shell.outputs.append({"output_type": "execute_result", "data": format_dict,
                                       "metadata": md_dict or {}, "execution_count": self.shell.execution_count})

    class Shell(InteractiveShell):
        displayhook_class = Type(ResultHook)
        display_pub_class = Type(Publisher)

        def _showtraceback(self, etype, evalue, stb):
            self.outputs.append(_error(etype, evalue, stb))

        def enable_gui(self, gui=None):
            """No event loop: figures are shown inline, as in a notebook."""

    InteractiveShell.clear_instance()   # the pool's warm-up ran the released notebook in a shell of its own
    shell = Shell.instance(config=Config({"HistoryManager": {"enabled": False}}), colors="nocolor")
    shell.outputs = []
    from matplotlib_inline.backend_inline import configure_inline_support
    configure_inline_support.current_backend = "unset"   # it gives only a process's first shell the figure formats
    shell.enable_matplotlib("inline")   # plt.show() displays the figure (a display_data output), as ipykernel's does
    return shell
