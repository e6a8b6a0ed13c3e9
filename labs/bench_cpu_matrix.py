"""The spread of every number the docs show, across this CPU's kernel families and 1 or 2 threads.

    python labs/bench_cpu_matrix.py                      # every shown output (the main job: ~1 min per cell)
    python labs/bench_cpu_matrix.py --only predictions   # the commands containing this text

Each command whose output a doc shows (``<!-- output of: ... -->``, and the lessons' prediction labs) runs once
per cell of the matrix: ATEN_CPU_CAPABILITY = each family this CPU runs (course/runs/kernels.py) x
OMP_NUM_THREADS = 1, 2, the oracle cache off. For each number that is not the same in every cell it prints
the values, their spread and the tolerance course/doc_outputs.py grants it (``exact`` when its label has
none: then the docs must not show it, or must show it as a claim); the tolerances are these spreads with a
margin for the CPUs this machine cannot run. Timings and samples are left out, as in the comparison.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from course.doc_outputs import NUMBER, TOLERANCES, compared, shown_outputs, tolerance_label
from course.implementations import REPO_ROOT
from course.runs.kernels import available_families

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "course" / "lessons").glob("*.md"))]
THREADS = (1, 2)


def shown_commands() -> list[str]:
    commands = {command for doc in DOCS for command, _ in shown_outputs(doc)}
    commands |= {f"python labs/{lab.name}" for lab in (REPO_ROOT / "labs").glob("lesson*_predictions.py")}
    return sorted(commands)


def run(command: str, family: str, threads: int, out_dir: str) -> str:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=family, OMP_NUM_THREADS=str(threads), MINIMIND_COURSE_CACHE="off",
               MPLBACKEND="Agg")
    args = command.split()
    if args[0] == "python":
        args[0] = sys.executable
    if "train_pretrain_impl.py" in command:
        args += ["--out_dir", out_dir]   # not the student's out/
    proc = subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    return proc.stdout + proc.stderr


def numbers_by_line(output: str) -> dict[str, list[tuple[str | None, str]]]:
    """Compared line with every number masked -> its (label, number) pairs."""
    lines = {}
    for line in output.replace("\r", "\n").splitlines():
        if compared(line):
            key = NUMBER.sub("#", line.strip())
            lines.setdefault(key, [(tolerance_label(line, m.start()), m.group()) for m in NUMBER.finditer(line)])
    return lines


def spreads(outputs: dict[str, str]) -> list[str]:
    """One report line per number that differs between the cells."""
    cells = {cell: numbers_by_line(out) for cell, out in outputs.items()}
    first = next(iter(cells.values()))
    report = []
    for key, numbers in first.items():
        for position, (label, _) in enumerate(numbers):
            values = {cell: lines[key][position][1] for cell, lines in cells.items() if key in lines}
            if len(set(values.values())) == 1 and len(values) == len(cells):
                continue
            floats = [float(v.replace(",", "")) for v in values.values()]
            spread = max(floats) - min(floats)
            tolerance = TOLERANCES.get(label) if label else None
            verdict = ("exact: differs" if tolerance is None else
                       f"tolerance {tolerance:g} ({'ok' if spread <= tolerance else 'EXCEEDED'})")
            missing = "" if len(values) == len(cells) else f" (line missing in {len(cells) - len(values)} cells)"
            report.append(f"  {key[:90]!r} number {position + 1} [{label or 'no label'}]: spread {spread:.3g}, "
                          f"{verdict}{missing}\n      " + ", ".join(f"{c}: {v}" for c, v in values.items()))
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only the commands containing this text")
    args = parser.parse_args(argv)
    families = available_families()
    print(f"kernel families of this CPU: {', '.join(families)}; threads {THREADS}")
    worst = 0
    with tempfile.TemporaryDirectory() as tmp:
        for command in (c for c in shown_commands() if args.only in c):
            outputs = {f"{family}/{threads}t": run(command, family, threads, str(Path(tmp) / f"{family}{threads}"))
                       for family in families for threads in THREADS}
            report = spreads(outputs)
            worst += sum("EXCEEDED" in line or "exact: differs" in line for line in report)
            print(f"{command}: {'every shown number the same in every cell' if not report else ''}")
            print("\n".join(report), flush=True)
    print(f"{worst} number(s) beyond their tolerance")
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
