"""Lesson 16 checks of ``TrainingSession`` at run time: loss sums kept on the device, ``no_sync`` before
the last micro-step, AMP / GradScaler, autocast, and the text run it drives."""
from __future__ import annotations

import contextlib

import torch

from course.protocol.driver import epoch_order, run_text_training
from course.protocol.text import shifted_target_count, token_nll_sum, token_weighted_step
from course.protocol.types import TrainingRunState, TrainingStepOptions, TrainingStepOutput
from course.runs import (SESSION_SCENARIO, global_batch_gradients, masked_micro_batches, new_session,
                         params_of, run_update, tiny_batches, tiny_model)
from course.runs.eager import eager

from ..framework import check, expect_close, expect_equal, expect_tensors_close, fail
from ..host_syncs import count_host_syncs
from .checks import count_hint, rule
from .session import gradient_norm
from .session_updates import UPDATE_CUTS


@contextlib.contextmanager
def overflowing(session, poisoned: bool = True):
    """Inside the block (if ``poisoned``) every backward puts an inf into the final norm's gradient: an update the
    GradScaler must skip."""
    hook = session.model.model.norm.weight.register_hook(lambda grad: grad + float("inf")) if poisoned else None
    try:
        yield
    finally:
        if hook is not None:
            hook.remove()


@check("TrainingSession", objective="on_device", hidden=True)
def session_keeps_loss_sums_on_device(impl):
    """No tensor -> host conversion or copy (.item(), float(), bool(), .tolist(), .cpu(), .numpy()) on micro-steps
    inside an update, of the first update and of the next, without a GradScaler and with an enabled one (whose
    get_scale() is an .item() once its scale tensor exists, i.e. after the first micro-step)."""
    batches = masked_micro_batches()
    units = sum(b.loss_units for b in batches)
    host_sync_rule = ("no tensor -> host conversion or copy (.item(), float(t), int(t), bool(t) / an if on a "
                      "tensor, .tolist(), .cpu(), .numpy()) on a micro-step that does not close the update: loss "
                      "totals stay device tensors")
    for what, scaler, scaler_rule in (
            ("no GradScaler", None, ""),
            ("an enabled GradScaler", torch.amp.GradScaler("cpu", init_scale=2.0 ** 10),
             "; the GradScaler's scale lives on the device too: read it (get_scale() is an .item()) only when the "
             "update closes")):
        session = new_session(impl, 4, scaler=scaler)
        for update in (1, 2):
            calls: list = []
            with count_host_syncs(calls):
                for batch in batches[:3]:
                    session.train_step(batch, TrainingStepOptions(normalization_units=units), token_weighted_step)
            with rule(host_sync_rule + scaler_rule):
                expect_equal(f"host syncs during the 3 non-final micro-steps of update {update} ({what})", calls, [])
            session.train_step(batches[3], TrainingStepOptions(normalization_units=units), token_weighted_step)


class SyncRecorder(torch.nn.Module):
    """A DDP-like model: it has ``no_sync()`` and records, per forward, whether it ran inside it (DDP decides in
    the forward whether the backward all-reduces)."""

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


def ddp_like_session(impl, k: int):
    model = SyncRecorder(tiny_model(SESSION_SCENARIO))
    return impl.TrainingSession(model, eager(torch.optim.SGD)(model.parameters(), lr=0.1), accumulation_steps=k)


@check("TrainingSession", objective="token_weighting", hidden=True)
def session_closing_microstep_all_reduces_under_ddp(impl):
    """A DDP-like model (it has no_sync): the micro-step that closes an update, at the K-th micro-step or on
    force_update, runs outside no_sync(): its backward is where DDP all-reduces the update's gradient over the
    ranks. (no_sync on the other micro-steps saves communication: the hardening tier's.)"""
    session = ddp_like_session(impl, 2)
    run_update(session, masked_micro_batches()[:2])
    run_update(session, masked_micro_batches()[2:3])      # a tail of one micro-step (force_update)
    closing = [session.model.forward_log[i] for i in (1, 2)]
    with rule("the micro-step that closes the update runs outside no_sync(): under DDP its backward all-reduces "
              "the update's gradient; inside no_sync() every rank would step on its own gradient only"):
        expect_equal("closing micro-steps (the K-th of K=2, a force_update tail) ran inside no_sync()", closing,
                     [False, False])


