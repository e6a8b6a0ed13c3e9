"""Tampering flags (``course/classroom/``: ``tampering.py``, ``compare.py``, ``watch.py``, ``tripwires.py``) and what
the class report shows of a class (``report.py``).

The flags must catch the forgeries (the two verified by hand first: a module of stubs that replaces
``course.checks.framework._verdict``, and ``from course.reference.train_loop import *``), also spelled so that no
static scan can read them (the audit hook and the tripwires see what happens, whatever the spelling), and must never
fire on honest code: every independent solution of tests/corpus/ and every submission of a simulated class. The
runtime cases run in one process of their own (tests/watched.py: the watch as a grader has it, without the
sandbox); grade-class with its sandbox is graded on the attack suite's class (tests/test_grade_class.py).
"""
from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from course.checks import LESSONS, get_lesson
from course.checks.framework import CORE, FAIL, PASS, TODO
from course.checks.notebook import run_checks
from course.classroom import compare, tampering, watch
from course.classroom.grade_class import Submission, default_out_dir, file_route_result
from course.classroom.confinement import Outcome
from course.classroom.inside import HIDDEN_KEY, MUTED_NOTE, RUN_KEY, runs
from course.classroom.report import ERROR, STOPPED, cells_that_raised, check_messages, exercise_state, write_report
from course.classroom.simulate import own_names, roster, variants
from course.implementations import REFERENCE_DIR, REPO_ROOT, module_from_source
from course.layout import NOTEBOOKS_DIR

LESSON = get_lesson("14")
STUB = (REPO_ROOT / "impl" / LESSON.module_file).read_text(encoding="utf-8")
REFERENCE = (REFERENCE_DIR / LESSON.module_file).read_text(encoding="utf-8")
CORPUS = sorted(p for p in (REPO_ROOT / "tests" / "corpus").glob("lesson*/*") if p.is_dir()
                and (p / get_lesson(p.parent.name.removeprefix("lesson")).module_file).is_file())
HONEST = REPO_ROOT / "tests" / "corpus" / "lesson14" / "functional"
TWIN = REPO_ROOT / "tests" / "corpus" / "lesson14" / "defensive"   # the code two students hand in alike
STUB_LINES = len(STUB.splitlines())
HONEST_SOURCE = (HONEST / LESSON.module_file).read_text(encoding="utf-8")


def forged(*lines: str) -> str:
    """The released stubs with ``lines`` appended (line STUB_LINES + 1 is the first of them)."""
    return STUB + "\n".join(lines) + "\n"


# --- the runtime cases: audit hook, tripwires, silence ------------------------------------------------------------

