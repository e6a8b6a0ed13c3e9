"""Lesson 16 checks of ``TrainingSession``: the update boundary, global normalization, clipping, errors
and aborts, hooks, lr and state.

The core checks (an ``objective``) drive the session with valid inputs only and grade what the objective
says; whatever else they could assert (argument rules, exception types and messages, ``None`` versus zero
gradients, report fields the objectives do not use) is graded by the hardening checks in ``session_hardening``.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from course.protocol.text import token_weighted_step
from course.protocol.types import TrainingStepOptions
from course.runs import capture_grads, global_batch_gradients, masked_micro_batches, new_session, params_of, run_update

from ..framework import check, expect_close, expect_equal, expect_tensors_close, fail
from .checks import GRAD_ATOL, GRAD_RTOL, rule
from .session_updates import expect_sgd_step, expect_update_gradient

INVALID_RULE = ("after any exception inside train_step every later train_step raises (AccumulationInvalidError) "
                "until reset_accumulation(): a half-built update never reaches an optimizer step")


def expect_refused(what: str, call, rule_text: str = INVALID_RULE) -> None:
    """``call()`` raises: the half-built update is refused. Any exception passes here; its type and message
    (AccumulationInvalidError naming reset_accumulation) are the hardening tier's."""
    try:
        call()
    except NotImplementedError:
        raise
    except Exception:
        return
    fail(what, "returned (the half-built update went on)", "an exception (AccumulationInvalidError)",
         f"hint: the rule: {rule_text}")


def lrs(session) -> list:
    return [group["lr"] for group in session.optimizer.param_groups]


def none_grads(model) -> list[str]:
    """The parameters of ``model`` whose ``.grad`` is a tensor (a zero one included), not None."""
    return [name for name, param in model.named_parameters() if param.grad is not None]


# --- core: the update boundary, token weighting, clipping --------------------------------------

@check("TrainingSession", objective="update_boundary")
def session_two_microsteps_one_optimizer_step(impl):
    """K=2: the first micro-step reports no update and leaves parameters alone; the second steps exactly once."""
    session = new_session(impl, 2)
    steps = []
    session.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    before = params_of(session.model)
    batches = masked_micro_batches()[:2]
    units = sum(b.loss_units for b in batches)
    first = session.train_step(batches[0], TrainingStepOptions(normalization_units=units), token_weighted_step)
    with rule("an update of K micro-steps closes at the K-th: the micro-steps before it only accumulate "
              "gradients (no optimizer step, parameters untouched)"):
        expect_equal("first micro-step (K=2): (parameters_updated, optimizer_step, microsteps_accumulated)",
                     (first.parameters_updated, first.optimizer_step, first.microsteps_accumulated), (False, 0, 1))
        expect_equal("optimizer.step calls after micro-step 1 of 2", len(steps), 0)
        expect_tensors_close("parameters before the update boundary", params_of(session.model), before,
                             rtol=0.0, atol=0.0)
    second = session.train_step(batches[1], TrainingStepOptions(normalization_units=units), token_weighted_step)
    with rule("the K-th micro-step closes the update with exactly one optimizer step, counted in optimizer_step"):
        expect_equal("second micro-step (K=2): (parameters_updated, optimizer_step, microsteps_accumulated)",
                     (second.parameters_updated, second.optimizer_step, second.microsteps_accumulated), (True, 1, 2))
        expect_equal("optimizer.step calls after 2 micro-steps with K=2", len(steps), 1)
        expect_equal("session.optimizer_step after one update", session.optimizer_step, 1)
        if all(torch.equal(p, before[n]) for n, p in params_of(session.model).items()):
            fail("parameters after the update", "unchanged", "changed by the optimizer step")


@check("TrainingSession", objective="update_boundary")
def session_force_update_commits_a_tail(impl):
    """K=4 but only 2 micro-batches left: force_update on the second commits them as one update."""
    session = new_session(impl, 4)
    reports = run_update(session, masked_micro_batches()[:2])
    with rule("an update closes at its K-th micro-step OR on options.force_update (the short tail "
              "the driver marks), whichever comes first"):
        expect_equal("parameters_updated per micro-step (K=4, force_update on the 2nd)",
                     [r.parameters_updated for r in reports], [False, True])
        expect_equal("microsteps_accumulated of the tail update", reports[-1].microsteps_accumulated, 2)
        expect_equal("session.optimizer_step after the tail", session.optimizer_step, 1)
        expect_equal("session.microsteps_accumulated after the tail", session.microsteps_accumulated, 0)


