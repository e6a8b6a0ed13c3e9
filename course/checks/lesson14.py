"""Lesson 14: learning rate, gradient accumulation, AMP and clipping - descriptor, checks, mistakes.

Tolerances are chosen so that algebraically equivalent code passes (``loss * (1 / K)``, a rearranged
cosine) while every catalogued mistake (end of this file) fails; the mistake-catalogue tests prove both.
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch

from course.minimind import get_lr

from course.runs import (LoopScenario, accumulate_gradients, epoch_batches, full_epoch_batches, in_float64,
                         run_impl, run_oracle, tiny_model, training_objects)
from course.runs.eager import eager
from course.runs.scenarios import LOOP_AMP_SCENARIOS, LOOP_BASE, LOOP_FP32_SCENARIOS

from .framework import (CheckFailure, Exercise, Lesson, expect_close, expect_equal, expect_raises,
                        expect_tensor_close, expect_tensors_close, fail)
from .student_tests import WrongImplementation, catalogue_weak_comparisons, grade_student_test


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


LESSON = Lesson(
    lesson_id="14",
    slug="lr_grad_accum_amp",
    title="Learning rate, gradient accumulation and mixed precision",
    module="train_loop",
    exercises=[
        Exercise("cosine_lr", "14 §5.1", points=2, hidden_points=1),
        Exercise("scale_loss_for_accumulation", "14 §5.2", points=1, hidden_points=1),
        Exercise("should_step_optimizer", "14 §5.3", points=1, hidden_points=1),
        Exercise("should_flush_tail", "14 §5.4", points=1, hidden_points=1),
        Exercise("train_one_epoch", "14 §5.5", points=3, hidden_points=2),
        Exercise("test_accumulation_matches_big_batch", "14 §5.6", points=2),
    ],
    labs=("lesson14_trace_pretrain_step.py", "lesson14_adamw_scale.py", "lesson14_predictions.py", "bench_lesson14_grader.py",
          "bench_lesson14_streaming.py"),
    notebook_mistake="clip_before_unscale",
    report=mechanics_report,
)
check = LESSON.check

# Steps of a 20-step run where the report and the first check compare the schedule.
REPORT_LR_STEPS = (0, 1, 5, 10, 19, 20)
LR_RTOL = 1e-12          # a rearranged formula differs by a few ulps, a wrong one by >= 1e-3

# --- cosine_lr -----------------------------------------------------------------------------


@check("cosine_lr")
def cosine_lr_matches_get_lr(impl):
    """cosine_lr equals MiniMind's get_lr along a 20-step run and across several (T, lr)."""
    cases = [(s, 20, 5e-4) for s in REPORT_LR_STEPS] + [
        (0, 1, 1.0), (1, 1, 1.0), (3, 7, 1e-3), (333, 1000, 3e-4), (12, 12, 2.0)]
    for step, total, lr in cases:
        expect_close(f"cosine_lr({step}, {total}, {lr})", impl.cosine_lr(step, total, lr),
                     get_lr(step, total, lr), rtol=LR_RTOL)


@check("cosine_lr")
def cosine_lr_endpoints(impl):
    """The schedule starts at base_lr and ends at 0.1 * base_lr (no warmup, no decay to 0)."""
    expect_close("cosine_lr(0, 100, 1.0) (start)", impl.cosine_lr(0, 100, 1.0), 1.0, rtol=LR_RTOL)
    expect_close("cosine_lr(100, 100, 1.0) (end)", impl.cosine_lr(100, 100, 1.0), 0.1, rtol=LR_RTOL)
    expect_close("cosine_lr(50, 100, 1.0) (middle)", impl.cosine_lr(50, 100, 1.0), 0.55, rtol=LR_RTOL)


@check("cosine_lr", hidden=True)
def cosine_lr_rejects_bad_arguments(impl):
    """total_steps <= 0 and current_step outside [0, total_steps] raise ValueError naming the argument."""
    expect_raises("cosine_lr(0, 0, 1e-3)", lambda: impl.cosine_lr(0, 0, 1e-3), ValueError, "total_steps")
    expect_raises("cosine_lr(0, -5, 1e-3)", lambda: impl.cosine_lr(0, -5, 1e-3), ValueError, "total_steps")
    expect_raises("cosine_lr(-1, 10, 1e-3)", lambda: impl.cosine_lr(-1, 10, 1e-3), ValueError, "current_step")
    expect_raises("cosine_lr(11, 10, 1e-3)", lambda: impl.cosine_lr(11, 10, 1e-3), ValueError, "current_step")

# --- scale_loss_for_accumulation -----------------------------------------------------------


@check("scale_loss_for_accumulation")
def scale_loss_divides_by_k(impl):
    """loss / K, as a tensor that still carries the graph (gradient 1/K)."""
    for value, k in [(8.0, 4), (3.0, 1), (1.0, 3), (2.5, 8)]:
        loss = torch.tensor(value, requires_grad=True)
        scaled = impl.scale_loss_for_accumulation(loss, k)
        if not torch.is_tensor(scaled):
            fail(f"scale_loss_for_accumulation(tensor({value}), {k}) type", type(scaled).__name__, "Tensor")
        expect_close(f"scale_loss_for_accumulation(tensor({value}), {k})", scaled.detach().item(), value / k, rtol=1e-6)
        if not scaled.requires_grad:
            fail("the scaled loss must stay in the autograd graph (requires_grad)", False, True)
        scaled.backward()
        if loss.grad is None:
            fail(f"d(scaled)/d(loss) for K={k}", None, 1.0 / k,
                 "hint: no gradient reached the loss: did the scaled loss lose its graph (a new tensor "
                 "built from .item() or .detach())?")
        expect_close(f"d(scaled)/d(loss) for K={k}", float(loss.grad), 1.0 / k, rtol=1e-6)