FILE_CASES = {
    "honest": {"files": {LESSON.module_file: HONEST_SOURCE}, "grade": True},
    "verdict": {"files": {LESSON.module_file: forged(
        "import course.checks.framework as f",
        "f._verdict = lambda check, module: f.CheckResult(check.name, check.exercise, 'PASS')")}},
    "verdict_spelled": {"files": {LESSON.module_file: forged(
        "_m = __import__('importlib').import_module('course.' + 'checks.framework')",
        "setattr(_m, '_ver' + 'dict', lambda c, mod: _m.CheckResult(c.name, c.exercise, 'PA' + 'SS'))")}},
    "verdict_dict": {"files": {LESSON.module_file: forged(
        "_g = getattr(__import__('sy' + 's'), 'mod' + 'ules')['course.' + 'checks.framework']",
        "vars(_g)['_ver' + 'dict'] = lambda c, mod: _g.CheckResult(c.name, c.exercise, 'PA' + 'SS')")}},
    "star": {"files": {LESSON.module_file: "from course.reference.train_loop import *\n"}},
    "star_spelled": {"files": {LESSON.module_file: "globals().update(vars(__import__('importlib').import_module("
                                                   "'course.ref' + 'erence.train_loop')))\n"}},
    "torch_equal": {"files": {LESSON.module_file: forged("torch.equal = lambda *args, **kwargs: True")}},
    "forged_answer": {"files": {LESSON.module_file: forged(
        "import os",
        "for _fd in range(3, 64):",
        "    try:",
        "        os.write(_fd, b'{\"checks\": {}}')",
        "    except OSError:",
        "        pass",
        "getattr(os, '_ex' + 'it')(0)")}},
    "gc_walk": {"files": {LESSON.module_file: forged("_objects = __import__('g' + 'c').get_objects()")}},
    "frames": {"files": {LESSON.module_file: forged("_frame = getattr(__import__('sys'), '_get' + 'frame')(0)")}},
    "proc_fd": {"files": {LESSON.module_file: forged("_fds = __import__('os').listdir('/pr' + 'oc/self/fd')")}},
    "exec": {"files": {LESSON.module_file: forged("getattr(__import__('builti' + 'ns'), 'ex' + 'ec')('_x = 1')")}},
    # found by an attack pass: the checks' own objects rewritten, the reference reached under its loaded name
    "check_objects": {"files": {LESSON.module_file: forged(
        "_modules = getattr(getattr(__import__('o' + 's'), 's' + 'ys'), 'mod' + 'ules')",
        "for _lesson in getattr(_modules.get('course' + '.che' + 'cks'), 'LESS' + 'ONS').values():",
        "    for _check in _lesson.checks:",
        "        _check.__dict__['run'] = lambda impl: None")}},
    "oracle_delegate": {"grade": True, "files": {LESSON.module_file: forged(
        "def train_one_epoch(*args, **kwargs):",
        "    from course.minimind.train_pretrain import train_epoch",
        "    return train_epoch(*args, **kwargs)")}},
    "reference_by_name": {"grade": True, "files": {LESSON.module_file: forged(
        "_modules = getattr(getattr(__import__('o' + 's'), 's' + 'ys'), 'mod' + 'ules')",
        "_R = [m for k, m in list(_modules.items()) if k.startswith('_course' + '_impl_')",
        "      and str(getattr(m, '__file__', '')).endswith('refer' + 'ence/train_loop.py')][0]",
        "def cosine_lr(*args, **kwargs):",
        "    return _R.cosine_lr(*args, **kwargs)")}},
    # found by a third attack pass: frames handed on by the standard library, and by a signal handler
    "walk_stack": {"files": {LESSON.module_file: forged(
        "_frames = [_f for _f, _ in __import__('trace' + 'back').walk_stack(None)]")}},
    "walk_tb": {"files": {LESSON.module_file: forged(
        "try:",
        "    1 / 0",
        "except ZeroDivisionError as _error:",
        "    _frames = [_f for _f, _ in __import__('trace' + 'back').walk_tb(_error.__traceback__)]")}},
    "current_frame": {"files": {LESSON.module_file: forged("_frame = __import__('logg' + 'ing').currentframe()")}},
    "closure": {"files": {LESSON.module_file: forged(
        "_inspect = __import__('insp' + 'ect')",
        "_seen = _inspect.getclosurevars(_inspect.getclosurevars)")}},
    "signal_handler": {"files": {LESSON.module_file: forged(
        "_signal = __import__('sig' + 'nal')",   # put back at once: the tripwires see no handler changed
        "_signal.signal(10, _signal.signal(10, lambda number, frame: None))")}},
    "test_by_code": {"grade": True, "files": {LESSON.module_file: HONEST_SOURCE + "\n".join([
        "", "", "def test_accumulation_matches_big_batch(accumulate_gradients):",
        "    _wrapped = getattr(accumulate_gradients, '__co' + 'de__').co_consts", ""])}},
    "honest_stdlib": {"files": {LESSON.module_file: forged(
        "import collections, logging, traceback",
        "_Point = collections.namedtuple('_Point', 'x y')",
        "_stack = traceback.format_stack()",
        "try:",
        "    1 / 0",
        "except ZeroDivisionError:",
        "    _shown = traceback.format_exc()",
        "logging.getLogger('a student').info('a line nobody sees')")}},
}
NOTEBOOK = f"{LESSON.name}.ipynb"
SETUP = "from course.checks.notebook import run_checks\n"
NOTEBOOK_CELLS = {
    "honest": "def cosine_lr(current_step, total_steps, base_lr):\n    return base_lr\n",
    "gc_walk": "import gc\nfor _o in gc.get_objects():\n    pass\n",
    "post_run_cell": "def _clear(result):\n    get_ipython().outputs.clear()\n\n"
                     "get_ipython().events.register('post_run_cell', _clear)\n",
    "shadow": "def run_checks(*args, **kwargs):\n    print('PASS  everything')\n",
    "star": "from course.reference.train_loop import *\n",
    "figure": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n",
    "custom_exc": ["get_ipython().set_custom_exc((AssertionError,), lambda *args, **kwargs: None)\n",
                   "raise AssertionError('a grade cell that fails')\n"],
}


def notebook_of(student_cells) -> str:
    """A notebook with the course's setup cell (locked) and the student's cells (cell 2 on)."""
    import nbformat
    setup = nbformat.v4.new_code_cell(SETUP, metadata={"nbgrader": {"grade": False, "grade_id": "setup",
                                                                  "locked": True, "solution": False}})
    cells = [student_cells] if isinstance(student_cells, str) else student_cells
    return nbformat.writes(nbformat.v4.new_notebook(cells=[setup, *map(nbformat.v4.new_code_cell, cells)]))


