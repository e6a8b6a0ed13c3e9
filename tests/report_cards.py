"""What every stage's report card must say (tests/test_stage_assembly.py, tests/test_sft_stage.py): the wall time,
within the run's own, beside the tokens/s of the stage's training function, and paths relative to the repository."""
from __future__ import annotations

import re

from course.checks.framework import expect_equal
from course.implementations import REPO_ROOT


def assert_card_basics(report: str, trained_in: str, run_seconds: float) -> None:
    wall = re.search(rf"^wall time (\d+\.\d) s; [\d,]+ tokens/s in {trained_in}$", report, re.M)
    assert wall and 0 < float(wall[1]) <= run_seconds + 0.05, (
        f"wall time ACTUAL {wall and wall[0]!r}, EXPECTED 'wall time S s; ...' with 0 < S <= the run's "
        f"{run_seconds:.2f} s")
    expect_equal("absolute paths into the repository", str(REPO_ROOT) in report, False)
    assert "| tokenizer | labs/data/stories_tokenizer/tokenizer.json (699 tokens) |" in report, report
