"""Submissions run under ``course.classroom.watch.AuditWatch`` the way a grader runs them, for
tests/test_grade_class_flags.py.

``python tests/watched.py CASES.json`` reads ``{case: {"route": "files" | "notebook", "files": {name: text},
"grade": bool, "hidden": {cell index: source}}}`` and prints ``{case: {"flags": [...], "answer": ..., "shown":
[per notebook cell, each output's type and MIME types, or its error's name]}}``. One process (torch and the lesson imported
once) forks a keeper-like parent and a grader-like child per case, as ``course.classroom.confinement`` does, without
the sandbox: the child installs the watch in its scratch directory, loads the module (``grade``: and runs the
lesson's core checks, as ``inside.grade_files``) or executes the notebook, and answers through a pipe.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course.checks import get_lesson  # noqa: E402
from course.classroom import watch  # noqa: E402
from course.classroom.inside import execute_notebook, grade_files  # noqa: E402

LESSON = get_lesson("14")


def _work(case: dict, scratch: Path) -> dict:
    if case["route"] == "notebook":
        [notebook] = scratch.glob("*.ipynb")
        hidden = case.get("hidden", {})   # cell index -> the hidden tests' source, as a keeper hands them over
        return execute_notebook(json.loads(notebook.read_text(encoding="utf-8")), lambda index: hidden[str(index)])
    if case.get("grade"):
        return grade_files(LESSON, scratch)
    module = LESSON.load("student", str(scratch))
    watch.checkpoint("after its import", vars(module))
    return {"checks": {}}


def run_case(case: dict) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="watched-"))
    for name, text in case["files"].items():
        (scratch / name).write_text(text, encoding="utf-8")
    audit_watch = watch.AuditWatch()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:   # the grader
        os.close(read_end)
        code = 1
        try:
            os.chdir(scratch)
            audit_watch.install(scratch)
            answer = json.dumps(_work(case, scratch)).encode()
            audit_watch.finish(answer)
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(answer)
            code = 0
        except BaseException:   # noqa: B036 - the child must reach os._exit; the traceback goes to stderr
            sys.excepthook(*sys.exc_info())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    shutil.rmtree(scratch, ignore_errors=True)
    shown = [[o.get("ename") or " ".join([o["output_type"], *sorted(o.get("data", {}))]) for o in cell or ()]
             for cell in json.loads(answer).get("cells", [])] if answer and case["route"] == "notebook" else []
    return {"flags": audit_watch.collect(answer), "answer": answer.decode(errors="replace")[:2000], "shown": shown}


def main() -> None:
    import torch
    torch.set_num_threads(1)   # a process with no thread pool forks safely
    cases = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    execute_notebook({"cells": []})   # as the pool's warm-up: every grader's shell is then not the process's first
    LESSON.load("reference")          # and its graded reference: loaded, under its own module name
    print(json.dumps({name: run_case(case) for name, case in cases.items()}))


if __name__ == "__main__":
    main()