@check("TrainingSession", objective="token_weighting")
def session_global_normalization_matches_one_backward(impl):
    """Unequal valid tokens per micro-batch (29, 10, 2, 1): accumulated gradient == one global-batch backward;
    the closing report carries the update's NLL sum (a device tensor) and its valid targets."""
    batches = masked_micro_batches()
    session = new_session(impl, 4)
    before, captured = params_of(session.model), {}
    reports = run_update(session, batches, before_update=capture_grads(session, captured))
    expect_update_gradient("accumulated gradient vs one global-batch backward", captured, batches, before)
    _, nll_sum, units = global_batch_gradients(batches)
    last = reports[-1]
    with rule("the report that closes an update carries its totals: loss_units = the outputs' loss_units "
              "summed, loss_sum = their loss_sum summed, kept as a tensor on the device (the driver reads "
              "every pending loss back in one host copy)"):
        expect_equal("loss_units reported at the boundary", last.loss_units, units)
        if not torch.is_tensor(last.loss_sum):
            fail("loss_sum reported at the boundary", type(last.loss_sum).__name__, "a device tensor (read back later)")
        expect_close("loss_sum at the boundary (NLL sum of the global batch)", float(last.loss_sum), float(nll_sum),
                     rtol=1e-6)


def gradient_norm(grads: dict) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))


@check("TrainingSession", objective="clipping")
def session_grad_norm_is_pre_clip(impl):
    """clip_grad_norm > 0: the reported norm is the pre-clip norm of the global-batch gradient."""
    batches = masked_micro_batches()
    expected, _, _ = global_batch_gradients(batches)
    report = run_update(new_session(impl, 4), batches, clip=0.01)[-1]
    with rule("grad_norm is the norm of the update's whole gradient BEFORE clipping (what clip_grad_norm_ "
              "returns)"):
        expect_close("grad_norm (pre-clip) of the update", report.grad_norm and float(report.grad_norm),
                     gradient_norm(expected), rtol=1e-5)


@check("TrainingSession", objective="clipping", hidden=True)
def session_clips_the_update(impl):
    """One SGD update per (clip_grad_norm, lr): clipped hard (0.01), to half the norm, not at all (a bound far
    above the norm) and off (0): the step is -lr * g * min(1, clip / (||g|| + 1e-6)) (clip_grad_norm_'s
    coefficient); with clipping on, grad_norm is the pre-clip norm."""
    batches = masked_micro_batches()
    grads, _, _ = global_batch_gradients(batches)
    norm = gradient_norm(grads)
    for clip, lr in ((0.01, 0.1), (norm / 2, 0.025), (norm * 100, 0.3), (0.0, 0.1)):
        session = new_session(impl, 4)
        before = params_of(session.model)
        report = run_update(session, batches, clip=clip, lr=lr)[-1]
        expect_sgd_step(f"one update, ||g|| = {norm:.4g}", session.model, before, grads, lr, clip)
        if clip > 0:
            with rule("grad_norm is the pre-clip norm of the gradient when clip_grad_norm > 0"):
                expect_close(f"grad_norm reported with clip_grad_norm={clip:.4g}",
                             report.grad_norm and float(report.grad_norm), norm, rtol=1e-5)


# --- core: aborts, errors, hooks, lr ---------------------------------------------------------------

@check("TrainingSession", objective="failure_safety", hidden=True)
def session_abort_discards_the_update(impl):
    """before_update -> True: no step, parameters unchanged; the next update does not reuse those gradients.
    With an enabled GradScaler (scale 2**10) before_update sees the gradients still scaled (it runs before
    unscale_), and the update after an abort goes through the scaler normally."""
    batches = masked_micro_batches()
    for scale in (1.0, 2.0 ** 10):
        scaler = torch.amp.GradScaler("cpu", init_scale=scale) if scale > 1 else None
        session = new_session(impl, 2, scaler=scaler)
        before, seen, captured = params_of(session.model), {}, {}
        capture = capture_grads(session, seen)
        reports = run_update(session, batches[:2], before_update=lambda: capture() or True)
        with rule("before_update returning True aborts the update: no optimizer step, the report says "
                  "aborted=True, parameters_updated=False"):
            expect_equal(f"aborted update (GradScaler scale {scale:g}): (parameters_updated, aborted, "
                         "optimizer_step)", (reports[-1].parameters_updated, reports[-1].aborted,
                                             session.optimizer_step), (False, True, 0))
            expect_tensors_close("parameters after an aborted update", params_of(session.model), before,
                                 rtol=0.0, atol=0.0)
        with rule("before_update runs before unscale_ and the optimizer step: with an enabled GradScaler it "
                  "sees the accumulated gradients still multiplied by the scale"):
            expect_tensors_close(f"gradient seen by an aborting before_update / scale {scale:g}",
                                 {n: g / scale for n, g in seen.items()}, global_batch_gradients(batches[:2])[0],
                                 rtol=GRAD_RTOL, atol=GRAD_ATOL)
        run_update(session, batches[2:], before_update=capture_grads(session, captured))
        expected, _, _ = global_batch_gradients(batches[2:])
        with rule("a before_update abort drops the aborted update's gradients (and counters): the next "
                  "update starts clean"):
            expect_tensors_close(f"gradient of the update after an abort / scale {scale:g} (must not contain "
                                 "the aborted one)", {n: g / scale for n, g in captured.items()}, expected,
                                 rtol=GRAD_RTOL, atol=GRAD_ATOL)
            expect_equal("optimizer_step after the update that follows an abort", session.optimizer_step, 1)


