"""Tripwires (source "tripwire" of ``course.classroom.tampering``'s flags): what no audit event shows, compared
with what it was before the student's code ran, after the import (or each notebook cell) and at the end: the
grader's modules and its own frozen objects (a lesson, its checks), the exercises' origins, the signal handlers
and the notebook shell's hooks.
"""
from __future__ import annotations

import os
import signal
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Callable, Optional

from course.implementations import REPO_ROOT

from .tampering import GRADE_CELL_NAMES, GRADER_DIRS, NOT_OWN, NOTEBOOK_HOOK, PATCH, PROCESS

def code_of(value):
    """The code object behind a function, method, partial or wrapper (None if there is none)."""
    for _ in range(8):
        if isinstance(value, types.FunctionType):
            return value.__code__
        value = getattr(value, "__wrapped__", None) or getattr(value, "__func__", None) or getattr(value, "func", None)
        if value is None:
            return None
    return None


def defined_at(value) -> Optional[tuple[str, int]]:
    """(file, first line) of the code that defined a function or class, or None."""
    if isinstance(value, type):
        for member in vars(value).values():
            code = code_of(member)
            if code is not None:
                return code.co_filename, code.co_firstlineno
        return None
    code = code_of(value)
    return (code.co_filename, code.co_firstlineno) if code is not None else None


def snapshot() -> dict:
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


def make_tripwire(student_of: Callable[[str], Optional[str]], send: Callable, before: dict, exercises: frozenset,
              library_writes: set) -> Callable:
    def where_defined(value) -> tuple[str, int]:
        origin = defined_at(value)
        label = student_of(origin[0]) if origin else None
        return (label, origin[1]) if label else ("-", 0)

    def report(kind, detail, value=None, where=""):
        """One tripwire flag, reported the first time only (``where``: when it was seen)."""
        file, line = where_defined(value) if value is not None else ("-", 0)
        send(kind, file, line, f"{detail} (seen {where})" if where else detail, "tripwire", key=detail)

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
        origin = defined_at(namespace[name])
        if origin and origin[0].startswith(grader_dirs):
            found[str(Path(origin[0]).relative_to(REPO_ROOT))].append(name)
    for origin, names in found.items():
        send(NOT_OWN, file, 0, f"{', '.join(names[:6])}{' ...' if len(names) > 6 else ''} "
             f"{'is' if len(names) == 1 else 'are'} the grader's own code, from {origin}", "tripwire")


def exercises_of(scratch: Path) -> frozenset:
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