def with_hidden_cell(student_cell: str, after: str = "") -> str:
    """``notebook_of(student_cell)`` and then a locked grade cell whose source (hidden tests) the grader is handed
    when it runs it (``HIDDEN_SOURCE``), as grade-class's notebook route runs one; then the cell ``after``."""
    import nbformat
    notebook = nbformat.reads(notebook_of(student_cell), as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("", metadata={
        HIDDEN_KEY: True, "nbgrader": {"grade": True, "grade_id": "hidden_cosine_lr", "locked": True, "points": 1,
                                       "solution": False}}))
    notebook.cells += [nbformat.v4.new_code_cell(after)] if after else []
    return nbformat.writes(notebook)


HIDDEN_SOURCE = "print('the checks ran')\ncosine_lr(1, 10, 0.5)\n"
LEAK = "def cosine_lr(current_step, total_steps, base_lr):\n    print('a hidden test, encoded')\n    return base_lr\n"
# found by a third attack pass: what IPython keeps of a cell it ran (its lines for tracebacks, the last result),
# read while the hidden cell runs and after it, printed reversed past the feedback's filter
STASH = ("import linecache\n_kept = []\n\n"
         "def _cell_texts():\n"
         "    shell = get_ipython()\n"
         "    results = [shell.last_execution_result, getattr(shell.displayhook, 'exec_result', None)]\n"
         "    return [''.join(entry[2]) for name, entry in list(linecache.cache.items()) if name.startswith('<')] + \\\n"
         "        [result.info.raw_cell for result in results if result is not None]\n\n"
         "def cosine_lr(current_step, total_steps, base_lr):\n"
         "    _kept.extend(_cell_texts())\n"
         "    return base_lr\n")
SHOW_STASH = "print([text[::-1] for text in _kept + _cell_texts() if 'cosine_lr(1,' in text])\n"


