"""What the docs show a command print, and how closely a run on another CPU must repeat it.

A doc shows a command's output in a ```text block right after the line ``<!-- output of: COMMAND -->``
(invisible once rendered); a lesson's prediction lab shows its printout after its ```bash block. A shown line
is compared with the real output: words, integers (updates, steps, counts) and unlabelled decimals (schedule
values, exact zeros) must match exactly; a decimal after a label of TOLERANCES may differ by at most that much;
lines holding a SKIPPED word (samples, timings, rates) are not compared at all.

Why tolerances: each CPU kernel family (ATEN_CPU_CAPABILITY, course/runs/kernels.py) and thread count splits
its sums its own way, so a float result moves in its last bits from one student's CPU to another's, and a
training run amplifies that. ``python labs/bench_cpu_matrix.py`` measures the spread of every shown number
across the families and thread counts of the machine it runs on; each tolerance below is that measured spread
with a margin, for the CPUs it could not run, and stays far below what a wrong implementation changes.
"""
from __future__ import annotations

import re
from pathlib import Path

from course.implementations import REPO_ROOT

MARKER = re.compile(r"^<!-- output of: (.+) -->$")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
# label before a number -> absolute tolerance ("loss:" also ends logits_loss: and aux_loss:). The spreads are
# labs/bench_cpu_matrix.py's across default/avx2 x 1/2 threads on an AMD EPYC, and an Intel Xeon's avx512 run.
TOLERANCES = {
    "val_loss": 0.05,                        # the main job's first and last (6.58, 1.00): spread 0.0001
    "loss:": 0.005,                          # the tiny preset's log lines, ~8.7 after 5 updates: spread 0
    "unscale -> clip: norm recorded": 1e-3,  # lesson 14 answers §3, 1.1439: spread 0
    "clip -> unscale: norm recorded": 0.1,   # lesson 14 answers §3, 74965.6 (65536 x 1.1439): spread 0.01
    "norm the step uses": 1e-4,              # lesson 14 answers §3, 1.0000 and 1.526e-05: spread 0
    "cosine": 1e-4,                          # lesson 16 answers §4.0, cosines to 4 decimals: spread 0
    "| =": 1e-6,                             # lesson 15 answers §4.1, max |parameter difference| ~3.8e-04: spread 0
    "drift after 10 updates": 0.005,         # lesson 17 notes §2, 3.74e-01 (loss / K) and rounding (token-weighted,
                                             # 4.9e-07 to 8.3e-07): spread 4e-07
    "left_in_epoch:": float("inf"),          # minutes: a timing
}
SKIPPED = ("sample:", "drawn:", "it/s", "tok/s", "tokens/s")


def shown_outputs(path: Path) -> list[tuple[str, list[str]]]:
    """(command, the lines of its shown output) for each marked ```text block of ``path``."""
    shown, lines = [], path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        match = MARKER.match(line.strip())
        if match:
            assert lines[i + 1].strip() == "```text", f"{path.name}:{i + 2}: a ```text block must follow {line}"
            end = lines.index("```", i + 2)
            shown.append((match.group(1), lines[i + 2:end]))
    return shown


def tolerance_label(line: str, start: int) -> str | None:
    """The TOLERANCES label that ends right before position ``start`` of ``line``, if any."""
    before = line[:start].rstrip()
    return next((label for label in TOLERANCES if before.endswith(label)), None)


def shape(line: str) -> tuple[str, list[tuple[str, float]]]:
    """The line with its tolerated numbers masked as ``#``, and those (label, value) pairs."""
    tolerated, text = [], line.replace(f"{REPO_ROOT}/", "").strip()

    def mask(match):
        label = tolerance_label(text, match.start())
        if label is None:
            return match.group()
        tolerated.append((label, float(match.group().replace(",", ""))))
        return "#"
    return NUMBER.sub(mask, text), tolerated


def compared(line: str) -> bool:
    return bool(line.strip()) and not any(word in line for word in SKIPPED)


def mismatches(shown: list[str], output: str, complete: bool = False) -> list[str]:
    """Why ``output`` does not print the ``shown`` lines (none: it does). The shown lines must appear in the
    output in order, each number within its tolerance; ``complete``: and no compared output line is left out."""
    actual = [shape(line) for line in output.splitlines() if compared(line)]
    problems, at = [], 0
    for line in filter(compared, shown):
        key, expected = shape(line)
        found = next((i for i in range(at, len(actual)) if actual[i][0] == key), None)
        if found is None:
            problems.append(f"a shown line the output lacks (searched from its compared line {at + 1})\n"
                            f"  EXPECTED: {line.strip()}")
            continue
        if complete and found != at:
            problems.append(f"output lines not shown before {line.strip()!r}: {[a[0] for a in actual[at:found]]}")
        for (label, want), (_, got) in zip(expected, actual[found][1]):
            if not abs(got - want) <= TOLERANCES[label]:
                problems.append(f"{label} in {line.strip()!r}\n  ACTUAL:   {got}\n  EXPECTED: {want} (tolerance "
                                f"{TOLERANCES[label]}: more than another CPU's rounding moves it)")
        at = found + 1
    if complete and at < len(actual):
        problems.append(f"output lines not shown at the end: {[a[0] for a in actual[at:]]}")
    return problems