@check("scale_loss_for_accumulation", hidden=True)
def scale_loss_rejects_bad_k(impl):
    """accumulation_steps <= 0 raises ValueError naming accumulation_steps."""
    for k in (0, -2):
        expect_raises(f"scale_loss_for_accumulation(loss, {k})",
                      lambda: impl.scale_loss_for_accumulation(torch.tensor(1.0), k), ValueError,
                      "accumulation_steps")

# --- should_step_optimizer -----------------------------------------------------------------


def optimizer_step_positions(impl, micro_steps: int, k: int) -> list[int]:
    return [s for s in range(1, micro_steps + 1) if impl.should_step_optimizer(s, k)]


@check("should_step_optimizer")
def should_step_at_window_ends(impl):
    """Steps at micro-steps K, 2K, ... (1-based): 8 micro-steps with K=4 step at [4, 8]."""
    expect_equal("optimizer steps for micro-steps 1..8, K=4", optimizer_step_positions(impl, 8, 4), [4, 8])
    expect_equal("optimizer steps for micro-steps 1..10, K=3", optimizer_step_positions(impl, 10, 3), [3, 6, 9])
    expect_equal("optimizer steps for micro-steps 1..3, K=1 (no accumulation)",
                 optimizer_step_positions(impl, 3, 1), [1, 2, 3])
    for step, k, expected in [(1, 4, False), (2, 4, False), (3, 4, False), (4, 4, True)]:
        expect_equal(f"should_step_optimizer({step}, {k})", bool(impl.should_step_optimizer(step, k)), expected)


@check("should_step_optimizer", hidden=True)
def should_step_rejects_bad_arguments(impl):
    """accumulation_steps <= 0 or step <= 0 (micro-steps are 1-based) raise ValueError naming the argument."""
    for step, k in ((4, 0), (4, -1)):
        expect_raises(f"should_step_optimizer({step}, {k})", lambda: impl.should_step_optimizer(step, k), ValueError,
                      "accumulation_steps")
    for step, k in ((0, 4), (-4, 4)):
        expect_raises(f"should_step_optimizer({step}, {k})", lambda: impl.should_step_optimizer(step, k), ValueError,
                      "step")

# --- should_flush_tail ---------------------------------------------------------------------


@check("should_flush_tail")
def should_flush_only_a_partial_window(impl):
    """Flush iff the epoch ran micro-steps (last > start) and ended inside a window (last % K != 0; the
    windows count from micro-step 1 of the epoch, not from start_step)."""
    cases = [((10, 0, 4), True), ((8, 0, 4), False), ((0, 0, 4), False), ((5, 0, 1), False),
             ((10, 8, 4), True), ((8, 8, 4), False), ((12, 9, 4), False), ((13, 12, 4), True),
             # a resume at start_step == last_step ran nothing: no flush even though last % K != 0
             ((5, 5, 4), False), ((6, 6, 4), False)]
    for args, expected in cases:
        expect_equal(f"should_flush_tail(last_step={args[0]}, start_step={args[1]}, K={args[2]})",
                     bool(impl.should_flush_tail(*args)), expected)


@check("should_flush_tail", hidden=True)
def should_flush_rejects_bad_arguments(impl):
    """accumulation_steps <= 0, start_step < 0 or last_step < start_step raise ValueError naming it."""
    for k in (0, -4):
        expect_raises(f"should_flush_tail(10, 0, {k})", lambda: impl.should_flush_tail(10, 0, k), ValueError,
                      "accumulation_steps")
    expect_raises("should_flush_tail(3, 5, 4)", lambda: impl.should_flush_tail(3, 5, 4), ValueError, "last_step")
    expect_raises("should_flush_tail(3, -1, 4)", lambda: impl.should_flush_tail(3, -1, 4), ValueError, "start_step")

# --- train_one_epoch -----------------------------------------------------------------------

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


# --- test_accumulation_matches_big_batch: the student's test against wrong accumulations ---------


def _micro_batch_loss(model, input_ids, labels):
    out = model(input_ids, labels=labels)
    return out.loss + out.aux_loss


def accumulate_without_dividing(model, micro_batches, accumulation_steps):
    for input_ids, labels in micro_batches:
        _micro_batch_loss(model, input_ids, labels).backward()


def accumulate_dividing_twice(model, micro_batches, accumulation_steps):
    for input_ids, labels in micro_batches:
        (_micro_batch_loss(model, input_ids, labels) / accumulation_steps / accumulation_steps).backward()


def accumulate_zeroing_every_micro_batch(model, micro_batches, accumulation_steps):
    for input_ids, labels in micro_batches:
        model.zero_grad(set_to_none=True)
        (_micro_batch_loss(model, input_ids, labels) / accumulation_steps).backward()


def accumulate_first_micro_batch_only(model, micro_batches, accumulation_steps):
    input_ids, labels = micro_batches[0]
    _micro_batch_loss(model, input_ids, labels).backward()