@pytest.fixture(scope="module")
def watched(tmp_path_factory) -> dict:
    cases = {f"files/{name}": {"route": "files", **case} for name, case in FILE_CASES.items()}
    cases |= {f"notebook/{name}": {"route": "notebook", "files": {NOTEBOOK: notebook_of(cell)}}
              for name, cell in NOTEBOOK_CELLS.items()}
    cases["notebook/hidden_leak"] = {"route": "notebook", "files": {NOTEBOOK: with_hidden_cell(LEAK)},
                                     "hidden": {"2": HIDDEN_SOURCE}}
    cases["notebook/hidden_kept"] = {"route": "notebook", "files": {NOTEBOOK: with_hidden_cell(STASH, SHOW_STASH)},
                                     "hidden": {"2": HIDDEN_SOURCE}}
    path = tmp_path_factory.mktemp("watched") / "cases.json"
    path.write_text(json.dumps(cases), encoding="utf-8")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "watched.py"), str(path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"tests/watched.py exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def runtime(watched: dict, case: str) -> list[tuple]:
    """(kind, file, line, source) of the flags a case's run reported."""
    return sorted((f["kind"], f["file"], f["line"], f["source"]) for f in watched[case]["flags"])


@pytest.mark.parametrize("case, expected", [
    # the two forgeries verified by hand, as written and spelled past any scan
    ("verdict", [(tampering.PATCH, LESSON.module_file, STUB_LINES + 2, "audit"),
                 (tampering.PATCH, LESSON.module_file, STUB_LINES + 2, "tripwire")]),
    ("verdict_spelled", [(tampering.PATCH, LESSON.module_file, STUB_LINES + 2, "audit"),
                         (tampering.PATCH, LESSON.module_file, STUB_LINES + 2, "tripwire")]),
    ("verdict_dict", [(tampering.PATCH, LESSON.module_file, STUB_LINES + 2, "tripwire")]),   # no setattr: no event
    ("star", [(tampering.NOT_OWN, LESSON.module_file, 0, "tripwire")]),
    ("star_spelled", [(tampering.NOT_OWN, "the submission's module", 0, "tripwire")]),   # its __file__ replaced
    ("torch_equal", [(tampering.PATCH, LESSON.module_file, STUB_LINES + 1, "audit"),
                     (tampering.PATCH, LESSON.module_file, STUB_LINES + 1, "tripwire")]),
    ("forged_answer", [(tampering.SILENCED, "-", 0, "audit")]),
    ("gc_walk", [(tampering.INTERNALS, LESSON.module_file, STUB_LINES + 1, "audit")]),
    ("frames", [(tampering.INTERNALS, LESSON.module_file, STUB_LINES + 1, "audit")]),
    ("proc_fd", [(tampering.DESCRIPTOR, LESSON.module_file, STUB_LINES + 1, "audit")]),
    ("exec", [(tampering.DYNAMIC, LESSON.module_file, STUB_LINES + 1, "audit")]),
    ("check_objects", [(tampering.PATCH, LESSON.module_file, STUB_LINES + 4, "tripwire")]),   # no event either
    ("reference_by_name", [(tampering.NOT_OWN, LESSON.module_file, STUB_LINES + 5, "audit")]),
    ("oracle_delegate", [(tampering.NOT_OWN, LESSON.module_file, STUB_LINES + 3, "audit")]),   # found by a 2nd pass
    ("walk_stack", [(tampering.INTERNALS, LESSON.module_file, STUB_LINES + 1, "audit")]),
    ("walk_tb", [(tampering.INTERNALS, LESSON.module_file, STUB_LINES + 4, "audit")]),
    ("current_frame", [(tampering.INTERNALS, LESSON.module_file, STUB_LINES + 1, "audit")]),
    ("closure", [(tampering.INTERNALS, LESSON.module_file, STUB_LINES + 2, "audit")]),
    ("signal_handler", [(tampering.INTERNALS, LESSON.module_file, STUB_LINES + 2, "audit")]),
    ("test_by_code", [(tampering.INTERNALS, LESSON.module_file, len(HONEST_SOURCE.splitlines()) + 4, "audit")]),
    ("honest_stdlib", []),   # namedtuple, logging and tracebacks read frames for themselves: no flag
])
def test_the_run_is_flagged_whatever_the_spelling(watched, case, expected):
    """Each forgery's run reports exactly these flags, with the submission's file and line: what the audit hook saw
    as it happened, what the tripwires found changed, and the silence of a grader that answered for itself."""
    got = runtime(watched, f"files/{case}")
    assert got == sorted(expected), (f"{case}: runtime flags\n  ACTUAL:   {got}\n  EXPECTED: {sorted(expected)}\n"
                                     f"{watched[f'files/{case}']['flags']}")


def test_an_honest_graded_run_is_not_flagged(watched):
    """A corpus solution graded in full (every check calling into it) causes no event worth a flag."""
    run = watched["files/honest"]
    answer = json.loads(run["answer"])
    assert all(row["status"] == PASS for row in answer["checks"].values()) and answer["checks"], run["answer"][:500]
    assert run["flags"] == [], f"ACTUAL {run['flags']}, EXPECTED no flag (a false flag on honest code)"


@pytest.mark.parametrize("case, expected", [
    ("honest", []),
    ("gc_walk", [(tampering.INTERNALS, "cell 2 (added)", 2, "audit")]),
    ("post_run_cell", [(tampering.NOTEBOOK_HOOK, "cell 2 (added)", 1, "tripwire")]),
    ("shadow", [(tampering.NOTEBOOK_HOOK, "cell 2 (added)", 1, "tripwire")]),
    ("star", [(tampering.NOT_OWN, "notebook", 0, "tripwire")]),
    ("custom_exc", [(tampering.NOTEBOOK_HOOK, "cell 2 (added)", 1, "tripwire")]),
])
def test_a_notebook_run_is_flagged_in_the_students_cell(watched, case, expected):
    """The notebook route: the flag names the student's cell (the course's setup cell imports from the grader and
    is not flagged); a hook in the shell, a rebound run_checks and the reference's functions are found."""
    got = runtime(watched, f"notebook/{case}")
    assert got == sorted(expected), (f"{case}: runtime flags\n  ACTUAL:   {got}\n  EXPECTED: {sorted(expected)}\n"
                                     f"{watched[f'notebook/{case}']['flags']}")


def test_a_hidden_cell_shows_nothing_the_students_code_prints(watched):
    """What the student's code prints while a hidden test cell runs could be the tests themselves, encoded past any
    filter (found by an attack pass): it is left out, with one note; what the cell's own code prints stays."""
    [*_, hidden] = json.loads(watched["notebook/hidden_leak"]["answer"])["cells"]
    texts = [o.get("text", "") for o in hidden]
    assert "the checks ran\n" in texts[0] and not any("encoded" in text for text in texts) and \
        any(text == MUTED_NOTE for text in texts), f"ACTUAL outputs of the hidden cell: {hidden}"


def test_nothing_the_shell_keeps_of_a_hidden_cell_reaches_a_later_cell(watched):
    """A hidden cell runs without IPython's run_cell: no line of it stays in linecache or in the shell's last
    execution result, where the student's code could read it while the cell runs or after, and print it reversed."""
    cells = json.loads(watched["notebook/hidden_kept"]["answer"])["cells"]
    shown = "".join(o.get("text", "") for o in cells[-1])
    assert shown.startswith("["), f"the last cell printed no list: {cells[-1]}"
    for line in HIDDEN_SOURCE.splitlines():
        assert line[::-1] not in shown, f"the hidden cell's line {line!r} reached a later cell, reversed:\n{shown}"


def test_an_error_a_custom_handler_swallows_still_fails_its_cell(watched):
    """``set_custom_exc`` shows no error for the exceptions it takes: the cell gets an error output all the same, as
    nbgrader's Execute adds one from the kernel's reply (else such a grade cell would score full points)."""
    shown = watched["notebook/custom_exc"]["shown"]
    assert shown[2] == ["AssertionError"], f"ACTUAL {shown}, EXPECTED an AssertionError in cell 3"


def test_every_notebook_grader_shows_a_figure_inline(watched):
    """A figure shown in a cell is a display_data with its PNG, as a kernel's inline backend gives it, in every
    grader (each a fresh shell in a process that ran others), and draws no flag."""
    run = watched["notebook/figure"]
    assert run["shown"][1] == ["display_data image/png text/plain"] and run["flags"] == [], run


@pytest.mark.parametrize("messages, answer, silenced", [
    ("S\nF\tNONCE\t{digest}\n", b'{"checks": {}}', False),
    ("S\nF\tNONCE\t{digest}\n", b'{"checks": {"forged": 1}}', True),   # a closing message for another answer
    ("S\nF\tGUESS\t{digest}\n", b'{"checks": {}}', True),              # not the keeper's nonce
    ("S\n", b'{"checks": {}}', True),                                  # closed without it
    ("", b"", False),                                                   # no answer: nothing to vouch for
])
def test_only_the_graders_own_closing_message_vouches_for_an_answer(messages, answer, silenced):
    import hashlib
    digest = hashlib.sha256(b'{"checks": {}}').hexdigest()
    flags = watch.parse_messages(messages.format(digest=digest), "NONCE", answer)
    assert any(f["kind"] == tampering.SILENCED for f in flags) == silenced, (
        f"ACTUAL {flags}, EXPECTED silenced={silenced}")


# --- the static scan --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, kind", [
    ("import course.checks.framework as f\n", tampering.GRADER),
    ("from course.reference.train_loop import *\n", tampering.GRADER),
    ("from course import classroom\n", tampering.GRADER),
    ("import gc\n", tampering.INTERNALS),
    ("import ctypes\n", tampering.INTERNALS),
    ("import sys\nf = sys._getframe(1)\n", tampering.INTERNALS),
    ("import sys\nm = sys.modules['course.checks.framework']\n", tampering.INTERNALS),
    ("def f():\n    return f.__globals__\n", tampering.INTERNALS),
    ("import builtins\n", tampering.INTERNALS),
    ("import os\nos.write(5, b'{}')\n", tampering.DESCRIPTOR),
    ("import os\nos._exit(0)\n", tampering.DESCRIPTOR),
    ("open(7, 'w')\n", tampering.DESCRIPTOR),
    ("path = '/proc/self/fd'\n", tampering.DESCRIPTOR),
    ("exec('x = 1')\n", tampering.DYNAMIC),
    ("value = eval('1 + 1')\n", tampering.DYNAMIC),
    ("import importlib\n", tampering.DYNAMIC),
    ("m = __import__('os')\n", tampering.DYNAMIC),
    ("import torch\ntorch.equal = lambda *a: True\n", tampering.PATCH),
    ("import torch.nn.functional as F\nsetattr(F, 'mse_loss', None)\n", tampering.PATCH),
    ("import torch\nvars(torch)['allclose'] = None\n", tampering.PATCH),
    ("import subprocess\n", tampering.PROCESS),
    ("name = 'course.checks.framework'\n", tampering.GRADER),
])
def test_the_static_scan_flags_each_pattern(source, kind):
    flags = tampering.scan_source(source, "m.py")
    assert kind in {f["kind"] for f in flags}, f"{source!r}: ACTUAL {flags}, EXPECTED a {kind} flag"
    assert all(f["file"] == "m.py" and f["line"] >= 1 for f in flags), flags


