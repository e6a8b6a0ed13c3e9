"""Lesson 16 checks of ``TrainingSession``: the update boundary, global normalization, clipping, errors
and aborts, hooks, lr and state."""
from __future__ import annotations

from copy import deepcopy
from dataclasses import replace

import torch

from course.protocol.text import token_weighted_step
from course.protocol.types import AccumulationInvalidError, TrainingStepOptions, TrainingStepOutput
from course.runs import (SESSION_SCENARIO, capture_grads, global_batch_gradients, masked_micro_batches,
                         new_session, params_of, run_update, tiny_model)
from course.runs.eager import eager

from ..framework import check, expect_close, expect_equal, expect_raises, expect_tensors_close, fail
from .checks import GRAD_ATOL, GRAD_RTOL, rule
from .session_updates import expect_sgd_step, expect_update_gradient


# --- TrainingSession: the update boundary ---------------------------------------------------

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
    expect_equal("first micro-step (K=2): (parameters_updated, optimizer_step, microsteps_accumulated)",
                 (first.parameters_updated, first.optimizer_step, first.microsteps_accumulated), (False, 0, 1))
    expect_equal("optimizer.step calls after micro-step 1 of 2", len(steps), 0)
    expect_tensors_close("parameters before the update boundary", params_of(session.model), before,
                         rtol=0.0, atol=0.0)
    second = session.train_step(batches[1], TrainingStepOptions(normalization_units=units), token_weighted_step)
    expect_equal("second micro-step (K=2): (parameters_updated, optimizer_step, microsteps_accumulated)",
                 (second.parameters_updated, second.optimizer_step, second.microsteps_accumulated), (True, 1, 2))
    expect_equal("optimizer.step calls after 2 micro-steps with K=2", len(steps), 1)
    expect_equal("session.optimizer_step after one update", session.optimizer_step, 1)
    if all(torch.equal(p, before[n]) for n, p in params_of(session.model).items()):
        fail("parameters after the update", "unchanged", "changed by the optimizer step")
    with rule("closing an update drops its gradients: every .grad is None after it "
              "(zero_grad(set_to_none=True)), not a zero tensor"):
        expect_equal("parameters whose .grad is not None after the update (zero_grad(set_to_none=True))",
                     [n for n, p in session.model.named_parameters() if p.grad is not None], [])


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
    """Unequal valid tokens per micro-batch (29, 10, 2, 1): accumulated gradient == one global-batch backward."""
    batches = masked_micro_batches()
    session = new_session(impl, 4)
    before, captured = params_of(session.model), {}
    reports = run_update(session, batches, before_update=capture_grads(session, captured))
    expect_update_gradient("accumulated gradient vs one global-batch backward", captured, batches, before)
    _, nll_sum, units = global_batch_gradients(batches)
    last = reports[-1]
    expect_equal("loss_units reported at the boundary", last.loss_units, units)
    if not torch.is_tensor(last.loss_sum):
        fail("loss_sum reported at the boundary", type(last.loss_sum).__name__, "a device tensor (read back later)")
    expect_close("loss_sum at the boundary (NLL sum of the global batch)", float(last.loss_sum), float(nll_sum),
                 rtol=1e-6)
    expect_equal("loss_sum / loss_units on micro-steps inside the update",
                 [(r.loss_sum, r.loss_units) for r in reports[:-1]], [(None, 0)] * 3)


def gradient_norm(grads: dict) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))


@check("TrainingSession", objective="clipping")
def session_grad_norm_is_pre_clip(impl):
    """clip_grad_norm > 0: the reported norm is the pre-clip norm of the global-batch gradient."""
    batches = masked_micro_batches()
    expected, _, _ = global_batch_gradients(batches)
    report = run_update(new_session(impl, 4), batches, clip=0.01)[-1]
    expect_close("grad_norm (pre-clip) of the update", report.grad_norm and float(report.grad_norm),
                 gradient_norm(expected), rtol=1e-5)


