"""Automatic mutation analysis: small wrong variants of a lesson's reference, made by rules nobody tuned to
the checks, graded by the lesson's own checks. A mutant that no check fails either shows a gap in the
checks or is equivalent to the reference (listed, with a one-line reason, in the lesson's
``equivalent_mutants.py``).

    python -m course mutants 14                    # every mutant of course/reference/train_loop.py
    python -m course mutants 14 --function cosine_lr

The rules (each applied to one place at a time, inside the reference's functions and methods; docstrings
and error-message text are left alone):

* compare: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``is`` <-> ``is not``, ``in`` <-> ``not in``
* arithmetic: ``+`` <-> ``-``, ``*`` <-> ``/``, ``//`` -> ``/``, ``%`` -> ``//``, ``**`` -> ``*``
* boolean: ``and`` <-> ``or``, ``not x`` -> ``x``, ``if c`` -> ``if not c`` (a condition that is no comparison)
* constant: an int n -> n + 1 and n - 1, a float x -> x + 1.0, ``True`` <-> ``False``
* statement: removed (``pass`` in its place); two neighbouring simple statements swapped
* call: its first two positional arguments swapped
* except: ``except Exception`` -> ``except ValueError``; a tuple of exceptions -> its first one

Each mutant is in a tier. A mutant inside a guard clause (an ``if`` whose body only raises: an argument rule),
a call of a ``_validate*`` helper or such a helper itself is a HARDENING mutant, killed by any check; every
other one changes the code of the lesson's objectives and is a CORE mutant: only a core check's failure kills
it (a core mutant that only a hardening check fails counts as survived until it gets a core check or a listed
reason).
"""
from __future__ import annotations

import ast
import copy
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from course.implementations import module_from_source

from .framework import CORE, HARDENING, PASS, Lesson, run_check

COMPARE_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
ARITHMETIC_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
                    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
SYMBOLS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
           ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
           ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.And: "and", ast.Or: "or"}
SIMPLE_STATEMENTS = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)
CHECK_SECONDS = 120   # a mutant that loops for ever fails the check it hangs in


@dataclass(frozen=True)
class Mutant:
    """The reference with one rule applied at one place. ``key`` names it stably (function, rule and the
    rule's occurrence in that function), so an equivalence listing survives edits elsewhere in the file."""
    function: str
    line: int
    rule: str
    occurrence: int
    original_line: str
    source: str = field(repr=False)
    tier: str = CORE    # HARDENING inside an argument rule (module docstring)

    @property
    def key(self) -> str:
        return f"{self.function}#{self.occurrence}: {self.rule}"


@dataclass
class MutantResult:
    mutant: Mutant
    killed_by: Optional[str]     # the first check that failed it (core checks run first); None: none did
    seconds: float
    killed_in: str = CORE        # the tier of the check that killed it

    @property
    def killed(self) -> bool:
        """A core mutant needs a core check to fail it; a hardening mutant any check."""
        return self.killed_by is not None and (self.mutant.tier == HARDENING or self.killed_in == CORE)


# --- finding the places and making the mutants -----------------------------------------------------

