"""Lesson 14 checks of ``train_one_epoch``: the run against the oracle's, record by record, in fp32 and
under autocast / GradScaler, plus its edge cases (the tail flush, an empty epoch, param groups,
scaler=None, host syncs inside the loop); the hardening tier: the records' Python types, no warnings,
.grad cleared to None (the arguments: loop_arguments). Failures carry a hint where the numbers point at a cause."""
from __future__ import annotations

import collections
import functools
import warnings
from pathlib import Path

import torch

from course.minimind import get_lr
from course.runs import LoopScenario, epoch_batches, run_impl, run_oracle, tiny_model, training_objects
from course.runs.scenarios import LOOP_AMP_SCENARIOS, LOOP_BASE, LOOP_FP32_SCENARIOS

from ..framework import (CheckFailure, check, expect_close, expect_equal, expect_tensor_close, expect_tensors_close,
                         expect_type, fail)
from ..host_syncs import count_host_syncs
from .checks import LR_RTOL
from .loop_hints import (aux_backward_hint, aux_hint, flags_hint, forward_lr_hint, frozen_weights_hint,
                         group_norm_hint, hint, host_copy_hint, loss_hint, lr_hint, norm_hint, scaled_norm_hint,
                         skipped_norm_hint, steps_hint, update_hint, warning_hint)


# Grading tolerances against the oracle. The reference matches bitwise (tests/test_oracle.py); these
# leave room for equivalent float orderings: a 1-ulp gradient change moves AdamW parameters by
# ~1e-8 after a dozen steps, while each catalogued mistake moves them by >= 1e-5 or changes a record.
LOSS_RTOL, NORM_RTOL, PARAM_ATOL, STATE_RTOL = 1e-5, 1e-4, 2e-6, 1e-4


# The hardening tier's record types: Python values, never tensors (a kept tensor holds memory or a graph). The
# core grades the values only (a 0-dim tensor of the right value passes it).
RECORD_TYPES = {"step": (int,), "lr": (float,), "loss": (float,), "aux_loss": (float,), "update_closed": (bool,),
                "overflow_skipped": (bool,), "grad_norm": (float, type(None)), "tail_flush": (bool,)}
RECORD_TYPES_HINT = ("hint: records hold Python values (an int step, float numbers, bool flags): convert the epoch's "
                     "tensors once at its end (torch.stack(...).tolist()); a tensor kept in a record holds device "
                     "memory, or the whole autograd graph, after the epoch")