@check("TrainingSession", objective="clipping", hidden=True)
def session_clips_the_update(impl):
    """One SGD update per (clip_grad_norm, lr): clipped hard (0.01), to half the norm, not at all (a bound far
    above the norm) and off (0): the step is -lr * g * min(1, clip / (||g|| + 1e-6)) (clip_grad_norm_'s
    coefficient); grad_norm is the pre-clip norm, None when clipping is off."""
    batches = masked_micro_batches()
    grads, _, _ = global_batch_gradients(batches)
    norm = gradient_norm(grads)
    for clip, lr in ((0.01, 0.1), (norm / 2, 0.025), (norm * 100, 0.3), (0.0, 0.1)):
        session = new_session(impl, 4)
        before = params_of(session.model)
        report = run_update(session, batches, clip=clip, lr=lr)[-1]
        expect_sgd_step(f"one update, ||g|| = {norm:.4g}", session.model, before, grads, lr, clip)
        with rule("grad_norm is the pre-clip norm of the unscaled gradient when clip_grad_norm > 0, and "
                  "None when clipping is off (0)"):
            expect_close(f"grad_norm reported with clip_grad_norm={clip:.4g}",
                         report.grad_norm if report.grad_norm is None else float(report.grad_norm),
                         norm if clip > 0 else None, rtol=1e-5)


@check("TrainingSession", objective="clipping", hidden=True)
def session_optimizer_over_part_of_the_model(impl):
    """An optimizer over the model's norm weights only (its matrices trainable, not optimized), K=1: the clip norm
    is over model.parameters(), all of them; closing the update, and aborting one, leaves every .grad of the
    MODEL None."""
    batches = masked_micro_batches()[:1]
    grads, _, _ = global_batch_gradients(batches)
    model = tiny_model(SESSION_SCENARIO)
    optimizer = eager(torch.optim.SGD)([p for p in model.parameters() if p.dim() <= 1], lr=0.1)
    session = impl.TrainingSession(model, optimizer, accumulation_steps=1)
    report = run_update(session, batches, clip=0.01)[-1]
    with rule("clipping runs clip_grad_norm_ over model.parameters(), every trainable parameter, not only the "
              "optimizer's: grad_norm is the norm of the whole model's gradient"):
        expect_close("grad_norm when the optimizer holds only the model's norm weights",
                     report.grad_norm and float(report.grad_norm), gradient_norm(grads), rtol=1e-5)
    for what in ("a stepped update", "an aborted update"):
        with rule("closing an update (stepped, skipped or aborted) leaves EVERY .grad of the model None "
                  "(model.zero_grad(set_to_none=True)), a trainable parameter the optimizer does not hold "
                  "included: else its gradient piles up over the updates"):
            expect_equal(f"model parameters whose .grad is not None after {what} (optimizer over norm weights only)",
                         [n for n, p in model.named_parameters() if p.grad is not None], [])
        run_update(session, batches, before_update=lambda: True)


SESSION_ARGUMENTS = ("model", "optimizer", "accumulation_steps", "scaler", "autocast")


@check("TrainingSession", hidden=True)
def session_rejects_zero_normalization_units(impl):
    """normalization_units 0 or -1 is an explicit ValueError, and nothing is updated (the lr of every param
    group included, though the call carries options.lr); like any error inside train_step it invalidates the
    accumulation until reset_accumulation(). accumulation_steps < 1 is a ValueError too."""
    session = new_session(impl, 1, two_param_groups=True)
    before = params_of(session.model)
    batch = masked_micro_batches()[0]
    for units in (0, -1):
        options = TrainingStepOptions(lr=0.5, normalization_units=units, force_update=True)
        with rule("normalization_units (the update's valid targets) must be >= 1: 0 or a negative value "
                  "is a ValueError naming normalization_units, raised before anything is computed"):
            expect_raises(f"train_step(..., normalization_units={units})",
                          lambda: session.train_step(batch, options, token_weighted_step), ValueError,
                          "normalization_units")
        with rule("a rejected normalization_units is an error inside train_step: it changes no parameter, lr or "
                  "counter, and, like any error there, invalidates the accumulation until reset_accumulation()"):
            expect_raises(f"train_step after a rejected normalization_units={units}",
                          lambda: session.train_step(batch, TrainingStepOptions(normalization_units=29,
                                                                                force_update=True),
                                                     token_weighted_step), AccumulationInvalidError,
                          "reset_accumulation")
        session.reset_accumulation()
    expect_tensors_close("parameters after a rejected update", params_of(session.model), before,
                         rtol=0.0, atol=0.0)
    expect_equal("optimizer_step after a rejected update", session.optimizer_step, 0)
    with rule("a rejected call changes nothing: validate normalization_units before writing options.lr"):
        expect_equal("lrs of the 2 param groups after rejected calls with options.lr=0.5",
                     [g["lr"] for g in session.optimizer.param_groups], [0.1, 0.05])
    for k in (0, -2):
        expect_raises(f"TrainingSession(accumulation_steps={k})", lambda: new_session(impl, k), ValueError,
                      "accumulation_steps", arguments=SESSION_ARGUMENTS)