@check("TrainingSession")
def session_uses_no_sync_before_the_last_microstep(impl):
    """A DDP-like model (has no_sync): micro-steps that do not close the update run inside no_sync()."""
    session = ddp_like_session(impl, 4)
    run_update(session, masked_micro_batches()[:3])
    with rule("when the model has no_sync (DDP), the forward and backward of every micro-step that "
              "does not close the update run inside model.no_sync(), the closing one outside: know "
              "whether a micro-step closes before its forward"):
        expect_equal("forward ran inside no_sync() per micro-step (K=4, force_update on the 3rd)",
                     session.model.forward_log, [True, True, False])


@check("TrainingSession", objective="mixed_precision", hidden=True)
def session_amp_scaler_overflow_and_unscale_before_clip(impl):
    """Enabled GradScaler('cpu'): the pre-clip norm is the UNSCALED one; an inf gradient skips the step
    (parameters_updated False, overflow_skipped True, scale halved) and the next update steps."""
    batches = masked_micro_batches()
    want = gradient_norm(global_batch_gradients(batches)[0])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    session = new_session(impl, 4, scaler=scaler)
    report = run_update(session, batches, clip=0.01)[-1]
    with rule("unscale the gradients before clipping: grad_norm and clip_grad_norm are about the "
              "UNSCALED gradient (a scaled one is scale x too large)"):
        expect_close("grad_norm with an enabled GradScaler (unscale before clip)",
                     report.grad_norm and float(report.grad_norm), want, rtol=1e-5)
    before = params_of(session.model)
    with overflowing(session):
        report = run_update(session, batches, clip=0.01)[-1]
    with rule("an update the GradScaler skips (inf/NaN) reports overflow_skipped=True, "
              "parameters_updated=False, and optimizer_step does not advance; the scaler is updated "
              "once per update (its scale backs off)"):
        expect_equal("update with an inf gradient: (parameters_updated, overflow_skipped, optimizer_step)",
                     (report.parameters_updated, report.overflow_skipped, session.optimizer_step), (False, True, 1))
        expect_equal("GradScaler scale after the overflow", scaler.get_scale(), 2.0 ** 9)
        expect_tensors_close("parameters after a skipped step", params_of(session.model), before,
                             rtol=0.0, atol=0.0)
    report = run_update(session, batches, clip=0.01)[-1]
    with rule("a skipped update is over: the next update steps through the scaler as usual"):
        expect_equal("update after the overflow: (parameters_updated, optimizer_step)",
                     (report.parameters_updated, session.optimizer_step), (True, 2))


@check("TrainingSession", objective="mixed_precision", hidden=True)
def session_skipped_update_calls_no_after_update(impl):
    """An update the GradScaler skips (inf gradient) does not run after_update; the next one does, once."""
    calls = []
    session = new_session(impl, 4, scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 10))
    with overflowing(session):
        skipped = run_update(session, masked_micro_batches(), after_update=lambda: calls.append("skipped update"))[-1]
    run_update(session, masked_micro_batches(), after_update=lambda: calls.append("next update"))
    with rule("an update whose gradient holds inf is skipped by the GradScaler and reports overflow_skipped=True"):
        expect_equal("overflow_skipped of the update with an inf gradient", skipped.overflow_skipped, True)
    if calls != ["next update"]:
        fail("after_update calls (skipped update, then a clean one)", calls, ["next update"],
             "hint: after_update runs only when the optimizer stepped: never on an update the GradScaler skipped")


@check("TrainingSession", objective="mixed_precision", hidden=True)
def session_scaler_growth_is_no_skip(impl):
    """GradScaler('cpu', growth_interval=1) doubles its scale after every clean step: a scale that GREW is no
    skip (only a lower scale is); every update steps, runs after_update and reports the unscaled norm."""
    batches = masked_micro_batches()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=1)
    session = new_session(impl, 4, scaler=scaler)
    calls: list = []
    want = gradient_norm(global_batch_gradients(batches)[0])
    report = run_update(session, batches, clip=0.01, after_update=lambda: calls.append(1))[-1]
    with rule("unscale the gradients before clipping: grad_norm is the UNSCALED gradient's norm"):
        expect_close("grad_norm with a growing GradScaler (unscaled)", report.grad_norm and float(report.grad_norm),
                     want, rtol=1e-5)
    run_update(session, batches[:2], after_update=lambda: calls.append(2))
    with rule("only a scale the GradScaler LOWERED means a skipped step; a scale that grew (after "
              "growth_interval clean steps) belongs to a step that happened"):
        expect_equal("2 clean updates with growth_interval=1: (parameters_updated, overflow_skipped, optimizer_step, "
                     "after_update calls, scale)", (report.parameters_updated, report.overflow_skipped,
                                                    session.optimizer_step, calls, scaler.get_scale()),
                     (True, False, 2, [1, 2], 2.0 ** 10))


