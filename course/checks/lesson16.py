"""Lesson 16: token-weighted accumulation and the single-step TrainingSession - descriptor, checks, mistakes.

The oracle of a session update is ONE backward of the whole global batch with the loss
``sum of NLL / valid tokens of the global batch``. Accumulating micro-batches reorders float sums,
so gradients are compared with ``atol=1e-6`` (measured difference ~1e-8; the ``loss / K`` mistake
differs by ~1e-1). Everything else (counts, flags, step positions) is compared exactly.
The DDP check lives in pytest only (tests/test_lesson16_train_session.py), it spawns processes.
"""
from __future__ import annotations

import contextlib

import torch

from course.protocol.driver import run_text_training
from course.protocol.text import shifted_target_count, token_nll_sum, token_weighted_step
from course.protocol.types import (GLOBAL_SEMANTICS, AccumulationInvalidError, TrainingRunState,
                                           TrainingStepOptions)
from course.runs import (SESSION_SCENARIO, accumulate_token_weighted, capture_grads, global_batch_gradients,
                         in_float64, masked_micro_batches, new_session, params_of, run_update, tiny_batches, tiny_model)

from .framework import (Exercise, Lesson, expect_close, expect_equal, expect_raises, expect_tensors_close,
                        fail)
from .student_tests import WrongImplementation, catalogue_weak_comparisons, grade_student_test

LESSON = Lesson(
    lesson_id="16",
    slug="token_weighted_training_session",
    title="Token-weighted gradient accumulation and the single-step TrainingSession",
    module="train_session",
    exercises=[
        Exercise("count_loss_units", "16 §4.1", points=1, hidden_points=1),
        Exercise("split_global_batch", "16 §4.2", points=1, hidden_points=1),
        Exercise("steps_per_epoch", "16 §4.2", points=1),
        Exercise("TrainingSession", "16 §4.3", points=3, hidden_points=3),
        Exercise("test_token_weighted_matches_global_batch", "16 §4.4", points=2),
        Exercise("migrate_train_state", "16 §5.4", points=1, hidden_points=1),
    ],
    labs=("lesson16_mean_of_means.py", "lesson16_token_weighted_accumulation.py", "lesson16_ddp_token_weighted.py", "bench_lesson16_session.py"),
    notebook_mistake="clip_before_unscale",
)
check = LESSON.check

GRAD_ATOL, GRAD_RTOL = 1e-6, 1e-5


# --- count_loss_units ----------------------------------------------------------------------

@check("count_loss_units")
def count_loss_units_sees_the_shift(impl):
    """Counts labels[..., 1:] != -100: position 0 is never a target, -100 anywhere never counts."""
    cases = [
        ([[5, 6, -100, -100], [-100, 7, 8, 9]], 4),     # unshifted count would be 5
        ([[1, 2, 3, 4, 5]], 4),
        ([[-100, -100, -100]], 0),
        ([[7]], 0),                                      # one position: nothing to predict
        ([3, -100, 4, 5], 2),                            # a single sequence [seq]
        ([[9, 9, 9], [9, -100, -100], [9, 9, -100]], 3),
    ]
    for labels, expected in cases:
        got = impl.count_loss_units(torch.tensor(labels))
        if not isinstance(got, int):
            fail(f"count_loss_units({labels}) type", type(got).__name__, "int (a host-side count)")
        expect_equal(f"count_loss_units({labels})", got, expected)


@check("count_loss_units", hidden=True)
def count_loss_units_rejects_bad_labels(impl):
    """A 0-dim tensor or float labels raise ValueError naming labels."""
    expect_raises("count_loss_units(tensor(3))", lambda: impl.count_loss_units(torch.tensor(3)), ValueError, "labels")
    expect_raises("count_loss_units(float labels)", lambda: impl.count_loss_units(torch.ones(2, 4)), ValueError,
                  "labels")


# --- split_global_batch / steps_per_epoch --------------------------------------------------

@check("split_global_batch")
def split_global_batch_micro_sizes(impl):
    """8 samples, global 8 / accum 4 -> four micro-batches of 2, in order; short tails split over what remains."""
    cases = [((list(range(8)), 8, 4), [[0, 1], [2, 3], [4, 5], [6, 7]]),
             ((list(range(5)), 8, 4), [[0, 1], [2, 3], [4]]),
             ((list(range(3)), 8, 4), [[0, 1], [2]]),
             ((list(range(6)), 6, 1), [[0, 1, 2, 3, 4, 5]]),
             ((list(range(6)), 6, 6), [[0], [1], [2], [3], [4], [5]])]
    for (samples, global_batch, accum), expected in cases:
        got = [list(m) for m in impl.split_global_batch(samples, global_batch, accum)]
        expect_equal(f"split_global_batch({samples}, global_batch_size={global_batch}, accumulation_steps={accum})",
                     got, expected)


@check("split_global_batch", hidden=True)
def split_global_batch_fails_fast(impl):
    """global % accum != 0, sizes < 1, empty or oversized sample lists raise ValueError naming the argument."""
    expect_raises("split_global_batch(8 samples, 8, 3)", lambda: impl.split_global_batch(list(range(8)), 8, 3),
                  ValueError, "accumulation_steps")
    expect_raises("split_global_batch(.., 0, 1)", lambda: impl.split_global_batch([1], 0, 1), ValueError,
                  "global_batch_size")
    expect_raises("split_global_batch(.., 4, 0)", lambda: impl.split_global_batch([1], 4, 0), ValueError,
                  "accumulation_steps")
    expect_raises("split_global_batch([], 4, 2)", lambda: impl.split_global_batch([], 4, 2), ValueError, "samples")
    expect_raises("split_global_batch(9 samples, 8, 4)", lambda: impl.split_global_batch(list(range(9)), 8, 4),
                  ValueError, "samples")


