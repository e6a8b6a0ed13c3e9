"""Lesson 14 checks of ``train_one_epoch``: the run against the oracle's, record by record, in fp32 and
under autocast / GradScaler, plus its edge cases (the tail flush, an empty epoch, param groups,
scaler=None; the arguments: loop_arguments). Failures carry a hint where the numbers point at a cause."""
from __future__ import annotations

import collections
import contextlib
import functools
import math

import torch

from course.minimind import get_lr
from course.runs import LoopScenario, epoch_batches, run_impl, run_oracle, training_objects
from course.runs.eager import eager
from course.runs.scenarios import LOOP_AMP_SCENARIOS, LOOP_BASE, LOOP_FP32_SCENARIOS

from ..framework import (CheckFailure, check, expect_close, expect_equal, expect_tensor_close, expect_tensors_close,
                         expect_type, fail)
from ..host_syncs import count_host_syncs
from .checks import LR_RTOL


# Grading tolerances against the oracle. The reference matches bitwise (tests/test_oracle.py); these
# leave room for equivalent float orderings: a 1-ulp gradient change moves AdamW parameters by
# ~1e-8 after a dozen steps, while each catalogued mistake moves them by >= 1e-5 or changes a record.
LOSS_RTOL, NORM_RTOL, PARAM_ATOL, STATE_RTOL = 1e-5, 1e-4, 2e-6, 1e-4


# What each record value must be: Python values, never tensors (a kept tensor holds memory or a graph).
RECORD_TYPES = {"step": (int,), "lr": (float,), "loss": (float,), "aux_loss": (float,), "update_closed": (bool,),
                "overflow_skipped": (bool,), "grad_norm": (float, type(None)), "tail_flush": (bool,)}
RECORD_TYPES_HINT = ("hint: records hold Python values (an int step, float numbers, bool flags): convert the epoch's "
                     "tensors once at its end (torch.stack(...).tolist()); a tensor kept in a record holds device "
                     "memory, or the whole autograd graph, after the epoch")
FORWARD_LR_HINT = "write each micro-step's lr into every param group before its forward, not only before an update"


def compare_runs(scenario: LoopScenario, actual, expected, forward_lrs=None) -> None:  # forward_lrs: see observed
    where = f"[{scenario.name}]"
    for i, record in enumerate(actual.records):
        missing = [k for k in RECORD_TYPES if k not in record]
        if missing:
            fail(f"{where} record {i} lacks keys", sorted(record), f"at least {list(RECORD_TYPES)}")
        for key, types in RECORD_TYPES.items():
            expect_type(f"{where} record {i} {key!r}", record[key], *types, detail=RECORD_TYPES_HINT)
    if forward_lrs is not None:
        expect_equal(f"{where} forward passes (one per micro-step)", len(forward_lrs), len(expected.records))
    seen = [(r["epoch"], r["step"]) for r in actual.records]
    with hint(steps_hint(seen, expected.records)):
        expect_equal(f"{where} micro-steps seen (epoch, step)", seen,
                     [(r["epoch"], r["step"]) for r in expected.records])
    for key, meaning in (("update_closed", "closed an accumulation window (optimizer asked to step)"),
                         ("overflow_skipped", "the GradScaler skipped optimizer.step (inf/NaN gradients)")):
        got_steps = [(r["epoch"], r["step"]) for r in actual.records if r[key]]
        with hint(flags_hint(key, got_steps, expected.records)):
            expect_equal(f"{where} micro-steps that {meaning} (epoch, step)", got_steps,
                         [(r["epoch"], r["step"]) for r in expected.records if r[key]])
    k = scenario.accumulation_steps
    for index, (got, want) in enumerate(zip(actual.records, expected.records)):
        at = f"{where} epoch {want['epoch']} step {want['step']}"
        with hint(lr_hint(scenario, got["lr"], want, actual.records[:index])):
            expect_close(f"{at}: lr", got["lr"], want["lr"], rtol=LR_RTOL)
        loss = _float(got["loss"])
        with hint(loss_hint(loss, want["loss"], k) or aux_hint(loss, want["loss"], want["aux_loss"])
                  or update_hint(scenario, expected.records, index)):
            expect_close(f"{at}: loss (unscaled, aux included)", loss, want["loss"], rtol=LOSS_RTOL, atol=1e-6)
        aux = _float(got["aux_loss"])
        with hint(aux_backward_hint(aux, want["aux_loss"], expected.records)):
            expect_close(f"{at}: aux_loss", aux, want["aux_loss"], rtol=LOSS_RTOL, atol=1e-8)
        norm = _float(got["grad_norm"])
        with hint(scaled_norm_hint(scenario, norm, want["grad_norm"]) or norm_hint(norm, want["grad_norm"], k)
                  or aux_backward_hint(norm, want["grad_norm"], expected.records)):
            expect_close(f"{at}: grad_norm before clipping", norm, want["grad_norm"], rtol=NORM_RTOL)
    if expected.scale is not None:
        expect_equal(f"{where} GradScaler scale after the run", actual.scale, expected.scale)
    with hint(update_hint(scenario, expected.records, len(expected.records))):
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
    for want, lrs in zip(expected.records, forward_lrs or ()):
        for group, lr in enumerate(lrs):
            with hint(FORWARD_LR_HINT):
                expect_close(f"{where} epoch {want['epoch']} step {want['step']}: lr of param group {group} at the "
                             "forward pass", lr, want["lr"], rtol=LR_RTOL)