@pytest.mark.parametrize("source", [
    "get_ipython().events.register('post_run_cell', print)\n",
    "def run_checks(*args):\n    pass\n",
    "globals = lambda: {}\n",
])
def test_the_static_scan_flags_what_a_notebook_cell_does_to_the_grade_cells(source):
    flags = tampering.scan_source(source, "cell 3 (added)", notebook=True)
    assert tampering.NOTEBOOK_HOOK in {f["kind"] for f in flags}, f"{source!r}: ACTUAL {flags}"


def test_the_static_scan_lets_a_submission_import_what_the_course_hands_out():
    """Lesson 16's setup cell imports the reference's should_step_optimizer: a submission may import it too (and
    lesson 14's, which hands out no such thing, may not)."""
    source = "from course.reference.train_loop import should_step_optimizer\n"
    assert tampering.scan_source(source, "m.py", allowed=_handed_out(get_lesson("16"))) == []
    assert tampering.scan_source(source, "m.py", allowed=_handed_out(LESSON)), "lesson 14 hands out no such thing"


@functools.lru_cache(maxsize=None)
def _simulated_sources() -> tuple[tuple[str, object, str], ...]:
    """(label, lesson, source) of a small simulated class of every lesson: the reference twice (a correct and a
    hanging student: the same variant, each with its own names), an equivalent form and two mistakes."""
    found = []
    for lesson in (get_lesson(i) for i in LESSONS):
        for student, _, label, source in roster(lesson, 6, {"correct": 0.4, "wrong": 0.4, "hanging": 0.2}):
            found.append((f"{lesson.lesson_id}/{student}/{label}", lesson, source))
    return tuple(found)


