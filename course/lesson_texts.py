"""The three texts of a lesson and their sections: the lesson (the why, each exercise as a question), its answers
(``python -m course answer NN SECTION``: read after an attempt) and its notes (engineering detail). A section is
found by the number its heading starts with (``## 5.4 should_flush_tail``, ``### 5.4 ...``, ``## 3. ...``), and an
exercise is still untouched while its stub's every body only raises ``NotImplementedError``."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Optional

HEADING = re.compile(r"^(#{1,6}) (\d+(?:\.\d+)*)\.?(?: |$)")


def _lines_outside_code(text: str) -> list[tuple[int, str]]:
    """(index, line) of every line outside fenced code blocks: a ``# comment`` in a bash block is no heading."""
    kept, inside = [], False
    for index, line in enumerate(text.splitlines()):
        if line.strip().startswith("```"):
            inside = not inside
        elif not inside:
            kept.append((index, line))
    return kept


def section_numbers(path: Path) -> list[str]:
    """The numbers of ``path``'s numbered headings, in order (``"5.4"``, ``"3"``, ...)."""
    return [m.group(2) for _, line in _lines_outside_code(path.read_text(encoding="utf-8"))
            if (m := HEADING.match(line))]


def section_text(path: Path, number: str) -> Optional[str]:
    """The section of ``path`` whose heading is numbered ``number``: its heading and everything up to the next
    heading of the same or a higher level; None when no heading has that number."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    headings = [(index, len(m.group(1)), m.group(2)) for index, line in _lines_outside_code(text)
                if (m := HEADING.match(line))]
    for position, (start, level, found) in enumerate(headings):
        if found == number:
            end = next((index for index, other, _ in headings[position + 1:] if other <= level), len(lines))
            body = lines[start:end]
            while body and (not body[-1].strip() or body[-1].startswith("<a id=")):
                body.pop()   # trailing blank lines and the next section's anchor
            return "\n".join(body) + "\n"
    return None


def untouched(module_path: Path, name: str) -> bool:
    """Whether the function or class ``name`` of ``module_path`` is still its stub: each body (the function's, or
    every method's) is at most a docstring and a ``raise NotImplementedError``. False for a file that does not
    parse or lacks ``name`` (something was written there)."""
    try:
        tree = ast.parse(module_path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    node = next((n for n in tree.body if getattr(n, "name", None) == name), None)
    if node is None:
        return False
    functions = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))] \
        if isinstance(node, ast.ClassDef) else [node]
    return bool(functions) and all(_only_raises_todo(f) for f in functions)


def _only_raises_todo(function: ast.AST) -> bool:
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"
