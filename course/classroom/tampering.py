"""Tampering flags: what a submission did to reach into the grader or the process, listed beside its score for the
instructor to review (README, "Instructor notes"). A flag never changes a score: nbgrader's gradebook gets the
points as usual.

Each flag is a dict {"kind", "file", "line", "detail", "source"}; ``file`` is the submission's file (the file
route) or ``cell N (grade_id)`` of its notebook, ``line`` a line of it (0: none). Four sources, each a module:

* here, ``static_flags`` (source "static"): the submission's code as the trusted parent reads it — the module and
  every other ``.py`` it holds, or the notebook's solution cells and the cells the student added — for imports of
  the grader, process internals (``gc``, ``ctypes``, frames, ``sys.modules``, builtins), raw descriptors and
  ``/proc``, dynamic code (``exec``, ``eval``, ``compile``, ``importlib``, ``__import__``), writes to other
  modules' or objects' attributes, IPython hooks and names the grade cells use;
* ``course.classroom.compare`` (source "compare"): an exercise identical to the reference's, a submission identical
  to another student's; it also gives each result of a class its static and compare flags;
* ``course.classroom.watch`` (source "audit"): the run watched from inside by an audit hook (PEP 578), which the
  student's code cannot take back, and the grader's closing message, whose absence is a flag;
* ``course.classroom.tripwires`` (source "tripwire"): the grader's modules and objects, the exercises' origins,
  the signal handlers and the notebook shell's hooks compared with what they were.

A static scan is evaded by obfuscation; the audit hook sees the events whatever the spelling. What neither sees:
code that uses only operations Python does not audit (a signal handler's frame, ``os.write`` to a descriptor
found by trying numbers) and spells them past the scan; README names this limit.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Optional

from course.implementations import REPO_ROOT

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


def cell_number(filename: str) -> Optional[int]:
    """The execution count of the notebook cell whose code IPython compiled under ``filename``
    (``<ipython-input-N-...>``; the graders run cell N as count N), or None for any other file."""
    if not filename.startswith("<ipython-input-"):
        return None
    number = filename[len("<ipython-input-"):].split("-", 1)[0]
    return int(number) if number.isdigit() else None


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

def parse_source(source: str) -> Optional[ast.Module]:
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


def import_kind(module: str) -> Optional[str]:
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
        for node in ast.walk(parse_source(_cell_text(cell)) or ast.Module(body=[], type_ignores=[])):
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
        kind = import_kind(module.lstrip("."))
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
    tree = parse_source(source)
    try:
        return _Scan(file, tree, notebook, frozenset(allowed)).run() if tree is not None else []
    except (RecursionError, MemoryError) as error:
        return [flag(UNSCANNED, file, 0, f"could not be scanned ({type(error).__name__}): read it", "static")]


def static_flags(path: Path, course_ids: Optional[set] = None, allowed: frozenset = frozenset()) -> list[dict]:
    """The static flags of a submission: its folder (the file route) or its notebook."""
    notebook = Path(path).is_file()
    return [f for label, source in submission_sources(path, course_ids)
            for f in scan_source(source, label, notebook, allowed)]