def accumulate_dividing_by_micro_batch_size(model, micro_batches, accumulation_steps):
    for input_ids, labels in micro_batches:
        (_micro_batch_loss(model, input_ids, labels) / len(input_ids)).backward()


WRONG_ACCUMULATIONS = (
    WrongImplementation("accumulate_without_dividing", "backpropagates each micro-batch loss undivided (K times the "
                        "gradient)", "its gradient is K times too large; with K = 1 dividing by K changes nothing: use K >= 2 "
                        "micro-batches",
                        accumulate_without_dividing),
    WrongImplementation("accumulate_dividing_twice", "backpropagates loss / K / K (1/K of the gradient)",
                        "its gradient is 1/K of the right one; with K = 1 the extra division changes nothing",
                        accumulate_dividing_twice),
    WrongImplementation("accumulate_zeroing_every_micro_batch", "zero_grad before every backward: only the last "
                        "micro-batch's gradient / K is left", "use K >= 2 micro-batches and compare every parameter's "
                        "gradient", accumulate_zeroing_every_micro_batch),
    WrongImplementation("accumulate_first_micro_batch_only", "backpropagates the first micro-batch's loss alone: the "
                        "right size, the wrong samples", "if every micro-batch holds the same samples, one of them "
                        "has the big batch's gradient: use different samples; and a tolerance near float rounding",
                        accumulate_first_micro_batch_only),
    WrongImplementation("accumulate_dividing_by_micro_batch_size", "divides each loss by the micro-batch size "
                        "len(input_ids) instead of K", "with micro-batches of exactly K samples the two divisors "
                        "are equal: pick a micro-batch size different from K", accumulate_dividing_by_micro_batch_size),
)


@check("test_accumulation_matches_big_batch")
def accumulation_test_passes_correct_and_fails_wrong(impl):
    """Your test passes the correct accumulation (course/runs/accumulation.py, and the same in float64) and
    raises AssertionError on each of 5 wrong ones: no division by K, division by K twice, zero_grad every
    micro-batch, the first micro-batch only, division by the micro-batch size; and on one gradient tensor 1 % off."""
    grade_student_test("test_accumulation_matches_big_batch", impl.test_accumulation_matches_big_batch,
                       (accumulate_gradients, in_float64(accumulate_gradients)), WRONG_ACCUMULATIONS,
                       "a correct accumulation differs from one big batch by float rounding (~1e-8 here, other "
                       "orders and float64 differ in other bits): compare with a tolerance, e.g. "
                       "torch.testing.assert_close(rtol=1e-4, atol=1e-6), against ONE backward of the whole batch's "
                       "mean loss")


# --- mistake catalogue: each wrong variant FAILS the check named; equivalents PASS every check ----

LESSON.mistake("off_by_one_step", "steps when (step + 1) % K == 0 (upstream before PR #698, issue #691)",
               "return step % accumulation_steps == 0", "return (step + 1) % accumulation_steps == 0",
               should_step_at_window_ends)
LESSON.mistake("old_cosine_peaks_at_1_1", "lr/10 + 0.5*lr*(1+cos): the old formula, starts at 1.1*lr",
               "base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
               "base_lr / 10 + 0.5 * base_lr * (1 + math.cos(math.pi * current_step / total_steps))",
               cosine_lr_matches_get_lr)
LESSON.mistake("loss_not_divided", "backpropagates the raw loss: K micro-batches sum instead of average",
               "return loss / accumulation_steps", "return loss", scale_loss_divides_by_k)
LESSON.mistake("clip_before_unscale", "clips the still-scaled gradients, then unscales",
               "    scaler.unscale_(optimizer)\n    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n",
               "    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n    scaler.unscale_(optimizer)\n",
               train_one_epoch_matches_oracle_amp)
LESSON.mistake("no_tail_flush", "never flushes an epoch's partial last window: its gradients leak into the next "
               "epoch's first update (K + r micro-batches) and are lost after the last epoch",
               "if should_flush_tail(last_step, start_step, accumulation_steps):", "if False:",
               train_one_epoch_matches_oracle_fp32)
LESSON.mistake("lr_only_at_optimizer_steps", "writes the lr into the optimizer only on update micro-steps",
               '        for group in optimizer.param_groups:\n            group["lr"] = lr\n',
               '        if should_step_optimizer(step, accumulation_steps):\n'
               '            for group in optimizer.param_groups:\n                group["lr"] = lr\n',
               train_one_epoch_matches_oracle_fp32)
LESSON.mistake("forgets_aux_loss", "trains on the LM loss only: the MoE router's balance loss is lost",
               "loss = out.loss + out.aux_loss", "loss = out.loss", train_one_epoch_matches_oracle_fp32)
LESSON.mistake("schedule_ignores_epoch", "cosine_lr(step, ...) restarts the schedule every epoch",
               "cosine_lr(epoch * iters + step, epochs * iters, base_lr)", "cosine_lr(step, epochs * iters, base_lr)",
               train_one_epoch_matches_oracle_fp32)
LESSON.mistake("ignores_start_step", "counts micro-steps from 1 after a resume",
               "enumerate(loader, start=start_step + 1)", "enumerate(loader, start=1)",
               train_one_epoch_matches_oracle_fp32)
