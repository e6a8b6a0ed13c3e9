"""The `python -m course check NN` tables that the lessons show are what the CLI prints today.

A lesson text's (or its answers' or notes') ```text block that starts with ``Lesson NN - student`` (untouched stubs) or
``Lesson NN - reference`` must equal the command's output line for line.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import warm_python
from stub_copies import untouched_impl

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "course" / "lessons"
TABLE_START = re.compile(r"^Lesson (\d+) - (student|reference)$")


def shown_tables() -> list[tuple[str, str, str, str]]:
    """(lesson file, lesson id, impl, block text) for every check table a lesson shows."""
    found = []
    for path in sorted(LESSONS.rglob("*.md")):   # every lesson's three texts, English and Chinese
        for block in re.findall(r"```text\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            match = TABLE_START.match(block.splitlines()[0])
            if match:
                found.append((path.relative_to(ROOT).as_posix(), match.group(1), match.group(2), block))
    return found


def test_lessons_show_check_tables():
    assert shown_tables(), "no lesson shows a `python -m course check` table any more"


@pytest.mark.parametrize("source,lesson_id,impl,block", shown_tables(), ids=lambda v: str(v)[:40])
def test_shown_table_is_the_cli_output(source, lesson_id, impl, block, tmp_path):
    # The student table is the untouched stubs' (the lesson says so), whatever impl/ holds now; the
    # copy's TODO messages are generic, so the rows and totals are compared, not the message lines.
    where = ["--impl-dir", str(untouched_impl(tmp_path / "impl"))] if impl == "student" else ["--impl", "reference"]
    proc = warm_python.run(["-m", "course", "check", lesson_id, *where], cwd=ROOT, env=dict(os.environ), timeout=600)
    printed = proc.stdout.replace(f"Lesson {lesson_id} - {where[1]}", f"Lesson {lesson_id} - {impl}")
    if impl == "student":
        printed, block = (
            "\n".join(line for line in text.splitlines() if not line.startswith("      ")) for text in (printed, block))
    assert printed.rstrip("\n") == block.rstrip("\n"), (
        f"{source}: the table shown for `python -m course check {lesson_id}` ({impl}) is stale\n"
        f"  ACTUAL (CLI):\n{printed}\n  EXPECTED (lesson):\n{block}")
