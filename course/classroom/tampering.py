"""Tampering flags: what a submission did to reach into the grader or the process, listed beside its score for the
instructor to review (README, "Instructor notes"). A flag never changes a score: nbgrader's gradebook gets the
points as usual.

Each flag is a dict {"kind", "file", "line", "detail", "source"}; ``file`` is the submission's file (the file
route) or ``cell N (grade_id)`` of its notebook, ``line`` a line of it (0: none). Three sources:

* ``static_flags`` (source "static"): the submission's code as the trusted parent reads it — the module and every
  other ``.py`` it holds, or the notebook's solution cells and the cells the student added — for imports of the
  grader, process internals (``gc``, ``ctypes``, frames, ``sys.modules``, builtins), raw descriptors and ``/proc``,
  dynamic code (``exec``, ``eval``, ``compile``, ``importlib``, ``__import__``), writes to other modules'
  attributes, IPython hooks and names the grade cells use;
* ``identical_flags`` (source "compare"): an exercise identical to the reference's, a submission identical to
  another student's (formatting, comments and docstrings aside);
* ``AuditWatch`` (sources "audit" and "tripwire"): the run watched from inside. Its audit hook (PEP 578: once added
  it cannot be removed) is added in the grader before the student's code runs and writes every event that code
  causes to a pipe the trusted keeper reads, at once: the student's code cannot take back what was written.
  Tripwires (``checkpoint``) compare the grader's modules, the exercises' origins, the signal handlers and the
  notebook shell's hooks with what they were. A grader whose answer comes back without the closing message
  ``finish`` writes (or with one for another answer) silenced the channel or forged its answer: a flag too.

A static scan is evaded by obfuscation; the audit hook sees the events whatever the spelling. What neither sees:
code that uses only operations Python does not audit (a signal handler's frame, ``os.write`` to a descriptor
found by trying numbers) and spells them past the scan; README names this limit.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import secrets
import signal
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable, Optional

from course.implementations import REFERENCE_DIR, REPO_ROOT

# kinds of flag, as the report names them
GRADER = "grader-import"          # the grader's own modules or files
INTERNALS = "process-internals"   # gc, ctypes, frames, code objects, sys.modules, builtins
DESCRIPTOR = "descriptor"         # raw descriptors, /proc, os._exit
DYNAMIC = "dynamic-code"          # exec, eval, compile, importlib, __import__
PATCH = "patch"                   # another module's (or class's) attributes written, grader code replaced
PROCESS = "process"               # processes, signals, sockets
NOTEBOOK_HOOK = "notebook-hook"   # IPython hooks and events, the names grade cells use rebound
NOT_OWN = "not-own-code"          # an exercise that is the reference's (or the grader's) object
SAME_AS_REFERENCE = "identical-to-reference"
SAME_AS_STUDENT = "identical-to-student"
SILENCED = "silenced"             # an answer without the grader's closing message
UNSCANNED = "unscanned"           # a source the static scan could not read through (nested too deep)

GRADER_MODULES = ("course.checks", "course.classroom", "course.reference")
GRADER_DIRS = tuple(REPO_ROOT / "course" / part for part in ("checks", "classroom", "reference"))
INTERNAL_MODULES = {"gc", "ctypes", "_ctypes", "inspect", "marshal", "builtins", "signal", "_signal", "_thread",
                    "faulthandler"}
DYNAMIC_MODULES = {"importlib", "runpy", "code", "codeop"}
PROCESS_MODULES = {"subprocess", "multiprocessing", "socket", "pty", "_posixsubprocess"}
INTERNAL_ATTRIBUTES = {"_getframe", "_current_frames", "f_back", "f_globals", "f_locals", "f_builtins", "tb_frame",
                       "gi_frame", "cr_frame", "ag_frame", "__globals__", "__code__", "__closure__", "__builtins__",
                       "__subclasses__", "settrace", "setprofile", "addaudithook", "get_objects", "get_referrers",
                       "get_referents", "cell_contents"}
NOTEBOOK_ATTRIBUTES = {"events", "set_hook", "ast_transformers", "input_transformers_post",
                       "input_transformers_cleanup", "input_transformer_manager", "user_ns", "user_global_ns",
                       "showtraceback", "_showtraceback", "display_pub", "displayhook", "run_cell", "run_cell_async",
                       "set_custom_exc", "custom_exceptions", "CustomTB"}
DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__", "breakpoint"}
DESCRIPTOR_CALLS = {"write", "read", "fdopen", "dup", "dup2", "close", "lseek", "ftruncate", "pwrite", "writev",
                    "sendfile"}   # os.NAME(<a number>, ...): an inherited descriptor
ALWAYS_DESCRIPTOR = {"dup2", "closerange", "set_inheritable", "set_blocking"}
PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "kill", "killpg", "execv", "execve", "execvp", "execl",
                 "spawnv", "posix_spawn", "setsid"}
SUSPECT_PATHS = ("/proc", "/dev/fd", "/dev/mem", "/sys/fs/cgroup")
GRADE_CELL_NAMES = {"run_checks", "globals", "get_ipython"}   # what the grade cells call: rebinding it forges them
MAX_DETAIL = 240
MIN_IDENTICAL_NODES = 120   # smaller exercises (cosine_lr: 83 AST nodes) come out identical from a hint's last rung


def flag(kind: str, file: str, line: int, detail: str, source: str) -> dict:
    return {"kind": kind, "file": file, "line": int(line or 0), "detail": detail[:MAX_DETAIL], "source": source}


# --- what a submission holds ------------------------------------------------------------------------------

def _cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def is_student_cell(cell: dict, course_ids: Optional[set] = None) -> bool:
    """Whether a notebook's code cell holds the student's code: a solution cell or one the student added. A locked
    cell with a grade_id (of ``course_ids``, the source's locked cells, where given: a submitted notebook's metadata
    is the student's) is the course's: nbgrader's sanitizing puts the source's back."""
    metadata = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
    meta = metadata.get("nbgrader") if isinstance(metadata.get("nbgrader"), dict) else {}
    grade_id = meta.get("grade_id")
    course = bool(meta.get("locked") and grade_id) and (course_ids is None or grade_id in course_ids)
    return cell.get("cell_type") == "code" and not course


def course_cell_ids(source_notebook: Path) -> set[str]:
    """The grade_ids of the locked cells of an nbgrader source notebook (nothing if it cannot be read)."""
    try:
        cells = json.loads(Path(source_notebook).read_text(encoding="utf-8")).get("cells", [])
        return {c["metadata"]["nbgrader"]["grade_id"] for c in cells
                if c.get("metadata", {}).get("nbgrader", {}).get("locked")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def cell_label(number: int, cell: dict) -> str:
    grade_id = (cell.get("metadata", {}).get("nbgrader", {}) or {}).get("grade_id")
    return f"cell {number} ({grade_id or 'added'})"


def _python_of_cell(text: str) -> str:
    """A cell's source as Python: IPython's ``%`` magics and ``!`` shell lines turned into the calls it makes."""
    if not any(line.lstrip().startswith(("%", "!")) for line in text.splitlines()) and "?" not in text:
        return text
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(text)
    except Exception:   # noqa: BLE001 - IPython refused the text: scan it as it stands
        return text


def notebook_cells(notebook: dict, course_ids: Optional[set] = None) -> list[tuple[str, str]]:
    """(label, Python source) of the student's cells of a notebook (nbformat 4 as a dict), numbered as the grader
    runs them (1 = the first cell)."""
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    return [(cell_label(number, cell), _python_of_cell(_cell_text(cell)))
            for number, cell in enumerate(cells if isinstance(cells, list) else [], 1)
            if isinstance(cell, dict) and is_student_cell(cell, course_ids)]


def submission_sources(path: Path, course_ids: Optional[set] = None, max_bytes: int = 4 << 20
                       ) -> list[tuple[str, str]]:
    """(label, source) of what a submission holds: every ``.py`` of its folder (the file route), or the student's
    cells of its notebook. A file it cannot read, or larger than ``max_bytes``, is left out (the grader reports it)."""
    path = Path(path)
    try:
        if path.is_file():
            if path.stat().st_size > max_bytes:
                return []
            return notebook_cells(json.loads(path.read_text(encoding="utf-8", errors="replace")), course_ids)
        files = sorted(p for p in path.rglob("*.py") if p.is_file() and not p.is_symlink()
                       and p.stat().st_size <= max_bytes)
        return [(p.relative_to(path).as_posix(), p.read_text(encoding="utf-8", errors="replace")) for p in files]
    except (OSError, ValueError, RecursionError):
        return []


# --- the static scan --------------------------------------------------------------------------------------

def _parse(source: str) -> Optional[ast.Module]:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None   # it does not run either: nothing it could do


def _dotted(node) -> str:
    """``a.b.c`` of a Name/Attribute chain, "" for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return ""


def _is_grader(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in GRADER_MODULES)


def _import_kind(module: str) -> Optional[str]:
    top = module.split(".")[0]
    if _is_grader(module):
        return GRADER
    if top in INTERNAL_MODULES:
        return INTERNALS
    if top in DYNAMIC_MODULES:
        return DYNAMIC
    if top in PROCESS_MODULES:
        return PROCESS
    return None


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """name -> module of every ``import X`` / ``import X.Y as Z`` in the source."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
    return aliases


def _is_number(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)


def course_imports(notebook: dict) -> set[str]:
    """What the course's own cells of a notebook import ("module" or "module.name"): the setup cell hands students
    some of the grader's objects (lesson 16's ``should_step_optimizer`` from the reference), which a submission may
    then import too."""
    found = set()
    for cell in notebook.get("cells", []) if isinstance(notebook, dict) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code" or is_student_cell(cell):
            continue
        for node in ast.walk(_parse(_cell_text(cell)) or ast.Module(body=[], type_ignores=[])):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


class _Scan:
    def __init__(self, file: str, tree: ast.Module, notebook: bool, allowed: frozenset = frozenset()):
        self.file, self.tree, self.notebook, self.allowed = file, tree, notebook, allowed
        self.aliases = _module_aliases(tree)
        self.found: dict[tuple, dict] = {}

    def add(self, kind: str, node, detail: str) -> None:
        line = getattr(node, "lineno", 0)
        self.found.setdefault((kind, line, detail), flag(kind, self.file, line, detail, "static"))

    def run(self) -> list[dict]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name not in self.allowed:
                        self._import(node, alias.name)
            elif isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                if all(f"{module}.{alias.name}" in self.allowed for alias in node.names):
                    continue
                if not self._import(node, module):   # from course import checks: the names are modules
                    for alias in node.names:
                        self._import(node, f"{module}.{alias.name}", quiet=True)
            elif isinstance(node, ast.Attribute):
                self._attribute(node)
            elif isinstance(node, ast.Name):
                self._name(node)
            elif isinstance(node, ast.Call):
                self._call(node)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                for target in (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]):
                    self._target(node, target)
            elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                self._constant(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and self.notebook:
                if node.name in GRADE_CELL_NAMES:
                    self.add(NOTEBOOK_HOOK, node, f"defines {node.name}, which the grade cells call")
        return sorted(self.found.values(), key=lambda f: (f["line"], f["kind"], f["detail"]))

    def _import(self, node, module: str, quiet: bool = False) -> bool:
        """Flag an imported module; whether it was flagged."""
        kind = _import_kind(module.lstrip("."))
        if kind and not (quiet and kind != GRADER):
            self.add(kind, node, f"imports {module}")
        for alias in node.names if self.notebook and not quiet else ():
            if (alias.asname or alias.name.split(".")[0]) in GRADE_CELL_NAMES:
                self.add(NOTEBOOK_HOOK, node, f"rebinds {alias.asname or alias.name}, which the grade cells call")
        return bool(kind)

    def _attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node)
        if node.attr in INTERNAL_ATTRIBUTES:
            self.add(INTERNALS, node, f"uses {dotted or '....' + node.attr}")
        elif dotted in ("sys.modules", "sys.meta_path", "sys.path_hooks", "sys.audit") or dotted.endswith(
                (".sys.modules", ".sys.meta_path")) or node.attr == "sys" and self._module_of(node.value):
            self.add(INTERNALS, node, f"uses {dotted or '....' + node.attr}")
        elif node.attr == "LESSONS":
            self.add(GRADER, node, f"uses {dotted or '....' + node.attr}, the grader's lessons")
        elif node.attr in NOTEBOOK_ATTRIBUTES and (self.notebook or "get_ipython" in ast.dump(node.value)):
            self.add(NOTEBOOK_HOOK, node, f"uses the notebook shell's {node.attr}")

    def _name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            self.add(INTERNALS, node, f"uses {node.id}")
        elif self.notebook and node.id in GRADE_CELL_NAMES and isinstance(node.ctx, (ast.Store, ast.Del)):
            self.add(NOTEBOOK_HOOK, node, f"rebinds {node.id}, which the grade cells call")

    def _call(self, node: ast.Call) -> None:
        function = _dotted(node.func)
        name = function.rsplit(".", 1)[-1]
        base = self.aliases.get(function.rsplit(".", 1)[0], "") if "." in function else ""
        if function in DYNAMIC_CALLS:
            self.add(DYNAMIC, node, f"calls {function}()")
        elif function in ("setattr", "delattr") and node.args and self._module_of(node.args[0]):
            self.add(PATCH, node, f"calls {function}() on the module {self._module_of(node.args[0])}")
        elif function in ("object.__setattr__", "object.__delattr__", "type.__setattr__"):
            self.add(PATCH, node, f"calls {function}(), which writes past a frozen object's guard")
        elif function == "open" and node.args and _is_number(node.args[0]):
            self.add(DESCRIPTOR, node, f"opens descriptor {node.args[0].value}")
        elif base == "os" and name == "_exit":
            self.add(DESCRIPTOR, node, "calls os._exit(): the process ends before the grader's own end")
        elif base == "os" and (name in ALWAYS_DESCRIPTOR
                               or name in DESCRIPTOR_CALLS and node.args and _is_number(node.args[0])):
            number = node.args[0].value if node.args and _is_number(node.args[0]) else None
            self.add(DESCRIPTOR, node, f"calls os.{name}" + (f"({number}, ...)" if number is not None else "()"))
        elif base == "os" and name in PROCESS_CALLS or base == "signal" or function in ("signal", "setitimer"):
            self.add(PROCESS, node, f"calls {function}()")

    def _module_of(self, node) -> str:
        dotted = _dotted(node)
        return self.aliases.get(dotted, "") or next(
            (f"{self.aliases[head]}{dotted[len(head):]}" for head in self.aliases if dotted.startswith(head + ".")), "")

    def _target(self, statement, target) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(statement, element)
        elif isinstance(target, ast.Attribute) and self._module_of(target.value):
            self.add(PATCH, statement, f"writes {self._module_of(target.value)}.{target.attr}")
        elif isinstance(target, ast.Subscript):
            container = _dotted(target.value)
            call = _dotted(target.value.func) if isinstance(target.value, ast.Call) else ""
            if container in ("sys.modules", "builtins.__dict__") or container.endswith(".__dict__") or \
                    isinstance(target.value, ast.Attribute) and target.value.attr == "__dict__" or \
                    call == "vars" and target.value.args:
                self.add(PATCH, statement, f"writes an item of {container or call + '(...)' or '....__dict__'}")

    def _constant(self, node: ast.Constant) -> None:
        text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
        if any(path in text for path in SUSPECT_PATHS):
            self.add(DESCRIPTOR, node, f"names {text[:80]!r}")
        elif any(name in text for name in GRADER_MODULES) or "course/checks" in text or "course/reference" in text \
                or "_course_impl" in text or text == "LESSONS":
            self.add(GRADER, node, f"names {text[:80]!r}")


def scan_source(source: str, file: str, notebook: bool = False, allowed: frozenset = frozenset()) -> list[dict]:
    """The static flags of one source (a module, or one notebook cell as Python); ``allowed``: imports the
    course's notebook makes itself (``course_imports``). A source too deep to scan is flagged as that."""
    tree = _parse(source)
    try:
        return _Scan(file, tree, notebook, frozenset(allowed)).run() if tree is not None else []
    except (RecursionError, MemoryError) as error:
        return [flag(UNSCANNED, file, 0, f"could not be scanned ({type(error).__name__}): read it", "static")]


