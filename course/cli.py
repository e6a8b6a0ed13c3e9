"""``python -m course``: grade exercises and list the mistake catalogue.

    python -m course check 14                     # your impl/ (TODO / PASS / FAIL per exercise)
    python -m course check 14 --impl reference    # the reference solutions
    python -m course check 14 --impl-dir DIR      # a submission laid out like impl/
    python -m course check 14 --json              # machine-readable
    python -m course mistakes 14                  # the typical mistakes the checks catch
    python -m course release                      # regenerate every notebook's nbgrader source and release
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from .checks import LESSONS, get_lesson
from .checks.framework import FAIL, PASS, TODO, exercise_status, grade, load_impl
from .checks.mistakes import catalogue
from .notebooks import NOTEBOOKS, NOTEBOOKS_DIR, release_all


def grade_lesson(lesson_id: str, impl: str, impl_dir: Optional[str]) -> dict:
    """Grade one implementation; the dict is what ``--json`` prints and the table shows."""
    lesson = get_lesson(lesson_id)
    try:
        module = load_impl(lesson, impl, impl_dir)
    except (ValueError, FileNotFoundError):
        raise
    except Exception as exc:  # a student file that does not even import
        return {"lesson": lesson_id, "impl": impl_dir or impl, "import_error": f"{type(exc).__name__}: {exc}",
                "exercises": [], "passed": 0, "total": len(lesson.exercises)}
    results = grade(lesson, module)
    exercises = []
    for exercise in lesson.exercises:
        mine = [r for r in results if r.exercise == exercise.name]
        status = exercise_status(mine)
        first = next((r for r in mine if r.status == status), None) if status != PASS else None
        exercises.append({
            "exercise": exercise.name, "status": status, "section": exercise.section,
            "message": first.message if first else "",
            "checks": [{"check": r.check, "status": r.status, "seconds": round(r.seconds, 3),
                        "message": r.message} for r in mine],
        })
    passed = sum(e["status"] == PASS for e in exercises)
    return {"lesson": lesson_id, "impl": impl_dir or impl, "exercises": exercises, "passed": passed,
            "total": len(exercises)}


def print_table(report: dict, lesson_file: str) -> None:
    print(f"Lesson {report['lesson']} - {report['impl']}")
    if "import_error" in report:
        print(f"  cannot import the implementation: {report['import_error']}")
        return
    width = max(len(e["exercise"]) for e in report["exercises"])
    for e in report["exercises"]:
        print(f"  {e['exercise']:<{width}}  {e['status']:<4}  read {e['section']}")
        if e["status"] != PASS:
            for line in e["message"].splitlines()[:8]:
                print(f"      {line}")
    todo = sum(e["status"] == TODO for e in report["exercises"])
    failed = sum(e["status"] == FAIL for e in report["exercises"])
    print(f"  total: {report['passed']}/{report['total']} passed, {failed} failed, {todo} TODO"
          f"  (lesson text: course/lessons/{lesson_file})")


def cmd_check(args) -> int:
    impls = ["student", "reference"] if args.impl == "both" else [args.impl]
    if args.impl_dir is not None:
        impls = ["dir"]
    reports = []
    for impl in impls:
        try:
            reports.append(grade_lesson(args.lesson, impl, args.impl_dir))
        except (ValueError, FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2, ensure_ascii=False))
    else:
        for report in reports:
            print_table(report, get_lesson(args.lesson).lesson_file)
    return 0 if all(r["passed"] == r["total"] for r in reports) else 1


def cmd_mistakes(args) -> int:
    mistakes, equivalents = catalogue(args.lesson)
    print(f"Lesson {args.lesson}: mistakes the checks catch")
    for m in mistakes:
        print(f"  - {m.name}: {m.description}\n      caught by {m.caught_by}")
    print("Accepted equivalent forms")
    for m in equivalents:
        print(f"  - {m.name}: {m.description}")
    return 0


def cmd_release(args) -> int:
    try:
        paths = release_all(Path(args.course_dir) if args.course_dir else NOTEBOOKS_DIR, args.lesson or None)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"released {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m course", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="grade a lesson's exercises")
    check.add_argument("lesson", choices=sorted(LESSONS), help="lesson id")
    check.add_argument("--impl", choices=["student", "reference", "both"], default="student",
                       help="which implementation to grade (default: student, i.e. impl/)")
    check.add_argument("--impl-dir", default=None, help="grade a directory laid out like impl/ instead")
    check.add_argument("--json", action="store_true", help="print machine-readable results")
    check.set_defaults(func=cmd_check)
    mistakes = sub.add_parser("mistakes", help="list the mistake catalogue of a lesson")
    mistakes.add_argument("lesson", choices=sorted(LESSONS))
    mistakes.set_defaults(func=cmd_mistakes)
    release = sub.add_parser("release", help="rebuild the nbgrader source and student release of the notebooks")
    release.add_argument("lesson", nargs="*", help=f"lesson ids {sorted(NOTEBOOKS)} (default: all of them)")
    release.add_argument("--course-dir", default=None, help="nbgrader course directory (default: notebooks/)")
    release.set_defaults(func=cmd_release)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
