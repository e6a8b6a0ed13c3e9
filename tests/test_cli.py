"""``python -m course check``: the table, exit codes, --json and grading a submission directory."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from stub_copies import untouched_impl

from course.checks import get_lesson
from course.implementations import STUDENT_DIR

ROOT = Path(__file__).resolve().parents[1]


def course_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_untouched_stubs_report_todo_and_exit_1(tmp_path):
    """Graded on an untouched copy of impl/, so it holds however far the student has got."""
    proc = course_cli("check", "14", "--impl-dir", str(untouched_impl(tmp_path / "impl")))
    assert proc.returncode == 1, f"ACTUAL exit {proc.returncode}, EXPECTED 1\n{proc.stdout}{proc.stderr}"
    exercises = get_lesson("14").exercises
    for exercise in exercises:
        line = next((ln for ln in proc.stdout.splitlines() if ln.strip().startswith(exercise.name + " ")), "")
        assert "TODO" in line and exercise.section in line, f"row for {exercise.name}: {line!r}\n{proc.stdout}"
    count = len(exercises)
    assert f"total: 0/{count} passed, 0 failed, {count} TODO" in proc.stdout, proc.stdout


def test_reference_passes_and_json_is_machine_readable():
    proc = course_cli("check", "14", "--impl", "reference", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    count = len(get_lesson("14").exercises)
    assert (report["passed"], report["total"]) == (count, count), report
    assert {e["status"] for e in report["exercises"]} == {"PASS"}


def test_impl_dir_grades_a_submission_with_a_mistake(tmp_path):
    """A submission directory laid out like impl/ whose train_loop.py has the (step+1) % K bug."""
    mistake = next(m for m in get_lesson("14").mistakes if m.name == "off_by_one_step")
    submission = tmp_path / "alice"
    shutil.copytree(STUDENT_DIR, submission)
    (submission / "train_loop.py").write_text(mistake.source(), encoding="utf-8")
    proc = course_cli("check", "14", "--impl-dir", str(submission), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    statuses = {e["exercise"]: e["status"] for e in json.loads(proc.stdout)["exercises"]}
    assert statuses["should_step_optimizer"] == "FAIL" and statuses["cosine_lr"] == "PASS", statuses
    table = course_cli("check", "14", "--impl-dir", str(submission)).stdout
    assert "ACTUAL:   [3, 7]" in table and "EXPECTED: [4, 8]" in table, table


def test_bad_arguments_are_clear_errors(tmp_path):
    proc = course_cli("check", "14", "--impl-dir", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "--impl-dir" in proc.stderr, proc.stderr
    proc = course_cli("check", "99")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr, proc.stderr


def test_align_prints_the_report_and_exits_by_alignment(tmp_path):
    """``python -m course align 14``: the reference prints the report and passes; untouched stubs (an untouched
    copy of impl/ standing in for the student's, so the test holds however far the student has got) say TODO."""
    proc = course_cli("align", "14", "--impl", "reference")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "alignment=passed", proc.stdout
    assert "optimizer_step_micro_steps=[4, 8]" in proc.stdout, proc.stdout
    untouched = untouched_impl(tmp_path / "impl")
    proc = subprocess.run([sys.executable, "-c", "import pathlib, sys; import course.implementations as i; "
                           "i.STUDENT_DIR = pathlib.Path(sys.argv[1]); from course.cli import main; "
                           "sys.exit(main(['align', '14']))", str(untouched)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "alignment=TODO" in proc.stderr, proc.stdout + proc.stderr
    proc = course_cli("align", "15")
    assert proc.returncode == 2 and "no alignment report" in proc.stderr, proc.stderr