def static_flags(path: Path, course_ids: Optional[set] = None, allowed: frozenset = frozenset()) -> list[dict]:
    """The static flags of a submission: its folder (the file route) or its notebook."""
    notebook = Path(path).is_file()
    return [f for label, source in submission_sources(path, course_ids)
            for f in scan_source(source, label, notebook, allowed)]


def _static_flags_or_why(path: Path, course_ids: Optional[set], allowed: frozenset) -> list[dict]:
    """``static_flags``, or one flag saying why a submission could not be scanned: never an error of the class."""
    try:
        return static_flags(path, course_ids, allowed)
    except Exception as error:   # noqa: BLE001 - one submission's text never stops the class's flags
        return [flag(UNSCANNED, "-", 0, f"could not be scanned ({type(error).__name__}): read it", "static")]


# --- identical code -----------------------------------------------------------------------------------------

def _without_docstrings(node):
    """A copy of ``node`` whose function, class and module bodies have no docstring."""
    import copy
    node = copy.deepcopy(node)
    for part in ast.walk(node):
        body = getattr(part, "body", None)
        if isinstance(part, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            part.body = body[1:] or [ast.Pass()]
    return node


def _is_stub(node) -> bool:
    """A definition still as released: its body (docstrings aside) only raises NotImplementedError or passes."""
    if isinstance(node, ast.ClassDef):
        methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        return all(_is_stub(m) for m in methods)
    body = _without_docstrings(node).body
    return all(isinstance(s, ast.Pass) or isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
               or isinstance(s, ast.Raise) and "NotImplementedError" in ast.dump(s) for s in body)


def exercise_fingerprints(sources: Iterable[tuple[str, str]], exercises: Iterable[str]
                          ) -> dict[str, tuple[str, int, str, int]]:
    """exercise -> (digest of its code, AST nodes, label, line) of every exercise the sources define and wrote (not
    stubs); a later definition replaces an earlier one, as running them would."""
    wanted, found = set(exercises), {}
    for label, source in sources:
        tree = _parse(source)
        for node in tree.body if tree is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in wanted:
                try:   # code nested too deep to copy is compared with nothing (the static scan flags it)
                    if _is_stub(node):
                        found.pop(node.name, None)
                        continue
                    code = _without_docstrings(node)
                    text = ast.dump(code, include_attributes=False)
                except (RecursionError, MemoryError):
                    continue
                found[node.name] = (hashlib.sha256(text.encode()).hexdigest(), sum(1 for _ in ast.walk(code)),
                                    label, node.lineno)
    return found


def reference_fingerprints(lesson) -> dict[str, set[str]]:
    """exercise -> digests of the reference's code: its module's, and its notebook's solution cells' (which nest
    the helpers)."""
    from course.checks.assignments import solution_cell
    reference = (REFERENCE_DIR / lesson.module_file).read_text(encoding="utf-8")
    stub = lesson.files()["stub"].read_text(encoding="utf-8")
    names = [e.name for e in lesson.exercises]
    forms = [("reference", reference)]
    for name in names:
        try:
            forms.append((name, solution_cell(name, stub, reference)))
        except ValueError:   # an exercise the notebook does not build from the reference
            continue
    digests: dict[str, set[str]] = defaultdict(set)
    for form in forms:
        for name, (digest, *_) in exercise_fingerprints([form], names).items():
            digests[name].add(digest)
    return digests


def identical_flags(lesson, submissions: dict[str, Path], course_ids: Optional[set] = None) -> dict[str, list[dict]]:
    """student -> flags: each exercise (of at least ``MIN_IDENTICAL_NODES`` nodes) identical to the reference's,
    and a submission whose written exercises are all identical to another student's."""
    names = [e.name for e in lesson.exercises]
    reference = reference_fingerprints(lesson)
    flags: dict[str, list[dict]] = defaultdict(list)
    same: dict[tuple, list[str]] = defaultdict(list)
    where = {}
    for student, path in submissions.items():
        try:
            found = exercise_fingerprints(submission_sources(path, course_ids), names)
        except Exception:   # noqa: BLE001 - one submission's text never stops the class's flags
            continue
        for name, (digest, nodes, label, line) in found.items():
            if digest in reference.get(name, ()) and nodes >= MIN_IDENTICAL_NODES:
                flags[student].append(flag(SAME_AS_REFERENCE, label, line, f"{name} is the reference's, "
                                           "formatting, comments and docstrings aside", "compare"))
        if sum(nodes for _, nodes, *_ in found.values()) >= MIN_IDENTICAL_NODES:
            key = tuple(sorted((name, digest) for name, (digest, *_) in found.items()))
            same[key].append(student)
            where[student] = min((label, line) for _, _, label, line in found.values())
    for students in (group for group in same.values() if len(group) > 1):
        for student in students:
            others = [s for s in students if s != student]
            label, line = where[student]
            flags[student].append(flag(SAME_AS_STUDENT, label, line, f"every exercise written is identical to "
                                       f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''}", "compare"))
    return dict(flags)


def add_class_flags(lesson, submissions: list, results: list[dict], source_notebook: Optional[Path] = None
                    ) -> list[dict]:
    """Give each result (``results[i]`` of ``submissions[i]``, a graded one having a route) the static and identical
    flags of the class as it is now, beside the flags its run reported; the results whose flags changed."""
    course_ids = course_cell_ids(source_notebook) if source_notebook else None
    try:
        allowed = course_imports(json.loads(lesson.files()["notebook release"].read_text(encoding="utf-8")))
    except (OSError, ValueError):
        allowed = set()
    graded = {s.student: s.path for s in submissions if s.route}
    found = identical_flags(lesson, graded, course_ids)
    changed = []
    for submission, result in zip(submissions, results):
        fresh = _static_flags_or_why(submission.path, course_ids, allowed) + found.get(submission.student, []) \
            if submission.route else []
        kept = [f for f in result.get("flags") or [] if f.get("source") not in ("static", "compare")]
        if kept + fresh != result.get("flags"):
            result["flags"] = kept + fresh
            changed.append(result)
    return changed


# --- watching the run from inside: audit hooks and tripwires ------------------------------------------------

MAX_MESSAGES = 100          # events reported per run (deduplicated); each message < PIPE_BUF, all < a pipe's 64 KiB
MAX_READ = 1 << 20
AUDITED_SET = "course.classroom.module.__setattr__"   # what an audited module raises when an attribute is written
_STARTED, _EVENT, _FINISHED, _MORE = "S", "E", "F", "M"
_STDLIB = Path(os.__file__).parent
_MACHINERY = (str(_STDLIB / "importlib"), "<frozen importlib")
_OS_WRAPPERS = ("<frozen os>", str(_STDLIB / "os.py"), str(_STDLIB / "pathlib.py"), str(_STDLIB / "io.py"),
                str(_STDLIB / "_pyio.py"), str(_STDLIB / "codecs.py"), str(_STDLIB / "tokenize.py"),
                str(_STDLIB / "linecache.py"), str(_STDLIB / "inspect.py"), str(_STDLIB / "shutil.py"),
                str(_STDLIB / "glob.py"), str(_STDLIB / "subprocess.py"), str(_STDLIB / "socket.py"),
                str(_STDLIB / "ctypes"), str(_STDLIB / "unittest" / "mock.py"))
_DIRECT = ()                                    # the Python frame that made the call decides
_PATCHERS = (str(_STDLIB / "unittest" / "mock.py"),)
_FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "__code__", "gi_code", "cr_code"}
_FUNCTION_PARTS = {"__code__", "__defaults__", "__kwdefaults__", "__closure__"}
_PROCESS_EVENTS = {"os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__", "socket.connect",
                   "socket.bind", "socket.sendto", "socket.sendmsg"}
_OUTSIDE_EVENTS = {"os.chmod", "os.chown", "os.utime", "os.setxattr", "os.removexattr", "os.chflags"}


class _AuditedModule(types.ModuleType):
    """A module whose attribute writes raise an audit event (a plain module's do not): the hook then names the
    line that patched ``torch.equal`` or ``course.checks.framework._verdict``, whatever the spelling."""
    __slots__ = ()

    def __setattr__(self, name, value):
        sys.audit(AUDITED_SET, self.__name__, name)
        super().__setattr__(name, value)

    def __delattr__(self, name):
        sys.audit(AUDITED_SET, self.__name__, name)
        super().__delattr__(name)


def _clean(text) -> str:
    return str(text).replace("\t", " ").replace("\n", " ").replace("\r", " ")[:MAX_DETAIL]


def _student_files(scratch: Path) -> Callable[[str], Optional[str]]:
    """filename -> the submission's label of it (None: not the student's): files under ``scratch`` by their relative
    path, and a notebook's student cells, as IPython names the code it compiles (``<ipython-input-N-...>``)."""
    root = str(Path(scratch).resolve()) + os.sep
    cells = {}
    for notebook in sorted(Path(scratch).glob("*.ipynb")):
        try:
            loaded = json.loads(notebook.read_text(encoding="utf-8", errors="replace"))
            cells = {number: cell_label(number, cell) for number, cell in enumerate(loaded.get("cells", []), 1)
                     if isinstance(cell, dict) and is_student_cell(cell)}
        except (OSError, ValueError, AttributeError, RecursionError):
            cells = {}

    def student_of(filename: str) -> Optional[str]:
        if filename.startswith(root):
            return filename[len(root):]
        if filename.startswith("<ipython-input-"):
            number = filename[len("<ipython-input-"):].split("-", 1)[0]
            return cells.get(int(number)) if number.isdigit() else None
        return None

    return student_of


def _code_of(value):
    """The code object behind a function, method, partial or wrapper (None if there is none)."""
    for _ in range(8):
        if isinstance(value, types.FunctionType):
            return value.__code__
        value = getattr(value, "__wrapped__", None) or getattr(value, "__func__", None) or getattr(value, "func", None)
        if value is None:
            return None
    return None


def _origin(value) -> Optional[tuple[str, int]]:
    """(file, first line) of the code that defined a function or class, or None."""
    if isinstance(value, type):
        for member in vars(value).values():
            code = _code_of(member)
            if code is not None:
                return code.co_filename, code.co_firstlineno
        return None
    code = _code_of(value)
    return (code.co_filename, code.co_firstlineno) if code is not None else None


def _identity(fd: int) -> Optional[tuple[int, int]]:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _open_descriptors() -> dict[int, tuple[int, int]]:
    """descriptor -> (device, inode) of what this process holds open beyond 0-2 (the listing's own one aside)."""
    listed = [int(fd) for fd in os.listdir("/proc/self/fd") if fd.isdigit() and int(fd) > 2]
    return {fd: identity for fd in listed if (identity := _identity(fd)) is not None}


class AuditWatch:
    """One grader's watch. The keeper makes it before it forks the grader; the grader calls ``install`` before any
    of the submission's code runs and ``finish`` with its answer; the keeper then ``collect``s the flags."""

    def __init__(self):
        self._read, self.fd = os.pipe()   # the keeper reads; the grader writes (``fd``: keep it open for it)
        os.set_blocking(self.fd, False)   # a full pipe loses a message (then the closing one: a flag), never hangs
        self._nonce = secrets.token_hex(16)

    def install(self, scratch: Path) -> None:
        """In the grader, before the submission's code: the audit hook, audited modules, the tripwires' snapshot."""
        os.close(self._read)
        student_of = _student_files(scratch)
        inherited = {fd: identity for fd, identity in _open_descriptors().items() if fd != self.fd}
        send = _sender(self.fd)
        before: dict = {}
        library_writes: set = set()   # (module, attribute) a library wrote itself (torch._dynamo: torch.manual_seed)
        exercises = _exercises_of(scratch)
        tripwire = _tripwire(student_of, send, before, exercises, library_writes)
        global _checkpoint
        _checkpoint = tripwire
        _guard_reference(scratch, student_of, send)
        before.update(_snapshot())
        for module in list(sys.modules.values()):
            if type(module) is types.ModuleType:
                module.__class__ = _AuditedModule
        self._finish = _closing(self.fd, self._nonce, tripwire)
        sys.addaudithook(_hook(student_of, send, inherited, Path(scratch), library_writes))
        send(_STARTED)

    def finish(self, answer: bytes) -> None:
        """In the grader, its answer made: the last tripwire and the closing message (the answer's digest)."""
        self._finish(answer)
        self._finish = None

    def collect(self, answer: bytes) -> list[dict]:
        """In the keeper, once the grader exited: the flags it reported; silence if an answer came back without
        the closing message for it."""
        os.close(self.fd)
        os.set_blocking(self._read, False)
        data = bytearray()
        try:
            while len(data) < MAX_READ and (chunk := os.read(self._read, 1 << 16)):
                data += chunk
        except BlockingIOError:
            pass
        finally:
            os.close(self._read)
        return parse_messages(data.decode("utf-8", errors="replace"), self._nonce, answer)


def parse_messages(text: str, nonce: str, answer: bytes) -> list[dict]:
    """The flags of a watch's messages (the keeper's side of ``_sender``)."""
    flags, started, closed = [], False, False
    digest = hashlib.sha256(bytes(answer)).hexdigest()
    for line in text.splitlines():
        parts = line.split("\t")
        if parts[0] == _STARTED:
            started = True
        elif parts[0] == _EVENT and len(parts) == 6:
            _, kind, file, number, detail, source = parts
            flags.append(flag(kind, file, int(number) if number.isdigit() else 0, detail, source))
        elif parts[0] == _MORE:
            flags.append(flag(INTERNALS, "-", 0, f"more than {MAX_MESSAGES} events: the first are listed", "audit"))
        elif parts[0] == _FINISHED and parts[1:] == [nonce, digest]:
            closed = True
    if answer and not closed:
        why = "never opened" if not started else "closed without the grader's closing message for this answer"
        flags.append(flag(SILENCED, "-", 0, f"the answer came back but the audit channel {why}: the submission "
                          "silenced it, or wrote the answer itself", "audit"))
    return list({tuple(f.values()): f for f in flags}.values())


def _sender(fd: int) -> Callable:
    """send(kind, ...): one line on the pipe at once; each distinct event once, at most MAX_MESSAGES."""
    write, seen, count = os.write, set(), [0]

    def send(tag, kind="", file="", line=0, detail="", source="audit", key=None):
        """``key``: what makes the event the same as one sent before (default: all of it)."""
        if tag == _EVENT:
            key = (kind, file, line, key or detail)
            if key in seen:
                return
            seen.add(key)
            count[0] += 1
            if count[0] > MAX_MESSAGES:
                tag = _MORE if count[0] == MAX_MESSAGES + 1 else ""
        if tag:
            message = "\t".join([tag] + ([kind, _clean(file), str(int(line)), _clean(detail), source]
                                         if tag == _EVENT else []))
            try:
                write(fd, (message + "\n").encode("utf-8", errors="backslashreplace"))
            except OSError:   # closed or full: the closing message will be missing too
                pass

    return send


def _closing(fd: int, nonce: str, tripwire: Callable) -> Callable[[bytes], None]:
    write, sha256 = os.write, hashlib.sha256

    def finish(answer: bytes) -> None:
        try:
            tripwire("at the end", None, True)
        except Exception:   # noqa: BLE001 - a tripwire that breaks must not cost the answer
            pass
        try:
            write(fd, f"{_FINISHED}\t{nonce}\t{sha256(bytes(answer)).hexdigest()}\n".encode())
        except OSError:
            pass

    return finish


_checkpoint: Optional[Callable] = None


def checkpoint(where: str, namespace: Optional[dict] = None) -> None:
    """The tripwires, in the grader (nothing where no watch is installed): after the submission's module is
    imported and after each notebook cell (``namespace``: the notebook's)."""
    if _checkpoint is not None:
        _checkpoint(where, namespace)


def _in(filename: str, prefixes: tuple) -> bool:
    return filename.startswith(prefixes)


def _hook(student_of: Callable[[str], Optional[str]], send: Callable, inherited: dict, scratch: Path,
          library_writes: set) -> Callable:
    """The audit hook: each event the submission's code caused (the first frame past the wrappers of the call is
    the student's) sent at once; a module attribute that other code wrote goes into ``library_writes``. It raises
    nothing (an exception would abort the audited operation)."""
    getframe, busy, abspath, identity = sys._getframe, [False], os.path.abspath, _identity
    scratch_root = str(Path(scratch).resolve()) + os.sep
    course_dirs = tuple(str(d) + os.sep for d in GRADER_DIRS)

    def suspect_path(path) -> Optional[tuple[str, str]]:
        if isinstance(path, int):   # one the grader was started with (not a number reused since)
            inherited_one = path in inherited and identity(path) == inherited[path]
            return (DESCRIPTOR, f"opens the inherited descriptor {path}") if inherited_one else None
        try:
            name = abspath(os.fsdecode(path))
        except (TypeError, ValueError):
            return None
        if name.startswith(SUSPECT_PATHS):
            return DESCRIPTOR, f"opens {name}"
        if name.startswith(course_dirs):
            return GRADER, f"reads the grader's file {name}"
        return None

    def judge(event: str, args: tuple):
        """(kind, detail, wrappers to look past) of an event worth a flag, or None."""
        if event == "import":
            kind = _import_kind(str(args[0]))
            return (kind, f"imports {args[0]}", _MACHINERY) if kind else None
        if event in ("exec", "compile"):   # exec of a string raises both: one flag
            return DYNAMIC, "compiles or runs code it builds (compile, exec, eval)", _DIRECT
        if event.startswith("gc.get_"):
            return INTERNALS, f"calls {event}()", _DIRECT
        if event in ("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.addaudithook",
                     "code.__new__", "function.__new__", "marshal.loads", "marshal.load"):
            return INTERNALS, f"calls {event}()", (str(_STDLIB / "inspect.py"),)
        if event.startswith("ctypes."):
            return INTERNALS, f"uses ctypes ({event})", (str(_STDLIB / "ctypes"),)
        if event == "object.__getattr__":
            return (INTERNALS, f"reads .{args[1]} of a {type(args[0]).__name__}", _DIRECT) \
                if args[1] in _FRAME_ATTRIBUTES else None
        if event in ("object.__setattr__", "object.__delattr__"):
            target, name = args[0], args[1]
            if name in _FUNCTION_PARTS and isinstance(target, types.FunctionType):
                return PATCH, f"replaces {name} of {target.__module__}.{target.__qualname__}", _PATCHERS
            if isinstance(target, type) and _origin_label(target) is None:
                return PATCH, f"writes {target.__module__}.{target.__qualname__}.{name}", _PATCHERS
            return None
        if event == AUDITED_SET:   # raised in _AuditedModule, a frame of this file
            return PATCH, f"writes {args[0]}.{args[1]}", _PATCHERS + (__file__,)
        if event == "open":
            found = suspect_path(args[0])
            return (*found, _OS_WRAPPERS) if found else None
        if event in ("os.listdir", "os.scandir"):
            found = args and suspect_path(args[0] if args[0] is not None else ".")
            return (found[0], f"lists {found[1].split(' ', 1)[1]}", _OS_WRAPPERS) if found else None
        if event in _PROCESS_EVENTS:
            return PROCESS, f"{event}", _OS_WRAPPERS
        if event in _OUTSIDE_EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
            name = abspath(os.fsdecode(args[0]))
            return (PATCH, f"{event} on {name}, outside its scratch directory", _OS_WRAPPERS) \
                if not name.startswith(scratch_root) else None
        return None

    def _origin_label(cls) -> Optional[str]:
        origin = _origin(cls)
        return student_of(origin[0]) if origin else None

    watched = frozenset({"import", "exec", "compile", "sys._getframe", "sys._current_frames", "sys.settrace",
                         "sys.setprofile", "sys.addaudithook", "code.__new__", "function.__new__", "marshal.loads",
                         "marshal.load", "object.__getattr__", "object.__setattr__", "object.__delattr__",
                         AUDITED_SET, "open", "os.listdir", "os.scandir"} | _PROCESS_EVENTS | _OUTSIDE_EVENTS)
    prefixes = ("ctypes.", "gc.get_")

    def hook(event: str, args: tuple) -> None:
        if busy[0] or event not in watched and not event.startswith(prefixes):   # builtins.id: ~40,000 a run
            return
        busy[0] = True
        try:
            verdict = judge(event, args)
            if verdict is not None:
                kind, detail, wrappers = verdict
                frame = getframe(1)
                while frame is not None and wrappers and _in(frame.f_code.co_filename, wrappers):
                    frame = frame.f_back
                label = student_of(frame.f_code.co_filename) if frame is not None else None
                if label is not None:
                    send(_EVENT, kind, label, frame.f_lineno, detail)
                elif event == AUDITED_SET:
                    library_writes.add((args[0], args[1]))
        except BaseException:   # noqa: BLE001 - a hook that raises would abort the operation it audits
            pass
        finally:
            busy[0] = False

    return hook


def _guard_reference(scratch: Path, student_of: Callable[[str], Optional[str]], send: Callable) -> None:
    """Wrap the reference's exercises (its functions, the methods of its classes) in every loaded module of the
    reference: one entered while the submission's own version of an exercise of the same lesson runs is flagged,
    however the submission found it (``sys.modules`` under any name, a check's globals). A student's test is given
    the reference on purpose, and a lesson's checks may hand an earlier lesson's reference to its exercises."""
    from course.checks import LESSONS
    notebooks = {p.stem for p in Path(scratch).glob("*.ipynb")}
    graded = {lesson.module_file: frozenset(e.name for e in lesson.exercises) for lesson in LESSONS.values()
              if (Path(scratch) / lesson.module_file).is_file() or lesson.name in notebooks}

    def running_exercise(module_file: str) -> Optional[tuple[str, str, int]]:
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            head, label = code.co_qualname.split(".")[0], student_of(code.co_filename)
            if label and head in graded[module_file] and not head.startswith("test_") and (
                    label == module_file or not label.endswith(".py")):   # the file, or a notebook's cell
                return head, label, frame.f_lineno
            frame = frame.f_back
        return None

    def guard(function, label: str, module_file: str):
        def guarded(*args, **kwargs):
            caller = running_exercise(module_file)
            if caller is not None:
                send(_EVENT, NOT_OWN, caller[1], caller[2], f"{caller[0]} runs the reference's {label}", "audit",
                     key=label)
            return function(*args, **kwargs)
        guarded.__name__, guarded.__qualname__, guarded.__doc__ = function.__name__, function.__qualname__, \
            function.__doc__
        return guarded

    for module in list(sys.modules.values()):
        path = str(getattr(module, "__file__", None) or "")
        module_file = os.path.basename(path)
        if not path.startswith(str(REFERENCE_DIR) + os.sep) or module_file not in graded:
            continue
        for name in graded[module_file] & set(vars(module)):
            value = vars(module)[name]
            if isinstance(value, types.FunctionType):
                setattr(module, name, guard(value, name, module_file))
            elif isinstance(value, type) and value.__module__ == module.__name__:
                for key, member in list(vars(value).items()):
                    if isinstance(member, types.FunctionType):
                        setattr(value, key, guard(member, f"{name}.{key}", module_file))


def _snapshot() -> dict:
    """What the tripwires compare: every module's attributes (the submission's are not loaded yet), the modules
    by name, the signal handlers."""
    modules = {name: (module, dict(vars(module)), _critical(name, module)) for name, module in list(sys.modules.items())
               if isinstance(module, types.ModuleType)}
    handlers = {}
    for number in signal.valid_signals():
        try:
            handlers[number] = signal.getsignal(number)
        except (OSError, ValueError):
            continue
    return {"modules": modules, "critical": [name for name, (*_, critical) in modules.items() if critical],
            "signals": handlers, "objects": _grader_state(modules)}


def _frozen(value) -> bool:
    params = getattr(type(value), "__dataclass_params__", None)
    return params is not None and params.frozen and not isinstance(value, type)


def _grader_state(modules: dict) -> list[tuple[object, str, dict]]:
    """(object, label, its attributes or items) of every frozen dataclass the course's modules reach (a lesson, its
    checks, exercises, mistakes) and of each container of them: the grader never changes one, so a change is a
    forgery that writes an object's ``__dict__`` (no audit event sees that)."""
    state, seen = [], set()

    def visit(value, label: str, depth: int) -> None:
        if depth > 4 or id(value) in seen:
            return
        if _frozen(value):
            seen.add(id(value))
            attributes = dict(vars(value))
            state.append((value, f"{type(value).__name__} {getattr(value, 'name', label)!r}", attributes))
            for key, item in attributes.items():
                visit(item, f"{label}.{key}", depth + 1)
        elif isinstance(value, (list, tuple, dict)) and len(value) <= 10_000:
            items = dict(value) if isinstance(value, dict) else dict(enumerate(value))
            if any(_frozen(item) for item in items.values()):
                seen.add(id(value))
                if not isinstance(value, tuple):
                    state.append((value, label, items))
                for key, item in items.items():
                    visit(item, f"{label}[{key!r}]", depth + 1)

    for name, (module, attributes, critical) in modules.items():
        if critical and name.startswith("course"):
            for key, value in attributes.items():
                visit(value, f"{name}.{key}", 0)
    return state


def _changed_parts(value, parts: dict) -> list[str]:
    """The attributes (or items) of a snapshot object that are no longer the objects they were."""
    try:
        now = vars(value) if _frozen(value) else dict(value) if isinstance(value, dict) else dict(enumerate(value))
    except TypeError:
        return ["its contents"]
    return sorted({str(key) for key in parts.keys() | now.keys() if now.get(key, _GONE) is not parts.get(key, _GONE)})


def _tripwire(student_of: Callable[[str], Optional[str]], send: Callable, before: dict, exercises: frozenset,
              library_writes: set) -> Callable:
    def where_defined(value) -> tuple[str, int]:
        origin = _origin(value)
        label = student_of(origin[0]) if origin else None
        return (label, origin[1]) if label else ("-", 0)

    def report(kind, detail, value=None, where=""):
        """One tripwire flag, reported the first time only (``where``: when it was seen)."""
        file, line = where_defined(value) if value is not None else ("-", 0)
        send(_EVENT, kind, file, line, f"{detail} (seen {where})" if where else detail, "tripwire", key=detail)

    def tripwire(where: str, namespace: Optional[dict] = None, every_module: bool = False) -> None:
        """``every_module``: also the modules that are not critical (the last time: ~50 ms)."""
        modules = before.get("modules", {})
        for name in modules if every_module else before.get("critical", ()):
            module, attributes, critical = modules[name]
            if name != "__main__" and sys.modules.get(name, module) is not module:   # IPython sets __main__
                report(PATCH, f"sys.modules[{name!r}] was replaced", sys.modules.get(name), where)
            now = vars(module)
            for key, value in attributes.items():
                new = now.get(key, _GONE)
                if new is not value and (critical and (name, key) not in library_writes
                                         or where_defined(new)[0] != "-"):
                    report(PATCH, f"{name}.{key} was replaced", None if new is _GONE else new, where)
        changed = [(label, part, (vars(value) if _frozen(value) else {}).get(part))
                   for value, label, parts in before.get("objects", ()) for part in _changed_parts(value, parts)]
        if changed:   # one flag: a forgery rewrites every check at once
            label, part, new = changed[0]
            more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
            report(PATCH, f"the grader's objects were changed: {label}.{part}{more}", new if callable(new) else None,
                   where)
        for number, handler in before.get("signals", {}).items():
            current = signal.getsignal(number)
            if current is not handler and callable(current) and where_defined(current)[0] != "-":
                report(PROCESS, f"installs a handler for {signal.Signals(number).name}", current)
        shell = _notebook_shell()
        loaded = [m for name, m in list(sys.modules.items()) if name not in modules]   # the submission's among them
        spaces = [(m, student_of(str(getattr(m, "__file__", None) or ""))) for m in loaded]
        spaces = [(vars(m), label) for m, label in spaces if label is not None]
        if namespace is None and shell is not None:
            namespace = shell.user_ns
        if namespace is not None and all(space is not namespace for space, _ in spaces):
            label = student_of(str(namespace.get("__file__") or "")) or (   # a module may have its __file__ replaced
                "notebook" if "get_ipython" in namespace else "the submission's module")
            spaces.append((namespace, label))
        for space, label in spaces:
            _grader_objects(space, label, exercises, send)
        if shell is not None:
            _notebook_tripwire(shell, namespace, report, where_defined)

    return tripwire


def _notebook_shell():
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    return getattr(getattr(shell_module, "InteractiveShell", None), "_instance", None)


def _grader_objects(namespace: dict, file: str, exercises: frozenset, send: Callable) -> None:
    """Exercises of the submission's namespace that are the grader's own functions or classes, one flag per grader
    file: ``from course.reference.train_loop import *``, whatever the spelling. (Other names may hold the grader's
    objects: lesson 16's setup cell hands out the reference's ``should_step_optimizer``.)"""
    grader_dirs = tuple(str(d) + os.sep for d in GRADER_DIRS)
    found: dict[str, list[str]] = defaultdict(list)
    for name in sorted(exercises & set(namespace)):
        origin = _origin(namespace[name])
        if origin and origin[0].startswith(grader_dirs):
            found[str(Path(origin[0]).relative_to(REPO_ROOT))].append(name)
    for origin, names in found.items():
        send(_EVENT, NOT_OWN, file, 0, f"{', '.join(names[:6])}{' ...' if len(names) > 6 else ''} "
             f"{'is' if len(names) == 1 else 'are'} the grader's own code, from {origin}", "tripwire")


def _exercises_of(scratch: Path) -> frozenset:
    """The exercise names of the lessons whose module or notebook the scratch directory holds."""
    from course.checks import LESSONS
    return frozenset(e.name for lesson in LESSONS.values() for e in lesson.exercises
                     if (Path(scratch) / lesson.module_file).is_file()
                     or (Path(scratch) / f"{lesson.name}.ipynb").is_file())


_GONE = object()
CRITICAL_MODULES = {"builtins", "math", "json", "os", "posixpath", "hashlib", "operator", "copy", "functools", "torch",
                    "torch.nn.functional", "torch.testing", "numpy", "numpy.testing"}


def _critical(name: str, module) -> bool:
    """A module the grading relies on, whose every attribute must stay as it was (elsewhere, libraries rebind
    their own globals: a change counts there when the new value is the submission's code): the course package's
    and ``CRITICAL_MODULES``."""
    return name in CRITICAL_MODULES or str(getattr(module, "__file__", None) or "").startswith(
        str(REPO_ROOT / "course") + os.sep)


def _notebook_tripwire(shell, namespace: dict, report: Callable, where_defined: Callable) -> None:
    """The grade cells' names and the notebook shell's hooks: none may be the student's."""
    for name in GRADE_CELL_NAMES:
        value = namespace.get(name)
        if value is not None and where_defined(value)[0] != "-":
            report(NOTEBOOK_HOOK, f"{name}, which the grade cells call, is the submission's", value)
    found = [value for callbacks in getattr(getattr(shell, "events", None), "callbacks", {}).values()
             for value in callbacks]
    manager = getattr(shell, "input_transformer_manager", None)
    for holder, names in ((shell, ("ast_transformers", "input_transformers_post")),
                          (manager, ("cleanup_transforms", "line_transforms", "token_transformers"))):
        for name in names:
            found += list(getattr(holder, name, None) or ())
    found += [value for value in vars(shell).values() if callable(value)]
    custom = getattr(getattr(shell, "CustomTB", None), "__func__", None)   # set_custom_exc's wrapper of a handler
    for cell in getattr(custom, "__closure__", None) or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:   # an empty cell
            continue
    found += [shell.displayhook, shell.display_pub] if hasattr(shell, "display_pub") else []
    for value in found:   # a function or method of the student's, or an object of a class of the student's
        target = value if isinstance(value, (types.FunctionType, types.MethodType)) else type(value)
        if where_defined(target)[0] != "-":
            report(NOTEBOOK_HOOK, "the notebook shell runs the submission's code as a hook", target)