@check("TrainingSession", objective="failure_safety", hidden=True)
def session_error_invalidates_the_accumulation(impl):
    """A step_fn error mid-update: later calls are refused until reset_accumulation(); then a clean update
    follows."""
    batches = masked_micro_batches()
    session = new_session(impl, 3)
    units = sum(b.loss_units for b in batches[:3])
    session.train_step(batches[0], TrainingStepOptions(normalization_units=units), token_weighted_step)

    def broken_step(model, batch):
        raise RuntimeError("data error in micro-step 2")
    try:
        session.train_step(batches[1], TrainingStepOptions(normalization_units=units), broken_step)
    except RuntimeError:
        pass
    else:
        fail("train_step with a step_fn that raises", "returned", "the step_fn's RuntimeError propagates")
    expect_refused("train_step after a failed micro-step (before reset_accumulation)",
                   lambda: session.train_step(batches[1], TrainingStepOptions(normalization_units=units),
                                              token_weighted_step))
    with rule(INVALID_RULE):
        expect_equal("optimizer_step after the failure", session.optimizer_step, 0)
    session.reset_accumulation()
    captured: dict = {}
    run_update(session, batches[2:], before_update=capture_grads(session, captured))
    expected, _, _ = global_batch_gradients(batches[2:])
    with rule("reset_accumulation() drops the half-built gradients and counters: the next update starts clean"):
        expect_tensors_close("gradient of the first update after reset_accumulation()", captured, expected,
                             rtol=GRAD_RTOL, atol=GRAD_ATOL)


def raising(where: str, error: type = RuntimeError):
    """A hook (step_fn, before_update, after_update or a gradient hook) that raises ``error``."""
    def hook(*_):
        raise error(f"error in {where}")
    return hook


def fail_an_update(session, batches, where: str, error: type) -> None:
    """One update of ``session`` in which ``where`` (backward: a gradient hook; or a hook of the options) raises
    ``error``; the error must propagate."""
    hooks = {} if where.startswith("backward") else {where: raising(where, error)}   # run_update's keywords
    handle = session.model.model.norm.weight.register_hook(raising(where, error)) if not hooks else None
    try:
        run_update(session, batches, **hooks)
    except error as exc:
        if "error in" not in str(exc):
            raise
    else:
        fail(f"an update whose {where} raises {error.__name__}", "returned", f"the {error.__name__} propagates")
    finally:
        if handle is not None:
            handle.remove()


@check("TrainingSession", objective="failure_safety", hidden=True)
def session_error_anywhere_invalidates_the_accumulation(impl):
    """Not only step_fn: an error in backward, in before_update or in after_update also makes the next call
    refused until reset_accumulation(); then the next update steps."""
    batches = masked_micro_batches()[:2]
    for where in ("backward (a gradient hook)", "before_update", "after_update"):
        session = new_session(impl, 2)
        fail_an_update(session, batches, where, RuntimeError)
        expect_refused(f"train_step after an error in {where} (before reset_accumulation)",
                       lambda: run_update(session, batches),
                       "ANY exception inside train_step (step_fn, backward, before_update, after_update) invalidates "
                       "the accumulation, not only one from step_fn: wrap the whole micro-step")
        session.reset_accumulation()
        reports = run_update(session, batches)
        with rule("reset_accumulation() makes the session accept micro-steps again"):
            expect_equal(f"the update after reset_accumulation() (error was in {where}): parameters_updated",
                         reports[-1].parameters_updated, True)


@check("TrainingSession", objective="update_boundary", hidden=True)
def session_after_update_runs_after_step_before_zero_grad(impl):
    """after_update sees the new parameters and the update's gradients still in place."""
    session = new_session(impl, 2)
    before = params_of(session.model)
    seen = {}

    def after():
        seen["params_changed"] = any(not torch.equal(p, before[n]) for n, p in params_of(session.model).items())
        seen["grads_present"] = any(p.grad is not None and bool(p.grad.abs().sum() > 0)
                                    for p in session.model.parameters())
    run_update(session, masked_micro_batches()[:2], after_update=after)
    with rule("after_update runs after the optimizer step and before the gradients are cleared"):
        expect_equal("after_update observations", seen, {"params_changed": True, "grads_present": True})