def skip_hint(seen: list, expected: list, backoff: float, growth: float) -> str:
    """The cause a wrong skip verdict points at: a grown scale taken for a skip, or a lowered one not taken."""
    if any(got[1] and not want[1] for got, want in zip(seen, expected)):
        return (f"hint: a scale that grew (growth_factor {growth}) was taken for a skip: only a LOWER scale means "
                "the GradScaler skipped the step, whatever its growth_factor")
    if any(want[1] and not got[1] for got, want in zip(seen, expected)):
        return (f"hint: a scale lowered by backoff_factor {backoff} was not taken for a skip: any LOWER scale "
                "(new < old) means a skip, whatever its backoff_factor")
    return "hint: the rule: the scaler is updated once per update (its scale backs off or grows)"


@check("TrainingSession", objective="mixed_precision", hidden=True)
def session_skip_detection_follows_any_scaler_factors(impl):
    """GradScaler('cpu', growth_interval=1) with factors other than the defaults (backoff 0.5 and growth 2: the
    checks above) on both sides of them (backoff 0.25 / growth 4, backoff 0.75 / growth 1.5), K=1: a clean update,
    an inf one, a clean one. Only the update whose scale went DOWN, by whatever backoff_factor, was skipped; a
    scale that grew by any factor stepped."""
    batch = masked_micro_batches()[3:]
    for backoff, growth in ((0.25, 4.0), (0.75, 1.5)):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_factor=growth, backoff_factor=backoff,
                                      growth_interval=1)
        session = new_session(impl, 1, scaler=scaler)
        seen = []
        for poisoned in (False, True, False):
            with overflowing(session, poisoned):
                report = run_update(session, batch)[-1]
            seen.append((report.parameters_updated, report.overflow_skipped, scaler.get_scale()))
        scales = (2.0 ** 8 * growth, 2.0 ** 8 * growth * backoff, 2.0 ** 8 * growth * backoff * growth)
        expected = [(True, False, scales[0]), (False, True, scales[1]), (True, False, scales[2])]
        if seen != expected:
            fail(f"(parameters_updated, overflow_skipped, scale) per update: clean, inf, clean (backoff_factor "
                 f"{backoff}, growth_factor {growth}, growth_interval 1)", seen, expected,
                 skip_hint(seen, expected, backoff, growth))


@check("TrainingSession")
def session_runs_every_backward(impl):
    """Every micro-step runs its backward, one whose micro-batch has no valid target (gradient_units 0) included,
    whether it closes the update or not: under DDP a rank that skips the closing backward never joins the
    gradient all-reduce the other ranks wait in (a hang)."""
    batches = masked_micro_batches(UPDATE_CUTS)
    with_target, all_padding = batches[2], batches[3]          # 1 and 0 valid targets
    backwards: list = []

    def counted_step(model, batch):
        output = token_weighted_step(model, batch)
        output.loss.register_hook(lambda grad: backwards.append(batch.loss_units))
        return output
    session = new_session(impl, 2)
    for update in ((with_target, all_padding), (all_padding, with_target)):
        run_update(session, list(update), step_fn=counted_step)
    with rule("every micro-step backpropagates its loss (times gradient_units / normalization_units, 0 for an "
              "all-padding micro-batch): skipping it leaves a DDP rank out of the all-reduce, a hang"):
        expect_equal("backward passes, by the valid targets of their micro-batch (2 updates of K=2, the all-padding "
                     "one closing the first)", backwards, [1, 0, 0, 1])


class AttachedLossSums:
    """A step_fn whose loss_sum still carries its graph (as a task's step function may return it); it keeps each
    tensor it returned, with a copy of its value."""

    def __init__(self):
        self.returned: list = []

    def __call__(self, model, batch) -> TrainingStepOutput:
        output = token_weighted_step(model, batch)
        nll_sum = token_nll_sum(model(batch.input_ids).logits, batch.labels)   # with its graph
        self.returned.append((nll_sum, nll_sum.detach().clone()))
        return TrainingStepOutput(output.loss, output.gradient_units, nll_sum, output.loss_units)