@check("steps_per_epoch")
def steps_per_epoch_is_ceil(impl):
    """ceil(samples / global batch): a short tail is one more update."""
    for count, global_batch, expected in [(160, 8, 20), (161, 8, 21), (20, 8, 3), (7, 8, 1), (0, 8, 0), (8, 1, 8)]:
        expect_equal(f"steps_per_epoch({count}, {global_batch})", impl.steps_per_epoch(count, global_batch), expected)
    expect_raises("steps_per_epoch(10, 0)", lambda: impl.steps_per_epoch(10, 0), ValueError, "global_batch_size")
    expect_raises("steps_per_epoch(-1, 8)", lambda: impl.steps_per_epoch(-1, 8), ValueError, "sample_count")


# --- TrainingSession: the update boundary ---------------------------------------------------

@check("TrainingSession")
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
    if any(p.grad is not None and p.grad.abs().sum() > 0 for p in session.model.parameters()):
        fail("gradients after the update", "still set", "zeroed (zero_grad after the step)")


@check("TrainingSession")
def session_force_update_commits_a_tail(impl):
    """K=4 but only 2 micro-batches left: force_update on the second commits them as one update."""
    session = new_session(impl, 4)
    reports = run_update(session, masked_micro_batches()[:2])
    expect_equal("parameters_updated per micro-step (K=4, force_update on the 2nd)",
                 [r.parameters_updated for r in reports], [False, True])
    expect_equal("microsteps_accumulated of the tail update", reports[-1].microsteps_accumulated, 2)
    expect_equal("session.optimizer_step after the tail", session.optimizer_step, 1)
    expect_equal("session.microsteps_accumulated after the tail", session.microsteps_accumulated, 0)


@check("TrainingSession")
def session_global_normalization_matches_one_backward(impl):
    """Unequal valid tokens per micro-batch (29, 10, 2, 1): accumulated gradient == one global-batch backward."""
    batches = masked_micro_batches()
    expected, nll_sum, units = global_batch_gradients(batches)
    session = new_session(impl, 4)
    captured: dict = {}
    reports = run_update(session, batches, before_update=capture_grads(session, captured))
    if not captured:
        fail("before_update hook at the update boundary", "never called", "called once before the step")
    expect_tensors_close("accumulated gradient vs one global-batch backward", captured, expected,
                         rtol=GRAD_RTOL, atol=GRAD_ATOL)
    last = reports[-1]
    expect_equal("loss_units reported at the boundary", last.loss_units, units)
    if not torch.is_tensor(last.loss_sum):
        fail("loss_sum reported at the boundary", type(last.loss_sum).__name__, "a device tensor (read back later)")
    expect_close("loss_sum at the boundary (NLL sum of the global batch)", float(last.loss_sum), float(nll_sum),
                 rtol=1e-6)
    expect_equal("loss_sum / loss_units on micro-steps inside the update",
                 [(r.loss_sum, r.loss_units) for r in reports[:-1]], [(None, 0)] * 3)


@check("TrainingSession")
def session_grad_norm_is_pre_clip(impl):
    """clip_grad_norm > 0: the reported norm is the pre-clip norm of the global-batch gradient."""
    batches = masked_micro_batches()
    expected, _, _ = global_batch_gradients(batches)
    want = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected.values()])))
    report = run_update(new_session(impl, 4), batches, clip=0.01)[-1]
    expect_close("grad_norm (pre-clip) of the update", report.grad_norm and float(report.grad_norm), want, rtol=1e-5)


