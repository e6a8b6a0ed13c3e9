"""The lesson-14 §10 lab: it draws its four figures and measures what the lesson quotes (the tail's r/K and
the decay factor are known in closed form, so they are expected values independent of the lab)."""
from __future__ import annotations

import re
import sys

from course.implementations import REPO_ROOT, load_module

sys.path.insert(0, str(REPO_ROOT / "labs"))   # as when the lab runs as a script: it imports its neighbours
LAB = load_module(REPO_ROOT / "labs" / "lesson14_fix_upstream.py", "fix_upstream_lab")
FIGURES = {"14_fix_upstream_tail", "14_fix_upstream_lr_per_update", "14_fix_upstream_norm_decay",
           "14_fix_upstream_warmup"}


def test_lab_draws_four_figures_and_measures_the_upstream_effects(tmp_path, capsys):
    LAB.main(["--impl", "reference", "--out", str(tmp_path), "--updates", "12"])
    out = capsys.readouterr().out
    assert {p.stem for p in tmp_path.glob("*.png")} == FIGURES, sorted(tmp_path.iterdir())
    for r in (1, 2, 3):
        upstream, fixed = map(float, re.search(rf"tail of r={r} \(K=4\): update gradient = ([\d.]+) x .*?, "
                                               rf"([\d.]+) x with", out).groups())
        assert abs(upstream - r / 4) < 2e-3 and abs(fixed - 1.0) < 2e-3, (
            f"r={r}: ACTUAL {upstream}, {fixed}; EXPECTED {r / 4} (upstream r/K), 1.0 (accumulation_divisor)")
    one_group, groups = map(float, re.search(r"one group ([\d.]+) .*adamw_param_groups ([\d.]+)", out).groups())
    assert abs(one_group - (1 - 5e-3 * 0.1) ** 12) < 1e-4 and groups == 1.0, (one_group, groups)
    assert "upstream every 3 micro-steps at [3, 6, 9, 10]" in out and "interval=1) at [4, 8, 10]" in out, out
