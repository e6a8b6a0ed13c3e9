"""``python -m course``: grade exercises, list mistakes, align, build notebooks, add a lesson.

    python -m course check 14                     # your impl/ (TODO / PASS / FAIL per exercise)
    python -m course check 14 --impl reference    # the reference solutions
    python -m course check 14 --impl-dir DIR      # a submission laid out like impl/
    python -m course check 14 --json              # machine-readable
    python -m course check 14 --all               # also the hardening tiers and extensions (never in the exit code)
    python -m course check 14 --only cosine_lr    # only these exercises (repeat it, or a comma list)
    python -m course hint 14 cosine_lr            # the next hint for one exercise (remembered locally)
    python -m course answer 14 5.4                # the answer to a section's question, after you wrote yours
    python -m course align 14                     # the lesson's alignment report for your impl/
    python -m course mutants 14                   # automatic mutants of the reference the checks miss
    python -m course mistakes 14                  # the typical mistakes the checks catch, and what each edits
    python -m course mistakes 14 --verify         # every catalogue entry's edit still applies to the reference
    python -m course syllabus                     # the README's syllabus table, from the descriptors
    python -m course release                      # regenerate every notebook's nbgrader source and release
    python -m course workspace 14                 # your copy of the lesson's notebook, in notebooks/workspace/
    python -m course check 14 --notebook PATH     # grade a notebook's exercises without a browser
    python -m course new-lesson 17 my_topic       # the skeleton of every file a new lesson needs
    python -m course kernels                      # the CPU kernel families torch runs on this machine
    python -m course grade-class 14 DIR           # every submission of a class: parallel, confined, resumable
    python -m course chat --weights out/full_sft_128.pth   # talk to a model: one line per turn, empty line ends
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Optional

from .checks import LESSONS, get_lesson, hints
from .checks.assignments import NOTEBOOKS_DIR, copy_to_workspace, notebook_lessons, release_all
from .checks.notebook import notebook_module_source
from .checks.catalogue import verify
from .checks.framework import CORE, HARDENING, OPTIONAL, PASS, TODO
from .checks.mutants import analyse, score_line, status_of
from .checks.parallel import MAX_JOBS, default_jobs
from .checks.results import SKIP, describe, grade_exercises
from .classroom.confinement import Limits, unavailable
from .classroom.grade_class import ClassRun, run_class
from .classroom.pool import Settings
from .implementations import REPO_ROOT, impl_root
from .input_errors import InputError, refuse
from .lesson_texts import section_numbers, section_text, untouched
from .runs.kernels import available_families
from .runs.threads import positive_integer
from .scaffold import new_lesson
from .trainers.chat import add_chat_arguments, chat


def grade_lesson(lesson_id: str, impl: str, impl_dir: Optional[str], include_optional: bool = False,
                 only: Optional[list[str]] = None, jobs: int = 1, answers_for: Optional[str] = None) -> dict:
    """Grade one implementation; the dict is what ``--json`` prints and the table shows.

    ``answers_for``: the folder the answer command's note looks at (default ``impl_dir``; "" for impl/).
    ``passed`` / ``total`` count the core exercises only (they decide the exit code); the hardening tiers
    and the optional extensions are graded only with ``include_optional`` (an extension also when ``only``
    names it), and summed apart under ``hardening`` and ``optional``."""
    lesson = get_lesson(lesson_id)
    try:
        module = lesson.load(impl, impl_dir)
    except (ValueError, FileNotFoundError):
        raise
    except Exception as exc:  # a student file that does not even import
        return {"lesson": lesson_id, "impl": impl_dir or impl, "only": only,
                "import_error": f"{type(exc).__name__}: {exc}", "exercises": [], "passed": 0,
                "total": len([e for e in lesson.core_exercises if not only or e.name in only])}
    exercises = []
    for result in grade_exercises(lesson, module, only, include_optional, jobs=jobs):
        row = _result_row(lesson_id, result)
        if result.tier == HARDENING:   # reported inside its exercise's core row
            exercises[-1]["hardening"] = row
        else:
            exercises.append({"exercise": result.exercise.name, "section": result.exercise.section,
                              "tier": result.tier, "optional": result.tier == OPTIONAL, **row,
                              "next": next_step(lesson, result.exercise, row["status"],
                                                impl_dir if answers_for is None else answers_for)})
    core = [e for e in exercises if e["tier"] == CORE]
    return {"lesson": lesson_id, "impl": impl_dir or impl, "only": only, "exercises": exercises,
            "hints_used": hints.used(lesson_id),
            "passed": sum(e["status"] == PASS for e in core), "total": len(core),
            HARDENING: _tier_summary([e["hardening"] for e in core if "hardening" in e]),
            OPTIONAL: _tier_summary([e for e in exercises if e["tier"] == OPTIONAL])}


def next_step(lesson, exercise, status: str, impl_dir: Optional[str] = None) -> str:
    """What to do after a result: a passed exercise compares with the answer's reasoning (of the graded folder,
    ``impl_dir``, when not impl/), a failed one climbs the hint ladder; "" otherwise (TODO, not graded, or no
    answer written for the section)."""
    answers = lesson.files()["answers (en)"]
    if status == PASS and answers.is_file() and exercise.section_number in section_numbers(answers):
        where = f" --impl-dir {impl_dir}" if impl_dir else ""
        return (f"compare with the reference reasoning: python -m course answer {lesson.lesson_id} "
                f"{exercise.section_number}{where}")
    if status not in (PASS, TODO, SKIP) and exercise.name in lesson.hints:
        return f"stuck? python -m course hint {lesson.lesson_id} {exercise.name} (the next of {len(hints.LEVELS)} hints)"
    return ""


def _result_row(lesson_id: str, result) -> dict:
    """Status, message (the first problem) and checks of one exercise's result in one tier."""
    problem = result.first_problem
    message = (f"{result.tier}: python -m course check {lesson_id} --all grades it" if result.status == SKIP
               else describe(problem) if problem else "")
    return {"status": result.status, "message": message,
            "warnings": list(dict.fromkeys(w for r in result.checks for w in r.warnings)),
            "checks": [{"check": r.check, "status": r.status, "seconds": round(r.seconds, 3), "message": r.message}
                       for r in result.checks]}