LESSON.mistake("zero_grad_every_micro_step", "clears gradients before each backward: nothing accumulates",
               "        scaler.scale(scaled_loss).backward()\n",
               "        optimizer.zero_grad(set_to_none=True)\n        scaler.scale(scaled_loss).backward()\n",
               train_one_epoch_matches_oracle_fp32)

LESSON.mistake("flush_ignores_start_step", "flushes whenever last_step % K != 0, also after a resume that ran nothing",
               "return last_step > start_step and last_step % accumulation_steps != 0",
               "return last_step % accumulation_steps != 0", should_flush_only_a_partial_window)
LESSON.mistake("flush_counts_windows_from_start_step", "(last - start) % K: windows restart at the resume point",
               "return last_step > start_step and last_step % accumulation_steps != 0",
               "return last_step > start_step and (last_step - start_step) % accumulation_steps != 0",
               should_flush_only_a_partial_window)
LESSON.mistake("loss_loses_graph", "rebuilds the scaled loss from .item(): no gradient reaches the model",
               "return loss / accumulation_steps",
               "return torch.tensor(loss.item() / accumulation_steps, requires_grad=True)", scale_loss_divides_by_k)
LESSON.mistake("step_accepts_negative_k", "should_step_optimizer refuses K == 0 only",
               "    if accumulation_steps <= 0:\n        raise ValueError(f\"accumulation_steps must be >= 1, got "
               "{accumulation_steps}\")\n    if step <= 0:",
               "    if accumulation_steps == 0:\n        raise ValueError(f\"accumulation_steps must be >= 1, got "
               "{accumulation_steps}\")\n    if step <= 0:", should_step_rejects_bad_arguments)
LESSON.mistake("step_accepts_negative_step", "should_step_optimizer refuses step == 0 only",
               "if step <= 0:", "if step == 0:", should_step_rejects_bad_arguments)
LESSON.mistake("flush_accepts_negative_k", "should_flush_tail refuses K == 0 only",
               "    if accumulation_steps <= 0:\n        raise ValueError(f\"accumulation_steps must be >= 1, got "
               "{accumulation_steps}\")\n    if start_step < 0:",
               "    if accumulation_steps == 0:\n        raise ValueError(f\"accumulation_steps must be >= 1, got "
               "{accumulation_steps}\")\n    if start_step < 0:", should_flush_rejects_bad_arguments)
LESSON.mistake("accepts_negative_epoch", "train_one_epoch checks epoch < epochs only",
               "if not 0 <= epoch < epochs:", "if epoch >= epochs:", train_one_epoch_rejects_bad_arguments)
LESSON.mistake("accepts_negative_start_step", "train_one_epoch checks start_step <= iters only",
               "if not 0 <= start_step <= iters:", "if start_step > iters:", train_one_epoch_rejects_bad_arguments)
LESSON.mistake("empty_epoch_crashes", "stacks the losses of an epoch that ran nothing: torch.stack([]) raises",
               "    if not steps:\n        return []\n", "", train_one_epoch_returns_nothing_for_an_empty_epoch)
LESSON.mistake("lr_in_first_group_only", "writes the lr into param_groups[0] only: other groups keep a stale lr",
               '        for group in optimizer.param_groups:\n            group["lr"] = lr\n',
               '        optimizer.param_groups[0]["lr"] = lr\n', train_one_epoch_sets_lr_in_every_param_group)
LESSON.mistake("scaler_none_enabled", "scaler=None builds an enabled GradScaler: fp32 runs skip overflowed updates",
               "scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)",
               "scaler = torch.amp.GradScaler(torch.device(device).type, enabled=True)",
               train_one_epoch_scaler_none_is_disabled)
LESSON.mistake("overflow_never_reported", "records overflow_skipped=False even when the GradScaler skipped the step",
               '"overflow_skipped": s in skipped_steps,', '"overflow_skipped": False,',
               train_one_epoch_matches_oracle_amp)
LESSON.mistake("skipped_update_not_closed", "update_closed only where parameters changed: a skipped window looks open",
               '"update_closed": s in norm_values,', '"update_closed": s in norm_values and s not in skipped_steps,',
               train_one_epoch_matches_oracle_amp)
LESSON.mistake("records_scaled_loss", "records loss / K instead of the micro-batch's loss",
               "losses.append(loss.detach())", "losses.append(scaled_loss.detach())",
               train_one_epoch_matches_oracle_fp32)
LESSON.mistake("tail_flush_not_marked", "the tail flush runs but no record says tail_flush",
               '"tail_flush": s == tail_step}', '"tail_flush": False}', train_one_epoch_marks_the_tail_flush)
LESSON.mistake("grad_norm_zero_without_update", "grad_norm 0.0 instead of None on micro-steps without an update",
               '"grad_norm": norm_values.get(s),', '"grad_norm": norm_values.get(s, 0.0),',
               train_one_epoch_marks_the_tail_flush)

LESSON.equivalent("multiply_by_reciprocal", "loss * (1 / K) instead of loss / K",
                  "return loss / accumulation_steps", "return loss * (1.0 / accumulation_steps)")
LESSON.equivalent("rearranged_cosine", "0.1*lr + 0.45*lr*(1 + cos(pi * (s / T)))",
                  "base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
                  "0.1 * base_lr + 0.45 * base_lr * (1 + math.cos(math.pi * (current_step / total_steps)))")
