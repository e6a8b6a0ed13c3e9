"""Lesson 14 checks of the four small functions: the cosine schedule, the loss scaling, when to step and
when to flush the tail; and the alignment report of ``python -m course align 14``.

Tolerances let algebraically equivalent code pass (``loss * (1 / K)``, a rearranged cosine) while every
catalogued mistake (``mistakes.py``) fails; the mistake-catalogue tests prove both.
"""
from __future__ import annotations

import torch

from course.minimind import get_lr

from ..framework import check, expect_close, expect_equal, expect_raises, expect_type, fail
from .loop_hints import hint

# Steps of a 20-step run where the report and the first check compare the schedule.
REPORT_LR_STEPS = (0, 1, 5, 10, 19, 20)
LR_RTOL = 1e-12          # a rearranged formula differs by a few ulps, a wrong one by >= 1e-3


def mechanics_report(impl) -> list[str]:
    """The lines ``python -m course align 14`` prints: lr differences from MiniMind's get_lr along a
    20-step run, a scaled loss and the optimizer-step positions."""
    lines = []
    for step in REPORT_LR_STEPS:
        diff = abs(impl.cosine_lr(step, 20, 5e-4) - get_lr(step, 20, 5e-4))
        lines.append(f"lr_step_{step}_diff={diff:.12f}")
    scaled = impl.scale_loss_for_accumulation(torch.tensor(8.0), 4)
    lines.append(f"scaled_loss={float(scaled):.6f}")
    lines.append(f"optimizer_step_micro_steps={optimizer_step_positions(impl, 8, 4)}")
    return lines


# --- cosine_lr -----------------------------------------------------------------------------


@check("cosine_lr", objective="schedule")
def cosine_lr_matches_get_lr(impl):
    """cosine_lr equals MiniMind's get_lr along a 20-step run and across several (T, lr)."""
    cases = [(s, 20, 5e-4) for s in REPORT_LR_STEPS] + [
        (0, 1, 1.0), (1, 1, 1.0), (3, 7, 1e-3), (333, 1000, 3e-4), (12, 12, 2.0)]
    for step, total, lr in cases:
        what = f"cosine_lr({step}, {total}, {lr})"
        with hint(endpoints_hint(impl)):
            expect_close(what, number(what, impl.cosine_lr(step, total, lr)), get_lr(step, total, lr), rtol=LR_RTOL)


def endpoints_hint(impl) -> str:
    """Where the schedule starts and ends, against MiniMind's base_lr and 0.1 * base_lr (lesson 14 §1.2)."""
    try:
        start, end = float(impl.cosine_lr(0, 100, 1.0)), float(impl.cosine_lr(100, 100, 1.0))
    except Exception:   # the comparison itself reports what went wrong
        return ""
    wrong = ([f"starts at {start:g} x base_lr instead of base_lr"] if abs(start - 1.0) > 1e-9 else []) + (
        [f"ends at {end:g} x base_lr instead of 0.1 x base_lr"] if abs(end - 0.1) > 1e-9 else [])
    if wrong:
        return f"the schedule {' and '.join(wrong)} (lesson 14 §1.2 fixes both endpoints)"
    return "both endpoints are right, the curve between them is not: half a cosine wave from s = 0 to s = T"


def number(what: str, value) -> float:
    """``value`` as a float: any number (a 0-dim tensor too) is graded by its value; its type is the hardening
    tier's (``cosine_lr_returns_a_python_float``)."""
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        fail(f"{what}: a number", f"{type(value).__name__} {value!r}", "a float")


@check("cosine_lr", objective="schedule")
def cosine_lr_endpoints(impl):
    """The schedule starts at base_lr and ends at 0.1 * base_lr (no warmup, no decay to 0)."""
    for step, expected, where in ((0, 1.0, "start"), (100, 0.1, "end"), (50, 0.55, "middle")):
        what = f"cosine_lr({step}, 100, 1.0) ({where})"
        expect_close(what, number(what, impl.cosine_lr(step, 100, 1.0)), expected, rtol=LR_RTOL)