@check("TrainingSession", hidden=True)
def session_clips_the_update(impl):
    """clip_grad_norm=0.01 with SGD lr 0.1: the step is -0.1 * g * 0.01 / (||g|| + 1e-6) (clip_grad_norm_'s
    coefficient); clip_grad_norm=0 clips nothing and reports grad_norm None."""
    batches = masked_micro_batches()
    expected_grads, _, _ = global_batch_gradients(batches)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected_grads.values()]))
    coefficient = float(torch.clamp(0.01 / (norm + 1e-6), max=1.0))
    for clip, scale in ((0.01, coefficient), (0.0, 1.0)):
        session = new_session(impl, 4)
        before = params_of(session.model)
        report = run_update(session, batches, clip=clip)[-1]
        expected = {n: before[n] - 0.1 * scale * g for n, g in expected_grads.items()}
        expect_tensors_close(f"parameters after one SGD update with clip_grad_norm={clip} (||g|| = {float(norm):.3f}; "
                             "a step 1/coefficient too large means the norm was computed but not applied)",
                             params_of(session.model), expected, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    expect_equal("grad_norm reported with clip_grad_norm=0 (clipping off)", report.grad_norm, None)


@check("TrainingSession", hidden=True)
def session_rejects_zero_normalization_units(impl):
    """normalization_units == 0 is an explicit ValueError, and nothing is updated."""
    session = new_session(impl, 1)
    before = params_of(session.model)
    batch = masked_micro_batches()[0]
    expect_raises("train_step(..., normalization_units=0)",
                  lambda: session.train_step(batch, TrainingStepOptions(normalization_units=0, force_update=True),
                                             token_weighted_step), ValueError, "normalization_units")
    expect_tensors_close("parameters after a rejected update", params_of(session.model), before,
                         rtol=0.0, atol=0.0)
    expect_equal("optimizer_step after a rejected update", session.optimizer_step, 0)
    expect_raises("TrainingSession(accumulation_steps=0)", lambda: new_session(impl, 0), ValueError, "accumulation_steps")


@check("TrainingSession", hidden=True)
def session_rejects_an_optimizer_on_other_tensors(impl):
    """Python's counterpart of 'moving keeps optimizer references valid': the optimizer must hold the
    model's own Parameter objects; one built on a copy is a ValueError naming optimizer."""
    model = tiny_model(SESSION_SCENARIO)
    orphan_optimizer = torch.optim.SGD(tiny_model(SESSION_SCENARIO).parameters(), lr=0.1)
    expect_raises("TrainingSession(model, optimizer over another model's parameters)",
                  lambda: impl.TrainingSession(model, orphan_optimizer, accumulation_steps=2), ValueError, "optimizer")


@check("TrainingSession", hidden=True)
def session_abort_discards_the_update(impl):
    """before_update -> True: no step, parameters unchanged; the next update does not reuse those gradients."""
    batches = masked_micro_batches()
    session = new_session(impl, 2)
    before = params_of(session.model)
    reports = run_update(session, batches[:2], before_update=lambda: True)
    expect_equal("aborted update: (parameters_updated, aborted, optimizer_step)",
                 (reports[-1].parameters_updated, reports[-1].aborted, session.optimizer_step), (False, True, 0))
    expect_tensors_close("parameters after an aborted update", params_of(session.model), before,
                         rtol=0.0, atol=0.0)
    captured: dict = {}
    run_update(session, batches[2:], before_update=capture_grads(session, captured))
    expected, _, _ = global_batch_gradients(batches[2:])
    expect_tensors_close("gradient of the update after an abort (must not contain the aborted one)", captured,
                         expected, rtol=GRAD_RTOL, atol=GRAD_ATOL)


@check("TrainingSession", hidden=True)
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
    expect_raises("train_step after a failed micro-step (before reset_accumulation)",
                  lambda: session.train_step(batches[1], TrainingStepOptions(normalization_units=units),
                                             token_weighted_step), RuntimeError, "reset_accumulation")
    expect_equal("optimizer_step after the failure", session.optimizer_step, 0)
    session.reset_accumulation()
    captured: dict = {}
    run_update(session, batches[2:], before_update=capture_grads(session, captured))
    expected, _, _ = global_batch_gradients(batches[2:])
    expect_tensors_close("gradient of the first update after reset_accumulation()", captured, expected,
                         rtol=GRAD_RTOL, atol=GRAD_ATOL)


@check("TrainingSession", hidden=True)
def session_error_anywhere_invalidates_the_accumulation(impl):
    """Not only step_fn: an error in backward, in before_update or in after_update also makes the next call
    raise AccumulationInvalidError (naming reset_accumulation) until reset_accumulation()."""
    def raising(where):
        def hook(*_):
            raise RuntimeError(f"error in {where}")
        return hook
    batches = masked_micro_batches()[:2]
    for where in ("backward (a gradient hook)", "before_update", "after_update"):
        session = new_session(impl, 2)
        hooks = {where: raising(where)} if where != "backward (a gradient hook)" else {}
        handle = (session.model.model.norm.weight.register_hook(raising(where)) if not hooks else None)
        try:
            run_update(session, batches, **hooks)
        except RuntimeError as exc:
            if "error in" not in str(exc):
                raise
        else:
            fail(f"an update whose {where} raises", "returned", "the RuntimeError propagates")
        if handle is not None:
            handle.remove()
        expect_raises(f"train_step after an error in {where} (before reset_accumulation)",
                      lambda: run_update(session, batches), AccumulationInvalidError, "reset_accumulation")
        session.reset_accumulation()
        reports = run_update(session, batches)
        expect_equal(f"the update after reset_accumulation() (error was in {where}): parameters_updated",
                     reports[-1].parameters_updated, True)


@check("TrainingSession", hidden=True)
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


@check("TrainingSession", hidden=True)
def session_sets_lr_and_normalization_is_fixed_per_update(impl):
    """options.lr lands in every param group; normalization_units may not change inside an update."""
    session = new_session(impl, 2, two_param_groups=True)
    batches = masked_micro_batches()
    session.train_step(batches[0], TrainingStepOptions(lr=0.025, normalization_units=39), token_weighted_step)
    expect_equal("lrs of the 2 param groups (0.1 and 0.05 before) after options.lr=0.025",
                 [g["lr"] for g in session.optimizer.param_groups], [0.025, 0.025])
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
    expect_equal("state() after one update at lr 0.025: (lr, optimizer_step, microsteps_accumulated, "
                 "accumulation_valid)", (boundary.lr, boundary.optimizer_step, boundary.microsteps_accumulated,
                                         boundary.accumulation_valid), (0.025, 1, 0, True))
    restored = new_session(impl, 2, two_param_groups=True)
    restored.load_state(boundary)
    expect_equal("after load_state(state at update 1, lr 0.025): (optimizer_step, lrs of both groups)",
                 (restored.optimizer_step, lrs(restored)), (1, [0.025, 0.025]))
    saved_from.train_step(batches[0], TrainingStepOptions(lr=0.0125, normalization_units=39), token_weighted_step)
    inside = saved_from.state()
    expect_equal("state().microsteps_accumulated after 1 micro-step of 2", inside.microsteps_accumulated, 1)
    fresh = new_session(impl, 2, two_param_groups=True)
    expect_raises("load_state(a state saved inside an update)", lambda: fresh.load_state(inside), ValueError,
                  "microsteps_accumulated")
    expect_equal("(optimizer_step, lrs) after a refused load_state", (fresh.optimizer_step, lrs(fresh)),
                 (0, [0.1, 0.05]))
    expect_raises("load_state(boundary state) on a session inside an update",
                  lambda: saved_from.load_state(boundary), ValueError, "microsteps_accumulated")
    expect_equal("(optimizer_step, lrs) of the session inside an update after a refused load_state",
                 (saved_from.optimizer_step, lrs(saved_from)), (1, [0.0125, 0.0125]))


_SYNC_METHODS = ("item", "tolist", "__float__", "__int__", "__bool__")


@contextlib.contextmanager
def count_host_syncs(counter: list):
    saved = {name: getattr(torch.Tensor, name) for name in _SYNC_METHODS}

    def counting(name):
        def wrapper(self, *args, **kwargs):
            counter.append(name)
            return saved[name](self, *args, **kwargs)
        return wrapper
    try:
        for name in _SYNC_METHODS:
            setattr(torch.Tensor, name, counting(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


@check("TrainingSession", hidden=True)
def session_keeps_loss_sums_on_device(impl):
    """No tensor -> host conversion (.item(), float(), bool(), .tolist()) on micro-steps inside an update."""
    session = new_session(impl, 4)
    batches = masked_micro_batches()
    units = sum(b.loss_units for b in batches)
    calls: list = []
    with count_host_syncs(calls):
        for batch in batches[:3]:
            session.train_step(batch, TrainingStepOptions(normalization_units=units), token_weighted_step)
    expect_equal("host syncs during 3 non-final micro-steps", calls, [])


@check("TrainingSession", hidden=True)
def session_uses_no_sync_before_the_last_microstep(impl):
    """A DDP-like model (has no_sync): micro-steps that do not close the update run inside no_sync()."""
    class SyncRecorder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.in_no_sync, self.forward_log = inner, False, []

        @contextlib.contextmanager
        def no_sync(self):
            self.in_no_sync = True
            try:
                yield
            finally:
                self.in_no_sync = False

        def forward(self, input_ids, labels=None):
            self.forward_log.append(self.in_no_sync)
            return self.inner(input_ids, labels=labels)
    model = SyncRecorder(tiny_model(SESSION_SCENARIO))
    session = impl.TrainingSession(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=4)
    run_update(session, masked_micro_batches()[:3])
    expect_equal("forward ran inside no_sync() per micro-step (K=4, force_update on the 3rd)",
                 model.forward_log, [True, True, False])


@check("TrainingSession", hidden=True)
def session_amp_scaler_overflow_and_unscale_before_clip(impl):
    """Enabled GradScaler('cpu'): the pre-clip norm is the UNSCALED one; an inf gradient skips the step
    (parameters_updated False, overflow_skipped True, scale halved) and the next update steps."""
    batches = masked_micro_batches()
    expected, _, _ = global_batch_gradients(batches)
    want = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected.values()])))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    session = new_session(impl, 4, scaler=scaler)
    report = run_update(session, batches, clip=0.01)[-1]
    expect_close("grad_norm with an enabled GradScaler (unscale before clip)",
                 report.grad_norm and float(report.grad_norm), want, rtol=1e-5)
    before = params_of(session.model)
    hook = session.model.model.norm.weight.register_hook(lambda g: g + float("inf"))
    report = run_update(session, batches, clip=0.01)[-1]
    hook.remove()
    expect_equal("update with an inf gradient: (parameters_updated, overflow_skipped, optimizer_step)",
                 (report.parameters_updated, report.overflow_skipped, session.optimizer_step), (False, True, 1))
    expect_equal("GradScaler scale after the overflow", scaler.get_scale(), 2.0 ** 9)
    expect_tensors_close("parameters after a skipped step", params_of(session.model), before,
                         rtol=0.0, atol=0.0)
    report = run_update(session, batches, clip=0.01)[-1]
    expect_equal("update after the overflow: (parameters_updated, optimizer_step)",
                 (report.parameters_updated, session.optimizer_step), (True, 2))