def _tier_summary(rows: list[dict]) -> dict:
    return {"graded": all(e["status"] != SKIP for e in rows), "passed": sum(e["status"] == PASS for e in rows),
            "total": len(rows)}


def _counts(rows: list[dict], passed: int, total: int) -> str:
    todo = sum(e["status"] == TODO for e in rows)
    return f"{passed}/{total} passed, {len(rows) - passed - todo} failed, {todo} TODO"


def print_table(report: dict, lesson_text: str) -> None:
    only = f" (only {', '.join(report['only'])})" if report["only"] else ""
    print(f"Lesson {report['lesson']} - {report['impl']}{only}")
    if "import_error" in report:
        print(f"  cannot import the implementation: {report['import_error']}")
        return
    width = max(len(e["exercise"]) for e in report["exercises"])
    for e in report["exercises"]:
        rows = [(e["tier"], e)] + ([(HARDENING, e["hardening"])] if e.get("hardening", {}).get("status", SKIP) != SKIP
                                   else [])   # an ungraded hardening tier is summed up below
        for tier, row in rows:
            print(f"  {e['exercise']:<{width}}  {row['status']:<4}  {tier:<9}  read {e['section']}")
            if row["status"] not in (PASS, SKIP):
                for line in row["message"].splitlines()[:8]:
                    print(f"      {line}")
            for warning in row["warnings"]:
                print(f"      warning (not graded): {warning}")
            if tier != HARDENING and e.get("next"):
                print(f"      {e['next']}")
    if report["hints_used"]:
        count = len(hints.LEVELS)
        print("  hints used: " + ", ".join(f"{name} {level}/{count}" for name, level in report["hints_used"].items()))
    core = [e for e in report["exercises"] if e["tier"] == CORE]
    print(f"  total: {_counts(core, report['passed'], report['total'])}"
          f"  (lesson text: {lesson_text})")
    for tier, what in ((HARDENING, "exercises' hardening checks (argument rules, conventions)"),
                       (OPTIONAL, "extensions")):
        summary = report[tier]
        if summary["total"] and summary["graded"]:
            rows = [e["hardening"] for e in report["exercises"] if "hardening" in e] if tier == HARDENING else \
                [e for e in report["exercises"] if e["tier"] == tier]
            print(f"  {tier}: {_counts(rows, summary['passed'], summary['total'])} (never in the exit code)")
        elif summary["total"]:
            print(f"  {tier}: {summary['total']} {what} not graded; "
                  f"python -m course check {report['lesson']} --all grades them (never in the exit code)")