LESSON.equivalent("not_modulo", "not step % K instead of step % K == 0",
                  "return step % accumulation_steps == 0", "return not step % accumulation_steps")


# The student's test (reference: course/reference/train_loop.py) with one edit each.
_ASSERT_GRADIENTS = catalogue_weak_comparisons(LESSON, "1e-4", accumulation_test_passes_correct_and_fails_wrong)
LESSON.mistake("test_bitwise", "rtol=0, atol=0: float rounding of a correct accumulation fails it",
               "rtol=1e-4, atol=1e-6,", "rtol=0.0, atol=0.0,", accumulation_test_passes_correct_and_fails_wrong)
LESSON.mistake("test_with_k_1", "one micro-batch of 12: a missing division by K cannot show",
               "k, micro_size = 3, 4", "k, micro_size = 1, 12", accumulation_test_passes_correct_and_fails_wrong)
LESSON.mistake("test_micro_batch_size_equals_k", "4 micro-batches of 4: dividing by the micro-batch size looks right",
               "k, micro_size = 3, 4", "k, micro_size = 4, 4", accumulation_test_passes_correct_and_fails_wrong)
LESSON.mistake("test_identical_micro_batches", "the same 4 samples in every micro-batch: one micro-batch alone "
               "already has the big batch's gradient",
               "input_ids, labels = tiny_batches(k * micro_size, scenario.max_length, 1, seed=0)[0]",
               "input_ids, labels = (t.repeat(k, 1) for t in tiny_batches(micro_size, scenario.max_length, 1, "
               "seed=0)[0])", accumulation_test_passes_correct_and_fails_wrong)
LESSON.mistake("test_expects_summed_gradient", "expects K x the big batch's gradient (the sum, not the mean)",
               "param.grad, expected.grad,", "param.grad, expected.grad * k,",
               accumulation_test_passes_correct_and_fails_wrong)

LESSON.equivalent("test_relative_norm", "one relative-norm bound on all gradients instead of assert_close per tensor",
                  "    for (name, param), expected in zip(model.named_parameters(), big.parameters()):\n"
                  + _ASSERT_GRADIENTS,
                  "    actual = torch.cat([p.grad.flatten() for p in model.parameters()])\n"
                  "    expected = torch.cat([p.grad.flatten() for p in big.parameters()])\n"
                  "    error = float((actual - expected).norm() / expected.norm())\n"
                  "    assert error <= 1e-5, f\"relative gradient error {error:.2e} > 1e-5\"\n")
LESSON.equivalent("test_chunks_by_k", "input_ids.chunk(k) instead of split(micro_size): the same micro-batches",
                  "list(zip(input_ids.split(micro_size), labels.split(micro_size)))",
                  "list(zip(input_ids.chunk(k), labels.chunk(k)))")

# === Extensions: fix upstream (lesson 14 §10). Optional: ``python -m course check 14 --all`` grades them, ======
# they never change the exit code and score no notebook points. Their checks are all visible.

LESSON.exercises.extend([
    Exercise("accumulation_divisor", "14 §10.1", optional=True),
    Exercise("lr_per_update", "14 §10.2", optional=True),
    Exercise("update_cadence_due", "14 §10.2", optional=True),
    Exercise("adamw_param_groups", "14 §10.3", optional=True),
    Exercise("warmup_cosine_lr", "14 §10.4", optional=True),
])
LESSON.labs += ("lesson14_fix_upstream.py",)

# --- accumulation_divisor (§10.1) ----------------------------------------------------------------

# One epoch of 6 micro-batches with K=4: a full window (micro-steps 1-4) and a tail of r=2 (5-6).
TAIL_SCENARIO = LoopScenario("dense, 1 epoch of 6 micro-batches, K=4 (tail of 2)", epochs=1, max_length=16)
GRAD_RTOL = 1e-4    # summing g_i / d in another order moves a gradient by a few ulps; r/K moves it by 50%


@check("accumulation_divisor")
def accumulation_divisor_is_k_then_r(impl):
    """K inside full windows, r = iters % K in the last r micro-steps (windows count from micro-step 1)."""
    cases = [((6, 4), [4, 4, 4, 4, 2, 2]), ((8, 4), [4] * 8), ((3, 8), [3, 3, 3]), ((5, 1), [1] * 5),
             ((7, 3), [3, 3, 3, 3, 3, 3, 1])]
    for (iters, k), expected in cases:
        expect_equal(f"[accumulation_divisor(step, iters={iters}, K={k}) for step in 1..{iters}]",
                     [impl.accumulation_divisor(step, iters, k) for step in range(1, iters + 1)], expected)


def window_gradients(model, batches, divisor) -> list[dict]:
    """Accumulate ``loss / divisor(step)`` over ``batches``; the gradients at each window's close (every
    K-th micro-step and the last one), cleared after each. No optimizer: the weights never move."""
    k, iters, closed = TAIL_SCENARIO.accumulation_steps, len(batches), []
    for step, (input_ids, labels) in enumerate(batches, start=1):
        out = model(input_ids, labels=labels)
        ((out.loss + out.aux_loss) / divisor(step)).backward()
        if step % k == 0 or step == iters:
            closed.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            model.zero_grad(set_to_none=True)
    return closed