def compare_runs(scenario: LoopScenario, actual, expected, forward_lrs) -> None:
    """``actual`` against the oracle's ``expected`` run; ``forward_lrs``: every param group's lr at each forward
    pass (see ``observed``). Where the records first differ, a hint names the run's likely cause."""
    where = f"[{scenario.name}]"
    for i, record in enumerate(actual.records):
        missing = [k for k in RECORD_TYPES if k not in record]
        if missing:
            fail(f"{where} record {i} lacks keys", sorted(record), f"at least {list(RECORD_TYPES)}")
    expect_equal(f"{where} forward passes (one per micro-step)", len(forward_lrs), len(expected.records))
    # what the whole run shows about a cause, named where a loss, a norm or the parameters first differ
    lr_cause = forward_lr_hint(forward_lrs, expected.records)
    run_cause = frozen_weights_hint(actual.params, expected.params, initial_params(scenario)) or lr_cause
    seen = [(r["epoch"], r["step"]) for r in actual.records]
    with hint(steps_hint(seen, expected.records)):
        expect_equal(f"{where} micro-steps seen (epoch, step)", seen,
                     [(r["epoch"], r["step"]) for r in expected.records])
    for key, meaning in (("update_closed", "closed an accumulation window (optimizer asked to step)"),
                         ("overflow_skipped", "the GradScaler skipped optimizer.step (inf/NaN gradients)"),
                         ("tail_flush", "the tail flush closed (a partial window, after the loop)")):
        got_steps = [(r["epoch"], r["step"]) for r in actual.records if r[key]]
        with hint(flags_hint(key, got_steps, expected.records)):
            expect_equal(f"{where} micro-steps that {meaning} (epoch, step)", got_steps,
                         [(r["epoch"], r["step"]) for r in expected.records if r[key]])
    k = scenario.accumulation_steps
    for index, (got, want) in enumerate(zip(actual.records, expected.records)):
        at = f"{where} epoch {want['epoch']} step {want['step']}"
        lr = _float(got["lr"])
        with hint(lr_hint(scenario, lr, want, actual.records[:index])):
            expect_close(f"{at}: lr", lr, want["lr"], rtol=LR_RTOL)
        loss = _float(got["loss"])
        with hint(loss_hint(loss, want["loss"], k) or aux_hint(loss, want["loss"], want["aux_loss"])
                  or update_hint(scenario, expected.records, index, run_cause)):
            expect_close(f"{at}: loss (unscaled, aux included)", loss, want["loss"], rtol=LOSS_RTOL, atol=1e-6)
        aux = _float(got["aux_loss"])
        with hint(aux_backward_hint(aux, want["aux_loss"], expected.records)):
            expect_close(f"{at}: aux_loss", aux, want["aux_loss"], rtol=LOSS_RTOL, atol=1e-8)
        norm = _float(got["grad_norm"])
        with hint(skipped_norm_hint(norm, want["grad_norm"]) or scaled_norm_hint(scenario, norm, want["grad_norm"])
                  or group_norm_hint(scenario, norm, want["grad_norm"]) or norm_hint(norm, want["grad_norm"], k)
                  or aux_backward_hint(norm, want["grad_norm"], expected.records)
                  or update_hint(scenario, expected.records, index, run_cause)):
            expect_close(f"{at}: grad_norm before clipping", norm, want["grad_norm"], rtol=NORM_RTOL)
    if expected.scale is not None:
        expect_equal(f"{where} GradScaler scale after the run", actual.scale, expected.scale)
    with hint(update_hint(scenario, expected.records, len(expected.records), run_cause)):
        expect_tensors_close(f"{where} parameters after training", actual.params, expected.params,
                             rtol=0.0, atol=PARAM_ATOL)
    expect_equal(f"{where} parameters with optimizer state", sorted(actual.optimizer_state),
                 sorted(expected.optimizer_state))
    for name, state in expected.optimizer_state.items():
        for key, want in state.items():
            got = actual.optimizer_state[name][key]
            if key == "step":
                expect_equal(f"{where} AdamW step count of {name}", float(got), float(want))
            else:
                expect_tensor_close(f"{where} AdamW {key} of {name}", got, want, rtol=STATE_RTOL,
                                    atol=STATE_RTOL * float(want.abs().max()))
    # last: a stale lr that reaches an update already showed above, with a hint naming that update
    for want, lrs in zip(expected.records, forward_lrs):
        for group, lr in enumerate(lrs):
            with hint(lr_cause):
                expect_close(f"{where} epoch {want['epoch']} step {want['step']}: lr of param group {group} at the "
                             "forward pass", lr, want["lr"], rtol=LR_RTOL)


def _float(value):
    """A record's number as a float (a 0-dim tensor of the right value passes the core; its type is graded by
    ``train_one_epoch_records_python_values``)."""
    return float(value) if value is not None else None


def initial_params(scenario: LoopScenario) -> dict:
    """The parameters every run of ``scenario`` starts from (the model is seeded), on the CPU like a run's."""
    return {n: p.detach().cpu() for n, p in tiny_model(scenario).named_parameters()}