@check("TrainingSession", hidden=True)
def session_skipped_update_calls_no_after_update(impl):
    """An update the GradScaler skips (inf gradient) does not run after_update; the next one does, once."""
    calls = []
    session = new_session(impl, 4, scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 10))
    hook = session.model.model.norm.weight.register_hook(lambda g: g + float("inf"))
    skipped = run_update(session, masked_micro_batches(), after_update=lambda: calls.append("skipped update"))[-1]
    hook.remove()
    run_update(session, masked_micro_batches(), after_update=lambda: calls.append("next update"))
    expect_equal("overflow_skipped of the update with an inf gradient", skipped.overflow_skipped, True)
    expect_equal("after_update calls (skipped update, then a clean one)", calls, ["next update"])


@check("TrainingSession", hidden=True)
def session_runs_step_fn_under_autocast(impl):
    """autocast=torch.autocast('cpu', bfloat16): the step_fn runs inside it."""
    dtypes = []

    def step(model, batch):
        dtypes.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return token_weighted_step(model, batch)
    session = new_session(impl, 2, autocast=torch.autocast("cpu", dtype=torch.bfloat16))
    batches = masked_micro_batches()[:2]
    for i, batch in enumerate(batches):
        session.train_step(batch, TrainingStepOptions(normalization_units=39, force_update=i == 1), step)
    expect_equal("autocast dtype seen inside step_fn", dtypes, [torch.bfloat16] * 2)
    expect_equal("optimizer_step after a bf16 update", session.optimizer_step, 1)


