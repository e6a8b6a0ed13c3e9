"""Lesson 15 checks of ``resume_position`` and of the exact resume it completes (fp32 and GradScaler)."""
from __future__ import annotations

from course.runs.scenarios import RESUME_FP32, RESUME_SCALER

from ..framework import check, expect_equal, expect_raises
from .checks import check_exact_resume


# --- resume_position ---------------------------------------------------------------------------


@check("resume_position")
def resume_position_cases(impl):
    """Mid-epoch resumes where it stopped; an epoch-end checkpoint resumes at the next epoch's start."""
    for (epoch, step, iters), expected in [((0, 4, 6), (0, 4)), ((0, 6, 6), (1, 0)), ((1, 0, 6), (1, 0)),
                                           ((2, 1, 3), (2, 1)), ((0, 1, 1), (1, 0))]:
        expect_equal(f"resume_position({{'epoch': {epoch}, 'step': {step}}}, iters={iters})",
                     tuple(impl.resume_position({"epoch": epoch, "step": step}, iters)), expected)
    expect_raises("resume_position(step=7, iters=6)", lambda: impl.resume_position({"epoch": 0, "step": 7}, 6),
                  ValueError, "step")
    expect_raises("resume_position(iters=0)", lambda: impl.resume_position({"epoch": 0, "step": 0}, 0),
                  ValueError, "iters")


@check("resume_position", uses=("SkipBatchSampler", "save_checkpoint", "load_checkpoint"))
def exact_resume_fp32(impl):
    """Stop at an update boundary, save, load into fresh objects, finish: bitwise the uninterrupted run."""
    check_exact_resume(impl, RESUME_FP32)


@check("resume_position", hidden=True, uses=("SkipBatchSampler", "save_checkpoint", "load_checkpoint"))
def exact_resume_with_grad_scaler(impl):
    """Same with an enabled CPU GradScaler whose scale was halved before the stop: the scale must survive."""
    check_exact_resume(impl, RESUME_SCALER)