def _float(value):
    return float(value) if value is not None else None


def _ratio(actual, expected, k: int):
    """actual / expected where a ratio can point at a cause (K > 1, both finite and non-zero), else None."""
    if k == 1 or actual is None or expected is None or not expected or not math.isfinite(actual * expected):
        return None
    return actual / expected


def steps_hint(seen, expected_records) -> str:
    """Micro-step numbers that restart at 1 where the oracle's continue after a resume."""
    if seen and expected_records and seen[0][1] == 1 and expected_records[0]["step"] > 1:
        return ("micro-steps continue after a resume: the first batch of this call is micro-step start_step + 1 "
                f"(here {expected_records[0]['step']}), not 1")
    return ""


def flags_hint(key: str, got_steps, expected_records) -> str:
    """Name the rule behind a wrong set of update_closed / overflow_skipped micro-steps."""
    got, want = set(got_steps), {(r["epoch"], r["step"]) for r in expected_records if r[key]}
    missing, extra = sorted(want - got), sorted(got - want)
    tails = {(r["epoch"], r["step"]) for r in expected_records if r["tail_flush"]}
    skipped = {(r["epoch"], r["step"]) for r in expected_records if r["overflow_skipped"]}
    causes = []
    if key == "update_closed":
        if set(missing) & tails:
            causes.append(f"the tail flush is missing at (epoch, step) {sorted(set(missing) & tails)}: a partial window "
                          "left when the epoch (or the loader) ends gets the update once; decide it from the last "
                          "micro-step actually run, never from iters")
        if set(missing) & skipped:
            causes.append(f"a skipped update still closes its window at {sorted(set(missing) & skipped)}: "
                          "update_closed means the optimizer was asked to step, whether or not the GradScaler stepped")
        if extra:
            causes.append(f"updates at {extra} where no window closes: a window of K closes on its K-th micro-step, "
                          "counted from micro-step 1 of the epoch")
    else:
        if extra:
            causes.append(f"overflow_skipped at {extra}, where the GradScaler stepped: a scale that grows (after "
                          "growth_interval clean updates) is no skip, and a disabled scaler never skips")
        if missing:
            causes.append(f"the GradScaler skipped optimizer.step at {missing} (inf/NaN gradients): report "
                          "overflow_skipped=True there, in the tail flush too")
    return "; ".join(causes)


def lr_hint(scenario: LoopScenario, actual, want, earlier) -> str:
    """A wrong lr that another rule explains: a schedule restarting per epoch, or a stale lr left in the optimizer."""
    if actual is None or not isinstance(actual, (int, float)):
        return ""
    total = scenario.epochs * scenario.iters
    if want["epoch"] > 0 and abs(actual - get_lr(want["step"], total, scenario.base_lr)) <= 1e-12 * abs(actual):
        return ("the schedule restarts every epoch: the lr follows the GLOBAL micro-step (epoch * iters + step of "
                "epochs * iters)")
    if actual == scenario.base_lr or any(actual == r.get("lr") for r in earlier):
        return ("a stale lr: the optimizer still holds an earlier lr. Write this micro-step's lr into every param "
                "group at EVERY micro-step, before its forward, not only where a window closes")
    return ""