@check("TrainingSession", hidden=True, uses=("count_loss_units", "split_global_batch", "steps_per_epoch"))
def session_drives_the_text_run(impl):
    """The run driver with this implementation: 20 samples, global 8 / accum 4 -> updates of 8, 8, 4 samples
    (4, 4, 2 micro-steps), one optimizer step each; max_steps=2 stops after 2 UPDATES."""
    input_ids, labels = tiny_batches(20, SESSION_SCENARIO.max_length, 1, 3)[0]
    dataset = list(zip(input_ids, labels))
    for max_steps, expected in [(0, [(8, 4), (8, 4), (4, 2)]), (2, [(8, 4), (8, 4)])]:
        session = new_session(impl, 4)
        records = run_text_training(session, dataset, TrainingRunState(), global_batch_size=8, accumulation_steps=4,
                                    epochs=1, max_steps=max_steps, impl=impl)
        expect_equal(f"(samples, micro-steps) per update, max_steps={max_steps}",
                     [(r["samples"], r["microsteps"]) for r in records], expected)
        expect_equal(f"optimizer steps, max_steps={max_steps}", session.optimizer_step, len(expected))


# --- migrate_train_state -------------------------------------------------------------------

LEGACY = {"epoch": 1, "step": 7, "batch_size": 2, "accum_steps": 4, "sample_count": 40, "model": {"w": 1},
          "optimizer": {"s": 2}}
# Lesson 15's stage assembly at the end of an epoch: 160 samples in micro-batches of 6 is 27 micro-steps; with
# accum 4 the tail flush applied micro-steps 25-27 before the save.
LEGACY_EPOCH_END = {"epoch": 0, "step": 27, "batch_size": 6, "accum_steps": 4, "sample_count": 160}


@check("migrate_train_state")
def migrate_legacy_state_to_global_semantics(impl):
    """Legacy micro-batch 2 x accum 4, 7 micro-steps done -> global 8, update 1 (the last boundary), 3 dropped."""
    original = dict(LEGACY)
    migrated = impl.migrate_train_state(original)
    expect_equal("the input state is not modified", original, LEGACY)
    expected = {"batch_size_semantics": GLOBAL_SEMANTICS, "global_batch_size": 8, "accum_steps": 4, "epoch": 1,
                "update_step_in_epoch": 1, "sample_position": 8, "dropped_microsteps": 3}
    expect_equal("migrated fields", {k: migrated.get(k) for k in expected}, expected)
    expect_equal("model / optimizer carried over", (migrated.get("model"), migrated.get("optimizer")),
                 (LEGACY["model"], LEGACY["optimizer"]))
    expect_equal("legacy keys batch_size / step removed", [k for k in ("batch_size", "step") if k in migrated], [])
    if "boundary" not in str(migrated.get("migration_note", "")):
        fail("migration_note must say the resume is at the last update boundary", migrated.get("migration_note"),
             "... update boundary ...")
    at_boundary = impl.migrate_train_state(dict(LEGACY, step=8))
    expect_equal("legacy step 8 = exactly 2 updates: (update_step_in_epoch, dropped_microsteps)",
                 (at_boundary["update_step_in_epoch"], at_boundary["dropped_microsteps"]), (2, 0))


@check("migrate_train_state", hidden=True)
def migrate_keeps_global_states_and_rejects_bad_ones(impl):
    """A 'global' state comes back equal; unknown semantics or bad legacy values raise ValueError naming the key."""
    new = {"batch_size_semantics": GLOBAL_SEMANTICS, "global_batch_size": 8, "accum_steps": 4, "epoch": 0,
           "update_step_in_epoch": 3, "sample_position": 24}
    expect_equal("migrate_train_state(global state)", impl.migrate_train_state(dict(new)), new)
    expect_raises("batch_size_semantics='micro'",
                  lambda: impl.migrate_train_state(dict(new, batch_size_semantics="micro")), ValueError,
                  "batch_size_semantics")
    expect_raises("legacy accum_steps=0", lambda: impl.migrate_train_state(dict(LEGACY, accum_steps=0)), ValueError,
                  "accum_steps")
    for key in ("batch_size", "sample_count"):
        expect_raises(f"legacy without {key} (it has no default)",
                      lambda: impl.migrate_train_state({k: v for k, v in LEGACY.items() if k != key}), ValueError, key)