def _handed_out(lesson) -> set[str]:
    """What the lesson's notebook imports from the grader itself (nothing where it has no notebook yet)."""
    release = lesson.files()["notebook release"]
    return tampering.course_imports(json.loads(release.read_text(encoding="utf-8"))) if release.is_file() else set()


def test_no_honest_submission_is_flagged_statically(tmp_path):
    """The false-flag rate on honest code, measured: 0 flags on the corpus solutions (36 or more) and on the
    simulated class of every lesson (its correct and wrong variants), each scanned with its lesson's handed-out
    imports."""
    flagged = {}
    for folder in CORPUS:
        lesson = get_lesson(folder.parent.name.removeprefix("lesson"))
        flags = tampering.static_flags(folder, allowed=_handed_out(lesson))
        if flags:
            flagged[str(folder.relative_to(REPO_ROOT))] = flags
    for label, lesson, source in _simulated_sources():
        flags = tampering.scan_source(source, lesson.module_file, allowed=_handed_out(lesson))
        if flags:
            flagged[label] = flags
    assert len(CORPUS) >= 36 and not flagged, f"honest code flagged (false flags): {flagged}"


# --- identical code ------------------------------------------------------------------------------------------------

def _write(root: Path, students: dict[str, str]) -> dict[str, Path]:
    paths = {}
    for student, source in students.items():
        (root / student).mkdir(parents=True)
        (root / student / LESSON.module_file).write_text(source, encoding="utf-8")
        paths[student] = root / student
    return paths


def test_a_copy_of_the_reference_or_of_a_classmate_is_flagged(tmp_path):
    """The reference re-formatted with its comments and docstrings gone is still the reference's; two students
    with the same code are flagged both; the released stubs and a corpus solution are not."""
    reformatted = ast.unparse(ast.parse(REFERENCE)).replace('"""', "'''")
    paths = _write(tmp_path, {"copy": "# my own work\n" + reformatted, "stubs": STUB,
                              "honest": (HONEST / LESSON.module_file).read_text(encoding="utf-8"),
                              "twin-a": (TWIN / LESSON.module_file).read_text(encoding="utf-8"),
                              "twin-b": "# copied\n" + (TWIN / LESSON.module_file).read_text(encoding="utf-8")})
    flags = compare.identical_flags(LESSON, paths)
    copied = {f["detail"].split(" ")[0] for f in flags.get("copy", []) if f["kind"] == tampering.SAME_AS_REFERENCE}
    assert "train_one_epoch" in copied and "cosine_lr" not in copied, (
        f"ACTUAL {sorted(copied)}, EXPECTED the exercises of {tampering.MIN_IDENTICAL_NODES}+ nodes "
        "(train_one_epoch...), not the small ones a hint spells out (cosine_lr)")
    for twin, other in (("twin-a", "twin-b"), ("twin-b", "twin-a")):
        assert [f["kind"] for f in flags.get(twin, [])] == [tampering.SAME_AS_STUDENT] and other in \
            flags[twin][0]["detail"], f"{twin}: ACTUAL {flags.get(twin)}"
    assert "stubs" not in flags and "honest" not in flags, f"false flags: {flags}"


def test_no_honest_class_is_flagged_identical(tmp_path):
    """Every lesson's corpus, and every lesson's simulated class (the same variant written by several students),
    has no identity flag: independent code is not identical, and neither is a simulated student's."""
    for lesson in (get_lesson(i) for i in LESSONS):
        folders = {p.name: p for p in CORPUS if (p / lesson.module_file).is_file()}
        simulated = {student: source for label, l, source in _simulated_sources() if l is lesson
                     for student in [label.split("/")[1]]}
        root = tmp_path / lesson.lesson_id
        for student, source in simulated.items():
            (root / student).mkdir(parents=True)
            (root / student / lesson.module_file).write_text(source, encoding="utf-8")
            folders[student] = root / student
        flags = compare.identical_flags(lesson, folders)
        assert not flags, f"lesson {lesson.lesson_id}: honest submissions flagged identical: {flags}"