@check("TrainingSession", hidden=True)
def session_rejects_a_negative_lr_or_clip(impl):
    """options.lr or options.clip_grad_norm below 0 (or NaN) is a ValueError naming the option, raised before
    anything changes: no parameter, lr or counter (0.0 is valid for both: no step size, no clipping)."""
    session = new_session(impl, 1, two_param_groups=True)
    before = params_of(session.model)
    batch = masked_micro_batches()[0]
    nan = float("nan")
    for name, value in (("lr", -1e-3), ("lr", nan), ("clip_grad_norm", -1.0), ("clip_grad_norm", nan)):
        options = replace(TrainingStepOptions(lr=0.5, normalization_units=batch.loss_units, force_update=True),
                          **{name: value})
        with rule(f"{name} must be >= 0: a negative or NaN {name} is a ValueError naming {name}, raised before "
                  "anything changes (a negative clip would flip the gradients)"):
            expect_raises(f"train_step(..., {name}={value})",
                          lambda: session.train_step(batch, options, token_weighted_step), ValueError, name)
        session.reset_accumulation()
    expect_tensors_close("parameters after rejected calls", params_of(session.model), before, rtol=0.0, atol=0.0)
    expect_equal("optimizer_step after rejected calls", session.optimizer_step, 0)
    with rule("a rejected call changes nothing: validate lr and clip_grad_norm before writing options.lr"):
        expect_equal("lrs of the 2 param groups after rejected calls with options.lr=0.5",
                     [g["lr"] for g in session.optimizer.param_groups], [0.1, 0.05])


@check("TrainingSession", hidden=True)
def session_rejects_a_bad_step_output(impl):
    """step_fn must return a TrainingStepOutput (else TypeError naming it) with gradient_units >= 0 (else
    ValueError naming gradient_units); 0 is a micro-batch without valid targets, accepted. A rejected output
    is an error like any other: the accumulation is invalid until reset_accumulation()."""
    batch = masked_micro_batches()[0]
    bad_outputs = (("a bare loss tensor", lambda out: out.loss, TypeError, "TrainingStepOutput"),
                   ("gradient_units=-1", lambda out: TrainingStepOutput(out.loss, -1, out.loss_sum, out.loss_units),
                    ValueError, "gradient_units"))
    for what, edit, error, name in bad_outputs:
        session = new_session(impl, 1)
        with rule("step_fn must return a TrainingStepOutput (else a TypeError naming "
                  "TrainingStepOutput) whose gradient_units is >= 0 (else a ValueError naming "
                  "gradient_units): check the output before using it"):
            expect_raises(f"train_step with a step_fn returning {what}",
                          lambda: session.train_step(batch, TrainingStepOptions(normalization_units=29),
                                                     lambda model, b: edit(token_weighted_step(model, b))), error, name)
        expect_equal(f"optimizer_step after a step_fn returned {what}", session.optimizer_step, 0)
        with rule("a rejected step_fn output is an error inside train_step: it invalidates the accumulation "
                  "(the next call raises AccumulationInvalidError until reset_accumulation())"):
            expect_raises(f"train_step after a step_fn returned {what}",
                          lambda: session.train_step(batch, TrainingStepOptions(normalization_units=29),
                                                     token_weighted_step), AccumulationInvalidError,
                          "reset_accumulation")


