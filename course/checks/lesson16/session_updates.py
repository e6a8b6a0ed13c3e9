"""Lesson 16 checks of ``TrainingSession`` over several updates: K = 1, a run of updates that differ in
micro-step count, lr, clipping and valid targets (a micro-batch without any), an abort between them.
Each update's gradient is compared with one backward of its global batch on the parameters it started
from; a wrong gradient comes with the cause its shape points at (``update_gradient_hint``)."""
from __future__ import annotations

import torch

from course.protocol.text import naive_mean_step, token_nll_sum, token_weighted_step
from course.protocol.types import TrainingStepOptions
from course.runs import (capture_grads, global_batch_gradients, grads_of, masked_micro_batches, new_session,
                         params_of, run_update, session_model)

from ..framework import CheckFailure, check, expect_close, expect_equal, expect_tensors_close, fail
from .checks import GRAD_ATOL, GRAD_RTOL, rule

# 11 micro-batches of 2 samples (labels[i, cut:] = -100); valid shifted targets per micro-batch:
# 29, 10, 1 | 0, 16 | 8, 30, 3 | 12, 4, 30
UPDATE_CUTS = ((16, 15), (9, 3), (2, 0), (1, 0), (16, 2), (5, 5), (16, 16), (3, 2), (7, 7), (3, 3), (16, 16))


def _flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.detach().reshape(-1).double() for _, g in sorted(grads.items())])


def _gradients_of(batches, params: dict, weight) -> torch.Tensor:
    """Flat gradient of sum_i weight(batch_i) * NLL sum_i on the tiny model holding ``params``."""
    model = session_model(params)
    for batch in batches:
        (token_nll_sum(model(batch.input_ids).logits, batch.labels) * weight(batch)).backward()
    return _flat(grads_of(model))


def _close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool(torch.linalg.vector_norm(actual - expected) <= 1e-4 * torch.linalg.vector_norm(expected))


def update_gradient_hint(captured: dict, expected: dict, batches, params: dict) -> str:
    """The cause a wrong update gradient points at (computed on failure only): the mean of micro-batch means,
    the last micro-batch alone, or the right direction scaled by K, 1/K or N."""
    got, want = _flat(captured), _flat(expected)
    k, units = len(batches), sum(b.loss_units for b in batches)
    if k > 1 and _close(got, _gradients_of(batches, params, lambda b: 1 / (k * max(b.loss_units, 1)))):
        return ("the gradient is the mean of micro-batch means (loss / K): weight each micro-batch's loss by "
                "gradient_units / normalization_units")
    if k > 1 and _close(got, _gradients_of(batches[-1:], params, lambda b: 1 / units)):
        return "only the last micro-batch's gradient is left: are gradients zeroed before the update closes?"
    ratio = float(got @ want / (want @ want))
    if not _close(got, ratio * want):
        return ""
    causes = {k: "the losses were summed, not weighted (loss * K?)", 1 / k: "the loss was divided by K on top",
              units: "the loss was not divided by normalization_units"}
    cause = next((text for factor, text in causes.items() if factor != 1 and abs(ratio / factor - 1) < 1e-3), "")
    return (f"the gradient points the right way but is {ratio:.4g} x the expected one (K={k}, N={units})"
            + (f": {cause}" if cause else ""))


