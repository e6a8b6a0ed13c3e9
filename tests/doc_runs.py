"""Documented commands, run once per test session, and the outputs the docs show for them.

A doc shows a command's output in a ```text block right after the line ``<!-- output of: COMMAND -->``
(invisible once rendered). The block may be abridged: its lines must appear in the real output in the same
order. Words and integers (updates, steps, sample counts) must match exactly; a number after a label of
TOLERANCES may differ by at most that much: losses move in the second decimal on another CPU or thread count
(kernels split their reductions differently), and timings are not compared at all. Lines with a sample, a
timing or a rate (SKIPPED) are not compared: a near-tie between two bytes may flip a greedy choice on another
CPU (the default run's sample is checked by its properties instead, tests/test_stage_assembly.py).
"""
from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import warm_python

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- output of: (.+) -->$")
# label before a number -> absolute tolerance ("loss:" also ends logits_loss: and aux_loss:); the one place
# these are stated
TOLERANCES = {"val_loss": 0.05, "loss:": 0.05, "left_in_epoch:": math.inf}
SKIPPED = ("sample:", "drawn:", "it/s", "tok/s", "tokens/s")
HINTS_FILE = Path(tempfile.mkdtemp(prefix="doc-runs-")) / "hints.json"
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")


@functools.lru_cache(maxsize=None)
def run_documented(command: str) -> subprocess.CompletedProcess:
    """``command`` run from the repo root (once per session: tests share the run): a plain python command by
    tests/warm_python.py, anything else with ``bash -c``."""
    env = dict(os.environ, MPLBACKEND="Agg", MINIMIND_COURSE_HINTS=str(HINTS_FILE))  # not the student's hints
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    python = warm_python.python_args(command)
    if python is not None:   # started by path, as from an unactivated virtual environment (IDEs, cron, CI)
        additions, args = python
        return warm_python.run(args, cwd=ROOT, env={**env, "PATH": path_without_nbgrader_helpers(), **additions},
                               timeout=3600)
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)


def path_without_nbgrader_helpers() -> str:
    """PATH minus every directory holding ``alembic``: what an unactivated virtual environment sees (nbgrader
    shells out to helpers there: ``python -m course release`` must work without them on PATH)."""
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not shutil.which("alembic", path=d))
    assert not shutil.which("alembic", path=path), "the test PATH should hide nbgrader's helper programs"
    return path


def shown_outputs(path: Path) -> list[tuple[str, list[str]]]:
    """(command, the lines of its shown output) for each marked ```text block of ``path``."""
    shown, lines = [], path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        match = MARKER.match(line.strip())
        if match:
            assert lines[i + 1].strip() == "```text", f"{path.name}:{i + 2}: a ```text block must follow {line}"
            end = lines.index("```", i + 2)
            shown.append((match.group(1), lines[i + 2:end]))
    return shown


def _shape(line: str) -> tuple[str, list[tuple[str, float]]]:
    """The line with its tolerated numbers masked, and those (label, value) pairs."""
    tolerated = []

    def mask(match):
        label = next((name for name in TOLERANCES if line[:match.start()].rstrip().endswith(name)), None)
        if label is None:
            return match.group()
        tolerated.append((label, float(match.group().replace(",", ""))))
        return "#"
    return NUMBER.sub(mask, line.replace(f"{ROOT}/", "").strip()), tolerated


def compare_shown(source: str, command: str, shown: list[str], output: str) -> None:
    """Each compared shown line appears in ``output`` (in order), its numbers within TOLERANCES."""
    actual = [_shape(line) for line in output.splitlines() if line.strip()]
    at = 0
    for line in shown:
        if not line.strip() or any(word in line for word in SKIPPED):
            continue
        key, expected = _shape(line)
        found = next((i for i in range(at, len(actual)) if actual[i][0] == key), None)
        assert found is not None, (f"{source}: `{command}` shows a line its output lacks (searched from output line {at})\n"
                                   f"  EXPECTED: {line}\n  ACTUAL output:\n{output[-3000:]}")
        for (label, want), (_, got) in zip(expected, actual[found][1]):
            assert abs(got - want) <= TOLERANCES[label], (
                f"{source}: `{command}`: {label} in {line!r}\n  ACTUAL:   {got}\n  EXPECTED: {want} "
                f"(tolerance {TOLERANCES[label]})")
        at = found + 1