@check("TrainingSession", hidden=True)
def session_rejects_an_optimizer_on_other_tensors(impl):
    """Python's counterpart of 'moving keeps optimizer references valid': the optimizer must hold the
    model's own Parameter objects in EVERY param group; one built (wholly, or its second group: decay /
    no-decay groups) on a copy is a ValueError naming optimizer."""
    model = tiny_model(SESSION_SCENARIO)
    copy = deepcopy(model)
    matrices = [p for p in model.parameters() if p.dim() > 1]
    copied_vectors = [p for p in copy.parameters() if p.dim() <= 1]
    orphans = (("optimizer over another model's parameters", list(copy.parameters())),
               ("optimizer whose 2nd param group (no decay) holds a deepcopy's parameters",
                [{"params": matrices}, {"params": copied_vectors, "weight_decay": 0.0}]))
    for what, groups in orphans:
        optimizer = eager(torch.optim.SGD)(groups, lr=0.1)
        with rule("every tensor of every param group must be one of model.parameters() (by identity)"):
            expect_raises(f"TrainingSession(model, {what})",
                          lambda: impl.TrainingSession(model, optimizer, accumulation_steps=2), ValueError,
                          "optimizer", arguments=SESSION_ARGUMENTS)


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
        expect_equal(f"aborted update (GradScaler scale {scale:g}): (parameters_updated, aborted, optimizer_step)",
                     (reports[-1].parameters_updated, reports[-1].aborted, session.optimizer_step), (False, True, 0))
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
    """A step_fn error mid-update: later calls raise until reset_accumulation(); then a clean update follows."""
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
    with rule("any exception inside train_step makes every later train_step raise "
              "AccumulationInvalidError (naming reset_accumulation()) until reset_accumulation()"):
        expect_raises("train_step after a failed micro-step (before reset_accumulation)",
                      lambda: session.train_step(batches[1], TrainingStepOptions(normalization_units=units),
                                                 token_weighted_step), RuntimeError, "reset_accumulation")
    expect_equal("optimizer_step after the failure", session.optimizer_step, 0)
    with rule("state().accumulation_valid is the session's flag as it is now: False after an error, True again "
              "after reset_accumulation()"):
        expect_equal("state().accumulation_valid after a failed micro-step", session.state().accumulation_valid,
                     False)
        session.reset_accumulation()
        expect_equal("state().accumulation_valid after reset_accumulation()", session.state().accumulation_valid,
                     True)
    with rule("reset_accumulation() drops the half-built gradients: every .grad is None "
              "(zero_grad(set_to_none=True)), not a zero tensor"):
        expect_equal("parameters whose .grad is not None after reset_accumulation() (zero_grad(set_to_none=True))",
                     [n for n, p in session.model.named_parameters() if p.grad is not None], [])
    captured: dict = {}
    run_update(session, batches[2:], before_update=capture_grads(session, captured))
    expected, _, _ = global_batch_gradients(batches[2:])
    expect_tensors_close("gradient of the first update after reset_accumulation()", captured, expected,
                         rtol=GRAD_RTOL, atol=GRAD_ATOL)


@check("TrainingSession", objective="failure_safety", hidden=True)
def session_error_anywhere_invalidates_the_accumulation(impl):
    """Not only step_fn: an error in backward, in before_update or in after_update also makes the next call
    raise AccumulationInvalidError (naming reset_accumulation) until reset_accumulation(); so does a
    KeyboardInterrupt (a BaseException, not an Exception: Ctrl-C in a notebook) in step_fn or in backward."""
    def raising(where, error=RuntimeError):
        def hook(*_):
            raise error(f"error in {where}")
        return hook
    batches = masked_micro_batches()[:2]
    cases = (("backward (a gradient hook)", RuntimeError), ("before_update", RuntimeError),
             ("after_update", RuntimeError), ("step_fn", KeyboardInterrupt),
             ("backward (a gradient hook)", KeyboardInterrupt))
    for where, error in cases:
        session = new_session(impl, 2)
        hooks = {} if where.startswith("backward") else {where: raising(where, error)}   # run_update's keywords
        handle = (session.model.model.norm.weight.register_hook(raising(where, error)) if not hooks else None)
        try:
            run_update(session, batches, **hooks)
        except error as exc:
            if "error in" not in str(exc):
                raise
        else:
            fail(f"an update whose {where} raises {error.__name__}", "returned", f"the {error.__name__} propagates")
        if handle is not None:
            handle.remove()
        where = f"{where} ({error.__name__})"
        with rule("ANY exception inside train_step (step_fn, backward, before_update, after_update), a "
                  "BaseException such as KeyboardInterrupt included (except BaseException, re-raised), "
                  "invalidates the accumulation, not only one from step_fn"):
            expect_raises(f"train_step after an error in {where} (before reset_accumulation)",
                          lambda: run_update(session, batches), AccumulationInvalidError, "reset_accumulation")
        session.reset_accumulation()
        reports = run_update(session, batches)
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
    expect_equal("after_update observations", seen, {"params_changed": True, "grads_present": True})


