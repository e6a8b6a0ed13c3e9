"""``python -m course check``: the table, exit codes, --json and grading a submission directory.

The commands run in this process through ``course.cli.main`` (what ``python -m course`` calls), which
saves a Python and torch start per command; tests/test_docs_commands.py runs ``python -m course`` itself.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

from stub_copies import untouched_impl

import course.implementations
from course.checks import get_lesson
from course.checks.framework import expect_equal
from course.cli import main
from course.implementations import REFERENCE_DIR, REPO_ROOT, STUDENT_DIR


def course_cli(*args) -> subprocess.CompletedProcess:
    """``python -m course ARGS``: exit code, stdout and stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        try:
            returncode = main(list(args))
        except SystemExit as exit_:   # argparse's usage errors
            returncode = exit_.code
    return subprocess.CompletedProcess(["python", "-m", "course", *args], returncode, stdout.getvalue(),
                                       stderr.getvalue())


def test_untouched_stubs_report_todo_and_exit_1(tmp_path):
    """Graded on an untouched copy of impl/, so it holds however far the student has got."""
    proc = course_cli("check", "14", "--impl-dir", str(untouched_impl(tmp_path / "impl")))
    assert proc.returncode == 1, f"ACTUAL exit {proc.returncode}, EXPECTED 1\n{proc.stdout}{proc.stderr}"
    exercises = get_lesson("14").core_exercises
    for exercise in exercises:
        line = next((ln for ln in proc.stdout.splitlines() if ln.strip().startswith(exercise.name + " ")), "")
        assert "TODO" in line and exercise.section in line, f"row for {exercise.name}: {line!r}\n{proc.stdout}"
    count = len(exercises)
    assert f"total: 0/{count} passed, 0 failed, {count} TODO" in proc.stdout, proc.stdout


def test_reference_passes_and_json_is_machine_readable():
    proc = course_cli("check", "14", "--impl", "reference", "--json", "--all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    count = len(get_lesson("14").core_exercises)
    assert (report["passed"], report["total"]) == (count, count), report
    assert {e["status"] for e in report["exercises"]} == {"PASS"}
    assert report["optional"] == {"graded": True, "passed": len(EXTENSIONS), "total": len(EXTENSIONS)}


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
    lines = table.splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["should_step_optimizer", "FAIL"])
    block = [ln.strip() for ln in lines[row + 1:] if ln.startswith("      ")][:9]
    assert block[0].startswith(f"FAIL {mistake.caught_by}: "), (
        f"the FAIL row should name the failing check\n  ACTUAL:   {block[0]!r}\n"
        f"  EXPECTED: 'FAIL {mistake.caught_by}: ...'")
    assert "stuck? python -m course hint 14 should_step_optimizer (the next of 4 hints)" in block, block
    passed = lines[next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["cosine_lr", "PASS"]) + 1].strip()
    expect_equal("the line under a passed exercise", passed,
                 f"compare with the reference reasoning: python -m course answer 14 5.1 --impl-dir {submission}")


def test_only_grades_the_named_exercises_and_runs_only_their_checks():
    lesson = get_lesson("14")
    proc = course_cli("check", "14", "--impl", "reference", "--json", "--only", "cosine_lr")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    ran = {e["exercise"]: [c["check"] for c in e["checks"]] for e in report["exercises"]}
    expected = {"cosine_lr": [c.name for c in lesson.checks if c.exercise == "cosine_lr" and c.tier == "core"]}
    assert ran == expected, f"ACTUAL checks run: {ran}\nEXPECTED: {expected}"
    assert (report["passed"], report["total"]) == (1, 1), report

    # Repeated and comma-separated; an optional exercise named here is graded but never in the exit code.
    proc = course_cli("check", "14", "--impl", "reference", "--json", "--only", "cosine_lr,should_flush_tail",
                      "--only", "warmup_cosine_lr")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    statuses = {e["exercise"]: e["status"] for e in report["exercises"]}
    expected = {"cosine_lr": "PASS", "should_flush_tail": "PASS", "warmup_cosine_lr": "PASS"}
    assert statuses == expected, f"ACTUAL {statuses}\nEXPECTED {expected}"
    assert (report["passed"], report["total"], report["optional"]) == (
        2, 2, {"graded": True, "passed": 1, "total": 1}), report


