"""Lesson 15 checks of ``resume_position`` and of the exact resume it completes (fp32 and GradScaler)."""
from __future__ import annotations

from course.runs.scenarios import RESUME_FP32, RESUME_SCALER

from ..framework import check, expect_equal, expect_raises, fail
from .checks import check_exact_resume, names_the_rule


# --- resume_position ---------------------------------------------------------------------------


POSITIONS = (  # ((saved epoch, saved step, iters), (start_epoch, start_step))
    ((0, 4, 6), (0, 4)), ((0, 5, 6), (0, 5)), ((0, 6, 6), (1, 0)), ((1, 0, 6), (1, 0)), ((2, 1, 3), (2, 1)),
    ((0, 1, 1), (1, 0)), ((0, 0, 1), (0, 0)), ((3, 1, 2), (3, 1)), ((2, 3, 3), (3, 0)))


def position_hint(epoch: int, step: int, iters: int, got) -> str:
    """The rule a wrong ``(start_epoch, start_step)`` breaks."""
    if step < iters and tuple(got) == (epoch + 1, 0):
        return (f"only step == iters (all {iters} micro-batches of the epoch trained) continues at (epoch + 1, 0); "
                f"step {step} leaves {iters - step} to train")
    if step == iters:
        return "a checkpoint written at the end of an epoch (step == iters) continues at (epoch + 1, 0)"
    return ("start_step is the number of micro-batches of the epoch already trained: (epoch, step), "
            "no + 1 anywhere")


@check("resume_position", objective="exact_resume")
@names_the_rule("start_step is the number of micro-batches of the epoch already trained; only step == iters "
                "continues at (epoch + 1, 0)")
def resume_position_cases(impl):
    """Mid-epoch (also one micro-batch before the end) resumes where it stopped; an epoch-end checkpoint resumes
    at the next epoch's start."""
    for (epoch, step, iters), expected in POSITIONS:
        got = tuple(impl.resume_position({"epoch": epoch, "step": step, "world_size": 1}, iters))
        if got != expected:
            fail(f"resume_position({{'epoch': {epoch}, 'step': {step}}}, iters={iters})", got, expected,
                 f"hint: {position_hint(epoch, step, iters, got)}")


@check("resume_position")
@names_the_rule("check iters (an int >= 1, not a bool) before step (within [0, iters]), each ValueError naming "
                "it; the checkpoint dict is read, never changed")
def resume_position_rejects_bad_arguments(impl):
    """A step outside [0, iters] or iters < 1 raises ValueError naming it (iters first when both are bad; True is
    a bool); the checkpoint dict given is left unchanged."""
    for (epoch, step, iters), _ in POSITIONS:
        given = {"epoch": epoch, "step": step, "world_size": 1}
        checkpoint = dict(given)
        impl.resume_position(checkpoint, iters)
        expect_equal(f"the checkpoint dict after resume_position({given}, iters={iters})", checkpoint, given)
    for step, iters, bad in ((7, 6, "step"), (-1, 6, "step"), (0, 0, "iters"), (2, 1.0, "iters"),
                             (1, True, "iters"), (7, 0, "iters"), (-1, -3, "iters")):
        expect_raises(f"resume_position({{'epoch': 0, 'step': {step}}}, iters={iters!r})",
                      lambda: impl.resume_position({"epoch": 0, "step": step}, iters), ValueError, bad,
                      ("iters", "step"))


# --- the exact resume --------------------------------------------------------------------------


@check("resume_position", objective="exact_resume", slow=True,
       uses=("SkipBatchSampler", "save_checkpoint", "load_checkpoint"))
@names_the_rule("an exact resume restores the model and the whole AdamW state (moments and step count), skips "
                "exactly the trained micro-batches and continues at resume_position's (epoch, step)")
def exact_resume_fp32(impl):
    """Stop at an update boundary, save, load into fresh objects, finish: bitwise the uninterrupted run."""
    check_exact_resume(impl, RESUME_FP32)


@check("resume_position", objective="exact_resume", hidden=True,
       uses=("SkipBatchSampler", "save_checkpoint", "load_checkpoint"))
@names_the_rule("restore the GradScaler's whole state, its scale AND its growth tracker, or the scale changes at "
                "other steps than in the uninterrupted run")
def exact_resume_with_grad_scaler(impl):
    """Same with an enabled CPU GradScaler whose scale was halved before the stop: the scale must survive."""
    check_exact_resume(impl, RESUME_SCALER)