def migrated_or_fail(impl, state: dict, fields: tuple, expected: tuple) -> dict:
    """``migrate_train_state(state)``; a ValueError there fails with ACTUAL vs EXPECTED (the state is valid)."""
    try:
        return impl.migrate_train_state(dict(state))
    except ValueError as exc:
        fail(f"migrate_train_state({state}): {fields}", f"ValueError: {exc}", expected)


@check("migrate_train_state", hidden=True)
def migrate_resumes_an_epoch_end_at_the_next_epoch(impl):
    """step == ceil(sample_count / batch_size) was saved after the epoch's tail flush: resume at update 0 of the
    next epoch with nothing dropped; one micro-step earlier is mid-epoch; past the end is a ValueError naming step."""
    fields = ("epoch", "update_step_in_epoch", "sample_position", "dropped_microsteps", "global_batch_size")
    migrated = migrated_or_fail(impl, LEGACY_EPOCH_END, fields, (1, 0, 0, 0, 24))
    got = tuple(migrated.get(k) for k in fields)
    if got != (1, 0, 0, 0, 24):
        fail(f"legacy epoch 0, step 27, micro-batch 6 x accum 4, 160 samples: {fields}", got, (1, 0, 0, 0, 24),
             "hint: 27 = ceil(160 / 6) is the epoch's last micro-step and the tail flush applied micro-steps 25-27; "
             "resuming at update 6 with 3 dropped trains samples 144-159 twice")
    mid = impl.migrate_train_state(dict(LEGACY_EPOCH_END, step=26))
    expect_equal("legacy step 26 of 27: (epoch, update_step_in_epoch, dropped_microsteps)",
                 (mid["epoch"], mid["update_step_in_epoch"], mid["dropped_microsteps"]), (0, 6, 2))
    expect_raises("legacy step 28 > ceil(160 / 6) = 27", lambda: impl.migrate_train_state(dict(LEGACY_EPOCH_END,
                                                                                                  step=28)),
                  ValueError, "step")


@check("migrate_train_state", hidden=True)
def migrate_fills_documented_legacy_defaults(impl):
    """A legacy state without epoch, step or accum_steps takes epoch 0, step 0, accum_steps 1."""
    fields = ("epoch", "update_step_in_epoch", "accum_steps", "global_batch_size", "dropped_microsteps")
    migrated = migrated_or_fail(impl, {"batch_size": 4, "sample_count": 40}, fields, (0, 0, 1, 4, 0))
    expect_equal(f"legacy {{batch_size: 4, sample_count: 40}} only: {fields}",
                 tuple(migrated.get(k) for k in fields), (0, 0, 1, 4, 0))

# --- test_token_weighted_matches_global_batch: the student's test against wrong accumulations --


def _backward_nll_sums(model, micro_batches, divisors):
    """Backpropagate each micro-batch's NLL sum divided by its divisor."""
    for (input_ids, labels), divisor in zip(micro_batches, divisors):
        (token_nll_sum(model(input_ids).logits, labels) / divisor).backward()


def accumulate_mean_of_means(model, micro_batches):
    k = len(micro_batches)
    _backward_nll_sums(model, micro_batches, [max(shifted_target_count(lab), 1) * k for _, lab in micro_batches])


def accumulate_counting_masked_targets(model, micro_batches):
    total = sum(lab[..., 1:].numel() for _, lab in micro_batches)
    _backward_nll_sums(model, micro_batches, [total] * len(micro_batches))


def accumulate_by_own_count(model, micro_batches):
    _backward_nll_sums(model, micro_batches, [max(shifted_target_count(lab), 1) for _, lab in micro_batches])


def accumulate_counting_unshifted(model, micro_batches):
    total = sum(int((lab != -100).sum()) for _, lab in micro_batches)
    _backward_nll_sums(model, micro_batches, [total] * len(micro_batches))


WRONG_TOKEN_WEIGHTINGS = (
    WrongImplementation("accumulate_mean_of_means", "lesson 14's loss / K: each micro-batch's mean NLL / K, so a "
                        "target in a sparse micro-batch weighs more", "with equal valid-target counts per "
                        "micro-batch (or K = 1) the mean of means IS the global mean: make the counts unequal",
                        accumulate_mean_of_means),
    WrongImplementation("accumulate_counting_masked_targets", "N counts every shifted position, -100 included",
                        "without masked (-100) targets the two counts are equal: mask some",
                        accumulate_counting_masked_targets),
    WrongImplementation("accumulate_by_own_count", "divides each micro-batch's NLL sum by its own count (K times "
                        "the mean-of-means gradient)", "with K = 1 one count is the global count: use K >= 2",
                        accumulate_by_own_count),
    WrongImplementation("accumulate_counting_unshifted", "N counts labels != -100 without the shift (position 0 "
                        "is never a target)", "if position 0 of every sample is masked the two counts agree: keep "
                        "valid labels at the start of some samples", accumulate_counting_unshifted),
)