def only_exercises(lesson_id: str, values: Optional[list[str]]) -> Optional[list[str]]:
    """The exercises ``--only`` names (repeated or comma-separated), each checked against the lesson's."""
    if not values:
        return None
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    valid = [e.name for e in get_lesson(lesson_id).exercises]
    unknown = [name for name in names if name not in valid]
    if unknown or not names:
        raise ValueError(f"--only must name exercises of lesson {lesson_id}: {', '.join(valid)}; got {unknown or values}")
    return list(dict.fromkeys(names))


def cmd_check(args) -> int:
    if args.notebook is not None:
        return check_notebook(args)
    impls = ["dir"] if args.impl_dir is not None else ["student", "reference"] if args.impl == "both" else [args.impl]
    reports = []
    try:
        only = only_exercises(args.lesson, args.only)
        for impl in impls:
            reports.append(grade_lesson(args.lesson, impl, args.impl_dir, args.all, only, args.jobs))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return show_reports(args, reports)


def check_notebook(args) -> int:
    """Grade the exercises a notebook defines (its setup, exercise and added cells, run as one module), without
    a browser or a kernel: the same checks as its grade cells."""
    lesson = get_lesson(args.lesson)
    if args.impl_dir is not None:
        print("error: --notebook and --impl-dir each name what to grade: give one", file=sys.stderr)
        return 2
    try:
        only = only_exercises(args.lesson, args.only)
        source = notebook_module_source(Path(args.notebook))
        with tempfile.TemporaryDirectory(prefix="notebook-check-") as folder:
            (Path(folder) / lesson.module_file).write_text(source, encoding="utf-8")
            report = grade_lesson(args.lesson, "dir", folder, args.all, only, args.jobs, answers_for="")
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["impl"] = args.notebook
    return show_reports(args, [report])


def show_reports(args, reports: list[dict]) -> int:
    """Print the reports (a table each, or ``--json``); the exit code: 0 only when every core exercise passed."""
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2, ensure_ascii=False))
    else:
        for report in reports:
            print_table(report, relative(get_lesson(args.lesson).files()["lesson text (en)"]))
    return 0 if all(r["passed"] == r["total"] for r in reports) else 1


def cmd_hint(args) -> int:
    """Show the exercise's next hint (or the last one again) and remember it."""
    lesson = get_lesson(args.lesson)
    try:
        if args.reset:
            hints.reset(lesson.lesson_id, lesson.exercise(args.exercise).name)
            print(f"hints of {args.exercise} reset: the next one is hint 1 ({hints.LEVELS[0]})")
            return 0
        level, text = hints.next_hint(lesson.lesson_id, lesson.hints, args.exercise, again=args.again)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    count = len(hints.LEVELS)
    print(f"Lesson {lesson.lesson_id}, {args.exercise}: hint {level} of {count} ({hints.LEVELS[level - 1]})\n")
    print(textwrap.indent(textwrap.fill(text, width=100), "  "))
    more = (f"python -m course hint {lesson.lesson_id} {args.exercise} shows hint {level + 1} "
            f"({hints.LEVELS[level]})" if level < count else "that was the last hint")
    print(f"\nnext: {more}; python -m course check {lesson.lesson_id} --only {args.exercise} grades it")
    return 0


