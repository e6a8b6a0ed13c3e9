"""Documented commands, run once per test session (tests share the runs). What a doc shows a command print is
compared with its real output by course/doc_outputs.py (the tolerances and what is skipped are stated there).
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import warm_python

from course.doc_outputs import mismatches

ROOT = Path(__file__).resolve().parents[1]
HINTS_FILE = Path(tempfile.mkdtemp(prefix="doc-runs-")) / "hints.json"
atexit.register(shutil.rmtree, HINTS_FILE.parent, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def run_documented(command: str) -> subprocess.CompletedProcess:
    """``command`` run from the repo root (once per session: tests share the run): a plain python command by
    tests/warm_python.py, anything else with ``bash -c``."""
    env = dict(os.environ, MPLBACKEND="Agg", MINIMIND_COURSE_HINTS=str(HINTS_FILE),  # not the student's hints
               TMPDIR=str(HINTS_FILE.parent))   # what torchrun and the labs leave there goes at exit
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


def compare_shown(source: str, command: str, shown: list[str], output: str) -> None:
    """Each compared shown line appears in ``output`` (in order), its numbers within their tolerances."""
    problems = mismatches(shown, output)
    assert not problems, f"{source}: `{command}`:\n" + "\n".join(problems) + f"\n  ACTUAL output:\n{output[-3000:]}"
