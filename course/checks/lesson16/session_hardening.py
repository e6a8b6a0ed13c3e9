"""Lesson 16's hardening checks of ``TrainingSession`` (graded by ``check 16 --all``): the reports and gradients
the objectives do not use, argument rules, and errors by name.
"""
from __future__ import annotations

from copy import deepcopy
from dataclasses import replace

import torch

from course.protocol.text import token_weighted_step
from course.protocol.types import AccumulationInvalidError, TrainingStepOptions, TrainingStepOutput
from course.runs import (SESSION_SCENARIO, global_batch_gradients, masked_micro_batches, new_session, params_of,
                         run_update, tiny_model)
from course.runs.eager import eager

from ..framework import check, expect_close, expect_equal, expect_raises, expect_tensors_close
from .checks import rule
from .session import fail_an_update, gradient_norm, lrs, none_grads

@check("TrainingSession")
def session_reports_totals_only_when_an_update_closes(impl):
    """A micro-step that does not close the update reports loss_sum None and loss_units 0, and so does the one
    whose before_update aborts it (its totals were dropped with its gradients); with clipping off (clip_grad_norm
    0) the closing report's grad_norm is None."""
    batches = masked_micro_batches()
    session = new_session(impl, 4)
    reports = run_update(session, batches)
    with rule("the totals belong to the report that closes the update: the others carry loss_sum None and "
              "loss_units 0 (TrainingStepReport's defaults)"):
        expect_equal("(loss_sum, loss_units) reported by the micro-steps inside the update",
                     [(r.loss_sum, r.loss_units) for r in reports[:-1]], [(None, 0)] * 3)
    aborted = run_update(session, batches[:2], before_update=lambda: True)[-1]
    with rule("an aborted update closes nothing: its report carries no totals (loss_sum None, loss_units 0, "
              "grad_norm None), they were dropped with its gradients"):
        expect_equal("(loss_sum, loss_units, grad_norm) reported by an update that before_update aborted",
                     (aborted.loss_sum, aborted.loss_units, aborted.grad_norm), (None, 0, None))
    with rule("grad_norm is None when clipping is off (clip_grad_norm 0): no norm was computed"):
        expect_equal("grad_norm reported with clip_grad_norm=0", reports[-1].grad_norm, None)


@check("TrainingSession")
def session_leaves_no_gradient_tensors(impl):
    """Closing an update, aborting one and reset_accumulation() leave every .grad None
    (zero_grad(set_to_none=True)), not a zero tensor: AdamW decays a parameter whose gradient is a zero tensor."""
    batches = masked_micro_batches()[:2]
    session = new_session(impl, 2)

    def reset_inside_an_update():
        session.train_step(batches[0], TrainingStepOptions(normalization_units=39), token_weighted_step)
        session.reset_accumulation()
    for what, act in (("a stepped update", lambda: run_update(session, batches)),
                      ("an aborted update", lambda: run_update(session, batches, before_update=lambda: True)),
                      ("reset_accumulation() inside an update", reset_inside_an_update)):
        act()
        with rule("closing an update (stepped, skipped or aborted) and reset_accumulation() drop the gradients: "
                  "every .grad is None (zero_grad(set_to_none=True)), not a zero tensor"):
            expect_equal(f"parameters whose .grad is not None after {what}", none_grads(session.model), [])


@check("TrainingSession")
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
                         none_grads(model), [])
        run_update(session, batches, before_update=lambda: True)


SESSION_ARGUMENTS = ("model", "optimizer", "accumulation_steps", "scaler", "autocast")