def cmd_answer(args) -> int:
    """Print the answer to one section's questions; first a one-line note if its exercise is still a stub."""
    lesson = get_lesson(args.lesson)
    language = "zh" if args.zh else "en"
    path = lesson.files()[f"answers ({language})"]
    text = section_text(path, args.section.lstrip("§")) if path.is_file() else None
    if text is None:
        known = ", ".join(section_numbers(path)) if path.is_file() else "none"
        print(f"error: lesson {lesson.lesson_id} has no answer numbered {args.section!r} "
              f"(sections of {relative(path)}: {known})", file=sys.stderr)
        return 2
    try:
        module_path = (Path(args.impl_dir).expanduser() if args.impl_dir else impl_root()) / lesson.module_file
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for exercise in lesson.exercises:
        if exercise.section_number == args.section.lstrip("§") and untouched(module_path, exercise.name):
            print(f"note: {exercise.name} in {module_path.name} is still the untouched stub - the answer below is "
                  f"best read after your own attempt (python -m course hint {lesson.lesson_id} {exercise.name} "
                  f"if stuck)\n")
    print(text, end="")
    return 0


def cmd_align(args) -> int:
    """Print the lesson's alignment report for an implementation and compare it with the reference's."""
    lesson = get_lesson(args.lesson)
    if lesson.report is None:
        print(f"error: lesson {lesson.lesson_id} has no alignment report; lessons with one: "
              f"{sorted(i for i, l in LESSONS.items() if l.report)}", file=sys.stderr)
        return 2
    try:
        lines = lesson.report(lesson.load(args.impl))
    except NotImplementedError as exc:
        print(f"alignment=TODO: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    expected = lesson.report(lesson.load("reference"))
    if lines != expected:
        wrong = [f"  ACTUAL:   {a}\n  EXPECTED: {e}" for a, e in zip(lines, expected) if a != e]
        print("alignment=failed\n" + "\n".join(wrong or [f"  ACTUAL: {len(lines)} lines, EXPECTED: {len(expected)}"]),
              file=sys.stderr)
        return 1
    print("alignment=passed")
    return 0


def cmd_mistakes(args) -> int:
    """List the lesson's catalogue, or with ``--verify`` check that every entry's edit still applies."""
    lesson = get_lesson(args.lesson)
    entries = [*lesson.mistakes, *lesson.equivalents]
    if args.verify:
        broken = verify(entries)
        for line in broken:
            print(line)
        if broken:
            print(f"{len(broken)} of {len(entries)} entries no longer apply to {lesson.files()['reference'].name}: "
                  "update their 'old' snippets", file=sys.stderr)
            return 1
        print(f"OK: {len(entries)} entries apply")
        return 0
    print(f"Lesson {args.lesson}: mistakes the checks catch")
    for m in lesson.mistakes:
        print(f"  - {m.name}: {m.description}\n      edits {m.function}, caught by {m.caught_by}")
    print("Accepted equivalent forms")
    for m in lesson.equivalents:
        print(f"  - {m.name}: {m.description}\n      edits {m.function}")
    return 0


def cmd_mutants(args) -> int:
    """Grade automatic mutants of the reference; list each survivor (a gap, or an equivalent to list)."""
    lesson = get_lesson(args.lesson)
    equivalents = lesson.equivalent_mutants

    def report(result):
        state = status_of(result, equivalents)
        if state != "killed" or args.verbose:
            where = (f"{result.killed_by} ({result.killed_in})" if result.killed
                     else equivalents.get(result.mutant.key) or
                     (f"only {result.killed_by}, a hardening check, failed it" if result.killed_by
                      else "no check failed it"))
            print(f"{state.upper():<10} [{result.mutant.tier}] {result.mutant.key}  (line {result.mutant.line}: "
                  f"{result.mutant.original_line})\n           {where}", flush=True)
    try:
        results = analyse(lesson, args.function, report)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(score_line(lesson.lesson_id, results, equivalents))
    return 0 if all(status_of(r, equivalents) != "survived" for r in results) else 1


def optional_note(lesson) -> str:
    """Extensions score no notebook points; the syllabus says how many a lesson has."""
    count = len(lesson.optional_exercises)
    return f" (+{count} optional, 0 points)" if count else ""


def relative(path: Path) -> str:
    """A path of ``Lesson.files()`` as the docs write it: relative to the repository root."""
    return path.relative_to(REPO_ROOT).as_posix()


def syllabus_table() -> str:
    """The README's syllabus table: one row per lesson, every cell from its descriptor."""
    rows = ["| lesson | title | text | your file | check | tests | labs | notebook points |",
            "|---|---|---|---|---|---|---|---|"]
    for lesson_id, lesson in sorted(LESSONS.items()):
        files = {role: relative(path) for role, path in lesson.files().items()}
        text = f"`{files['lesson text (en)']}` ([中文]({files['lesson text (zh)']}))"
        labs = ", ".join(f"`{files[f'lab {lab}']}`" for lab in lesson.labs) or "-"
        rows.append(f"| {lesson_id} | {lesson.title} | {text} | `{files['stub']}` | "
                    f"`python -m course check {lesson_id}` | `{files['test']}` | {labs} | "
                    f"{lesson.points}{optional_note(lesson)} |")
    return "\n".join(rows)


def cmd_syllabus(args) -> int:
    print(syllabus_table())
    return 0


def cmd_workspace(args) -> int:
    """Copy each (or the named) lesson's release notebook into the workspace, where no command writes again."""
    lessons = [get_lesson(i) for i in args.lesson] if args.lesson else notebook_lessons()
    for lesson in lessons:
        path, written = copy_to_workspace(lesson)
        path = Path(os.path.relpath(path)) if path.is_relative_to(Path.cwd()) else path   # as the student types it
        state = "copied the release to" if written else "kept your notebook (never overwritten):"
        print(f"{state} {path}\n  open it: jupyter lab {path}\n  grade it without a browser: "
              f"python -m course check {lesson.lesson_id} --notebook {path}")
    return 0


def cmd_release(args) -> int:
    try:
        paths = release_all(Path(args.course_dir) if args.course_dir else NOTEBOOKS_DIR, args.lesson or None,
                            overwrite_work=args.overwrite_work)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"released {path}")
    return 0