def scaled_norm_hint(scenario: LoopScenario, actual, expected) -> str:
    """A pre-clip norm a power of two (a GradScaler scale) times the oracle's: the clip saw scaled gradients."""
    if not getattr(scenario, "scaler_enabled", False) or not actual or not expected:
        return ""
    if not (math.isfinite(actual) and math.isfinite(expected)):
        return ""
    ratio = actual / expected
    if ratio >= 2 and abs(math.log2(ratio) - round(math.log2(ratio))) < 0.01:
        return (f"norm = {ratio:.0f} x expected, a GradScaler scale: clipping the still-scaled gradients: unscale "
                "first (scaler.unscale_ before clip_grad_norm_, lesson 14 §1.5)")
    return ""


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


def aux_hint(actual, expected, aux) -> str:
    if actual is not None and aux and abs(expected - actual - aux) <= 1e-3 * abs(aux):
        return "loss = expected - aux_loss: the aux loss is not in the loss (loss = out.loss + out.aux_loss)"
    return ""


# The MoE router's aux_loss is ~1e-3 of the LM loss: leaving it out of the backward moves a norm or the
# router's next aux_loss by well under 1 %.
AUX_SIZED = 0.01


def aux_backward_hint(actual, expected, records) -> str:
    """A small difference (norm, aux_loss) in a run with an aux loss points at a backward without it."""
    if actual is None or not expected or not any(r["aux_loss"] for r in records):
        return ""
    if abs(actual / expected - 1) < AUX_SIZED:
        return ("a small difference in a run with an aux loss: the aux loss is not in the backward "
                "(backpropagate (out.loss + out.aux_loss) / K)")
    return ""


def update_hint(scenario: LoopScenario, records, index: int) -> str:
    """The loss or the parameters first differ at ``index`` while every earlier lr, loss and norm matched: name
    what only the updates before it use (the tail flush's lr, the clipping)."""
    causes = []
    if index > 0 and records[index - 1]["tail_flush"]:
        update = records[index - 1]
        causes.append(f"a stale lr in the tail flush at epoch {update['epoch']} step {update['step']} right before "
                      "(write the lr into every param group at every micro-step, not only where a window closes)")
    clipped = [(r["epoch"], r["step"]) for r in records[:index] if r["update_closed"] and r["grad_norm"] is not None
               and math.isfinite(r["grad_norm"]) and r["grad_norm"] > scenario.grad_clip]
    if clipped:
        causes.append(f"no clipping to grad_clip: the updates at (epoch, step) {clipped} had pre-clip norms above "
                      f"grad_clip={scenario.grad_clip} (clip_grad_norm_(model.parameters(), grad_clip), after "
                      "unscale_)")
    return "all earlier records matched; likely " + " or ".join(causes) if causes else ""


@contextlib.contextmanager
def hint(text: str):
    """Append ``hint: text`` to a failure raised inside the block (when there is a hint)."""
    try:
        yield
    except CheckFailure as exc:
        if not text:
            raise
        raise CheckFailure(f"{exc}\n  hint: {text}") from None


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
    """``run_impl``, shared by the checks of one grading run (the tail check and the base scenario), and the param
    groups' lr at each forward pass. A loader that ends early comes as a one-shot generator."""
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


@check("train_one_epoch")
def train_one_epoch_marks_the_tail_flush(impl):
    """With 6 micro-batches and K=4 the last record of an epoch is the tail flush: it closes an update
    and reports a norm; grad_norm is None wherever no update closed."""
    records = [r for r in impl_run(impl.train_one_epoch, LOOP_BASE)[0].records if r.get("epoch") == 0]
    last = records[-1]
    if not (last.get("update_closed") and last.get("tail_flush") and last.get("grad_norm") is not None):
        fail("last record of an epoch ending mid-window (6 micro-steps, K=4)",
             {k: last.get(k) for k in ("step", "update_closed", "tail_flush", "grad_norm")},
             {"step": 6, "update_closed": True, "tail_flush": True, "grad_norm": "a float (pre-clip norm)"},
             "hint: the tail flush closes the last, partial window after the loop; its record (the last micro-step "
             "run) says update_closed=True, tail_flush=True and carries the pre-clip norm")
    if not all(r.get("grad_norm") is None for r in records if not r.get("update_closed")):
        fail("grad_norm on micro-steps without an update",
             [r.get("grad_norm") for r in records], "None wherever update_closed is False",
             "hint: grad_norm is None where no update closed (not 0.0: no norm was measured there)")


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
    """With two param groups (e.g. decay / no decay) every group holds the schedule's lr at every forward pass
    and at every optimizer step (4 micro-batches, K=3: an update at 3, the tail flush at 4)."""
    scenario = LOOP_BASE.with_(name="dense, 1 epoch of 4 micro-batches, K=3, two param groups", epochs=1, iters=4,
                               accumulation_steps=3)
    objects = training_objects(scenario)
    params = list(objects.model.parameters())
    optimizer = eager(torch.optim.AdamW)([{"params": params[::2]}, {"params": params[1::2]}], lr=scenario.base_lr)
    at_steps, at_forwards = [], []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: at_steps.append([g["lr"] for g in opt.param_groups]))
    observed(impl.train_one_epoch, at_forwards)(
        objects.model, epoch_batches(scenario, 0), optimizer, device="cpu", epoch=0, epochs=1, iters=scenario.iters,
        base_lr=scenario.base_lr, accumulation_steps=3, grad_clip=1.0)
    with hint("write the lr into EVERY optimizer.param_groups entry, not only the first"):
        expect_group_lrs("optimizer.step", at_steps, (3, 4), scenario)
    with hint(FORWARD_LR_HINT):
        expect_group_lrs("the forward pass", at_forwards, (1, 2, 3, 4), scenario)