@check("TrainingSession", objective="update_boundary", hidden=True)
def session_sets_lr_and_normalization_is_fixed_per_update(impl):
    """options.lr lands in every param group, 0.0 (a schedule's end) included: that update leaves the parameters
    as they were; normalization_units may not change inside an update."""
    batches = masked_micro_batches()
    zero_lr = new_session(impl, 1, two_param_groups=True)
    before = params_of(zero_lr.model)
    zero_lr.train_step(batches[0], TrainingStepOptions(lr=0.0, normalization_units=29), token_weighted_step)
    with rule("options.lr, when given (not None), is the lr of every param group: 0.0 is an lr, not 'no lr' "
              "(test `is not None`, not truthiness)"):
        expect_equal("lrs of the 2 param groups (0.1 and 0.05 before) after an update with options.lr=0.0",
                     [g["lr"] for g in zero_lr.optimizer.param_groups], [0.0, 0.0])
        expect_tensors_close("parameters after an SGD update at lr 0.0", params_of(zero_lr.model), before,
                             rtol=0.0, atol=0.0)
    session = new_session(impl, 2, two_param_groups=True)
    session.train_step(batches[0], TrainingStepOptions(lr=0.025, normalization_units=39), token_weighted_step)
    with rule("options.lr goes into EVERY param group (AdamW setups often have two)"):
        expect_equal("lrs of the 2 param groups (0.1 and 0.05 before) after options.lr=0.025",
                     [g["lr"] for g in session.optimizer.param_groups], [0.025, 0.025])
    with rule("normalization_units is fixed for the whole update: a different value inside it is a "
              "ValueError naming normalization_units"):
        expect_raises("normalization_units 39 -> 40 inside one update",
                      lambda: session.train_step(batches[1], TrainingStepOptions(normalization_units=40),
                                                 token_weighted_step), ValueError, "normalization_units")


@check("TrainingSession", hidden=True)
def session_state_and_load_state_round_trip(impl):
    """state() reports lr (param group 0), optimizer_step, microsteps_accumulated, accumulation_valid; load_state
    restores optimizer_step and lr (every group) at an update boundary, and raises ValueError naming
    microsteps_accumulated, changing nothing, when the saved state or the session is inside an update."""
    def lrs(session):
        return [g["lr"] for g in session.optimizer.param_groups]
    batches = masked_micro_batches()[:2]
    saved_from = new_session(impl, 2, two_param_groups=True)
    run_update(saved_from, batches, lr=0.025)
    boundary = saved_from.state()
    with rule("state().lr is the lr param group 0 holds NOW (the last options.lr), not the "
              "optimizer's construction lr"):
        expect_equal("state() after one update at lr 0.025: (lr, optimizer_step, microsteps_accumulated, "
                     "accumulation_valid)", (boundary.lr, boundary.optimizer_step, boundary.microsteps_accumulated,
                                             boundary.accumulation_valid), (0.025, 1, 0, True))
    restored = new_session(impl, 2, two_param_groups=True)
    restored.load_state(boundary)
    with rule("load_state restores optimizer_step and writes state.lr into every param group"):
        expect_equal("after load_state(state at update 1, lr 0.025): (optimizer_step, lrs of both groups)",
                     (restored.optimizer_step, lrs(restored)), (1, [0.025, 0.025]))
    saved_from.load_state(replace(boundary, lr=0.05, optimizer_step=5))
    with rule("state() reports the session as it is now: after load_state, the loaded lr and optimizer_step "
              "(not the last options.lr the session saw)"):
        expect_equal("state() (lr, optimizer_step) after load_state(lr 0.05, optimizer_step 5) on a session that "
                     "trained at options.lr 0.025", (saved_from.state().lr, saved_from.state().optimizer_step),
                     (0.05, 5))
    saved_from.train_step(batches[0], TrainingStepOptions(lr=0.0125, normalization_units=39), token_weighted_step)
    inside = saved_from.state()
    expect_equal("state().microsteps_accumulated after 1 micro-step of 2", inside.microsteps_accumulated, 1)
    fresh = new_session(impl, 2, two_param_groups=True)
    with rule("load_state only at an update boundary: a saved state with microsteps_accumulated != "
              "0 is a ValueError naming microsteps_accumulated, nothing changed"):
        expect_raises("load_state(a state saved inside an update)", lambda: fresh.load_state(inside), ValueError,
                      "microsteps_accumulated")
    with rule("a refused load_state changes nothing, and state().lr reports param group 0's lr"):
        expect_equal("(optimizer_step, lrs, state().lr) after a refused load_state",
                     (fresh.optimizer_step, lrs(fresh), fresh.state().lr), (0, [0.1, 0.05], 0.1))
    with rule("load_state only at an update boundary: a session with microsteps_accumulated != 0 "
              "refuses it with a ValueError naming microsteps_accumulated, nothing changed"):
        expect_raises("load_state(boundary state) on a session inside an update",
                      lambda: saved_from.load_state(boundary), ValueError, "microsteps_accumulated")
    expect_equal("(optimizer_step, lrs) of the session inside an update after a refused load_state",
                 (saved_from.optimizer_step, lrs(saved_from)), (5, [0.0125, 0.0125]))
