"""The class report, ``OUT/report.md`` with its figures under ``OUT/figures/``: a roster (per student the points,
each exercise's state, the cells that raised and the tampering flags), every flag with its file and line, per
exercise the share of the class that got all its points, the checks most failed (with the exercise's first hint),
the distribution of total points, the submissions that could not be graded in full and the slowest ones.

It also holds what turns a notebook's outputs into the per-student JSON's details: the cells that raised and each
failed check's message (``cells_that_raised``, ``check_messages``)."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from course.checks.assignments import scored_cells
from course.checks.framework import FAIL, PASS, TODO, Lesson

from .tampering import cell_label

TOP = 10   # rows of the "most failed" and "slowest" tables
ERROR, STOPPED = "error", "stopped"   # an exercise's state beside PASS, FAIL and TODO
STOPPED_ERROR = "GradingStopped"      # the error stopped_outputs puts in every cell of a stopped grader
_DESCRIBED = re.compile(rf"(?:^|\n\n)({FAIL}|{TODO}) (\w+): ")   # course.checks.results.describe, in an error


def cells_that_raised(notebook, outputs: list) -> list[str]:
    """``cell N (grade_id): ErrorName`` of every cell whose outputs hold an error (a stopped grader's aside)."""
    raised = []
    for number, (cell, cell_outputs) in enumerate(zip(notebook["cells"], outputs), 1):
        names = [o.get("ename", "") for o in cell_outputs or () if o.get("output_type") == "error"]
        if names and STOPPED_ERROR not in names:
            raised.append(f"{cell_label(number, cell)}: {names[0]}")
    return raised


def check_messages(notebook, outputs: list) -> dict[str, str]:
    """check -> the message (ACTUAL vs EXPECTED, or the stub's TODO) of every check a grade cell reported failing,
    from the AssertionError its ``run_checks`` raised."""
    messages = {}
    for cell, cell_outputs in zip(notebook["cells"], outputs):
        if not cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            continue
        for output in cell_outputs or ():
            text = output.get("evalue", "") if output.get("output_type") == "error" else ""
            found = list(_DESCRIBED.finditer(text))
            for match, following in zip(found, found[1:] + [None]):
                messages[match.group(2)] = text[match.end():following.start() if following else None].strip()
    return messages


def _exercise_cells(lesson: Lesson) -> dict[str, dict[str, int]]:
    """exercise -> {its scored grade cell: points}."""
    exercise_of = {c.name: c.exercise for c in lesson.checks}
    cells: dict[str, dict[str, int]] = {}
    for grade_id, points, names in scored_cells(lesson):
        cells.setdefault(exercise_of[names[0]], {})[grade_id] = points
    return cells


def _exercise_checks(lesson: Lesson) -> dict[str, list[str]]:
    """exercise -> the checks its scored grade cells run."""
    exercise_of = {c.name: c.exercise for c in lesson.checks}
    checks: dict[str, list[str]] = {}
    for _, _, names in scored_cells(lesson):
        checks.setdefault(exercise_of[names[0]], []).extend(names)
    return checks


def _full_marks(result: dict, cells: dict[str, int]) -> bool:
    return all((result["cells"].get(cell) or 0) >= points for cell, points in cells.items())


def exercise_state(result: dict, checks: list[str]) -> str:
    """PASS, TODO (a stub left), FAIL (a check's verdict), error (the student's code raised, or the grade cell
    raised before its checks ran) or stopped (the grader stopped or the submission was refused) of one exercise."""
    statuses = [result.get("checks", {}).get(name) for name in checks]
    messages = result.get("messages") or {}
    if all(status == PASS for status in statuses):
        return PASS
    if TODO in statuses:
        return TODO
    if None in statuses:
        return STOPPED if result.get("problem") else ERROR
    if any(str(messages.get(name, "")).startswith(f"{name} raised ") for name in checks):
        return ERROR
    return FAIL


def _cell(text) -> str:
    """``text`` on one line of a table or a list (a submission's text never starts a line of the report)."""
    return " ".join(str(text).splitlines()).replace("|", "\\|")


def _why_unfinished(result: dict) -> str:
    raised = "cells that raised: " + ", ".join(result["cells_raised"]) if result.get("cells_raised") else ""
    return "; ".join(filter(None, [result["problem"], raised]))


def _where(flag: dict) -> str:
    return f"{flag['file']}:{flag['line']}" if flag.get("line") else str(flag.get("file", "-"))


def _figures(lesson: Lesson, results: list[dict], shares: dict[str, float], folder: Path) -> list[str]:
    from matplotlib.figure import Figure   # no pyplot: no backend, no window
    folder.mkdir(parents=True, exist_ok=True)
    histogram = Figure(figsize=(6, 3.5))
    axes = histogram.subplots()
    axes.hist([r["points"] for r in results], bins=range(0, lesson.points + 2), align="left", color="#4878a8",
              edgecolor="white")
    axes.set(xlabel="total points", ylabel="submissions", title=f"Lesson {lesson.lesson_id}: points "
             f"(of {lesson.points}), {len(results)} submissions")
    histogram.tight_layout()
    histogram.savefig(folder / "points_histogram.png", dpi=100)
    bars = Figure(figsize=(6, 0.45 * len(shares) + 1.2))
    axes = bars.subplots()
    names = list(shares)[::-1]
    axes.barh(names, [100 * shares[n] for n in names], color="#59a14f")
    axes.set(xlim=(0, 100), xlabel="% of the class with every point", title="Passed, per exercise")
    bars.tight_layout()
    bars.savefig(folder / "exercise_pass_rate.png", dpi=100)
    return ["points_histogram.png", "exercise_pass_rate.png"]


def _roster(lesson: Lesson, results: list[dict]) -> list[str]:
    exercises = _exercise_checks(lesson)
    lines = ["## Roster", "", f"Per exercise: {PASS}, {FAIL} (a check's verdict), {TODO} (a stub left), {ERROR} "
             f"(the student's code raised, or the grade cell did before its checks ran), {STOPPED} (the grading "
             "stopped: see below).", "",
             "| student | points | " + " | ".join(exercises) + " | cells that raised | flags |",
             "|---|---|" + "---|" * len(exercises) + "---|---|"]
    for r in results:
        states = [exercise_state(r, checks) for checks in exercises.values()]
        raised = "; ".join(r.get("cells_raised") or []) or "-"
        flags = r.get("flags") or []
        lines.append(f"| {_cell(r['student'])} | {r['points']:g} | " + " | ".join(states)
                     + f" | {_cell(raised)} | {len(flags) or '-'} |")
    return lines


def _flags(results: list[dict]) -> list[str]:
    flagged = [r for r in results if r.get("flags")]
    lines = ["## Tampering flags", ""]
    if not flagged:
        return lines + ["None: no submission reached into the grader or the process (static scan, audit hook and "
                        "tripwires), none is identical to the reference or to another.", ""]
    lines += [f"{len(flagged)} submission{'s' if len(flagged) != 1 else ''} flagged, for you to review: a flag changes no score (the gradebook has "
              "the points as graded). Seen by: static (the source), audit (an event while it ran), tripwire (a "
              "change found after it ran), compare (identical code).", "",
              "| student | points | flag | where | what | seen by |", "|---|---|---|---|---|---|"]
    for r in flagged:
        for flag in r["flags"]:
            lines.append(f"| {_cell(r['student'])} | {r['points']:g} | {flag['kind']} | {_cell(_where(flag))} | "
                         f"{_cell(flag['detail'])} | {flag.get('source', '')} |")
    return lines + [""]


def write_report(lesson: Lesson, results: list[dict], out_dir: Path, every_cell: bool = False) -> Path:
    """Write the report of ``results`` (one per submission, as ``grade_class`` stores them; ``every_cell``: the
    notebooks' figure and check cells were run too); returns its path."""
    count = len(results)
    cells = _exercise_cells(lesson)
    shares = {name: sum(_full_marks(r, ids) for r in results) / max(count, 1) for name, ids in cells.items()}
    figures = _figures(lesson, results, shares, out_dir / "figures") if count else []
    failed = Counter(check for r in results for check, status in r["checks"].items() if status != PASS)
    exercise_of = {c.name: c.exercise for c in lesson.checks}
    totals = [r["points"] for r in results]
    flagged = sum(bool(r.get("flags")) for r in results)
    lines = [f"# Lesson {lesson.lesson_id} ({lesson.title}): class report", "",
             f"{count} submissions; points: mean {sum(totals) / max(count, 1):.1f} of {lesson.points}, "
             f"{sum(t == lesson.points for t in totals)} with every point, {sum(t == 0 for t in totals)} with none; "
             f"{flagged} flagged for review.", ""]
    lines += [f"![{name}](figures/{name})" for name in figures] + [""]
    lines += _roster(lesson, results) + [""] + _flags(results)
    lines += ["## Passed, per exercise", "", "| exercise | section | share of the class with every point |",
              "|---|---|---|"]
    lines += [f"| {name} | {lesson.section_of(name)} | {100 * share:.0f} % |" for name, share in shares.items()]
    lines += ["", "## Checks most failed", "", "| check | exercise | submissions failing it | hint (the idea) |",
              "|---|---|---|---|"]
    for check, times in failed.most_common(TOP):
        exercise = exercise_of.get(check, "?")
        hint = lesson.hints.get(exercise, ("",))[0].replace("|", "\\|")
        lines.append(f"| {check} | {exercise} | {times} | {hint} |")
    unfinished = [r for r in results if r["problem"] or r.get("cells_raised")]
    lines += ["", "## Not graded in full", ""]
    lines += [f"- {_cell(r['student'])}: {_cell(_why_unfinished(r))}" for r in unfinished] or [
        "None: every submission ran to its end and no cell raised."]
    noisy = [r["student"] for r in results if r["wrote_stderr"]]
    lines += ["", f"Wrote to stderr (shown in each result's JSON, never graded): {', '.join(noisy) or 'none'}.", ""]
    lines += ["## Slowest submissions", "", "| student | seconds | peak memory (MiB) | points |", "|---|---|---|---|"]
    lines += [f"| {_cell(r['student'])} | {r['seconds']:.1f} | {r['max_rss_mb']:.0f} | {r['points']:g} |"
              for r in sorted(results, key=lambda r: -r["seconds"])[:TOP]]
    sandboxes = sorted({str(r["sandbox"]) for r in results if r.get("sandbox")})
    lines += [""] + [f"Sandbox: {sandbox}." for sandbox in sandboxes]
    if not every_cell and any(r.get("route") == "notebook" for r in results):
        lines.append("The figure cells and the hardening and extension check cells were not run, so the feedback "
                     "lacks them (they score nothing): grade-class --every-cell runs them as nbgrader autograde does.")
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