def cmd_new_lesson(args) -> int:
    try:
        written = new_lesson(args.lesson, args.slug, title=args.title, module=args.module,
                             root=Path(args.root) if args.root else None)
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print("next: fill in each file (README, 'Adding a lesson'), then run python -m pytest")
    return 0


def cmd_kernels(args) -> int:
    families = available_families()
    print("\n".join(families[:-1] if args.others else families))
    return 0


def cmd_grade_class(args) -> int:
    """Grade every submission of a class (README, "Instructor notes")."""
    why = unavailable()
    if why and not args.unconfined:
        return refuse(InputError(f"--unconfined: {why}; pass --unconfined to grade without it (README, "
                                 "\"Instructor notes\": what a submission can then do)"))
    if why:
        print(f"--unconfined: {why}", flush=True)
    settings = Settings(Limits(args.timeout, args.memory_mb, confined=not args.unconfined), args.cell_timeout,
                        args.jobs, args.every_cell)
    run = ClassRun(args.lesson, Path(args.submissions_dir), Path(args.out) if args.out else None, settings,
                   args.dask_scheduler, args.shard_size)
    try:
        run_class(run, say=lambda line: print(line, flush=True))
    except InputError as error:
        return refuse(error)
    except KeyboardInterrupt:
        print("interrupted: every finished submission is saved; run the same command again to go on", flush=True)
        return 130
    return 0


def positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {value}")
    return number