@check("TrainingSession")
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
    with rule("a rejected call changes nothing: validate normalization_units before writing options.lr"):
        expect_tensors_close("parameters after a rejected update", params_of(session.model), before,
                             rtol=0.0, atol=0.0)
        expect_equal("optimizer_step after a rejected update", session.optimizer_step, 0)
        expect_equal("lrs of the 2 param groups after rejected calls with options.lr=0.5", lrs(session), [0.1, 0.05])
    for k in (0, -2):
        with rule("accumulation_steps < 1 is a ValueError naming accumulation_steps"):
            expect_raises(f"TrainingSession(accumulation_steps={k})", lambda: new_session(impl, k), ValueError,
                          "accumulation_steps", arguments=SESSION_ARGUMENTS)


@check("TrainingSession")
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
    with rule("a rejected call changes nothing: validate lr and clip_grad_norm before writing options.lr"):
        expect_tensors_close("parameters after rejected calls", params_of(session.model), before, rtol=0.0,
                             atol=0.0)
        expect_equal("optimizer_step after rejected calls", session.optimizer_step, 0)
        expect_equal("lrs of the 2 param groups after rejected calls with options.lr=0.5", lrs(session), [0.1, 0.05])


@check("TrainingSession")
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


@check("TrainingSession")
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


@check("TrainingSession")
def session_keeps_normalization_units_within_an_update(impl):
    """normalization_units may not change inside an update: a different value is a ValueError naming it."""
    batches = masked_micro_batches()
    session = new_session(impl, 2)
    session.train_step(batches[0], TrainingStepOptions(normalization_units=39), token_weighted_step)
    with rule("normalization_units is fixed for the whole update: a different value inside it is a "
              "ValueError naming normalization_units"):
        expect_raises("normalization_units 39 -> 40 inside one update",
                      lambda: session.train_step(batches[1], TrainingStepOptions(normalization_units=40),
                                                 token_weighted_step), ValueError, "normalization_units")


@check("TrainingSession")
def session_names_the_invalid_accumulation(impl):
    """After an error inside train_step, later calls raise AccumulationInvalidError naming reset_accumulation();
    a KeyboardInterrupt (a BaseException, not an Exception: Ctrl-C in a notebook) in step_fn or in backward
    invalidates the accumulation too; state().accumulation_valid is False until reset_accumulation()."""
    batches = masked_micro_batches()[:2]
    for where, error in (("step_fn", RuntimeError), ("step_fn", KeyboardInterrupt),
                         ("backward (a gradient hook)", KeyboardInterrupt)):
        session = new_session(impl, 2)
        fail_an_update(session, batches, where, error)
        what = f"{where} ({error.__name__})"
        with rule("ANY exception inside train_step, a BaseException such as KeyboardInterrupt included (except "
                  "BaseException, re-raised), makes every later call raise AccumulationInvalidError naming "
                  "reset_accumulation()"):
            expect_raises(f"train_step after an error in {what} (before reset_accumulation)",
                          lambda: run_update(session, batches), AccumulationInvalidError, "reset_accumulation")
        with rule("state().accumulation_valid is the session's flag as it is now: False after an error, True again "
                  "after reset_accumulation()"):
            expect_equal(f"state().accumulation_valid after an error in {what}", session.state().accumulation_valid,
                         False)
            session.reset_accumulation()
            expect_equal("state().accumulation_valid after reset_accumulation()", session.state().accumulation_valid,
                         True)


@check("TrainingSession")
def session_load_state_only_at_a_boundary(impl):
    """load_state raises ValueError naming microsteps_accumulated, changing nothing, when the saved state or the
    session is inside an update; state().lr is param group 0's lr."""
    batches = masked_micro_batches()[:2]
    saved_from = new_session(impl, 2, two_param_groups=True)
    run_update(saved_from, batches, lr=0.025)
    boundary = saved_from.state()
    saved_from.train_step(batches[0], TrainingStepOptions(lr=0.0125, normalization_units=39), token_weighted_step)
    inside = saved_from.state()
    with rule("state().microsteps_accumulated counts the micro-steps of the update in progress"):
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
                     (saved_from.optimizer_step, lrs(saved_from)), (1, [0.0125, 0.0125]))