def expect_update_gradient(what: str, captured: dict, batches, params: dict) -> dict:
    """The captured gradient of an update over ``batches`` (started from ``params``) against one backward of
    the global batch; returns that oracle gradient."""
    expected, _, _ = global_batch_gradients(batches, params)
    if not captured:
        fail(f"{what}: before_update hook at the update boundary", "never called", "called once before the step")
    try:
        expect_tensors_close(what, captured, expected, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    except CheckFailure as exc:
        cause = update_gradient_hint(captured, expected, batches, params)
        raise CheckFailure(f"{exc}\n  hint: {cause}" if cause else str(exc)) from None
    return expected


def clip_coefficient(grads: dict, clip: float) -> float:
    """clip_grad_norm_'s factor: min(1, clip / (||g|| + 1e-6)); 1 when clipping is off (clip <= 0)."""
    norm = float(torch.linalg.vector_norm(_flat(grads)))
    return min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0


def expect_sgd_step(what: str, model, before: dict, grads: dict, lr: float, clip: float) -> None:
    """Parameters after one SGD update: before - lr * coefficient * g, with a hint when they moved by the
    unclipped step or by a step clipped to another norm."""
    coefficient = clip_coefficient(grads, clip)
    after = params_of(model)
    expected = {n: before[n] - lr * coefficient * g for n, g in grads.items()}
    try:
        expect_tensors_close(f"{what}: parameters after the SGD update (lr {lr}, clip_grad_norm {clip})", after,
                             expected, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    except CheckFailure as exc:
        moved = _flat({n: before[n] - after[n] for n in grads})
        step = float(moved @ _flat(grads)) / float(_flat(grads) @ _flat(grads))   # lr x coefficient it applied
        norm = float(torch.linalg.vector_norm(_flat(grads)))
        cause = (f"the update moved by lr x {step / lr:.4g} x g (expected lr x {coefficient:.4g} x g; "
                 f"||g|| = {norm:.4g})")
        if coefficient < 1 and abs(step / lr - 1) < 1e-3:
            cause += ": no clipping, the update is larger than clip_grad_norm allows"
        elif coefficient < 1 and abs(step / lr / coefficient - 1) > 1e-3:
            cause += f": clipped to a norm of {step / lr * norm:.4g}, not clip_grad_norm={clip}"
        elif abs(step / lr - coefficient) > 1e-3 * coefficient:
            cause += (f": the step used lr {step / coefficient:.4g}, not options.lr={lr} (without options.lr: the "
                      "optimizer's own): write options.lr into the param groups before the step")
        raise CheckFailure(f"{exc}\n  hint: {cause}") from None


def _update(session, batches, *, units=None, lr=None, clip=0.0, force_last=True, **hooks):
    """One update, each micro-step's report as (parameters_updated, optimizer_step, microsteps, aborted)."""
    units = sum(b.loss_units for b in batches) if units is None else units
    reports = []
    for i, batch in enumerate(batches):
        options = TrainingStepOptions(lr=lr, clip_grad_norm=clip, normalization_units=units,
                                      force_update=force_last and i == len(batches) - 1, **hooks)
        try:
            reports.append(session.train_step(batch, options, token_weighted_step))
        except ValueError as exc:   # every input is valid, a micro-batch without valid targets too
            fail(f"train_step on a micro-batch with {batch.loss_units} valid targets (normalization_units {units})",
                 f"ValueError: {exc}", "a report (gradient_units 0 is allowed: that micro-batch adds nothing)",
                 "hint: the rule: gradient_units 0 (a micro-batch without a valid target, all padding) is allowed and "
                 "adds nothing to the update; only gradient_units < 0 and normalization_units < 1 are refused")
    return reports, [(r.parameters_updated, r.optimizer_step, r.microsteps_accumulated, r.aborted) for r in reports]


@check("TrainingSession", objective="update_boundary")
def session_k1_every_microstep_is_an_update(impl):
    """K=1: every micro-step closes its own update without force_update, normalized by its own units (down to
    normalization_units=1, the smallest allowed)."""
    batches = masked_micro_batches()[::3]
    session = new_session(impl, 1)
    for i, batch in enumerate(batches):     # 29 and 1 valid targets
        before, captured = params_of(session.model), {}
        reports, summary = _update(session, [batch], force_last=False, before_update=capture_grads(session, captured))
        with rule("an update closes at the K-th micro-step, K = the accumulation_steps the session was "
                  "built with; K = 1: every micro-step is an update of its own"):
            expect_equal(f"K=1, micro-step {i + 1}: (parameters_updated, optimizer_step, microsteps_accumulated, "
                         "aborted)", summary, [(True, i + 1, 1, False)])
        grads = expect_update_gradient(f"K=1, update {i + 1} ({batch.loss_units} valid targets): gradient",
                                       captured, [batch], before)
        expect_sgd_step(f"K=1, update {i + 1}", session.model, before, grads, 0.1, 0.0)
        expect_equal(f"K=1, update {i + 1}: loss_units", reports[-1].loss_units, batch.loss_units)


@check("TrainingSession", objective="token_weighting", hidden=True)
def session_weights_by_gradient_units(impl):
    """A step_fn whose gradient_units is not its loss_units (naive_mean_step: the micro-batch MEAN counts as 1
    unit, loss_units = its n_k valid targets), normalization_units = K: the update's gradient is the sum of
    mean_k / K (the mean of micro-batch means), for K = 2 and 4; the report's loss_units is the sum of the n_k."""
    batches = masked_micro_batches()
    for k in (2, 4):
        session = new_session(impl, k)
        before, captured = params_of(session.model), {}
        report = run_update(session, batches[:k], units=k, step_fn=naive_mean_step,
                            before_update=capture_grads(session, captured))[-1]
        model = session_model(before)
        for batch in batches[:k]:
            (naive_mean_step(model, batch).loss / k).backward()
        with rule("each micro-step backpropagates loss * gradient_units / normalization_units: gradient_units "
                  "weighs the gradient, loss_units only counts targets for the reported loss"):
            expect_tensors_close(f"gradient of a naive_mean_step update (K={k}, gradient_units 1, loss_units "
                                 f"{[b.loss_units for b in batches[:k]]})", captured, grads_of(model),
                                 rtol=GRAD_RTOL, atol=GRAD_ATOL)
        with rule("the report's loss_units is the sum of the micro-steps' output.loss_units (the targets the "
                  "loss_sum covers), whatever gradient_units weighed the backward"):
            expect_equal(f"loss_units reported by a naive_mean_step update (K={k}, gradient_units {k} in all)",
                         report.loss_units, sum(b.loss_units for b in batches[:k]))


@check("TrainingSession", objective="update_boundary", hidden=True)
def session_consecutive_updates_start_clean(impl):
    """K=3, four updates in a row, each starting from a clean state: 3 micro-steps at the optimizer's lr; a tail
    of 2 (force_update) at lr 0.025 whose first micro-batch has no valid target; an aborted one; 3 micro-steps
    at lr 0.3 clipped hard. Each gradient is its own global batch's, on the parameters it started from."""
    batches = masked_micro_batches(UPDATE_CUTS)
    session = new_session(impl, 3)
    plan = [("update 1 (3 micro-steps, K=3)", batches[0:3], None, 0.0, [(False, 0, 1, False), (False, 0, 2, False),
                                                                          (True, 1, 3, False)]),
            ("update 2 (tail of 2, no valid target in the 1st)", batches[3:5], 0.025, 50.0,
             [(False, 1, 1, False), (True, 2, 2, False)]),
            ("update 4 (3 micro-steps after an abort)", batches[8:11], 0.3, 0.05,
             [(False, 2, 1, False), (False, 2, 2, False), (True, 3, 3, False)])]
    for number, (what, members, lr, clip, expected_reports) in enumerate(plan):
        if number == 2:
            before = params_of(session.model)
            _, summary = _update(session, batches[5:8], before_update=lambda: True)
            with rule("an update aborted by before_update reports aborted=True, takes no optimizer step and leaves "
                      "the parameters as they were"):
                expect_equal("update 3, aborted by before_update: reports", summary,
                             [(False, 2, 1, False), (False, 2, 2, False), (False, 2, 3, True)])
                expect_tensors_close("parameters after the aborted update 3", params_of(session.model), before,
                                     rtol=0.0, atol=0.0)
        before, captured = params_of(session.model), {}
        reports, summary = _update(session, members, lr=lr, clip=clip, before_update=capture_grads(session, captured))
        with rule("one optimizer step per update that is not aborted; an update closes at its K-th "
                  "micro-step or on force_update; an abort reports aborted=True and does not advance "
                  "optimizer_step"):
            expect_equal(f"{what}: (parameters_updated, optimizer_step, microsteps_accumulated, aborted) per "
                         "micro-step", summary, expected_reports)
        grads = expect_update_gradient(f"{what}: accumulated gradient vs one global-batch backward", captured,
                                       members, before)
        expect_sgd_step(what, session.model, before, grads, 0.1 if lr is None else lr, clip)
        _, nll_sum, units = global_batch_gradients(members, before)
        with rule("each update starts clean: when an update closes (stepped, skipped or aborted) its "
                  "micro-step count AND its loss totals go back to 0"):
            expect_equal(f"{what}: loss_units", reports[-1].loss_units, units)
            expect_close(f"{what}: loss_sum", float(reports[-1].loss_sum), float(nll_sum), rtol=1e-6)
            expect_equal(f"{what}: session.microsteps_accumulated after it", session.microsteps_accumulated, 0)
