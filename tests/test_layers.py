"""The import layers of the project (README, "Project layout"): every import runs downward, there is no
import cycle, and only the grader, the CLI (with its new-lesson scaffold, which writes the lesson paths the grader
spells), notebooks' grade cells and the tests import ``course.checks``.

Imports are read from the source (``ast``), so the test sees every import statement of every module,
inside functions too, without running anything.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from course.implementations import REPO_ROOT

# Longest matching prefix wins; a module may import its own layer or any layer below.
LAYERS = {
    "course": 0,
    "course.minimind": 0,
    "course.implementations": 1,
    "course.layout": 1,
    "course.lesson_texts": 1,
    "course.doc_outputs": 1,
    "course.runs": 1,
    "course.protocol": 1,
    "course.reference": 2,
    "course.checks": 2,
    "course.experiments": 2,
    "course.trainers": 3,
    "course.cli": 3,
    "course.classroom": 3,
    "course.scaffold": 3,
    "course.__main__": 3,
    "labs": 3,
    "impl": 3,
    "notebooks": 3,
}
# Who may import the grader: the grader itself, the CLI with its class grader, and notebooks (their grade cells'
# helper).
GRADER_USERS = ("course.checks", "course.cli", "course.classroom", "course.__main__", "notebooks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    roots = [REPO_ROOT / "course", REPO_ROOT / "labs", REPO_ROOT / "impl", REPO_ROOT / "notebooks" / "lessons"]
    return {module_name(p): p for root in roots for p in sorted(root.rglob("*.py"))}


def imports_of(name: str, path: Path) -> set[str]:
    """Absolute names of the ``course`` / ``impl`` modules a file imports (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m.split(".")[0] in ("course", "impl")}


MODULES = source_modules()
GRAPH = {name: {m for m in imports_of(name, path) if m in MODULES and m != name} for name, path in MODULES.items()}


def layer_of(name: str) -> int:
    prefixes = [p for p in LAYERS if name == p or name.startswith(p + ".")]
    assert prefixes, f"{name} is in no layer: add it to LAYERS (and to the README's Project layout)"
    return LAYERS[max(prefixes, key=len)]


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_run_downward(name):
    upward = sorted(m for m in GRAPH[name] if layer_of(m) > layer_of(name))
    assert not upward, (f"{name} (layer {layer_of(name)}) imports a layer above it: "
                        f"{[(m, layer_of(m)) for m in upward]}")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_the_grader_cli_and_notebooks_import_the_grader(name):
    if name.startswith(GRADER_USERS):
        return
    grader = sorted(m for m in imports_of(name, MODULES[name]) if m == "course.checks" or m.startswith("course.checks."))
    assert not grader, f"{name} imports the grader {grader}: use course.runs / course.implementations instead"


def test_no_import_cycles():
    state: dict[str, int] = {}   # 1 = on the current path, 2 = done

    def visit(name, path):
        state[name] = 1
        for nxt in sorted(GRAPH[name]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path):
    """The rules above can fail: an oracle module importing the grader, and a two-module cycle."""
    oracle = tmp_path / "course" / "minimind" / "bad.py"
    oracle.parent.mkdir(parents=True)
    oracle.write_text("from course.checks import LESSONS\nfrom . import other\n", encoding="utf-8")
    found = imports_of("course.minimind.bad", oracle)
    assert "course.checks" in found and "course.minimind.other" in found, found
    assert layer_of("course.checks") > layer_of("course.minimind.bad")