def _message_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes whose mutation only changes text: docstrings, f-strings, and what a ``raise`` builds."""
    skipped = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skipped |= {id(n) for n in ast.walk(body[0])}
        if isinstance(node, ast.JoinedStr) or isinstance(node, ast.Raise) and node.exc is not None:
            target = node if isinstance(node, ast.JoinedStr) else node.exc
            skipped |= {id(n) for n in ast.walk(target)}
    return skipped


def _rules(node: ast.AST) -> Iterator[tuple[str, Callable[[ast.AST], None]]]:
    """(rule, apply) for every mutation of ``node`` itself; ``apply`` edits a copy of the node in place."""
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            if type(op) in COMPARE_SWAPS:
                new = COMPARE_SWAPS[type(op)]
                yield (f"compare {SYMBOLS[type(op)]} -> {SYMBOLS[new]}",
                       lambda n, i=index, new=new: n.ops.__setitem__(i, new()))
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in ARITHMETIC_SWAPS:
        new = ARITHMETIC_SWAPS[type(node.op)]
        yield f"arithmetic {SYMBOLS[type(node.op)]} -> {SYMBOLS[new]}", lambda n, new=new: setattr(n, "op", new())
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield f"boolean {SYMBOLS[type(node.op)]} -> {SYMBOLS[new]}", lambda n, new=new: setattr(n, "op", new())
    elif isinstance(node, ast.Constant) and not isinstance(node.value, str) and node.value is not None \
            and node.value is not Ellipsis:
        value = node.value
        if isinstance(value, bool):
            yield f"constant {value} -> {not value}", lambda n: setattr(n, "value", not n.value)
        elif isinstance(value, int):
            yield f"constant {value} -> {value + 1}", lambda n: setattr(n, "value", n.value + 1)
            yield f"constant {value} -> {value - 1}", lambda n: setattr(n, "value", n.value - 1)
        elif isinstance(value, float):
            yield f"constant {value!r} -> {value + 1.0!r}", lambda n: setattr(n, "value", n.value + 1.0)
    elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
        yield "call: first two arguments swapped", lambda n: n.args.__setitem__(slice(0, 2), n.args[1::-1][:2])
    elif isinstance(node, ast.ExceptHandler) and node.type is not None:
        if isinstance(node.type, ast.Name) and node.type.id in ("Exception", "BaseException"):
            yield f"except {node.type.id} -> ValueError", lambda n: setattr(n, "type", ast.Name("ValueError"))
        elif isinstance(node.type, ast.Tuple) and len(node.type.elts) > 1:
            yield "except: only the first exception of the tuple", lambda n: setattr(n, "type", n.type.elts[0])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "boolean: not x -> x", None   # applied by the parent (the node is replaced)
    if isinstance(node, (ast.If, ast.While)) and not isinstance(node.test, (ast.Compare, ast.UnaryOp)):
        yield "condition negated", lambda n: setattr(n, "test", ast.UnaryOp(ast.Not(), n.test))


def _statement_rules(body: list) -> Iterator[tuple[int, str, Callable[[list], None]]]:
    """(index, rule, apply) for removing one statement of ``body`` or swapping two simple neighbours."""
    for index, statement in enumerate(body):
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef, ast.Pass)):
            continue
        kind = type(statement).__name__
        yield index, f"statement removed ({kind})", lambda b, i=index: b.__setitem__(i, ast.Pass())
        if index + 1 < len(body) and isinstance(statement, SIMPLE_STATEMENTS) and \
                isinstance(body[index + 1], SIMPLE_STATEMENTS):
            yield index, "statements swapped with the next one", \
                lambda b, i=index: b.__setitem__(slice(i, i + 2), [b[i + 1], b[i]])


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _argument_rules(function: ast.AST, qualified: str) -> set[int]:
    """ids of the nodes in ``function``'s argument rules: its guard clauses (an ``if`` whose body only raises,
    with no ``else``) and its calls of ``_validate*`` helpers, or all of it when it is such a helper."""
    if qualified.split(".")[-1].startswith("_validate"):
        return {id(n) for n in ast.walk(function)}
    guards = [n for n in ast.walk(function) if isinstance(n, ast.If) and not n.orelse
              and all(isinstance(statement, ast.Raise) for statement in n.body)]
    guards += [n for n in ast.walk(function) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
               and isinstance(n.value.func, ast.Name) and n.value.func.id.startswith("_validate")]
    return {id(n) for guard in guards for n in ast.walk(guard)}


def _sites(tree: ast.Module, only: Optional[str]) -> Iterator[tuple[str, int, str, Callable[[ast.Module], None], str]]:
    """(function, line, rule, apply-to-a-copy-of-the-module, tier) for every mutation site, in file order."""
    skipped = _message_nodes(tree)
    for qualified, function in _functions(tree):
        if only is not None and qualified != only and not qualified.startswith(only + "."):
            continue
        rules = _argument_rules(function, qualified)

        def tier(node):
            return HARDENING if id(node) in rules else CORE
        nodes = [n for n in ast.walk(function) if n is not function]
        for position, node in enumerate(nodes):
            if id(node) in skipped:
                continue
            for rule, apply in _rules(node):
                if apply is None:   # "not x -> x": replace the UnaryOp in its parent
                    yield qualified, node.lineno, rule, _replacer(qualified, position, lambda n: n.operand), tier(node)
                else:
                    yield qualified, getattr(node, "lineno", function.lineno), rule, \
                        _editor(qualified, position, apply), tier(node)
        for holder in [function, *nodes]:
            for attribute in ("body", "orelse", "finalbody"):
                body = getattr(holder, attribute, None)
                if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                    for index, rule, apply in _statement_rules(body):
                        if index == 0 and holder is function and id(body[0]) in skipped:
                            continue   # the docstring
                        yield qualified, body[index].lineno, rule, \
                            _body_editor(qualified, ([function, *nodes].index(holder)), attribute, apply), \
                            tier(body[index])


def _function_node(module: ast.Module, qualified: str) -> ast.AST:
    return dict(_functions(module))[qualified]


def _editor(qualified: str, position: int, apply):
    def edit(module):
        function = _function_node(module, qualified)
        apply([n for n in ast.walk(function) if n is not function][position])
    return edit


def _replacer(qualified: str, position: int, replacement):
    def edit(module):
        function = _function_node(module, qualified)
        target = [n for n in ast.walk(function) if n is not function][position]
        for parent in ast.walk(function):
            for name, value in ast.iter_fields(parent):
                if value is target:
                    setattr(parent, name, replacement(target))
                elif isinstance(value, list) and any(v is target for v in value):
                    value[[v is target for v in value].index(True)] = replacement(target)
    return edit


def _body_editor(qualified: str, holder_position: int, attribute: str, apply):
    def edit(module):
        function = _function_node(module, qualified)
        holders = [function, *[n for n in ast.walk(function) if n is not function]]
        apply(getattr(holders[holder_position], attribute))
    return edit


def _top_level_index(tree: ast.Module, qualified: str) -> int:
    top = qualified.split(".")[0]
    return next(i for i, node in enumerate(tree.body) if getattr(node, "name", None) == top)


def mutants(source: str, function: Optional[str] = None) -> list[Mutant]:
    """Every mutant of ``source`` (only of ``function`` and its methods when given) that still compiles. Only
    the edited top-level definition is rewritten (unparsed); the rest of the file stays as it is."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    found, occurrences = [], {}
    for qualified, line, rule, edit, tier in _sites(tree, function):
        index = _top_level_index(tree, qualified)
        original = tree.body[index]
        module = ast.Module(body=list(tree.body), type_ignores=[])
        module.body[index] = copy.deepcopy(original)
        edit(module)
        ast.fix_missing_locations(module.body[index])
        first = min([original.lineno] + [d.lineno for d in getattr(original, "decorator_list", [])])
        try:
            text = "".join(lines[:first - 1]) + ast.unparse(module.body[index]) + "\n" + "".join(lines[original.end_lineno:])
            compile(text, "<mutant>", "exec")
        except (SyntaxError, ValueError, TypeError):
            continue
        occurrence = occurrences[(qualified, rule)] = occurrences.get((qualified, rule), 0) + 1
        found.append(Mutant(qualified, line, rule, occurrence, lines[line - 1].strip(), text, tier))
    return found