def add_grade_class_parser(sub) -> None:
    grade = sub.add_parser("grade-class", help="grade every submission of a class: in parallel, each confined, "
                                               "resumable; into nbgrader's gradebook, a CSV and a report")
    grade.add_argument("lesson", choices=sorted(LESSONS))
    grade.add_argument("submissions_dir", metavar="SUBMISSIONS_DIR",
                       help="an nbgrader course's submitted/ folder (<student>/<assignment>/<assignment>.ipynb), or a "
                            "folder of submission folders laid out like impl/ (<student>/<module>.py)")
    grade.add_argument("--jobs", type=positive_integer, default=len(os.sched_getaffinity(0)), metavar="N",
                       help="submissions graded at once (default: this machine's cores; Dask: its local workers)")
    grade.add_argument("--out", default=None, metavar="DIR",
                       help="results, grades.csv and report.md (default: grade-class/<lesson> beside SUBMISSIONS_DIR)")
    grade.add_argument("--timeout", type=positive_number, default=300.0, metavar="SECONDS",
                       help="wall-time limit of one submission's grading, all its cells (default: 300)")
    grade.add_argument("--cell-timeout", type=positive_number, default=0.0, metavar="SECONDS",
                       help="notebooks: limit of one cell (default: the course's Execute.timeout, as autograde)")
    grade.add_argument("--every-cell", action="store_true",
                       help="notebooks: run the figure, hardening and extension cells too, as autograde does (they "
                            "score nothing; the feedback then shows them)")
    grade.add_argument("--memory-mb", type=positive_integer, default=4096, metavar="MIB",
                       help="memory of one submission's grading: its processes, their shared memory and files in "
                            "its scratch directory (a cgroup), and each process's address space (default: 4096; "
                            "torch's address space alone is ~1000)")
    grade.add_argument("--unconfined", action="store_true",
                       help="grade where the sandbox (bubblewrap) or the cgroup limits are missing, with what this "
                            "machine has (it says what is not enforced)")
    grade.add_argument("--dask-scheduler", default=None, metavar="ADDRESS",
                       help="grade on a Dask cluster: a scheduler address (tcp://host:8786), or 'local' for a "
                            "LocalCluster of --jobs workers here")
    grade.add_argument("--shard-size", type=positive_integer, default=16, metavar="N",
                       help="Dask: submissions per task (each task warms one pool)")
    grade.set_defaults(func=cmd_grade_class)