DETACH_HINT = ("hint: accumulate output.loss_sum.detach(): the sum of attached tensors keeps every micro-step's "
               "graph (activations) in memory until the update closes")


def expect_detached(what: str, total) -> None:
    if not torch.is_tensor(total) or total.requires_grad:
        fail(f"{what}: requires_grad (a graph kept alive)", getattr(total, "requires_grad", total), False,
             DETACH_HINT)


@check("TrainingSession", objective="on_device", hidden=True)
def session_accumulates_detached_loss_sums(impl):
    """A step_fn whose loss_sum still carries its graph: the session keeps loss_sum.detach(), so no micro-step's
    graph stays alive in the update's total (the report's loss_sum)."""
    step = AttachedLossSums()
    batches = masked_micro_batches()[:3]
    report = run_update(new_session(impl, 3), batches, step_fn=step)[-1]
    expect_detached("loss_sum reported at the boundary", report.loss_sum)


@check("TrainingSession")
def session_keeps_the_callers_loss_sums(impl):
    """The pending total state() reports inside an update is detached too, and the tensors step_fn returned keep
    their values (the total is a new tensor, not the first loss_sum added into in place)."""
    step = AttachedLossSums()
    batches = masked_micro_batches()[:3]
    session = new_session(impl, 3)
    options = TrainingStepOptions(normalization_units=sum(b.loss_units for b in batches))
    for batch in batches[:2]:
        session.train_step(batch, options, step)
    expect_detached("state().loss_sum after 2 of 3 micro-steps", session.state().loss_sum)
    session.train_step(batches[2], options, step)
    with rule("the session never writes into a tensor step_fn returned: sum into a new tensor (a + b), not "
              "total += b on the first loss_sum (its .detach() shares the caller's storage)"):
        expect_equal("loss_sum values step_fn returned, read after the update",
                     [float(tensor.detach()) for tensor, _ in step.returned],
                     [float(value) for _, value in step.returned])


@check("TrainingSession", objective="mixed_precision", hidden=True)
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
    with rule("every micro-step runs step_fn inside the autocast context the session was built with"):
        expect_equal("autocast dtype seen inside step_fn", dtypes, [torch.bfloat16] * 2)
        expect_equal("optimizer_step after a bf16 update", session.optimizer_step, 1)


@check("TrainingSession", objective="token_weighting", hidden=True,
       uses=("count_loss_units", "split_global_batch", "steps_per_epoch"))
def session_drives_the_text_run(impl):
    """The run driver with this implementation: 20 samples (labels masked from a per-sample cut), global 8 /
    accum 4 -> updates of 8, 8, 4 samples (4, 4, 2 micro-steps), one optimizer step each, each normalized by its
    global batch's valid shifted targets; max_steps=2 stops after 2 UPDATES."""
    input_ids, labels = tiny_batches(20, SESSION_SCENARIO.max_length, 1, 3)[0]
    labels = labels.clone()
    for i in range(len(labels)):
        labels[i, 16 - 3 * (i % 5):] = -100          # 0, 3, 6, 9 or 12 masked positions
    dataset = list(zip(input_ids, labels))
    order = epoch_order(len(dataset), TrainingRunState().seed, 0)
    for max_steps, expected in [(0, [(8, 4), (8, 4), (4, 2)]), (2, [(8, 4), (8, 4)])]:
        session = new_session(impl, 4)
        records = run_text_training(session, dataset, TrainingRunState(), global_batch_size=8, accumulation_steps=4,
                                    epochs=1, max_steps=max_steps, impl=impl)
        with rule("the driver's updates: global batches of 8 (the tail of 4) in micro-batches of 2, each closed by "
                  "force_update on its last micro-batch with one optimizer step"):
            expect_equal(f"(samples, micro-steps) per update, max_steps={max_steps}",
                         [(r["samples"], r["microsteps"]) for r in records], expected)
            expect_equal(f"optimizer steps, max_steps={max_steps}", session.optimizer_step, len(expected))
    for update, record in enumerate(records):
        update_labels = labels[order[8 * update:8 * update + 8]]
        if record["normalization_units"] != shifted_target_count(update_labels):
            fail(f"normalization_units of update {update + 1} (its global batch's valid shifted targets)",
                 record["normalization_units"], shifted_target_count(update_labels),
                 count_hint(update_labels, record["normalization_units"]))