def warning_free(train_one_epoch, where: str):
    """``train_one_epoch`` that fails naming the first warning a call emits: the loop emits none (a warning there is
    a misconfiguration, e.g. a GradScaler built for CUDA that disables itself on a CPU-only machine)."""
    def run(*args, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = train_one_epoch(*args, **kwargs)
        if caught:
            first = caught[0]
            fail(f"{where} warnings emitted by train_one_epoch ({len(caught)}; the first)",
                 f"{first.category.__name__}: {first.message} ({Path(first.filename).name}:{first.lineno})", "none",
                 f"hint: {warning_hint(str(first.message))}")
        return records
    return run


def observed(train_one_epoch, forward_lrs: list, one_shot: bool = False):
    """``train_one_epoch`` that appends every param group's lr to ``forward_lrs`` at each forward pass of the model
    and, if ``one_shot``, gets its batches as a generator (no len(): the loader may be any iterable)."""
    def run(model, loader, optimizer, **kwargs):
        handle = model.register_forward_pre_hook(
            lambda module, args: forward_lrs.append([group["lr"] for group in optimizer.param_groups]))
        try:
            return train_one_epoch(model, (batch for batch in loader) if one_shot else loader, optimizer, **kwargs)
        finally:
            handle.remove()
    return run


@functools.lru_cache(maxsize=4)
def impl_run(train_one_epoch, scenario: LoopScenario):
    """``run_impl``, shared by the checks of one grading run (the tail and record checks and the base scenario),
    and the param groups' lr at each forward pass. A loader that ends early comes as a one-shot generator."""
    forward_lrs = []
    result = run_impl(observed(train_one_epoch, forward_lrs, one_shot=scenario.loader_length is not None), scenario)
    return result, forward_lrs


def _check_scenarios(impl, scenarios) -> None:
    for scenario in scenarios:
        try:
            result, forward_lrs = impl_run(impl.train_one_epoch, scenario)
        except TypeError as exc:
            if scenario.loader_length is None:
                raise
            fail(f"[{scenario.name}] train_one_epoch(loader=a generator of {scenario.loader_length} batches)",
                 f"TypeError: {exc}", "a run: the loader is any iterable",
                 "hint: loader may be any iterable: do not call len(loader) (a generator has no length); the tail "
                 "flush follows the last micro-step actually run" if "len()" in str(exc) else "")
        compare_runs(scenario, result, run_oracle(scenario), forward_lrs)


def base_epoch_records(impl) -> list[dict]:
    """The records of epoch 0 of the base scenario (6 micro-batches, K=4: an update at 4, the tail flush at 6)."""
    return [r for r in impl_run(impl.train_one_epoch, LOOP_BASE)[0].records if r.get("epoch") == 0]


@check("train_one_epoch", objective="tail_flush")
def train_one_epoch_marks_the_tail_flush(impl):
    """With 6 micro-batches and K=4 the last record of an epoch is the tail flush: it closes an update
    and reports a norm."""
    last = base_epoch_records(impl)[-1]
    if not (last.get("update_closed") and last.get("tail_flush") and last.get("grad_norm") is not None):
        fail("last record of an epoch ending mid-window (6 micro-steps, K=4)",
             {k: last.get(k) for k in ("step", "update_closed", "tail_flush", "grad_norm")},
             {"step": 6, "update_closed": True, "tail_flush": True, "grad_norm": "a float (pre-clip norm)"},
             "hint: the tail flush closes the last, partial window after the loop; its record (the last micro-step "
             "run) says update_closed=True, tail_flush=True and carries the pre-clip norm")


@check("train_one_epoch", objective="records")
def train_one_epoch_reports_a_norm_only_where_an_update_closed(impl):
    """grad_norm is None wherever no update closed (6 micro-batches, K=4: a norm at 4 and 6 only)."""
    records = base_epoch_records(impl)
    if not all(r.get("grad_norm") is None for r in records if not r.get("update_closed")):
        fail("grad_norm on micro-steps without an update",
             [r.get("grad_norm") for r in records], "None wherever update_closed is False",
             "hint: grad_norm is None where no update closed (not 0.0: no norm was measured there)")


@check("train_one_epoch")
def train_one_epoch_records_python_values(impl):
    """The records hold Python values (an int step, float numbers, bool flags), not tensors: a tensor kept in a
    record holds device memory, or a whole autograd graph, after the epoch."""
    for scenario in (LOOP_BASE, LOOP_AMP_SCENARIOS[1]):
        for i, record in enumerate(impl_run(impl.train_one_epoch, scenario)[0].records):
            for key, types in RECORD_TYPES.items():
                expect_type(f"[{scenario.name}] record {i} {key!r}", record.get(key), *types,
                            detail=RECORD_TYPES_HINT)


@check("train_one_epoch", objective="tail_flush")
def train_one_epoch_returns_nothing_for_an_empty_epoch(impl):
    """A resume at start_step == iters (6 micro-batches, K=4: upstream saved before its tail flush) runs no
    micro-step: it returns [] and changes nothing."""
    objects = training_objects(LOOP_BASE)
    before = {n: p.detach().clone() for n, p in objects.model.named_parameters()}
    try:
        records = impl.train_one_epoch(
            objects.model, [], objects.optimizer, device="cpu", epoch=0, epochs=2, iters=6, base_lr=5e-4,
            accumulation_steps=4, grad_clip=1.0, start_step=6)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as exc:
        fail("train_one_epoch(loader=[], iters=6, start_step=6, K=4)", f"{type(exc).__name__}: {exc}", [],
             "hint: nothing ran, so there is nothing to stack, flush or record: return [] early")
    expect_equal("train_one_epoch(loader=[], iters=6, start_step=6, K=4)", records, [])
    expect_tensors_close("parameters after an empty epoch",
                         {n: p.detach() for n, p in objects.model.named_parameters()}, before, rtol=0.0, atol=0.0)


@check("train_one_epoch", objective="schedule")
def train_one_epoch_sets_lr_in_every_param_group(impl):
    """With two param groups (e.g. decay / no decay) every group holds the schedule's lr at every forward pass
    and at every optimizer step (4 micro-batches, K=3: an update at 3, the tail flush at 4)."""
    scenario = LOOP_BASE.with_(name="dense, 1 epoch of 4 micro-batches, K=3, two param groups", epochs=1, iters=4,
                               accumulation_steps=3, two_param_groups=True)
    objects = training_objects(scenario)
    optimizer = objects.optimizer
    at_steps, at_forwards = [], []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: at_steps.append([g["lr"] for g in opt.param_groups]))
    observed(impl.train_one_epoch, at_forwards)(
        objects.model, epoch_batches(scenario, 0), optimizer, device="cpu", epoch=0, epochs=1, iters=scenario.iters,
        base_lr=scenario.base_lr, accumulation_steps=3, grad_clip=1.0)
    expect_group_lrs("optimizer.step", at_steps, (3, 4), scenario)
    expect_group_lrs("the forward pass", at_forwards, (1, 2, 3, 4), scenario)


