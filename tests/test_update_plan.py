"""UpdatePlan (course/runs/update_plan.py), the stage assembly's update arithmetic. Every expected value is
counted by hand from the rule "windows of K micro-steps, counted from micro-step 1 of each epoch; an epoch's
last window may be a shorter tail", never computed with the formulas under test."""
from __future__ import annotations

import pytest

from course.runs.update_plan import UpdatePlan, window_error

K1 = UpdatePlan(iters=5, accumulation_steps=1, epochs=2)          # every micro-step is an update
K_OVER_ITERS = UpdatePlan(iters=3, accumulation_steps=5, epochs=3)  # one tail-only update per epoch
EVEN = UpdatePlan(iters=8, accumulation_steps=4, epochs=3)          # windows 1-4, 5-8: no tail
TAIL = UpdatePlan(iters=20, accumulation_steps=3, epochs=2)         # windows 1-3, ..., 16-18, tail 19-20


@pytest.mark.parametrize("plan,expected", [(K1, 5), (K_OVER_ITERS, 1), (EVEN, 2), (TAIL, 7)])
def test_updates_per_epoch(plan, expected):
    assert plan.updates_per_epoch == expected


@pytest.mark.parametrize("plan,closing", [
    (K1, [1, 2, 3, 4, 5]),
    (K_OVER_ITERS, [3]),
    (EVEN, [4, 8]),
    (TAIL, [3, 6, 9, 12, 15, 18, 20]),
])
def test_closes_update(plan, closing):
    assert [step for step in range(1, plan.iters + 1) if plan.closes_update(step)] == closing


@pytest.mark.parametrize("plan,epoch,step,expected", [
    (K1, 0, 1, 1), (K1, 1, 3, 8), (K1, 1, 0, 5),
    (K_OVER_ITERS, 0, 1, 1), (K_OVER_ITERS, 0, 3, 1), (K_OVER_ITERS, 2, 0, 2), (K_OVER_ITERS, 2, 2, 3),
    (EVEN, 0, 4, 1), (EVEN, 0, 5, 2), (EVEN, 1, 5, 4), (EVEN, 2, 8, 6),
    (TAIL, 0, 0, 0), (TAIL, 0, 3, 1), (TAIL, 0, 4, 2), (TAIL, 0, 18, 6), (TAIL, 0, 19, 7), (TAIL, 0, 20, 7),
    (TAIL, 1, 0, 7), (TAIL, 1, 1, 8), (TAIL, 1, 20, 14),
])
def test_update_index(plan, epoch, step, expected):
    """The update a micro-step belongs to (from 1 over the run); step 0 counts the updates before the epoch,
    the resume's counter for a checkpoint at an epoch start."""
    assert plan.update_index(epoch, step) == expected


@pytest.mark.parametrize("micro_steps,expected", [(1, (0, 1)), (20, (0, 20)), (21, (1, 1)), (40, (1, 20)),
                                                  (41, (2, 1))])
def test_position(micro_steps, expected):
    assert TAIL.position(micro_steps) == expected


@pytest.mark.parametrize("plan,epoch,interval,expected", [
    (K1, 0, 2, [2, 4]),           # updates 2, 4; micro-step 5 is the epoch's end, evaluated elsewhere
    (K1, 1, 2, [1, 3]),           # updates 6, 8
    (K_OVER_ITERS, 0, 1, []),     # its only update is the epoch's end
    (EVEN, 0, 1, [4]),
    (EVEN, 0, 3, []),             # update 1 at micro-step 4; update 2 ends the epoch
    (EVEN, 1, 3, [4]),            # update 3
    (TAIL, 0, 4, [12]),           # update 4
    (TAIL, 1, 4, [3, 15]),        # updates 8 and 12
])
def test_eval_steps(plan, epoch, interval, expected):
    assert plan.eval_steps(epoch, interval) == expected


@pytest.mark.parametrize("interval,expected", [(0, set()), (6, {6, 12, 18, 20}), (18, {18, 20}), (20, {20}),
                                               (24, {20})])
def test_save_steps(interval, expected):
    assert TAIL.save_steps(interval) == expected


@pytest.mark.parametrize("stop_after", [0, 3, 18, 20, 21 + 2, 40, 60, 61])
def test_stops_on_an_update_boundary_or_past_the_run_are_accepted(stop_after):
    """23 is micro-step 3 of epoch 2 (a boundary); 60 and 61 lie past the 2 epochs, so the run never stops."""
    assert TAIL.stop_error(stop_after) is None


@pytest.mark.parametrize("stop_after,step,epoch", [(1, 1, 1), (19, 19, 1), (21, 1, 2), (39, 19, 2)])
def test_a_stop_inside_a_window_is_refused(stop_after, step, epoch):
    """21 and 39 are multiples of K = 3 that fall inside a window: windows restart after epoch 1's tail."""
    assert TAIL.stop_error(stop_after) == (
        f"--stop_after {stop_after} is micro-step {step} of epoch {epoch} (20 micro-steps per epoch), inside an "
        "accumulation window; stop at a multiple of --accumulation_steps (3) within the epoch or at its end")


@pytest.mark.parametrize("epoch,stop_after,expected", [(0, 0, None), (0, 9, 9), (1, 9, None), (0, 20, 20),
                                                       (0, 21, None), (1, 21, 1), (1, 40, 20)])
def test_stop_step(epoch, stop_after, expected):
    assert TAIL.stop_step(epoch, stop_after) == expected


@pytest.mark.parametrize("previous,step,interval,expected", [
    (0, 3, 5, False), (3, 6, 5, True), (6, 9, 5, False), (9, 12, 5, True), (15, 18, 5, False),
    (18, 20, 5, True), (18, 20, 100, True), (15, 18, 100, False), (0, 3, 3, True),
])
def test_log_due(previous, step, interval, expected):
    """Logged when the update crosses a multiple of the interval (counted in micro-steps) or ends the epoch."""
    assert TAIL.log_due(previous, step, interval) is expected


@pytest.mark.parametrize("value,expected", [
    (0, None), (6, None), (3, None),
    (7, "--save_interval must be 0 or a positive multiple of --accumulation_steps (3), got 7"),
    (-3, "--save_interval must be 0 or a positive multiple of --accumulation_steps (3), got -3"),
])
def test_window_error(value, expected):
    assert window_error("save_interval", value, 3) == expected


@pytest.mark.parametrize("fields,name", [
    ((0, 1, 1), "iters"), ((5, 0, 1), "accumulation_steps"), ((5, 1, 0), "epochs"), ((5.0, 1, 1), "iters"),
])
def test_bad_plan_names_the_argument(fields, name):
    with pytest.raises(ValueError, match=f"UpdatePlan: {name} must be an int >= 1"):
        UpdatePlan(*fields)


@pytest.mark.parametrize("call,message", [
    (lambda: TAIL.closes_update(0), r"step must be in \[1, iters=20\], got 0"),
    (lambda: TAIL.closes_update(21), r"step must be in \[1, iters=20\], got 21"),
    (lambda: TAIL.update_index(0, 21), r"step must be in \[0, iters=20\], got 21"),
    (lambda: TAIL.update_index(0, -1), r"step must be in \[0, iters=20\], got -1"),
    (lambda: TAIL.position(0), "micro_steps must be >= 1, got 0"),
    (lambda: TAIL.eval_steps(0, 0), "eval_interval must be >= 1, got 0"),
])
def test_bad_argument_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
