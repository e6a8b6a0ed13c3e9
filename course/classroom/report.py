"""The class report, ``OUT/report.md`` with its figures under ``OUT/figures/``: per exercise the share of the
class that got all its points, the checks most failed (with the exercise's first hint), the distribution of
total points, the submissions that could not be graded in full and the slowest ones."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from course.checks.assignments import scored_cells
from course.checks.framework import PASS, Lesson

TOP = 10   # rows of the "most failed" and "slowest" tables


def _exercise_cells(lesson: Lesson) -> dict[str, dict[str, int]]:
    """exercise -> {its scored grade cell: points}."""
    exercise_of = {c.name: c.exercise for c in lesson.checks}
    cells: dict[str, dict[str, int]] = {}
    for grade_id, points, names in scored_cells(lesson):
        cells.setdefault(exercise_of[names[0]], {})[grade_id] = points
    return cells


def _full_marks(result: dict, cells: dict[str, int]) -> bool:
    return all((result["cells"].get(cell) or 0) >= points for cell, points in cells.items())


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


def write_report(lesson: Lesson, results: list[dict], out_dir: Path) -> Path:
    """Write the report of ``results`` (one per submission, as ``grade_class`` stores them); returns its path."""
    count = len(results)
    cells = _exercise_cells(lesson)
    shares = {name: sum(_full_marks(r, ids) for r in results) / max(count, 1) for name, ids in cells.items()}
    figures = _figures(lesson, results, shares, out_dir / "figures") if count else []
    failed = Counter(check for r in results for check, status in r["checks"].items() if status != PASS)
    exercise_of = {c.name: c.exercise for c in lesson.checks}
    totals = [r["points"] for r in results]
    lines = [f"# Lesson {lesson.lesson_id} ({lesson.title}): class report", "",
             f"{count} submissions; points: mean {sum(totals) / max(count, 1):.1f} of {lesson.points}, "
             f"{sum(t == lesson.points for t in totals)} with every point, {sum(t == 0 for t in totals)} with none.",
             ""]
    lines += [f"![{name}](figures/{name})" for name in figures] + [""]
    lines += ["## Passed, per exercise", "", "| exercise | section | share of the class with every point |",
              "|---|---|---|"]
    lines += [f"| {name} | {lesson.section_of(name)} | {100 * share:.0f} % |" for name, share in shares.items()]
    lines += ["", "## Checks most failed", "", "| check | exercise | submissions failing it | hint (the idea) |",
              "|---|---|---|---|"]
    for check, times in failed.most_common(TOP):
        exercise = exercise_of.get(check, "?")
        hint = lesson.hints.get(exercise, ("",))[0].replace("|", "\\|")
        lines.append(f"| {check} | {exercise} | {times} | {hint} |")
    stopped = [r for r in results if r["problem"]]
    lines += ["", "## Not graded in full", ""]
    lines += [f"- {r['student']}: {r['problem']}" for r in stopped] or ["None: every submission ran to its end."]
    noisy = [r["student"] for r in results if r["wrote_stderr"]]
    lines += ["", f"Wrote to stderr (shown in each result's JSON, never graded): {', '.join(noisy) or 'none'}.", ""]
    lines += ["## Slowest submissions", "", "| student | seconds | peak memory (MiB) | points |", "|---|---|---|---|"]
    lines += [f"| {r['student']} | {r['seconds']:.1f} | {r['max_rss_mb']:.0f} | {r['points']:g} |"
              for r in sorted(results, key=lambda r: -r["seconds"])[:TOP]]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