# --- grading them ----------------------------------------------------------------------------------

class CheckTimedOut(Exception):
    """A check ran longer than CHECK_SECONDS on a mutant (a loop that no longer ends)."""


@contextmanager
def time_limit(seconds: float):
    def expire(signum, frame):
        raise CheckTimedOut(f"no result after {seconds:.0f} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def exercises_reaching(lesson: Lesson, source: str, function: str) -> list[str]:
    """The exercises whose checks can run ``function`` ("name" or "Class.method") of the reference ``source``:
    those that are, or name, it or a definition naming it (transitively), and those whose checks use one of
    them. Every exercise when code outside the definitions names one (it may run at import)."""
    def names(node) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    definitions, elsewhere = {}, set()   # definition -> the names its code uses; names used outside definitions
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            definitions[node.name] = names(node)
        else:
            elsewhere |= names(node)
    reached, added = set(), {function.split(".")[0]}
    while added:
        reached |= added
        added = {name for name, used in definitions.items() if name not in reached and used & reached}
    exercises = {e.name for e in lesson.exercises}
    if elsewhere & reached:
        return sorted(exercises)
    reaching = reached & exercises
    return sorted(reaching | {c.exercise for c in lesson.checks if set(c.uses) & reaching})


def grade_mutant(lesson: Lesson, mutant: Mutant, exercises: list[str]) -> MutantResult:
    """Run the core checks before the others (then the checks of ``exercises`` first) until one fails the
    mutant; an extension's checks count as core here (an extension is its own objective)."""
    start = time.perf_counter()
    module = module_from_source(mutant.source, f"mutant_{lesson.lesson_id}",
                                f"<mutant of {lesson.module_file}: {mutant.key}>")

    def tier(check):
        return HARDENING if check.tier == HARDENING and not lesson.exercise(check.exercise).optional else CORE
    ordered = sorted(lesson.checks, key=lambda c: (tier(c) == HARDENING, c.exercise not in exercises))
    for check in ordered:
        with time_limit(CHECK_SECONDS):
            try:
                result = run_check(check, module)
            except CheckTimedOut:
                return MutantResult(mutant, check.name, time.perf_counter() - start, tier(check))
        if result.status != PASS:
            return MutantResult(mutant, check.name, time.perf_counter() - start, tier(check))
    return MutantResult(mutant, None, time.perf_counter() - start)


def analyse(lesson: Lesson, function: Optional[str] = None, progress=None) -> list[MutantResult]:
    """Grade every mutant of the lesson's reference; ``progress(result)`` after each one."""
    source = lesson.files()["reference"].read_text(encoding="utf-8")
    known = [name for name, _ in _functions(ast.parse(source))]
    if function is not None and not any(k == function or k.startswith(function + ".") for k in known):
        raise ValueError(f"--function must be a function or class of {lesson.module_file}: {known}, got {function!r}")
    results = []
    for mutant in mutants(source, function):
        result = grade_mutant(lesson, mutant, exercises_reaching(lesson, source, mutant.function))
        results.append(result)
        if progress is not None:
            progress(result)
    return results


def status_of(result: MutantResult, equivalents: dict[str, str]) -> str:
    if result.killed:
        return "killed"
    return "equivalent" if result.mutant.key in equivalents else "survived"


def score_line(lesson_id: str, results: list[MutantResult], equivalents: dict[str, str]) -> str:
    """One line per tier: mutants, killed, equivalent (listed), survived, and the score."""
    lines = []
    for tier in (CORE, HARDENING):
        statuses = [status_of(r, equivalents) for r in results if r.mutant.tier == tier]
        killed, equivalent = statuses.count("killed"), statuses.count("equivalent")
        survived = len(statuses) - killed - equivalent
        graded = len(statuses) - equivalent
        score = 100.0 * killed / graded if graded else 100.0
        lines.append(f"lesson {lesson_id} {tier}: {len(statuses)} mutants, {killed} killed, {equivalent} "
                     f"equivalent, {survived} survived: score {score:.1f} % of the non-equivalent")
    return "\n".join(lines)