@check("test_token_weighted_matches_global_batch")
def token_weighted_test_passes_correct_and_fails_wrong(impl):
    """Your test passes the correct token-weighted accumulation (course/runs/accumulation.py, and the same in
    float64) and raises AssertionError on each of 4 wrong ones: the mean of micro-batch means, a count with the
    masked targets, each micro-batch by its own count, a count without the shift; and on one gradient tensor 1 % off."""
    grade_student_test("test_token_weighted_matches_global_batch", impl.test_token_weighted_matches_global_batch,
                       (accumulate_token_weighted, in_float64(accumulate_token_weighted)), WRONG_TOKEN_WEIGHTINGS,
                       "a correct accumulation differs from one global-batch backward by float rounding (~1e-8 "
                       "here, float64 in other bits): compare with a tolerance, e.g. torch.testing.assert_close("
                       "rtol=1e-5, atol=1e-6), against ONE backward of the NLL sum / valid targets of the whole "
                       "global batch")


# --- mistake catalogue: each wrong variant FAILS the check named; equivalents PASS every check ----

LESSON.mistake('loss_over_k', 'backpropagates loss / K (mean of micro-batch means) instead of unit weighting',
               'weight = output.gradient_units / options.normalization_units',
               'weight = 1 / self.accumulation_steps',
               session_global_normalization_matches_one_backward)
LESSON.mistake('counts_unshifted_labels', 'counts labels != -100 without the shift: one target too many per row',
               'return int((labels[..., 1:] != IGNORE_INDEX).sum())',
               'return int((labels != IGNORE_INDEX).sum())',
               count_loss_units_sees_the_shift)
LESSON.mistake('steps_on_micro_count_only', 'closes an update only every K micro-steps: force_update is ignored',
               'closes_update = options.force_update or should_step_optimizer(',
               'closes_update = should_step_optimizer(',
               session_force_update_commits_a_tail)
LESSON.mistake('clip_before_unscale', 'clips the still-scaled gradients, then unscales',
               '        self.scaler.unscale_(self.optimizer)\n        grad_norm = None\n        if options.clip_grad_norm > 0:\n            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)\n',
               '        grad_norm = None\n        if options.clip_grad_norm > 0:\n            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)\n        self.scaler.unscale_(self.optimizer)\n',
               session_amp_scaler_overflow_and_unscale_before_clip)
LESSON.mistake('error_keeps_half_update', 'a failed micro-step leaves the accumulation valid: the next call reuses it',
               '            self.accumulation_valid = False\n            raise\n',
               '            raise\n',
               session_error_invalidates_the_accumulation)
LESSON.mistake('abort_keeps_gradients', 'a before_update abort forgets the counters but keeps the gradients',
               '            self.reset_accumulation()\n            return TrainingStepReport(False',
               '            self._clear_pending()\n            return TrainingStepReport(False',
               session_abort_discards_the_update)
LESSON.mistake('zero_units_accepted', 'accepts normalization_units == 0 (division by zero instead of a clear error)',
               'if options.normalization_units <= 0:',
               'if options.normalization_units < 0:',
               session_rejects_zero_normalization_units)
LESSON.mistake('loss_readback_every_microstep', 'reads the loss back to the host on every micro-step',
               'loss_sum = output.loss_sum.detach()',
               'loss_sum = torch.tensor(output.loss_sum.item())',
               session_keeps_loss_sums_on_device)
LESSON.mistake('syncs_every_microstep', 'never uses no_sync: DDP all-reduces on every micro-step',
               'sync_ctx = no_sync() if no_sync is not None and not closes_update else nullcontext()',
               'sync_ctx = nullcontext()',
               session_uses_no_sync_before_the_last_microstep)
LESSON.mistake('floor_steps_per_epoch', 'sample_count // global_batch_size: the short tail update is lost',
               'return math.ceil(sample_count / global_batch_size)',
               'return sample_count // global_batch_size',
               steps_per_epoch_is_ceil)
LESSON.mistake('split_drops_partial_micro', 'drops a partial micro-batch of a short global batch',
               'for i in range(0, len(samples), micro)]',
               'for i in range(0, len(samples) - micro + 1, micro)]',
               split_global_batch_micro_sizes)
LESSON.mistake('legacy_batch_kept_as_global', 'reads a legacy micro-batch size as the global batch',
               'global_batch = legacy["batch_size"] * accum',
               'global_batch = legacy["batch_size"]',
               migrate_legacy_state_to_global_semantics)

LESSON.mistake('norm_without_clipping', 'computes the pre-clip gradient norm but never clips (max_norm = inf)',
               'grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)',
               'grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf"))',
               session_clips_the_update)
LESSON.mistake('zero_grad_norm_when_not_clipping', 'reports grad_norm 0 instead of None when clipping is off',
               '        grad_norm = None\n',
               '        grad_norm = torch.zeros(())\n',
               session_clips_the_update)
LESSON.mistake('invalidates_only_on_step_fn_errors',
               'marks the accumulation invalid only when step_fn raises, not on errors in backward or the hooks',
               '        try:\n            return self._train_step(batch, options, step_fn)\n'
               '        except BaseException:\n'
               '            self.accumulation_valid = False\n            raise\n',
               '        def guarded_step_fn(model, micro_batch):\n            try:\n'
               '                return step_fn(model, micro_batch)\n            except BaseException:\n'
               '                self.accumulation_valid = False\n                raise\n'
               '        return self._train_step(batch, options, guarded_step_fn)\n',
               session_error_anywhere_invalidates_the_accumulation)
LESSON.mistake('after_update_on_skipped_step', 'runs after_update although the GradScaler skipped the step',
               '            self.optimizer_step += 1\n            if options.after_update is not None:\n'
               '                options.after_update()\n',
               '            self.optimizer_step += 1\n        if options.after_update is not None:\n'
               '            options.after_update()\n',
               session_skipped_update_calls_no_after_update)
