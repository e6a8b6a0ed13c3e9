"""Grading in forked workers (course/checks/parallel.py) gives what grading in-process gives, in the same
order; a worker that dies is a FAIL naming it; a process where forking is unsafe grades in-process.

The forking runs in a child Python started with OMP_NUM_THREADS=1, as ``python -m course`` starts: this
pytest process has torch's thread pool running, and forking a multi-threaded process is what the runner
refuses to do."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import textwrap

from course.checks.framework import PASS, Check
from course.checks.parallel import can_fork, run_checks
from course.implementations import REPO_ROOT

CHILD = textwrap.dedent("""
    import json, os
    from course.checks import get_lesson
    from course.checks.framework import Check, CheckFailure
    from course.checks.parallel import can_fork, run_checks
    from course.checks.results import grade_exercises

    def reports_its_process(module):
        raise CheckFailure(str(os.getpid()))

    def dies(module):
        os._exit(3)

    checks = [Check(f"pid{i}", "x", reports_its_process) for i in range(3)] + [Check("dies", "x", dies)]
    lesson = get_lesson("14")
    mistake = next(m for m in lesson.mistakes if m.name == "clip_before_unscale")
    graded = {jobs: [(r.check, r.status, r.message) for e in grade_exercises(lesson, mistake.build(),
                                                                             only=["train_one_epoch"], jobs=jobs)
                     for r in e.checks] for jobs in (1, 2)}
    print(json.dumps({"parent": os.getpid(), "can_fork": can_fork(),
                      "synthetic": [(r.check, r.status, r.message) for r in run_checks(checks, None, jobs=2)],
                      "in_process": graded[1], "forked": graded[2]}))
""")


def test_forked_workers_grade_like_one_process_and_report_a_dead_worker():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["can_fork"], "a fresh single-threaded process on one torch thread must be allowed to fork"
    names = [name for name, _, _ in report["synthetic"]]
    assert names == ["pid0", "pid1", "pid2", "dies"], f"results out of order: {names}"
    pids = {message for name, _, message in report["synthetic"] if name.startswith("pid")}
    assert str(report["parent"]) not in pids, f"the checks ran in the parent {report['parent']}, EXPECTED workers"
    name, status, message = report["synthetic"][-1]
    assert status == "FAIL" and "died" in message and "--jobs 1" in message, (status, message)
    assert report["forked"] == report["in_process"], (
        "forked grading must report what in-process grading reports, check by check:\n"
        f"ACTUAL   {report['forked']}\nEXPECTED {report['in_process']}")
    assert any(status == "FAIL" for _, status, _ in report["in_process"]), "the mistake must fail a check"


def test_a_process_with_other_threads_grades_in_process():
    release = threading.Event()
    helper = threading.Thread(target=release.wait)
    helper.start()
    try:
        assert not can_fork(), "forking while another thread runs can deadlock the child"
        results = run_checks([Check(f"runs_here{i}", "x", lambda module: module.append(os.getpid()))
                              for i in range(2)], ran := [], jobs=4)
    finally:
        release.set()
        helper.join()
    assert [r.status for r in results] == [PASS, PASS] and ran == [os.getpid()] * 2, (results, ran)


def test_python_m_course_starts_torch_on_the_course_thread_count():
    """``python -m course`` sets OMP_NUM_THREADS before torch starts (so it starts no thread pool and grading
    can fork) to the course's own default."""
    from course.runs.threads import TINY_MODEL_THREADS
    source = (REPO_ROOT / "course" / "__main__.py").read_text()
    assert f'os.environ.setdefault("OMP_NUM_THREADS", "{TINY_MODEL_THREADS}")' in source
    assert source.index("OMP_NUM_THREADS") < source.index("from .cli import"), "set it before torch is imported"