def expect_group_lrs(where: str, seen: list, steps: tuple, scenario: LoopScenario) -> None:
    """``seen``: the 2 param groups' lr at each ``where`` event, one per micro-step in ``steps``."""
    expect_equal(f"micro-steps reaching {where} (4 micro-batches, K=3)", len(seen), len(steps))
    schedule = [get_lr(step, scenario.iters, scenario.base_lr) for step in range(scenario.iters + 1)]
    for step, lrs in zip(steps, seen):
        expect_equal(f"param groups at {where} of micro-step {step}", len(lrs), 2)
        for group, lr in enumerate(lrs):
            with hint(group_lr_hint(lrs, step, schedule, scenario.base_lr)):
                expect_close(f"lr of param group {group} at {where} of micro-step {step} of 4", lr, schedule[step],
                             rtol=LR_RTOL)


def group_lr_hint(lrs: list, step: int, schedule: list, base_lr: float) -> str:
    """The rule that the param groups' ``lrs`` at micro-step ``step`` break (``schedule``: the lr of each step)."""
    if any(abs(lr - lrs[0]) > LR_RTOL * abs(lrs[0]) for lr in lrs):
        return "write the lr into EVERY optimizer.param_groups entry, not only the first"
    if step > 1 and abs(lrs[0] - schedule[step - 1]) <= LR_RTOL * schedule[step - 1]:
        return (f"the lr of micro-step {step - 1}, one micro-step late: write micro-step {step}'s lr into the param "
                "groups before its forward (and so before its update), not after")
    if lrs[0] == base_lr:
        return "the optimizer still holds its initial lr: write each micro-step's lr before its forward"
    return "a stale lr: write each micro-step's lr into every param group before its forward, not only before an update"