def cmd_chat(args) -> int:
    try:
        return chat(args)
    except InputError as exc:
        return refuse(exc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m course", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="grade a lesson's exercises")
    check.add_argument("lesson", choices=sorted(LESSONS), help="lesson id")
    check.add_argument("--impl", choices=["student", "reference", "both"], default="student",
                       help="which implementation to grade (default: student, i.e. impl/)")
    check.add_argument("--impl-dir", default=None, help="grade a directory laid out like impl/ instead")
    check.add_argument("--notebook", default=None, metavar="PATH",
                       help="grade the exercises of a notebook (e.g. notebooks/workspace/NN_*.ipynb) without a browser")
    check.add_argument("--json", action="store_true", help="print machine-readable results")
    check.add_argument("--all", action="store_true",
                       help="grade the hardening tiers and the optional extensions too (never in the exit code)")
    check.add_argument("--only", action="append", metavar="EXERCISE",
                       help="grade only these exercises (repeat it or separate names by commas; an optional "
                            "exercise named here is graded, still never in the exit code)")
    check.add_argument("--jobs", type=positive_integer, default=default_jobs(), metavar="N",
                       help=f"worker processes sharing the checks out (default: this machine's cores, at most "
                            f"{MAX_JOBS}; 1 runs them in this process)")
    check.set_defaults(func=cmd_check)
    hint = sub.add_parser("hint", help="show the next hint of an exercise (the idea, where to look, the rule, "
                                       "a near-solution)")
    hint.add_argument("lesson", choices=sorted(LESSONS))
    hint.add_argument("exercise", help="the exercise, e.g. cosine_lr")
    hint.add_argument("--again", action="store_true", help="show the last hint again instead of the next one")
    hint.add_argument("--reset", action="store_true", help="forget the hints shown for this exercise")
    hint.set_defaults(func=cmd_hint)
    answer = sub.add_parser("answer", help="print the answer to a lesson section's questions (read it after you "
                                           "wrote yours), e.g. answer 14 5.4")
    answer.add_argument("lesson", choices=sorted(LESSONS))
    answer.add_argument("section", help="the lesson section whose questions it answers, e.g. 5.4 (or 3: the "
                                        "predictions)")
    answer.add_argument("--zh", action="store_true", help="the Chinese answers")
    answer.add_argument("--impl-dir", default=None, metavar="DIR",
                        help="whose attempt the note looks at (default: impl/)")
    answer.set_defaults(func=cmd_answer)
    align = sub.add_parser("align", help="print a lesson's alignment report and compare it with the reference's")
    align.add_argument("lesson", choices=sorted(LESSONS))
    align.add_argument("--impl", choices=["student", "reference"], default="student")
    align.set_defaults(func=cmd_align)
    mistakes = sub.add_parser("mistakes", help="list the mistake catalogue of a lesson")
    mistakes.add_argument("lesson", choices=sorted(LESSONS))
    mistakes.add_argument("--verify", action="store_true",
                          help="check that every entry's edit still applies to its function in the reference")
    mistakes.set_defaults(func=cmd_mistakes)
    mutants = sub.add_parser("mutants", help="grade automatic mutants of a lesson's reference (instructors; minutes)")
    mutants.add_argument("lesson", choices=sorted(LESSONS))
    mutants.add_argument("--function", default=None,
                         help="only mutants of this reference function or class (default: every one)")
    mutants.add_argument("--verbose", action="store_true", help="also print each killed mutant and its check")
    mutants.set_defaults(func=cmd_mutants)
    syllabus = sub.add_parser("syllabus", help="print the README's syllabus table")
    syllabus.set_defaults(func=cmd_syllabus)
    release = sub.add_parser("release", help="rebuild the nbgrader source and student release of the notebooks")
    release.add_argument("lesson", nargs="*", help=f"lesson ids {sorted(LESSONS)} (default: every notebook)")
    release.add_argument("--course-dir", default=None, help="nbgrader course directory (default: notebooks/)")
    release.add_argument("--overwrite-work", action="store_true",
                         help="release over a release notebook that holds work (cells run, exercises written)")
    workspace = sub.add_parser("workspace", help="copy the lessons' notebooks to notebooks/workspace/ (git-ignored; "
                                                 "nothing regenerates them): work there")
    workspace.add_argument("lesson", nargs="*", help=f"lesson ids {sorted(LESSONS)} (default: every notebook)")
    workspace.set_defaults(func=cmd_workspace)
    release.set_defaults(func=cmd_release)
    kernels = sub.add_parser("kernels", help="list the CPU kernel families torch runs here (ATEN_CPU_CAPABILITY), "
                                             "this CPU's own last")
    kernels.add_argument("--others", action="store_true", help="only the families other than this CPU's own")
    kernels.set_defaults(func=cmd_kernels)
    chat = sub.add_parser("chat", help="talk to a weights file (e.g. the SFT stage's out/full_sft_128.pth): one "
                                       "user line per turn on stdin, one answer line each; an empty line ends it")
    add_chat_arguments(chat)
    chat.set_defaults(func=cmd_chat)
    new = sub.add_parser("new-lesson", help="write the skeleton of every file a new lesson needs")
    new.add_argument("lesson", help="lesson number, e.g. 17")
    new.add_argument("slug", help="snake_case topic, e.g. lr_warmup: files are named <lesson>_<slug>")
    new.add_argument("--title", default=None, help="lesson title (default: from the slug)")
    new.add_argument("--module", default=None, help="exercise module name (default: the slug)")
    new.add_argument("--root", default=None, help="repository root to write into (default: this checkout)")
    new.set_defaults(func=cmd_new_lesson)
    add_grade_class_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