def expect_group_lrs(where: str, seen: list, steps: tuple, scenario: LoopScenario) -> None:
    """``seen``: the 2 param groups' lr at each ``where`` event, one per micro-step in ``steps``."""
    expect_equal(f"micro-steps reaching {where} (4 micro-batches, K=3)", len(seen), len(steps))
    for step, lrs in zip(steps, seen):
        expect_equal(f"param groups at {where} of micro-step {step}", len(lrs), 2)
        for group, lr in enumerate(lrs):
            expect_close(f"lr of param group {group} at {where} of micro-step {step} of 4", lr,
                         get_lr(step, scenario.iters, scenario.base_lr), rtol=LR_RTOL)


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
    skipped = [r["step"] for r in records if r.get("overflow_skipped")]
    with hint("scaler=None means a DISABLED GradScaler (enabled=False): it never skips a step" if skipped else ""):
        expect_equal("micro-steps with overflow_skipped=True under scaler=None", skipped, [])
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


SYNC_SCENARIO = LoopScenario("dense, 1 epoch, K=8: one window that only the tail flush closes", epochs=1,
                             accumulation_steps=8, hidden_size=32, num_hidden_layers=1, max_length=16)


@functools.lru_cache(maxsize=4)
def tail_only_run(train_one_epoch, micro_steps: int):
    """An epoch of ``micro_steps`` < K micro-batches (one update: the tail flush) under ``count_host_syncs``;
    returns (the conversions counted, names of parameters whose .grad is not None afterwards)."""
    scenario = SYNC_SCENARIO.with_(iters=micro_steps)
    objects, calls = training_objects(scenario), []
    batches = epoch_batches(scenario, 0)   # outside the count: building them (once, then cached) converts too
    with count_host_syncs(calls):
        train_one_epoch(objects.model, batches, objects.optimizer, device="cpu", epoch=0, epochs=1,
                        iters=micro_steps, base_lr=scenario.base_lr, accumulation_steps=8, grad_clip=scenario.grad_clip)
    return calls, [n for n, p in objects.model.named_parameters() if p.grad is not None]


@check("train_one_epoch", hidden=True)
def train_one_epoch_syncs_once_per_epoch(impl):
    """No device-to-host sync per micro-step: an epoch of 5 micro-steps converts tensors to Python (.item(),
    float(), .tolist(), ...) exactly as often as one of 2 with the same single update."""
    short, long = (tail_only_run(impl.train_one_epoch, n)[0] for n in (2, 5))
    extra = list((collections.Counter(long) - collections.Counter(short)).elements())
    with hint("keep detached tensors during the epoch and convert them once at its end" if extra else ""):
        expect_equal("host syncs that 3 more micro-steps add (epoch of 5 vs 2, K=8)", extra, [])


@check("train_one_epoch", hidden=True)
def train_one_epoch_clears_gradients_to_none(impl):
    """After an update the gradients are cleared with zero_grad(set_to_none=True): .grad is None."""
    left = tail_only_run(impl.train_one_epoch, 2)[1]
    with hint("clear with zero_grad(set_to_none=True): after an update every .grad is None, not a tensor of zeros"
              if left else ""):
        expect_equal("parameters whose .grad is not None after the epoch's last update (2 micro-steps, K=8)", left, [])