@check("cosine_lr")
def cosine_lr_returns_a_python_float(impl):
    """The lr is a Python float (math.cos, not torch.cos): the loop writes it into optimizer.param_groups and the
    records, where a tensor would drag torch along."""
    for args in ((0, 20, 5e-4), (7, 20, 5e-4), (20, 20, 5e-4)):
        expect_type(f"cosine_lr{args}", impl.cosine_lr(*args), float,
                    detail="hint: return a Python float (math.cos, not torch.cos; no tensor)")


@check("cosine_lr")
def cosine_lr_rejects_bad_arguments(impl):
    """total_steps <= 0 and current_step outside [0, total_steps] raise ValueError naming the argument (both bad:
    total_steps, checked first)."""
    for args, argument in [((0, 0, 1e-3), "total_steps"), ((0, -5, 1e-3), "total_steps"),
                           ((-1, 0, 1e-3), "total_steps"), ((-1, 10, 1e-3), "current_step"),
                           ((11, 10, 1e-3), "current_step")]:
        expect_raises(f"cosine_lr{args}", lambda: impl.cosine_lr(*args), ValueError, argument,
                      ("current_step", "total_steps", "base_lr"))

# --- scale_loss_for_accumulation -----------------------------------------------------------


@check("scale_loss_for_accumulation", objective="loss_scaling")
def scale_loss_divides_by_k(impl):
    """loss / K, as a tensor that still carries the graph (gradient 1/K)."""
    for value, k in [(8.0, 4), (3.0, 1), (1.0, 3), (2.5, 8)]:
        loss = torch.tensor(value, requires_grad=True)
        scaled = impl.scale_loss_for_accumulation(loss, k)
        if not torch.is_tensor(scaled):
            fail(f"scale_loss_for_accumulation(tensor({value}), {k}) type", type(scaled).__name__, "Tensor")
        actual = scaled.detach().item()
        with hint(f"the loss is not divided by K={k}: return loss / K" if k > 1 and actual == value else ""):
            expect_close(f"scale_loss_for_accumulation(tensor({value}), {k})", actual, value / k, rtol=1e-6)
        if not scaled.requires_grad:
            fail("the scaled loss must stay in the autograd graph (requires_grad)", False, True)
        scaled.backward()
        if loss.grad is None:
            fail(f"d(scaled)/d(loss) for K={k}", None, 1.0 / k,
                 "hint: no gradient reached the loss: did the scaled loss lose its graph (a new tensor "
                 "built from .item() or .detach())?")
        expect_close(f"d(scaled)/d(loss) for K={k}", float(loss.grad), 1.0 / k, rtol=1e-6)


@check("scale_loss_for_accumulation")
def scale_loss_rejects_bad_k(impl):
    """accumulation_steps <= 0 raises ValueError naming accumulation_steps."""
    for k in (0, -2):
        expect_raises(f"scale_loss_for_accumulation(loss, {k})",
                      lambda: impl.scale_loss_for_accumulation(torch.tensor(1.0), k), ValueError,
                      "accumulation_steps", ("loss", "accumulation_steps"))

# --- should_step_optimizer -----------------------------------------------------------------


BOOL_HINT = "hint: return a bool (a comparison), not the int 0 / 1"


def optimizer_step_positions(impl, micro_steps: int, k: int) -> list[int]:
    return [s for s in range(1, micro_steps + 1) if impl.should_step_optimizer(s, k)]


@check("should_step_optimizer", objective="update_cadence")
def should_step_at_window_ends(impl):
    """Steps at micro-steps K, 2K, ... (1-based): 8 micro-steps with K=4 step at [4, 8]."""
    positions = optimizer_step_positions(impl, 8, 4)
    if positions != [4, 8]:
        fail("optimizer steps for micro-steps 1..8, K=4", positions, [4, 8],
             "hint: micro-steps are 1-based and windows start at micro-step 1 (1..K, K+1..2K, ...): a window "
             "closes on its K-th micro-step")
    expect_equal("optimizer steps for micro-steps 1..10, K=3", optimizer_step_positions(impl, 10, 3), [3, 6, 9])
    expect_equal("optimizer steps for micro-steps 1..3, K=1 (no accumulation)",
                 optimizer_step_positions(impl, 3, 1), [1, 2, 3])
    for step, k, expected in [(1, 4, False), (2, 4, False), (3, 4, False), (4, 4, True), (5, 1, True)]:
        expect_equal(f"should_step_optimizer({step}, {k}) (as a truth value)",
                     bool(impl.should_step_optimizer(step, k)), expected)


