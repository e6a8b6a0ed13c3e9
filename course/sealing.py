"""Sealed functions: a function whose objects are constants of its own code, so that what it calls is reached
only through its ``__code__`` (a read Python's audit hooks see: ``object.__getattr__``), never through a closure
or globals (reads no audit event shows). The test-writing checks hand a student's test implementations this way,
and the grade-class watch wraps the reference's exercises this way.
"""
from __future__ import annotations

import builtins
import types
from typing import Callable


def sealed(template: Callable, name: str, **constants) -> Callable:
    """A copy of ``template`` named ``name`` in which each string constant that is a key of ``constants`` is that
    object (the template assigns it to a local); no closure, builtins-only globals. For example, with
    ``def template(x): double = "double"; return double(x)``, ``sealed(template, "twice", double=f)(3)`` is ``f(3)``.
    """
    code = template.__code__
    if code.co_freevars:
        raise ValueError(f"template {template.__qualname__} has a closure: its objects must be constants")
    missing = set(constants) - set(code.co_consts)
    if missing:
        raise ValueError(f"template {template.__qualname__} has no constant {sorted(missing)}")
    consts = tuple(constants[c] if isinstance(c, str) and c in constants else c for c in code.co_consts)
    names = {"co_name": name, **({"co_qualname": name} if hasattr(code, "co_qualname") else {})}   # 3.11+
    function = types.FunctionType(code.replace(co_consts=consts, **names),
                                  {"__builtins__": builtins}, name)
    function.__doc__ = template.__doc__
    return function
