"""Lesson 14 checks of ``train_one_epoch``: the run against the oracle's, record by record, in fp32 and
under autocast / GradScaler, plus its edge cases (the tail flush, an empty epoch, param groups, scaler=None,
bad arguments). Failures carry a hint where the numbers point at a cause."""
from __future__ import annotations

import contextlib
import functools
import math

import torch

from course.minimind import get_lr
from course.runs import LoopScenario, epoch_batches, run_impl, run_oracle, training_objects
from course.runs.eager import eager
from course.runs.scenarios import LOOP_AMP_SCENARIOS, LOOP_BASE, LOOP_FP32_SCENARIOS

from ..framework import (CheckFailure, check, expect_close, expect_equal, expect_raises, expect_tensor_close,
                         expect_tensors_close, fail)
from .checks import LR_RTOL


# Grading tolerances against the oracle. The reference matches bitwise (tests/test_oracle.py); these
# leave room for equivalent float orderings: a 1-ulp gradient change moves AdamW parameters by
# ~1e-8 after a dozen steps, while each catalogued mistake moves them by >= 1e-5 or changes a record.
LOSS_RTOL, NORM_RTOL, PARAM_ATOL, STATE_RTOL = 1e-5, 1e-4, 2e-6, 1e-4


def compare_runs(scenario: LoopScenario, actual, expected) -> None:
    where = f"[{scenario.name}]"
    keys = ("step", "lr", "loss", "aux_loss", "update_closed", "overflow_skipped", "grad_norm")
    for i, record in enumerate(actual.records):
        missing = [k for k in keys if k not in record]
        if missing:
            fail(f"{where} record {i} lacks keys", sorted(record), f"at least {list(keys)}")
    expect_equal(f"{where} micro-steps seen (epoch, step)", [(r["epoch"], r["step"]) for r in actual.records],
                 [(r["epoch"], r["step"]) for r in expected.records])
    for key, meaning in (("update_closed", "closed an accumulation window (optimizer asked to step)"),
                         ("overflow_skipped", "the GradScaler skipped optimizer.step (inf/NaN gradients)")):
        expect_equal(f"{where} micro-steps that {meaning} (epoch, step)",
                     [(r["epoch"], r["step"]) for r in actual.records if r[key]],
                     [(r["epoch"], r["step"]) for r in expected.records if r[key]])
    k = scenario.accumulation_steps
    for got, want in zip(actual.records, expected.records):
        at = f"{where} epoch {want['epoch']} step {want['step']}"
        expect_close(f"{at}: lr", got["lr"], want["lr"], rtol=LR_RTOL)
        with hint(loss_hint(_float(got["loss"]), want["loss"], k)):
            expect_close(f"{at}: loss (unscaled, aux included)", _float(got["loss"]), want["loss"],
                         rtol=LOSS_RTOL, atol=1e-6)
        expect_close(f"{at}: aux_loss", _float(got["aux_loss"]), want["aux_loss"], rtol=LOSS_RTOL, atol=1e-8)
        with hint(norm_hint(_float(got["grad_norm"]), want["grad_norm"], k)):
            expect_close(f"{at}: grad_norm before clipping", _float(got["grad_norm"]), want["grad_norm"],
                         rtol=NORM_RTOL)
    if expected.scale is not None:
        expect_equal(f"{where} GradScaler scale after the run", actual.scale, expected.scale)
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


def _float(value):
    return float(value) if value is not None else None


def _ratio(actual, expected, k: int):
    """actual / expected where a ratio can point at a cause (K > 1, both finite and non-zero), else None."""
    if k == 1 or actual is None or expected is None or not expected or not math.isfinite(actual * expected):
        return None
    return actual / expected


def loss_hint(actual, expected, k: int) -> str:
    ratio = _ratio(actual, expected, k)
    if ratio is not None and abs(ratio * k - 1) < 0.01:
        return f"loss = expected / K (K={k}): record the unscaled loss, before scale_loss_for_accumulation"
    return ""


def norm_hint(actual, expected, k: int) -> str:
    """K micro-batch gradients summed are K to sqrt(K) times one of them (aligned to random directions)."""
    ratio = _ratio(actual, expected, k)
    if ratio is None:
        return ""
    if abs(ratio / k - 1) < 0.01:
        return f"norm = K x expected (K={k}): is the loss divided by K (scale_loss_for_accumulation) before backward?"
    if 0.5 / k <= ratio <= 1.25 / math.sqrt(k):
        return (f"norm between 1/K and 1/sqrt(K) of expected (K={k}): are gradients zeroed every micro-step, "
                "so only the last micro-batch's gradient is left?")
    return ""


@contextlib.contextmanager
def hint(text: str):
    """Append ``hint: text`` to a failure raised inside the block (when there is a hint)."""
    try:
        yield
    except CheckFailure as exc:
        if not text:
            raise
        raise CheckFailure(f"{exc}\n  hint: {text}") from None


@functools.lru_cache(maxsize=4)
def impl_run(train_one_epoch, scenario: LoopScenario):
    """``run_impl``, shared by the checks of one grading run (the tail check and the base scenario)."""
    return run_impl(train_one_epoch, scenario)


def _check_scenarios(impl, scenarios) -> None:
    for scenario in scenarios:
        compare_runs(scenario, impl_run(impl.train_one_epoch, scenario), run_oracle(scenario))