def lr_hint(got: list, lr: float, construction: list) -> str:
    """The cause the param groups' lrs point at after an update with ``options.lr = lr``."""
    if got == construction and lr == 0.0:
        return ("hint: options.lr=0.0 was ignored: 0.0 is an lr (a schedule's end), not 'no lr': test "
                "options.lr is not None, not its truth")
    if got[0] == lr and any(value != lr for value in got[1:]):
        return ("hint: options.lr went into the first param group only: write it into EVERY param group "
                "(AdamW setups often have two)")
    return f"hint: the param groups hold {got}, not options.lr={lr}: write options.lr itself into every param group"


@check("TrainingSession", objective="update_boundary", hidden=True)
def session_sets_lr_in_every_group(impl):
    """options.lr lands in every param group, 0.0 (a schedule's end) included: that update leaves the parameters
    as they were."""
    batch = masked_micro_batches()[0]
    for lr in (0.025, 0.0):
        session = new_session(impl, 1, two_param_groups=True)
        construction, before = lrs(session), params_of(session.model)
        session.train_step(batch, TrainingStepOptions(lr=lr, normalization_units=batch.loss_units),
                           token_weighted_step)
        if lrs(session) != [lr, lr]:
            fail(f"lrs of the 2 param groups ({construction} before) after an update with options.lr={lr}",
                 lrs(session), [lr, lr], lr_hint(lrs(session), lr, construction))
    with rule("an update at options.lr 0.0 changes no parameter (SGD, no weight decay)"):
        expect_tensors_close("parameters after an SGD update at lr 0.0", params_of(session.model), before,
                             rtol=0.0, atol=0.0)


# --- core: the session's state across a checkpoint --------------------------------------------------

@check("TrainingSession", objective="resume", hidden=True)
def session_state_round_trip_at_a_boundary(impl):
    """state() after an update reports its lr (the last options.lr) and optimizer_step, and keeps them while the
    session trains on (a snapshot); load_state of it on a fresh session (two param groups, or one) restores both
    (the lr in every param group) and the next update counts on from there; after load_state, state() reports
    what was loaded."""
    batches = masked_micro_batches()[:2]
    saved_from = new_session(impl, 2, two_param_groups=True)
    run_update(saved_from, batches, lr=0.025)
    boundary = saved_from.state()
    with rule("state().lr is the lr param group 0 holds NOW (the last options.lr), not the optimizer's "
              "construction lr"):
        expect_equal("state().lr after one update at options.lr 0.025", boundary.lr, 0.025)
    with rule("state().optimizer_step is the number of optimizer steps taken"):
        expect_equal("state().optimizer_step after one update", boundary.optimizer_step, 1)
    run_update(saved_from, batches, lr=0.0125)
    later = saved_from.state()   # asked again, as a driver that logs or saves the state each update does
    with rule("state() returns a snapshot: a state taken at an update boundary keeps its values while the session "
              "trains on and is asked again (a new TrainingSessionState per call, never one updated in place)"):
        expect_equal("(lr, optimizer_step) of the state taken after update 1, once the session took update 2 at "
                     "lr 0.0125 and reported its state again", (boundary.lr, boundary.optimizer_step), (0.025, 1))
        expect_equal("(lr, optimizer_step) of the state taken after update 2", (later.lr, later.optimizer_step),
                     (0.0125, 2))
    for groups in (2, 1):
        restored = new_session(impl, 2, two_param_groups=groups == 2)
        restored.load_state(boundary)
        with rule("load_state restores optimizer_step: the resumed run counts on from the saved one"):
            expect_equal("optimizer_step after load_state(state at update 1)", restored.optimizer_step, 1)
        with rule("load_state writes state.lr into every param group"):
            expect_equal(f"lrs of the {groups} param group(s) after load_state(state with lr 0.025)", lrs(restored),
                         [0.025] * groups)
        report = run_update(restored, batches)[-1]
        with rule("load_state restores optimizer_step: the resumed run counts on from the saved one"):
            expect_equal("optimizer_step reported by the first update after load_state(state at update 1)",
                         report.optimizer_step, 2)
        with rule("state() reports the session as it is now: the lr param group 0 holds and optimizer_step"):
            expect_equal(f"state() (lr, optimizer_step) after that update, {groups} param group(s)",
                         (restored.state().lr, restored.state().optimizer_step), (0.025, 2))
    saved_from.load_state(replace(boundary, lr=0.05, optimizer_step=5))
    with rule("state() reports the session as it is now: after load_state, the loaded lr and optimizer_step "
              "(not the last options.lr the session saw)"):
        expect_equal("state() (lr, optimizer_step) after load_state(lr 0.05, optimizer_step 5) on a session that "
                     "trained at options.lr 0.025", (saved_from.state().lr, saved_from.state().optimizer_step),
                     (0.05, 5))