@check("accumulation_divisor")
def accumulation_divisor_gives_the_tail_its_mean_gradient(impl):
    """A loop dividing each micro-batch by accumulation_divisor: the full window's gradient is the mean of its 4
    micro-batch gradients, and the tail update's the mean of its r=2 (upstream: r/K = 0.5 of it)."""
    batches = full_epoch_batches(TAIL_SCENARIO, 0)
    iters, k = len(batches), TAIL_SCENARIO.accumulation_steps
    model = tiny_model(TAIL_SCENARIO)
    actual = window_gradients(model, batches, lambda step: impl.accumulation_divisor(step, iters, k))
    per_batch = []
    for input_ids, labels in batches:
        out = model(input_ids, labels=labels)
        (out.loss + out.aux_loss).backward()
        per_batch.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    windows = [per_batch[:k], per_batch[k:]]
    expect_equal("updates closed in an epoch of 6 micro-batches, K=4", len(actual), len(windows))
    for index, (got, members) in enumerate(zip(actual, windows)):
        want = {n: torch.stack([g[n] for g in members]).mean(0) for n in members[0]}
        scale = max(float(w.abs().max()) for w in want.values())
        name = "model.norm.weight"
        ratio = float(got[name].norm() / want[name].norm())
        with hint(f"the update's gradient is {ratio:.3f} x the mean of its {len(members)} micro-batch gradients"
                  + (f" (r/K = {len(members)}/{k}: the tail is still divided by K)"
                     if abs(ratio - len(members) / k) < 0.01 else "")):
            expect_tensors_close(f"update {index + 1} ({len(members)} micro-batches): accumulated gradient vs "
                                 "the mean of its micro-batch gradients", got, want, rtol=GRAD_RTOL,
                                 atol=GRAD_RTOL * scale)


@check("accumulation_divisor")
def accumulation_divisor_rejects_bad_arguments(impl):
    """accumulation_steps or iters <= 0, step outside [1, iters]: ValueError naming the argument."""
    for args, argument in [((1, 6, 0), "accumulation_steps"), ((1, 6, -4), "accumulation_steps"),
                           ((1, 0, 4), "iters"), ((0, 6, 4), "step"), ((7, 6, 4), "step")]:
        expect_raises(f"accumulation_divisor{args}", lambda: impl.accumulation_divisor(*args), ValueError, argument)

# --- lr_per_update and update_cadence_due (§10.2) ------------------------------------------------

# (iters, K, epochs): tails of 2 and 2, none, an epoch shorter than K, K=1 (one update per micro-step).
UPDATE_RUNS = [(6, 4, 2), (10, 4, 2), (8, 4, 1), (3, 8, 2), (5, 1, 1)]