@check("train_one_epoch")
def train_one_epoch_marks_the_tail_flush(impl):
    """With 6 micro-batches and K=4 the last record of an epoch is the tail flush: it closes an update
    and reports a norm; grad_norm is None wherever no update closed."""
    records = [r for r in impl_run(impl.train_one_epoch, LOOP_BASE).records if r.get("epoch") == 0]
    last = records[-1]
    if not (last.get("update_closed") and last.get("tail_flush") and last.get("grad_norm") is not None):
        fail("last record of an epoch ending mid-window (6 micro-steps, K=4)",
             {k: last.get(k) for k in ("step", "update_closed", "tail_flush", "grad_norm")},
             {"step": 6, "update_closed": True, "tail_flush": True, "grad_norm": "a float (pre-clip norm)"})
    if not all(r.get("grad_norm") is None for r in records if not r.get("update_closed")):
        fail("grad_norm on micro-steps without an update",
             [r.get("grad_norm") for r in records], "None wherever update_closed is False")


@check("train_one_epoch")
def train_one_epoch_returns_nothing_for_an_empty_epoch(impl):
    """A resume at start_step == iters (6 micro-batches, K=4: the tail was flushed before the save) runs no
    micro-step: it returns [] and changes nothing."""
    objects = training_objects(LOOP_BASE)
    before = {n: p.detach().clone() for n, p in objects.model.named_parameters()}
    try:
        records = impl.train_one_epoch(objects.model, [], objects.optimizer, device="cpu", epoch=0, epochs=2,
                                       iters=6, base_lr=5e-4, accumulation_steps=4, grad_clip=1.0, start_step=6)
    except NotImplementedError:
        raise
    except Exception as exc:
        fail("train_one_epoch(loader=[], iters=6, start_step=6, K=4)", f"{type(exc).__name__}: {exc}", [],
             "hint: nothing ran, so there is nothing to stack, flush or record: return [] early")
    expect_equal("train_one_epoch(loader=[], iters=6, start_step=6, K=4)", records, [])
    expect_tensors_close("parameters after an empty epoch",
                         {n: p.detach() for n, p in objects.model.named_parameters()}, before, rtol=0.0, atol=0.0)


@check("train_one_epoch")
def train_one_epoch_sets_lr_in_every_param_group(impl):
    """With two param groups (e.g. decay / no decay) every group gets the schedule's lr."""
    scenario = LOOP_BASE.with_(name="dense, 1 epoch of 4 micro-batches, two param groups", epochs=1, iters=4)
    objects = training_objects(scenario)
    params = list(objects.model.parameters())
    optimizer = eager(torch.optim.AdamW)([{"params": params[::2]}, {"params": params[1::2]}], lr=scenario.base_lr)
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append([g["lr"] for g in opt.param_groups]))
    impl.train_one_epoch(objects.model, epoch_batches(scenario, 0), optimizer, device="cpu", epoch=0, epochs=1,
                         iters=scenario.iters, base_lr=scenario.base_lr, accumulation_steps=4, grad_clip=1.0)
    expect_equal("lr of (group 0, group 1) at optimizer.step (micro-step 4 of 4, K=4)", seen,
                 [[get_lr(4, 4, scenario.base_lr)] * 2])


@check("train_one_epoch", hidden=True)
def train_one_epoch_scaler_none_is_disabled(impl):
    """scaler=None means a disabled GradScaler: an inf gradient is not skipped (the update runs, the weights it
    reaches become non-finite) and no record says overflow_skipped."""
    scenario = LOOP_BASE.with_(name="dense, 2 micro-batches, K=2, scaler=None, inf gradient in micro-step 2",
                               epochs=1, iters=2, accumulation_steps=2, overflow_at_backward=2)
    objects = training_objects(scenario)
    records = impl.train_one_epoch(objects.model, epoch_batches(scenario, 0), objects.optimizer, device="cpu",
                                   epoch=0, epochs=1, iters=scenario.iters, base_lr=scenario.base_lr,
                                   accumulation_steps=scenario.accumulation_steps, grad_clip=1.0)
    expect_equal("micro-steps with overflow_skipped=True under scaler=None",
                 [r["step"] for r in records if r.get("overflow_skipped")], [])
    weight = objects.model.model.norm.weight
    expect_equal("model.norm.weight all finite after the inf gradient's update under scaler=None",
                 bool(torch.isfinite(weight).all()), False)


@check("train_one_epoch")
def train_one_epoch_matches_oracle_fp32(impl):
    """Same lr, step positions, losses, grad norms, parameters and AdamW state as the oracle (fp32)."""
    _check_scenarios(impl, LOOP_FP32_SCENARIOS)


@check("train_one_epoch", hidden=True)
def train_one_epoch_matches_oracle_amp(impl):
    """bf16 autocast and an enabled CPU GradScaler with an overflow (step skipped, scale halved)."""
    _check_scenarios(impl, LOOP_AMP_SCENARIOS)


@check("train_one_epoch", hidden=True)
def train_one_epoch_rejects_bad_arguments(impl):
    """K, iters or epochs <= 0, epoch outside [0, epochs), start_step outside [0, iters]: ValueError
    naming the argument."""
    objects = training_objects(LOOP_BASE)
    good = dict(device="cpu", epoch=0, epochs=1, iters=6, base_lr=5e-4, accumulation_steps=4, grad_clip=1.0)
    bad = [(dict(accumulation_steps=0), "accumulation_steps"), (dict(iters=0), "iters"),
           (dict(epochs=0), "epochs"), (dict(epoch=1), "epoch"), (dict(epoch=-1), "epoch"),
           (dict(start_step=7), "start_step"), (dict(start_step=-1), "start_step")]
    for changes, argument in bad:
        expect_raises(f"train_one_epoch(..., {', '.join(f'{k}={v}' for k, v in changes.items())})",
                      lambda: impl.train_one_epoch(objects.model, epoch_batches(LOOP_BASE, 0), objects.optimizer,
                                                   **{**good, **changes}), ValueError, argument)