def _unrenamed(source: str, suffix: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = node.id.removesuffix(f"_{suffix}")
    return ast.dump(tree)


def test_own_names_changes_only_names_and_keeps_what_the_checks_see():
    """The simulated students' renaming is a consistent substitution that captures no other name (so every variant
    of every lesson behaves as written), and lesson 14's reference so renamed passes its quick exercises' checks and
    a loop check while a catalogued mistake so renamed still fails the check that catches it."""
    from course.checks.results import grade_exercises
    for lesson in (get_lesson(i) for i in LESSONS):   # the references and their equivalent forms (a mistake is a
        for label, source in variants(lesson)["correct"]:   # one-line edit of the reference: the same functions)
            renamed = own_names(source, "s9")
            written = ast.dump(ast.parse(ast.unparse(ast.parse(source))))
            assert _unrenamed(renamed, "s9") == written, f"{lesson.lesson_id} {label}: more than names changed"
            before = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
            assert not {n.id for n in ast.walk(ast.parse(renamed)) if isinstance(n, ast.Name)
                        and n.id.endswith("_s9")} & before, f"{lesson.lesson_id} {label}: a new name captures one"
    module = module_from_source(own_names(REFERENCE, "s001"), "renamed_14", "<renamed reference>")
    quick = [c.name for c in LESSON.checks if c.tier == CORE and c.exercise not in
             ("train_one_epoch", "test_accumulation_matches_big_batch")] + ["train_one_epoch_marks_the_tail_flush"]
    failed = [r.check for e in grade_exercises(LESSON, module, check_names=quick) for r in e.checks
              if r.status != PASS]
    assert not failed, f"the renamed reference fails {failed}"
    mistake = next(m for m in LESSON.mistakes if m.caught_by in quick)
    wrong = module_from_source(own_names(mistake.source(), "s002"), "renamed_mistake", "<renamed mistake>")
    [result] = [r for e in grade_exercises(LESSON, wrong, check_names=[mistake.caught_by]) for r in e.checks]
    assert result.status == FAIL, f"{mistake.name} renamed: ACTUAL {result.status}, EXPECTED FAIL"


# --- the report: roster, flags, messages ----------------------------------------------------------------------

def _result(student: str, points: float, checks: dict, **extra) -> dict:
    return {"student": student, "route": "files", "points": points, "max_points": float(LESSON.points),
            "cells": {}, "checks": checks, "problem": "", "seconds": 1.0, "max_rss_mb": 100.0,
            "wrote_stderr": False, "stderr": "", "flags": [], **extra}


def test_the_report_has_a_roster_and_every_flag_beside_the_score(tmp_path):
    names = [c.name for c in LESSON.checks if c.exercise == "cosine_lr" and not c.hidden and c.tier == "core"]
    honest = _result("alice", 15, {name: PASS for name in names})
    forger = _result("mallory", 15, {name: PASS for name in names}, flags=[
        tampering.flag(tampering.PATCH, LESSON.module_file, 168, "writes course.checks.framework._verdict", "audit")])
    raised = _result("bob", 3, {names[0]: FAIL}, route="notebook", messages={names[0]: f"{names[0]} raised KeyError"},
                     cells_raised=["cell 4 (cosine_lr): NameError"])
    report = write_report(LESSON, [honest, forger, raised], tmp_path).read_text(encoding="utf-8")
    assert "| mallory | 15 | patch | train_loop.py:168 | writes course.checks.framework._verdict | audit |" in report, (
        report)
    roster = next(line for line in report.splitlines() if line.startswith("| bob |"))
    assert f"| {ERROR} |" in roster and "cell 4 (cosine_lr): NameError" in roster, roster
    unfinished = report.split("## Not graded in full")[1].split("##")[0]
    assert "bob: cells that raised: cell 4 (cosine_lr): NameError" in unfinished and "None" not in unfinished, (
        unfinished)
    assert "--every-cell" in report, "the report says the notebooks' figure cells were not run, and how to run them"


@pytest.mark.parametrize("statuses, messages, problem, state", [
    ({"a": PASS, "b": PASS}, {}, "", PASS),
    ({"a": PASS, "b": TODO}, {"b": "TODO (lesson 14 §5.1)"}, "", TODO),
    ({"a": PASS, "b": FAIL}, {"b": "cosine\n  ACTUAL: 1\n  EXPECTED: 2"}, "", FAIL),
    ({"a": PASS, "b": FAIL}, {"b": "b raised ZeroDivisionError: division by zero"}, "", ERROR),
    ({"a": PASS}, {}, "", ERROR),            # b never ran: its cell raised before its checks did
    ({"a": PASS}, {}, "timed out", STOPPED),
])
def test_an_exercise_state_tells_todo_fail_and_error_apart(statuses, messages, problem, state):
    got = exercise_state({"checks": statuses, "messages": messages, "problem": problem}, ["a", "b"])
    assert got == state, f"ACTUAL {got}, EXPECTED {state}"


def test_the_json_carries_each_failed_checks_message_on_both_routes():
    """File route: from the grader's answer; notebook route: from the AssertionError its grade cell raised."""
    outcome = Outcome({"checks": {"cosine_lr_endpoints": {"status": FAIL, "message": "lr\n  ACTUAL: 1\n  EXPECTED: 2"},
                                  "cosine_lr_matches_get_lr": {"status": PASS, "message": ""}}}, "", 1.0, 1.0, "")
    row = file_route_result(LESSON, outcome)
    assert row["messages"] == {"cosine_lr_endpoints": "lr\n  ACTUAL: 1\n  EXPECTED: 2"}, row
    namespace = {"cosine_lr": lambda current_step, total_steps, base_lr: base_lr}   # never decays
    with pytest.raises(AssertionError) as raised:
        run_checks(namespace, "14", "cosine_lr_matches_get_lr", "cosine_lr_endpoints")
    cell = {"cell_type": "code", "metadata": {"nbgrader": {"grade": True, "grade_id": "test_cosine_lr"}}}
    outputs = [[{"output_type": "error", "ename": "AssertionError", "evalue": str(raised.value)}]]
    messages = check_messages({"cells": [cell]}, outputs)
    assert set(messages) == {"cosine_lr_matches_get_lr", "cosine_lr_endpoints"} and all(
        "ACTUAL" in m and "EXPECTED" in m for m in messages.values()), messages
    assert cells_that_raised({"cells": [cell]}, outputs) == ["cell 1 (test_cosine_lr): AssertionError"]


# --- the instructor's path ---------------------------------------------------------------------------------------

def test_every_cell_runs_the_show_only_cells():
    plot = {"cell_type": "code", "metadata": {"nbgrader": {"locked": True, "grade": False, "grade_id": "plot_lr"}}}
    assert not runs(plot) and runs({**plot, "metadata": {**plot["metadata"], RUN_KEY: True}})


def test_the_default_output_folder_is_git_ignored():
    """grade-class's results hold grades: its default folder (grade-class/ beside SUBMISSIONS_DIR) is ignored."""
    out = default_out_dir(LESSON, NOTEBOOKS_DIR / "submitted") / "report.md"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(out)], cwd=REPO_ROOT)
    assert ignored.returncode == 0, f"{out.relative_to(REPO_ROOT)} is not git-ignored (.gitignore: grade-class/)"


