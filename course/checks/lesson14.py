"""Lesson 14: learning rate, gradient accumulation, AMP and clipping - descriptor, checks, mistakes.

Tolerances are chosen so that algebraically equivalent code passes (``loss * (1 / K)``, a rearranged
cosine) while every catalogued mistake (end of this file) fails; the mistake-catalogue tests prove both.
"""
from __future__ import annotations

import functools

import torch

from course.minimind import get_lr

from course.runs import LoopScenario, epoch_batches, run_impl, run_oracle, training_objects
from course.runs.scenarios import LOOP_AMP_SCENARIOS, LOOP_BASE, LOOP_FP32_SCENARIOS

from .framework import (Exercise, Lesson, expect_close, expect_equal, expect_raises,
                        expect_tensor_close, expect_tensors_close, fail)


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
    ],
    labs=("lesson14_trace_pretrain_step.py", "lesson14_adamw_scale.py", "bench_lesson14_grader.py",
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
    """accumulation_steps <= 0 or a 0-based step raise ValueError naming the argument."""
    expect_raises("should_step_optimizer(4, 0)", lambda: impl.should_step_optimizer(4, 0), ValueError,
                  "accumulation_steps")
    expect_raises("should_step_optimizer(0, 4)", lambda: impl.should_step_optimizer(0, 4), ValueError, "step")

# --- should_flush_tail ---------------------------------------------------------------------


@check("should_flush_tail")
def should_flush_only_a_partial_window(impl):
    """Flush iff the epoch ran micro-steps (last > start) and ended inside a window."""
    cases = [((10, 0, 4), True), ((8, 0, 4), False), ((0, 0, 4), False), ((5, 0, 1), False),
             ((10, 8, 4), True), ((8, 8, 4), False), ((12, 9, 4), False), ((13, 12, 4), True)]
    for args, expected in cases:
        expect_equal(f"should_flush_tail(last_step={args[0]}, start_step={args[1]}, K={args[2]})",
                     bool(impl.should_flush_tail(*args)), expected)


@check("should_flush_tail", hidden=True)
def should_flush_rejects_bad_arguments(impl):
    """accumulation_steps <= 0, start_step < 0 or last_step < start_step raise ValueError."""
    expect_raises("should_flush_tail(10, 0, 0)", lambda: impl.should_flush_tail(10, 0, 0), ValueError,
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
    keys = ("step", "lr", "loss", "aux_loss", "optimizer_step", "grad_norm")
    for i, record in enumerate(actual.records):
        missing = [k for k in keys if k not in record]
        if missing:
            fail(f"{where} record {i} lacks keys", sorted(record), f"at least {list(keys)}")
    expect_equal(f"{where} micro-steps seen (epoch, step)", [(r["epoch"], r["step"]) for r in actual.records],
                 [(r["epoch"], r["step"]) for r in expected.records])
    expect_equal(f"{where} micro-steps where the optimizer stepped (epoch, step)",
                 [(r["epoch"], r["step"]) for r in actual.records if r["optimizer_step"]],
                 [(r["epoch"], r["step"]) for r in expected.records if r["optimizer_step"]])
    for got, want in zip(actual.records, expected.records):
        at = f"{where} epoch {want['epoch']} step {want['step']}"
        expect_close(f"{at}: lr", got["lr"], want["lr"], rtol=LR_RTOL)
        expect_close(f"{at}: loss (unscaled, aux included)", _float(got["loss"]), want["loss"],
                     rtol=LOSS_RTOL, atol=1e-6)
        expect_close(f"{at}: aux_loss", _float(got["aux_loss"]), want["aux_loss"], rtol=LOSS_RTOL, atol=1e-8)
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


@functools.lru_cache(maxsize=4)
def impl_run(train_one_epoch, scenario: LoopScenario):
    """``run_impl``, shared by the checks of one grading run (the tail check and the base scenario)."""
    return run_impl(train_one_epoch, scenario)


def _check_scenarios(impl, scenarios) -> None:
    for scenario in scenarios:
        compare_runs(scenario, impl_run(impl.train_one_epoch, scenario), run_oracle(scenario))


@check("train_one_epoch")
def train_one_epoch_marks_the_tail_flush(impl):
    """With 6 micro-batches and K=4 the last record of an epoch is the tail flush: it steps and reports a norm."""
    records = [r for r in impl_run(impl.train_one_epoch, LOOP_BASE).records if r.get("epoch") == 0]
    last = records[-1]
    if not (last["optimizer_step"] and last.get("grad_norm") is not None):
        fail("last record of an epoch ending mid-window (6 micro-steps, K=4)",
             {k: last.get(k) for k in ("step", "optimizer_step", "grad_norm")},
             {"step": 6, "optimizer_step": True, "grad_norm": "a float (pre-clip norm)"})
    if not all(r.get("grad_norm") is None for r in records if not r["optimizer_step"]):
        fail("grad_norm on micro-steps without an optimizer step",
             [r.get("grad_norm") for r in records], "None wherever optimizer_step is False")


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
           (dict(epochs=0), "epochs"), (dict(epoch=1), "epoch"), (dict(start_step=7), "start_step")]
    for changes, argument in bad:
        expect_raises(f"train_one_epoch(..., {', '.join(f'{k}={v}' for k, v in changes.items())})",
                      lambda: impl.train_one_epoch(objects.model, epoch_batches(LOOP_BASE, 0), objects.optimizer,
                                                   **{**good, **changes}), ValueError, argument)


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

LESSON.equivalent("multiply_by_reciprocal", "loss * (1 / K) instead of loss / K",
                  "return loss / accumulation_steps", "return loss * (1.0 / accumulation_steps)")
LESSON.equivalent("rearranged_cosine", "0.1*lr + 0.45*lr*(1 + cos(pi * (s / T)))",
                  "base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
                  "0.1 * base_lr + 0.45 * base_lr * (1 + math.cos(math.pi * (current_step / total_steps)))")
LESSON.equivalent("not_modulo", "not step % K instead of step % K == 0",
                  "return step % accumulation_steps == 0", "return not step % accumulation_steps")