@check("train_one_epoch", objective="overflow_skip", hidden=True)
def train_one_epoch_scaler_none_is_disabled(impl):
    """scaler=None means no loss scaling (a disabled GradScaler, or none at all): an inf gradient is not skipped
    (the update runs, the weights it reaches become non-finite) and no record says overflow_skipped."""
    scenario = LOOP_BASE.with_(name="dense, 2 micro-batches, K=2, scaler=None, inf gradient in micro-step 2",
                               epochs=1, iters=2, accumulation_steps=2, overflow_at_backward=2)
    objects = training_objects(scenario)
    records = impl.train_one_epoch(
        objects.model, epoch_batches(scenario, 0), objects.optimizer, device="cpu", epoch=0, epochs=1,
        iters=scenario.iters, base_lr=scenario.base_lr, accumulation_steps=scenario.accumulation_steps, grad_clip=1.0)
    skipped = [r["step"] for r in records if r.get("overflow_skipped")]
    with hint("scaler=None means no loss scaling (a DISABLED GradScaler, enabled=False, or none at all): it never "
              "skips a step" if skipped else ""):
        expect_equal("micro-steps with overflow_skipped=True under scaler=None", skipped, [])
    weight = objects.model.model.norm.weight
    expect_equal("model.norm.weight all finite after the inf gradient's update under scaler=None",
                 bool(torch.isfinite(weight).all()), False)


@check("train_one_epoch", objective="update_order")
def train_one_epoch_matches_oracle_fp32(impl):
    """Same lr, step positions, losses, grad norms, parameters and AdamW state as the oracle (fp32)."""
    _check_scenarios(impl, LOOP_FP32_SCENARIOS)


@check("train_one_epoch", objective="overflow_skip", hidden=True)
def train_one_epoch_matches_oracle_amp(impl):
    """bf16 autocast and an enabled CPU GradScaler with an overflow (step skipped, scale halved)."""
    _check_scenarios(impl, LOOP_AMP_SCENARIOS)


SYNC_SCENARIO = LoopScenario("dense, 1 epoch, K=8: one window that only the tail flush closes", epochs=1,
                             accumulation_steps=8, hidden_size=32, num_hidden_layers=1, max_length=16)


@functools.lru_cache(maxsize=8)
def tail_only_run(train_one_epoch, micro_steps: int, scaler_enabled: bool = False):
    """An epoch of ``micro_steps`` < K micro-batches (one update: the tail flush, after the loop) under
    ``count_host_syncs``, with ``scaler=None`` or the caller's enabled GradScaler; returns (the conversions counted
    inside the loop, from the first forward pass to the last one; names of parameters whose .grad is not None
    afterwards). Conversions after the loop are free of the cost the lesson teaches: once the last micro-step is
    queued, the first one waits for it and the rest find the device idle."""
    scenario = SYNC_SCENARIO.with_(iters=micro_steps, scaler_enabled=scaler_enabled)
    objects, calls, forwards = training_objects(scenario), [], []
    batches = epoch_batches(scenario, 0)   # outside the count: building them (once, then cached) converts too
    handle = objects.model.register_forward_pre_hook(lambda module, args: forwards.append(len(calls)))
    try:
        with count_host_syncs(calls):
            train_one_epoch(objects.model, batches, objects.optimizer, device="cpu", epoch=0, epochs=1,
                            iters=micro_steps, base_lr=scenario.base_lr, accumulation_steps=8,
                            grad_clip=scenario.grad_clip, scaler=objects.scaler if scaler_enabled else None)
    finally:
        handle.remove()
    in_loop = calls[forwards[0]:forwards[-1]] if forwards else []
    return in_loop, [n for n, p in objects.model.named_parameters() if p.grad is not None]


@check("train_one_epoch", objective="no_host_sync", hidden=True)
def train_one_epoch_syncs_once_per_epoch(impl):
    """No device-to-host sync per micro-step, with scaler=None and with an enabled GradScaler: between its first
    forward pass and its last, an epoch of 5 micro-steps converts device tensors to Python (.item(), float(),
    .tolist(), ...) or copies them to the host (.cpu(), .numpy()) exactly as often as one of 2 with the same single
    update (the tail flush). Conversions after the loop are free: convert there. A tensor born on the host (made
    without a device, e.g. a schedule computed with torch) waits for no device and does not count."""
    for scaler_enabled, scaler in ((False, "scaler=None"), (True, "an enabled GradScaler")):
        short, long = (tail_only_run(impl.train_one_epoch, n, scaler_enabled)[0] for n in (2, 5))
        extra = list((collections.Counter(long) - collections.Counter(short)).elements())
        with hint(host_copy_hint(extra, scaler_enabled)):
            expect_equal(f"host syncs that 3 more micro-steps add inside the loop (epoch of 5 vs 2, K=8, {scaler})",
                         extra, [])