def test_only_with_an_unknown_exercise_exits_2_listing_the_valid_names():
    proc = course_cli("check", "14", "--only", "cosine")
    names = [e.name for e in get_lesson("14").exercises]
    assert proc.returncode == 2, f"ACTUAL exit {proc.returncode}, EXPECTED 2\n{proc.stdout}{proc.stderr}"
    assert "--only" in proc.stderr and all(name in proc.stderr for name in names), (
        f"ACTUAL stderr: {proc.stderr!r}\nEXPECTED: '--only' and every exercise of lesson 14 {names}")


def test_bad_arguments_are_clear_errors(tmp_path):
    proc = course_cli("check", "14", "--impl-dir", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "--impl-dir" in proc.stderr, proc.stderr
    proc = course_cli("check", "99")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr, proc.stderr


def test_align_prints_the_report_and_exits_by_alignment(tmp_path, monkeypatch):
    """``python -m course align 14``: the reference prints the report and passes; untouched stubs (an untouched
    copy of impl/ standing in for the student's, so the test holds however far the student has got) say TODO."""
    proc = course_cli("align", "14", "--impl", "reference")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "alignment=passed", proc.stdout
    assert "optimizer_step_micro_steps=[4, 8]" in proc.stdout, proc.stdout
    monkeypatch.setattr(course.implementations, "STUDENT_DIR", untouched_impl(tmp_path / "impl"))
    proc = course_cli("align", "14")
    assert proc.returncode == 1 and "alignment=TODO" in proc.stderr, proc.stdout + proc.stderr
    proc = course_cli("align", "15")
    assert proc.returncode == 2 and "no alignment report" in proc.stderr, proc.stderr


# --- optional extensions (lesson 14 §10): graded only with --all, never in the exit code -----------------

EXTENSIONS = ("accumulation_divisor", "lr_per_update", "update_cadence_due", "adamw_param_groups", "warmup_cosine_lr")


def test_extensions_are_marked_optional_and_graded_only_with_all(tmp_path):
    """A submission with every core exercise right and a failing extension (upstream's tail divided by K) whose
    accumulation_divisor also leaves a mark when it is called: without --all the extension is reported SKIP
    and never called, exit 0; with --all it FAILs and the exit code is still 0."""
    mistake = next(m for m in get_lesson("14").mistakes if m.name == "tail_still_divided_by_k")
    marker = tmp_path / "accumulation_divisor_called"
    called = f"    open({str(marker)!r}, 'a').close()\n    tail = iters % accumulation_steps"
    submission = tmp_path / "bob"
    shutil.copytree(STUDENT_DIR, submission)
    (submission / "train_loop.py").write_text(
        mistake.source().replace("    tail = iters % accumulation_steps", called, 1), encoding="utf-8")

    proc = course_cli("check", "14", "--impl-dir", str(submission), "--json")
    assert proc.returncode == 0, f"ACTUAL exit {proc.returncode}, EXPECTED 0\n{proc.stdout}{proc.stderr}"
    report = json.loads(proc.stdout)
    kinds = {e["exercise"]: e["optional"] for e in report["exercises"]}
    assert all(kinds[name] for name in EXTENSIONS) and not kinds["train_one_epoch"], kinds
    skipped = {e["exercise"]: (e["status"], e["checks"]) for e in report["exercises"] if e["optional"]}
    assert skipped == {name: ("SKIP", []) for name in EXTENSIONS}, skipped
    assert report["optional"] == {"graded": False, "passed": 0, "total": len(EXTENSIONS)}, report["optional"]
    assert not marker.exists(), "without --all an extension's checks must not run"

    proc = course_cli("check", "14", "--impl-dir", str(submission), "--json", "--all")
    assert proc.returncode == 0, f"a failing extension must not change the exit code: ACTUAL {proc.returncode}"
    report = json.loads(proc.stdout)
    statuses = {e["exercise"]: e["status"] for e in report["exercises"]}
    assert statuses["accumulation_divisor"] == "FAIL" and statuses["warmup_cosine_lr"] == "PASS", statuses
    assert (report["passed"], report["total"]) == (len(get_lesson("14").core_exercises),) * 2, report
    assert report["optional"] == {"graded": True, "passed": len(EXTENSIONS) - 1, "total": len(EXTENSIONS)}
    assert marker.exists(), "with --all the extension's checks run"


def test_table_marks_core_and_optional_and_a_failing_core_exercise_exits_1(tmp_path):
    """Untouched stubs under --all: every row says core, hardening or optional, extensions and hardening tiers
    are TODO (graded), exit 1 from the core exercises alone."""
    proc = course_cli("check", "14", "--impl-dir", str(untouched_impl(tmp_path / "impl")), "--all")
    assert proc.returncode == 1, f"ACTUAL exit {proc.returncode}, EXPECTED 1\n{proc.stdout}{proc.stderr}"
    rows = [ln.split()[:3] for ln in proc.stdout.splitlines() if ln.startswith("  ") and "read 14" in ln]
    assert [row for row in rows if row[0] in EXTENSIONS] == [[name, "TODO", "optional"] for name in EXTENSIONS], rows
    assert [row for row in rows if row[0] == "cosine_lr"] == [["cosine_lr", "TODO", "core"],
                                                             ["cosine_lr", "TODO", "hardening"]], rows
    assert f"optional: 0/{len(EXTENSIONS)} passed, 0 failed, {len(EXTENSIONS)} TODO" in proc.stdout, proc.stdout


def test_python_m_course_exits_early_with_all_its_output():
    """``python -m course`` ends without the interpreter's teardown (course/__main__.py): through a pipe, the
    whole report still arrives, with main()'s exit code (the documented ``check 14  # expect exit 1`` command
    of lesson 14 §6.1 runs the same ending with exit 1)."""
    proc = subprocess.run([sys.executable, "-m", "course", "check", "14", "--impl", "reference", "--only", "cosine_lr",
                           "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"ACTUAL exit {proc.returncode}, EXPECTED 0\n{proc.stderr}"
    report = json.loads(proc.stdout)   # a truncated report does not parse
    assert [e["exercise"] for e in report["exercises"]] == ["cosine_lr"], report


def test_kernels_lists_the_cpus_families_its_own_last():
    """``python -m course kernels``: default first, the family torch picks here last (what .ci/run's matrix
    reads); --others all but that one; the same list from a process forced onto the default kernels."""
    from course.runs.kernels import kernel_family
    listed = course_cli("kernels")
    assert listed.returncode == 0 and listed.stdout.split()[0] == "default", listed
    if "ATEN_CPU_CAPABILITY" not in os.environ:
        assert listed.stdout.split()[-1] == kernel_family(), f"ACTUAL {listed.stdout!r}, EXPECTED {kernel_family()} last"
    assert course_cli("kernels", "--others").stdout.split() == listed.stdout.split()[:-1]
    listing = "from course.runs.kernels import available_families; print('\\n'.join(available_families()))"
    forced = subprocess.run([sys.executable, "-c", listing], cwd=REPO_ROOT, capture_output=True, text=True,
                            env=dict(os.environ, ATEN_CPU_CAPABILITY="default"))
    assert forced.stdout == listed.stdout and not forced.stderr, (
        f"under ATEN_CPU_CAPABILITY=default\n  ACTUAL {forced.stdout!r} {forced.stderr[-500:]}\n  "
        f"EXPECTED {listed.stdout!r}")


def test_hardening_checks_never_decide_the_exit_code(tmp_path):
    """A cosine_lr right on every objective that checks its arguments in another order (a hardening rule):
    without --all it passes and its hardening tier is only counted as not graded; with --all the hardening row
    FAILs with the rule's message, and the exit code is still 0."""
    mistake = next(m for m in get_lesson("14").mistakes if m.name == "cosine_checks_step_first")
    submission = tmp_path / "carol"
    shutil.copytree(REFERENCE_DIR, submission, ignore=shutil.ignore_patterns("__pycache__"))
    (submission / "train_loop.py").write_text(mistake.source(), encoding="utf-8")
    proc = course_cli("check", "14", "--impl-dir", str(submission), "--only", "cosine_lr")
    assert proc.returncode == 0, f"ACTUAL exit {proc.returncode}, EXPECTED 0\n{proc.stdout}{proc.stderr}"
    assert "hardening" in proc.stdout and "FAIL" not in proc.stdout, proc.stdout
    proc = course_cli("check", "14", "--impl-dir", str(submission), "--only", "cosine_lr", "--all", "--json")
    assert proc.returncode == 0, f"ACTUAL exit {proc.returncode}, EXPECTED 0 (a hardening failure)\n{proc.stdout}"
    [row] = json.loads(proc.stdout)["exercises"]
    assert (row["status"], row["hardening"]["status"]) == ("PASS", "FAIL"), row
    assert "cosine_lr_rejects_bad_arguments" in row["hardening"]["message"], row["hardening"]["message"]
