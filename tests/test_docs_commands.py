"""Every command in the README and the lessons' texts (lesson, answers, notes) runs, with the exit code the text promises.

Convention for authors: each non-empty line of a ```bash block is one command, run from the repo
root with ``bash -c``. A line may end with ``# expect exit N`` (e.g. a check on untouched stubs
exits 1); otherwise it must exit 0. The install and test commands are what CI itself runs, so
here they are checked to appear verbatim in .ci/run instead of being run recursively.
Each Chinese text must carry exactly the commands of its English twin.
A command's output shown in a doc (``<!-- output of: COMMAND -->`` before a ```text block) is compared with
the real one, numbers within the tolerances of course/doc_outputs.py.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_runs import compare_shown, run_documented

from course.doc_outputs import shown_outputs

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "course" / "lessons"
RUN_BY_CI = {"pip install -r requirements.txt": "python3 -m pip install",
             "python -m pytest -n auto": "python3 -m pytest -n auto"}
EXPECT = re.compile(r"\s+#\s*expect exit (\d+)\s*$")


def doc_files() -> list[Path]:
    """The README and every lesson's three texts (lesson, answers, notes), English then Chinese."""
    return [ROOT / "README.md"] + english_texts() + [chinese_twin(path) for path in english_texts()]


def english_texts() -> list[Path]:
    return sorted(LESSONS.glob("*.md")) + sorted(LESSONS.glob("answers/*.md")) + sorted(LESSONS.glob("notes/*.md"))


def chinese_twin(english: Path) -> Path:
    return LESSONS / "zh" / english.relative_to(LESSONS)


def commands_in(path: Path) -> list[str]:
    commands, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            inside = line.strip() == "```bash" if not inside else False
            continue
        if inside and line.strip() and not line.strip().startswith("#"):
            commands.append(line.strip())
    return commands


def all_commands() -> list[tuple[str, str]]:
    seen, out = set(), []
    for path in doc_files():
        for command in commands_in(path):
            if command not in seen:
                seen.add(command)
                out.append((path.relative_to(ROOT).as_posix(), command))
    return out


def test_docs_have_commands():
    assert (ROOT / "README.md").is_file(), "README.md is missing"
    assert len(all_commands()) >= 4, f"expected the README quickstart commands, found {all_commands()}"


@pytest.mark.parametrize("english", english_texts(), ids=lambda p: p.relative_to(LESSONS).as_posix())
def test_chinese_twin_has_the_same_commands(english):
    twin = chinese_twin(english)
    assert twin.is_file(), f"{english.name} has no Chinese twin at {twin.relative_to(ROOT)}"
    assert commands_in(twin) == commands_in(english), (
        f"commands differ\n  ACTUAL (zh): {commands_in(twin)}\n  EXPECTED (en): {commands_in(english)}")


@pytest.mark.parametrize("source,command", all_commands(), ids=lambda v: v if len(v) < 70 else v[:67] + "...")
def test_command_runs(source, command):
    match = EXPECT.search(command)
    expected_rc = int(match.group(1)) if match else 0
    command = EXPECT.sub("", command)
    if command in RUN_BY_CI:
        ci = (ROOT / ".ci" / "run").read_text()
        assert RUN_BY_CI[command] in ci, f"{source}: {command!r} should be what .ci/run runs; .ci/run:\n{ci}"
        return
    proc = run_documented(command)
    output = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == expected_rc, (
        f"{source}: `{command}`\n  ACTUAL exit:   {proc.returncode}\n  EXPECTED exit: {expected_rc}\n{output}")
    assert "Warning" not in proc.stderr, f"{source}: `{command}` printed a warning:\n{proc.stderr[-2000:]}"
    for path in doc_files():
        for shown_command, shown in shown_outputs(path):
            if shown_command == command:
                compare_shown(path.relative_to(ROOT).as_posix(), command, shown, proc.stdout + proc.stderr)


def test_shown_outputs_belong_to_commands_that_run():
    commands = {command for _, command in all_commands()}
    orphans = [(path.name, command) for path in doc_files() for command, _ in shown_outputs(path)
               if command not in commands]
    assert not orphans, f"shown outputs of commands no ```bash block runs: {orphans}"