def test_a_refused_submission_gets_no_static_flags(tmp_path):
    """A submission refused before grading (no route) is not read by the scan; a graded one's flags replace the
    ones an earlier run stored, and the run's own flags stay."""
    paths = _write(tmp_path, {"a": forged("import gc"), "b": "x = 1\n"})
    submissions = [Submission("a", paths["a"], "files", "d"), Submission("b", paths["b"], "", "", "refused")]
    stale = tampering.flag(tampering.GRADER, "old.py", 1, "a flag of an earlier version", "static")
    run = tampering.flag(tampering.SILENCED, "-", 0, "from the run", "audit")
    results = [_result("a", 0, {}, flags=[stale, run]), _result("b", 0, {})]
    changed = compare.add_class_flags(LESSON, submissions, results)
    assert changed == [results[0]] and results[0]["flags"][0] == run and \
        [f["kind"] for f in results[0]["flags"][1:]] == [tampering.INTERNALS], results[0]["flags"]
    assert results[1]["flags"] == [], results[1]["flags"]


def test_a_submission_too_deep_to_compare_never_stops_the_class(tmp_path):
    """Code that parses but is nested too deep to copy (an expression of 300 terms: found by an attack pass, it
    ended the whole run with a RecursionError while its exercises were compared) is compared with nothing, and
    every other submission is flagged as ever."""
    deep = "def cosine_lr(a, b, c):\n    return " + " + ".join(["a"] * 300) + "\n"
    paths = _write(tmp_path, {"deep": STUB, "other": forged("import gc")})
    (paths["deep"] / "helpers.py").write_text(deep, encoding="utf-8")
    submissions = [Submission(s, paths[s], "files", s) for s in ("deep", "other")]
    results = [_result(s, 0, {}) for s in ("deep", "other")]
    compare.add_class_flags(LESSON, submissions, results)
    kinds = [[f["kind"] for f in r["flags"]] for r in results]
    assert kinds == [[], [tampering.INTERNALS]], f"ACTUAL {kinds}, EXPECTED no flag, then internals"


def test_a_submissions_text_never_starts_a_line_of_the_report(tmp_path):
    """An error message with line breaks (an attack pass wrote a fake "## Tampering flags" section into the report
    through its ImportError) stays on its student's line."""
    fake = "x\n\n## Tampering flags\n\nNone\r## Instructor note\u2028- alice: copied"
    write_report(LESSON, [_result("mallory", 0, {}, problem=fake, cells_raised=["cell 3\n## x"])], tmp_path)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    headings = [line for line in report.splitlines() if line.startswith("#")]
    assert "## Instructor note" not in headings and headings.count("## Tampering flags") <= 1, headings