@check("should_step_optimizer")
def should_step_returns_a_bool(impl):
    """A bool, not the int 0 / 1: equal in an ``if``, but not the type the contract promises."""
    for step, k in ((4, 4), (3, 4), (1, 1)):
        expect_type(f"should_step_optimizer({step}, {k})", impl.should_step_optimizer(step, k), bool,
                    detail=BOOL_HINT)


@check("should_step_optimizer")
def should_step_rejects_bad_arguments(impl):
    """accumulation_steps <= 0 or step <= 0 (micro-steps are 1-based) raise ValueError naming the argument."""
    for step, k, argument in ((4, 0, "accumulation_steps"), (4, -1, "accumulation_steps"), (0, 4, "step"),
                              (-4, 4, "step"), (0, 0, "accumulation_steps")):
        expect_raises(f"should_step_optimizer({step}, {k})", lambda: impl.should_step_optimizer(step, k), ValueError,
                      argument, ("step", "accumulation_steps"))

def flush_rule(last_step: int, start_step: int, k: int, expected: bool) -> str:
    """The rule a wrong should_flush_tail answer breaks."""
    if last_step == start_step:
        return "this call ran no micro-step (last_step == start_step): no gradient of its own waits, nothing to flush"
    if start_step and not expected and last_step % k == 0:
        return (f"windows count from micro-step 1 of the epoch, not from start_step: {last_step} closes a window "
                f"of K={k}, so nothing is left over")
    if expected:
        return "micro-steps after the last window boundary are still waiting in param.grad: the tail must be flushed"
    return f"micro-step {last_step} closed a window of K={k}: nothing is left to flush"


# --- should_flush_tail ---------------------------------------------------------------------


@check("should_flush_tail", objective="tail_flush")
def should_flush_only_a_partial_window(impl):
    """Flush iff the epoch ran micro-steps (last > start) and ended inside a window (last % K != 0; the
    windows count from micro-step 1 of the epoch, not from start_step)."""
    cases = [((10, 0, 4), True), ((8, 0, 4), False), ((0, 0, 4), False), ((5, 0, 1), False),
             ((10, 8, 4), True), ((8, 8, 4), False), ((12, 9, 4), False), ((13, 12, 4), True),
             # resumed inside the last partial window: the call ran only part of it, and its micro-steps wait
             ((10, 9, 4), True), ((11, 9, 4), True),
             # a resume at start_step == last_step ran nothing: no flush even though last % K != 0
             ((5, 5, 4), False), ((6, 6, 4), False)]
    for args, expected in cases:
        actual = bool(impl.should_flush_tail(*args))
        if actual != expected:
            fail(f"should_flush_tail(last_step={args[0]}, start_step={args[1]}, K={args[2]})", actual, expected,
                 f"hint: {flush_rule(*args, expected)}")


@check("should_flush_tail")
def should_flush_returns_a_bool(impl):
    """A bool, not the int 0 / 1: equal in an ``if``, but not the type the contract promises."""
    for args in ((10, 0, 4), (8, 0, 4), (5, 5, 4)):
        expect_type(f"should_flush_tail{args}", impl.should_flush_tail(*args), bool, detail=BOOL_HINT)


@check("should_flush_tail")
def should_flush_rejects_bad_arguments(impl):
    """accumulation_steps <= 0, start_step < 0 or last_step < start_step raise ValueError naming it."""
    for args, argument in [((10, 0, 0), "accumulation_steps"), ((10, 0, -4), "accumulation_steps"),
                           ((3, 5, 4), "last_step"), ((3, -1, 4), "start_step"), ((-2, -1, 4), "start_step"),
                           ((3, 5, 0), "accumulation_steps"), ((-2, -1, 0), "accumulation_steps")]:
        expect_raises(f"should_flush_tail{args}", lambda: impl.should_flush_tail(*args), ValueError, argument,
                      ("last_step", "start_step", "accumulation_steps"))