class SentTensor(torch.Tensor):
    """A batch tensor that records each device it is sent to (``.to(...)``, ``.cuda()``, a ``device=`` argument):
    the device move can be graded on the CPU, where it changes nothing. Every op on it gives a plain tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = kwargs.get("device")
        if target is None and func in (torch.Tensor.to, torch.Tensor.cuda):
            target = next((a for a in args[1:] if isinstance(a, (str, torch.device, int))), "cuda" if
                          func is torch.Tensor.cuda else None)
        if target is not None:
            for sent in (a for a in args if isinstance(a, SentTensor)):
                sent.sent_to.append(str(torch.device(target)) if not isinstance(target, int) else f"cuda:{target}")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def sent_batches(scenario: LoopScenario) -> list[tuple[SentTensor, SentTensor]]:
    batches = []
    for input_ids, labels in epoch_batches(scenario, 0):
        pair = (input_ids.as_subclass(SentTensor), labels.as_subclass(SentTensor))
        for tensor in pair:
            tensor.sent_to = []
        batches.append(pair)
    return batches


@check("train_one_epoch", objective="batch_to_device")
def train_one_epoch_sends_every_batch_to_the_device(impl):
    """Every micro-batch's input_ids and labels are sent to ``device`` (``.to(device)``) before its forward pass.
    Graded on the CPU with batches that record where they were sent (on CUDA a batch left on the host crashes)."""
    scenario = SYNC_SCENARIO.with_(iters=2)
    objects, batches = training_objects(scenario), sent_batches(scenario)
    impl.train_one_epoch(objects.model, batches, objects.optimizer, device="cpu", epoch=0, epochs=1, iters=2,
                         base_lr=scenario.base_lr, accumulation_steps=8, grad_clip=scenario.grad_clip)
    with hint("move each micro-batch to the device first: input_ids.to(device) and labels.to(device) (the "
              "checks pass device='cpu'; the stage assembly passes its --device, e.g. cuda:0)"):
        expect_equal(f"[{scenario.name}, 2 micro-steps, device='cpu'] where each batch's (input_ids, labels) were "
                     f"sent", [(ids.sent_to[-1:], labels.sent_to[-1:]) for ids, labels in batches],
                     [(["cpu"], ["cpu"])] * len(batches))


@check("train_one_epoch")
def train_one_epoch_emits_no_warnings(impl):
    """The loop emits no warnings, with scaler=None and with the caller's GradScaler: a warning there is a
    misconfiguration (torch.amp.GradScaler() without a device is a CUDA scaler, enabled on a GPU even in an fp32
    run; torch.cuda.amp.GradScaler is deprecated)."""
    scenario = SYNC_SCENARIO.with_(iters=2)
    for scaler_passed in (False, True):
        objects = training_objects(scenario)
        warning_free(impl.train_one_epoch, f"[{scenario.name}, 2 micro-steps, scaler="
                                            f"{'a disabled GradScaler' if scaler_passed else 'None'}]")(
            objects.model, epoch_batches(scenario, 0), objects.optimizer, device="cpu", epoch=0, epochs=1,
            iters=2, base_lr=scenario.base_lr, accumulation_steps=8, grad_clip=scenario.grad_clip,
            scaler=objects.scaler if scaler_passed else None)


@check("train_one_epoch")
def train_one_epoch_clears_gradients_to_none(impl):
    """After an update the gradients are cleared with zero_grad(set_to_none=True): .grad is None."""
    left = tail_only_run(impl.train_one_epoch, 2)[1]
    with hint("clear with zero_grad(set_to_none=True): after an update every .grad is None, not a tensor of zeros"
              if left else ""):
        expect_equal("parameters whose .grad is not None after the epoch's last update (2 micro-steps, K=8)", left, [])