@check("lr_per_update")
def lr_per_update_follows_the_update_count(impl):
    """Every micro-step of update n (1-based, n = epoch * ceil(iters/K) + ceil(step/K)) gets get_lr(n, N),
    N = epochs * ceil(iters/K): constant within a window, 0.1 * base_lr on the last update."""
    base_lr = 5e-4
    for iters, k, epochs in UPDATE_RUNS:
        per_epoch = -(-iters // k)
        for epoch in range(epochs):
            for step in range(1, iters + 1):
                update = epoch * per_epoch + -(-step // k)
                expect_close(f"lr_per_update(epoch={epoch}, step={step}, iters={iters}, epochs={epochs}, K={k}) "
                             f"(update {update} of {epochs * per_epoch})",
                             impl.lr_per_update(epoch, step, iters, epochs, k, base_lr),
                             get_lr(update, epochs * per_epoch, base_lr), rtol=LR_RTOL)


@check("lr_per_update")
def lr_per_update_rejects_bad_arguments(impl):
    """K, iters or epochs <= 0, epoch outside [0, epochs), step outside [1, iters]: ValueError naming it."""
    good = dict(epoch=0, step=1, iters=6, epochs=2, accumulation_steps=4, base_lr=5e-4)
    bad = [(dict(accumulation_steps=0), "accumulation_steps"), (dict(iters=0), "iters"), (dict(epochs=0), "epochs"),
           (dict(epoch=2), "epoch"), (dict(epoch=-1), "epoch"), (dict(step=0), "step"), (dict(step=7), "step")]
    for changes, argument in bad:
        expect_raises(f"lr_per_update(..., {', '.join(f'{k}={v}' for k, v in changes.items())})",
                      lambda: impl.lr_per_update(**{**good, **changes}), ValueError, argument)


@check("update_cadence_due")
def update_cadence_counts_updates(impl):
    """Due where micro-step step closes update n = step / K with n % interval == 0, and at step == iters."""
    cases = [((10, 2, 2), [4, 8, 10]), ((10, 4, 1), [4, 8, 10]), ((12, 4, 2), [8, 12]), ((7, 1, 3), [3, 6, 7]),
             ((3, 8, 5), [3]), ((16, 4, 3), [12, 16])]
    for (iters, k, interval), expected in cases:
        expect_equal(f"micro-steps 1..{iters} where update_cadence_due(step, iters={iters}, K={k}, "
                     f"interval={interval})",
                     [s for s in range(1, iters + 1) if impl.update_cadence_due(s, iters, k, interval)], expected)


@check("update_cadence_due")
def update_cadence_rejects_bad_arguments(impl):
    """K, iters or interval <= 0, step outside [1, iters]: ValueError naming the argument."""
    for args, argument in [((1, 10, 0, 2), "accumulation_steps"), ((1, 0, 2, 2), "iters"),
                           ((1, 10, 2, 0), "interval"), ((1, 10, 2, -1), "interval"), ((0, 10, 2, 2), "step"),
                           ((11, 10, 2, 2), "step")]:
        expect_raises(f"update_cadence_due{args}", lambda: impl.update_cadence_due(*args), ValueError, argument)

# --- adamw_param_groups (§10.3) --------------------------------------------------------------------


def _group_names(model, groups) -> list[list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names.get(id(p), f"<not a parameter of the model: {tuple(p.shape)}>") for p in g["params"]]
            for g in groups]


@check("adamw_param_groups")
def adamw_param_groups_exempt_norms_and_embeddings(impl):
    """Two groups (weight_decay wd, then 0.0): matrices decay; 1-D parameters and the (tied) embedding do
    not; every trainable parameter appears exactly once and a frozen one not at all; AdamW accepts them."""
    for use_moe in (False, True):
        model = tiny_model(LoopScenario("param groups", use_moe=use_moe))
        frozen = model.model.layers[0].self_attn.q_proj.weight
        frozen.requires_grad_(False)
        groups = impl.adamw_param_groups(model, 0.1)
        where = f"adamw_param_groups(tiny {'MoE' if use_moe else 'dense'} model, 0.1)"
        if not (isinstance(groups, list) and all(isinstance(g, dict) and "params" in g for g in groups)):
            fail(f"{where}: type", type(groups).__name__, "a list of dicts with 'params' and 'weight_decay'")
        expect_equal(f"{where}: weight_decay of each group", [g.get("weight_decay") for g in groups], [0.1, 0.0])
        actual = _group_names(model, groups)
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        expected = [[n for n, p in trainable if p.ndim >= 2 and id(p) not in embeddings],
                    [n for n, p in trainable if p.ndim < 2 or id(p) in embeddings]]
        expect_equal(f"{where}: parameter names of (decay, no decay); lm_head.weight is model.embed_tokens.weight",
                     actual, expected)
        eager(torch.optim.AdamW)(groups, lr=5e-4)   # raises if a parameter is in two groups


@check("adamw_param_groups")
def adamw_param_groups_reject_bad_weight_decay(impl):
    """A negative or NaN weight_decay raises ValueError naming weight_decay; 0 and values >= 1 are valid."""
    model = tiny_model(LoopScenario("param groups"))
    for value in (-0.1, float("nan")):
        expect_raises(f"adamw_param_groups(model, {value})", lambda: impl.adamw_param_groups(model, value),
                      ValueError, "weight_decay")
    for value in (0.0, 1.0, 2.5):
        try:
            groups = impl.adamw_param_groups(model, value)
        except ValueError as exc:
            fail(f"adamw_param_groups(model, {value}) (a valid weight decay)", f"ValueError: {exc}",
                 "two groups; only a negative or NaN weight_decay is an error")
        expect_equal(f"adamw_param_groups(model, {value}): weight_decay of each group",
                     [g.get("weight_decay") for g in groups], [value, 0.0])

# --- warmup_cosine_lr (§10.4) ----------------------------------------------------------------------


def _warmup_cosine(step: int, total: int, base_lr: float, warmup: int) -> float:
    return base_lr * step / warmup if step < warmup else get_lr(step - warmup, total - warmup, base_lr)


@check("warmup_cosine_lr")
def warmup_cosine_lr_ramps_then_follows_get_lr(impl):
    """base_lr * s / W below W, then get_lr(s - W, T - W): 0 at s = 0, base_lr at W, 0.1 * base_lr at T;
    W = 0 is get_lr itself."""
    for total, warmup, base_lr in [(20, 5, 5e-4), (100, 10, 1.0), (7, 1, 1e-3), (12, 0, 2.0), (3, 2, 1.0)]:
        for step in range(total + 1):
            expect_close(f"warmup_cosine_lr({step}, total_steps={total}, base_lr={base_lr}, warmup_steps={warmup})",
                         impl.warmup_cosine_lr(step, total, base_lr, warmup),
                         _warmup_cosine(step, total, base_lr, warmup), rtol=LR_RTOL, atol=1e-15)
    for step, expected in [(0, 0.0), (10, 1.0), (100, 0.1)]:
        expect_close(f"warmup_cosine_lr({step}, 100, 1.0, 10) (endpoint)", impl.warmup_cosine_lr(step, 100, 1.0, 10),
                     expected, rtol=LR_RTOL, atol=1e-15)


@check("warmup_cosine_lr")
def warmup_schedule_rejects_bad_arguments(impl):
    """total_steps <= 0, warmup_steps outside [0, total_steps), current_step outside [0, total_steps]:
    ValueError naming the argument."""
    for args, argument in [((0, 0, 1e-3, 0), "total_steps"), ((0, 10, 1e-3, -1), "warmup_steps"),
                           ((0, 10, 1e-3, 10), "warmup_steps"), ((-1, 10, 1e-3, 2), "current_step"),
                           ((11, 10, 1e-3, 2), "current_step")]:
        expect_raises(f"warmup_cosine_lr{args}", lambda: impl.warmup_cosine_lr(*args), ValueError, argument)


# --- extension mistakes: each FAILS the check named; the equivalent PASSES every check ---------------

LESSON.mistake("tail_still_divided_by_k", "accumulation_divisor returns K everywhere: upstream's tail of r/K",
               "return tail if step > iters - tail else accumulation_steps", "return accumulation_steps",
               accumulation_divisor_gives_the_tail_its_mean_gradient)
LESSON.mistake("tail_window_one_step_early", "step >= iters - r: the last micro-step of the last full window "
               "joins the tail", "return tail if step > iters - tail else accumulation_steps",
               "return tail if step >= iters - tail else accumulation_steps", accumulation_divisor_is_k_then_r)
LESSON.mistake("divisor_accepts_step_past_iters", "accumulation_divisor checks step >= 1 only",
               "    if not 1 <= step <= iters:\n        raise ValueError(f\"step must be in [1, iters={iters}], got "
               "{step}\")\n    tail = ",
               "    if step < 1:\n        raise ValueError(f\"step must be in [1, iters={iters}], got {step}\")\n"
               "    tail = ", accumulation_divisor_rejects_bad_arguments)
LESSON.mistake("lr_per_micro_step", "lr_per_update keeps upstream's schedule over micro-steps",
               "return cosine_lr(update, epochs * updates_per_epoch, base_lr)",
               "return cosine_lr(epoch * iters + step, epochs * iters, base_lr)", lr_per_update_follows_the_update_count)
LESSON.mistake("updates_floor_division", "iters // K updates per epoch: the tail flush is not counted",
               "updates_per_epoch = math.ceil(iters / accumulation_steps)",
               "updates_per_epoch = iters // accumulation_steps", lr_per_update_follows_the_update_count)
LESSON.mistake("update_index_zero_based", "(step - 1) // K: updates counted from 0, the schedule never ends at "
               "0.1 * base_lr", "math.ceil(step / accumulation_steps)", "(step - 1) // accumulation_steps",
               lr_per_update_follows_the_update_count)
LESSON.mistake("lr_per_update_accepts_any_step", "lr_per_update never checks step",
               "        raise ValueError(f\"step must be in [1, iters={iters}], got {step}\")\n    updates_per_epoch",
               "        pass\n    updates_per_epoch", lr_per_update_rejects_bad_arguments)
LESSON.mistake("cadence_in_micro_steps", "step % interval: upstream's cadence, counted in micro-steps",
               "(step // accumulation_steps) % interval == 0", "step % interval == 0", update_cadence_counts_updates)
LESSON.mistake("cadence_misses_epoch_end", "no log or save after the epoch's last (tail) update",
               "    if step == iters:\n        return True\n", "", update_cadence_counts_updates)
LESSON.mistake("cadence_accepts_zero_interval", "update_cadence_due refuses a negative interval only",
               "if interval <= 0:", "if interval < 0:", update_cadence_rejects_bad_arguments)
LESSON.mistake("decays_norms", "1-D parameters (norm weights) decay: only embeddings are exempt",
               "if param.ndim < 2 or id(param) in embeddings:", "if id(param) in embeddings:",
               adamw_param_groups_exempt_norms_and_embeddings)
LESSON.mistake("decays_embeddings", "the embedding (and the tied lm_head) decays",
               "if param.ndim < 2 or id(param) in embeddings:", "if param.ndim < 2:",
               adamw_param_groups_exempt_norms_and_embeddings)
LESSON.mistake("tied_weight_listed_twice", "named_parameters(remove_duplicate=False): the tied embedding / lm_head "
               "weight lands in the no-decay group twice", "for _, param in model.named_parameters():",
               "for _, param in model.named_parameters(remove_duplicate=False):",
               adamw_param_groups_exempt_norms_and_embeddings)
LESSON.mistake("frozen_parameters_grouped", "parameters with requires_grad=False go to the optimizer too",
               "        if not param.requires_grad:\n            continue\n", "",
               adamw_param_groups_exempt_norms_and_embeddings)
LESSON.mistake("rejects_zero_weight_decay", "weight_decay > 0 as the rule: the valid 0.0 (no decay at all) raises",
               "if not weight_decay >= 0:", "if not weight_decay > 0:", adamw_param_groups_reject_bad_weight_decay)
LESSON.mistake("accepts_nan_weight_decay", "weight_decay < 0 as the test: NaN passes",
               "if not weight_decay >= 0:", "if weight_decay < 0:", adamw_param_groups_reject_bad_weight_decay)
LESSON.mistake("cosine_ignores_warmup", "after the warmup the cosine runs over s / T, not (s - W) / (T - W)",
               "return cosine_lr(current_step - warmup_steps, total_steps - warmup_steps, base_lr)",
               "return cosine_lr(current_step, total_steps, base_lr)", warmup_cosine_lr_ramps_then_follows_get_lr)
LESSON.mistake("warmup_one_step_ahead", "(s + 1) / W: the warmup reaches base_lr one step early",
               "return base_lr * current_step / warmup_steps", "return base_lr * (current_step + 1) / warmup_steps",
               warmup_cosine_lr_ramps_then_follows_get_lr)
LESSON.mistake("warmup_may_fill_the_run", "warmup_steps == total_steps accepted: no step left for the cosine",
               "if not 0 <= warmup_steps < total_steps:", "if not 0 <= warmup_steps <= total_steps:",
               warmup_schedule_rejects_bad_arguments)
LESSON.equivalent("warmup_fraction_first", "current_step / warmup_steps * base_lr",
                  "return base_lr * current_step / warmup_steps", "return current_step / warmup_steps * base_lr")