LESSON.mistake('lr_on_first_group_only', 'writes options.lr into the first param group only',
               '            for group in self.optimizer.param_groups:\n                group["lr"] = options.lr\n',
               '            self.optimizer.param_groups[0]["lr"] = options.lr\n',
               session_sets_lr_and_normalization_is_fixed_per_update)
LESSON.mistake('state_reports_initial_lr', "state() reports the optimizer's construction lr, not the current one",
               'TrainingSessionState(lr=self.optimizer.param_groups[0]["lr"]',
               'TrainingSessionState(lr=self.optimizer.defaults["lr"]',
               session_state_and_load_state_round_trip)
LESSON.mistake('load_state_accepts_mid_update_state', 'load_state accepts a state saved inside an update',
               'if state.microsteps_accumulated or self.microsteps_accumulated:',
               'if self.microsteps_accumulated:',
               session_state_and_load_state_round_trip)
LESSON.mistake('load_state_inside_an_update', 'load_state runs on a session that is inside an update',
               'if state.microsteps_accumulated or self.microsteps_accumulated:',
               'if state.microsteps_accumulated:',
               session_state_and_load_state_round_trip)
LESSON.mistake('load_state_keeps_optimizer_step', 'load_state does not restore optimizer_step',
               '        self.optimizer_step = state.optimizer_step\n',
               '',
               session_state_and_load_state_round_trip)
LESSON.mistake('load_state_keeps_lr', 'load_state does not restore the lr',
               '        for group in self.optimizer.param_groups:\n            group["lr"] = state.lr\n',
               '',
               session_state_and_load_state_round_trip)
LESSON.mistake('epoch_end_needs_a_window_boundary',
               'takes a legacy epoch end whose step is not a multiple of accum_steps as mid-epoch: the tail is '
               'trained twice',
               'if step == micro_steps_per_epoch:',
               'if step == micro_steps_per_epoch and step % accum == 0:',
               migrate_resumes_an_epoch_end_at_the_next_epoch)
LESSON.mistake('legacy_epoch_length_floored', 'floor(sample_count / batch_size) micro-steps per epoch: the partial '
               'last micro-batch is forgotten',
               'micro_steps_per_epoch = math.ceil(legacy["sample_count"] / legacy["batch_size"])',
               'micro_steps_per_epoch = legacy["sample_count"] // legacy["batch_size"]',
               migrate_resumes_an_epoch_end_at_the_next_epoch)
LESSON.mistake('legacy_defaults_ignored', 'raises on a legacy state without epoch / step / accum_steps instead of '
               'using the documented defaults',
               'legacy = {**LEGACY_DEFAULTS, **state}',
               'legacy = dict(state)',
               migrate_fills_documented_legacy_defaults)

LESSON.equivalent('weight_inside_the_graph', 'loss * units / N as tensor ops instead of a Python float weight',
                  'self.scaler.scale(output.loss * weight).backward()',
                  'self.scaler.scale(output.loss * output.gradient_units / options.normalization_units).backward()')
LESSON.equivalent('count_with_item', '(...).sum().item() instead of int((...).sum())',
                  'return int((labels[..., 1:] != IGNORE_INDEX).sum())',
                  'return (labels[..., 1:] != IGNORE_INDEX).sum().item()')
LESSON.equivalent('ceil_by_negation', '-(-n // b) instead of math.ceil(n / b)',
                  'return math.ceil(sample_count / global_batch_size)',
                  'return -(-sample_count // global_batch_size)')

# The student's test (reference: course/reference/train_session.py) with one edit each.
_ASSERT_GRADIENTS = catalogue_weak_comparisons(LESSON, "1e-5", token_weighted_test_passes_correct_and_fails_wrong)
LESSON.mistake("test_equal_counts", "every sample fully valid: 30 targets per micro-batch, the mean of means is right",
               "cuts = ((16, 15), (9, 3), (2, 2), (2, 0))", "cuts = ((16, 16),) * 4",
               token_weighted_test_passes_correct_and_fails_wrong)
LESSON.mistake("test_one_micro_batch", "K = 1: one micro-batch's count is the global count",
               "cuts = ((16, 15), (9, 3), (2, 2), (2, 0))", "cuts = ((16, 15),)",
               token_weighted_test_passes_correct_and_fails_wrong)
LESSON.mistake("test_target_counts_unshifted", "the global-batch target divides by labels != -100 (no shift)",
               "/ shifted_target_count(labels)).backward()", "/ int((labels != -100).sum())).backward()",
               token_weighted_test_passes_correct_and_fails_wrong)

LESSON.equivalent("test_oracle_gradients", "the target from course.runs.global_batch_gradients (the same one "
                  "backward) instead of computing it in the test",
                  "    for (name, param), expected in zip(model.named_parameters(), big.parameters()):\n"
                  + _ASSERT_GRADIENTS,
                  "    from course.runs import global_batch_gradients\n"
                  "    oracle, _, _ = global_batch_gradients(masked_micro_batches(cuts))\n"
                  "    for name, param in model.named_parameters():\n"
                  "        assert torch.allclose(param.grad, oracle[name], rtol=1e-5, atol=1e-6), name\n")
