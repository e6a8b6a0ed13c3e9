"""Lesson 14: the hints of ``train_one_epoch``'s failures against the oracle: where the numbers (a ratio, a
record's flags, a stale value) point at a likely cause, the failure names the rule it breaks."""
from __future__ import annotations

import contextlib
import math

import torch

from course.minimind import get_lr
from course.runs import LoopScenario

from ..framework import CheckFailure


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
    """Name the rule behind a wrong set of update_closed / overflow_skipped / tail_flush micro-steps."""
    got, want = set(got_steps), {(r["epoch"], r["step"]) for r in expected_records if r[key]}
    missing, extra = sorted(want - got), sorted(got - want)
    tails = {(r["epoch"], r["step"]) for r in expected_records if r["tail_flush"]}
    skipped = {(r["epoch"], r["step"]) for r in expected_records if r["overflow_skipped"]}
    causes = []
    if key == "update_closed":
        if set(missing) & tails:
            causes.append(f"the tail flush is missing at (epoch, step) {sorted(set(missing) & tails)}: a partial "
                          "window left when the epoch (or the loader) ends gets the update once; decide it from the "
                          "last micro-step actually run, never from iters")
        if set(missing) & skipped:
            causes.append(f"a skipped update still closes its window at {sorted(set(missing) & skipped)}: "
                          "update_closed means the optimizer was asked to step, whether or not the GradScaler stepped")
        if extra:
            causes.append(f"updates at {extra} where no window closes: a window of K closes on its K-th micro-step, "
                          "counted from micro-step 1 of the epoch")
    elif key == "tail_flush":
        if extra:
            causes.append(f"tail_flush=True at {extra}, where no tail flush ran: tail_flush marks only the partial "
                          "window that the flush after the loop closes, never a window closed on its K-th micro-step "
                          "(not even at step == iters)")
        if missing:
            causes.append(f"no tail_flush at {missing}: the record of the last micro-step run says tail_flush=True "
                          "when the flush after the loop closed its partial window")
    else:
        if extra:
            causes.append(f"overflow_skipped at {extra}, where the GradScaler stepped: a scale that grows (after "
                          "growth_interval clean updates) is no skip, and a disabled scaler never skips")
        if missing:
            causes.append(f"the GradScaler skipped optimizer.step at {missing} (inf/NaN gradients): report "
                          "overflow_skipped=True there, in the tail flush too")
    return "; ".join(causes)


def lr_hint(scenario: LoopScenario, actual, want, earlier) -> str:
    """A wrong lr that another rule explains: a schedule restarting per epoch, a stale lr left in the optimizer,
    or the schedule of a fixed base_lr (a round one other than the base_lr passed)."""
    if actual is None or not isinstance(actual, (int, float)):
        return ""
    total = scenario.epochs * scenario.iters
    if want["epoch"] > 0 and abs(actual - get_lr(want["step"], total, scenario.base_lr)) <= 1e-12 * abs(actual):
        return ("the schedule restarts every epoch: the lr follows the GLOBAL micro-step (epoch * iters + step of "
                "epochs * iters)")
    if actual == scenario.base_lr or any(actual == r.get("lr") for r in earlier):
        return ("a stale lr: the optimizer still holds an earlier lr. Write this micro-step's lr into every param "
                "group at EVERY micro-step, before its forward, not only where a window closes")
    implied = actual / get_lr(want["epoch"] * scenario.iters + want["step"], total, 1.0)   # the base_lr it follows
    if not math.isclose(implied, scenario.base_lr) and math.isclose(implied, float(f"{implied:.2g}"), rel_tol=1e-9):
        return (f"the lr follows the schedule of base_lr={implied:g}, not of the base_lr={scenario.base_lr:g} passed: "
                "the lr is proportional to the caller's base_lr (cosine_lr(..., base_lr), never a constant)")
    return ""


def skipped_norm_hint(actual, expected) -> str:
    """A finite grad_norm recorded where the GradScaler skipped the update (the oracle's norm is inf or NaN)."""
    if actual is None or expected is None or math.isfinite(expected) or not math.isfinite(actual):
        return ""
    return ("the GradScaler skipped this update (inf/NaN gradients): its record carries the pre-clip norm that "
            "clip_grad_norm_ returned, non-finite, never a finite stand-in (a skipped update records inf or nan)")


def group_norm_hint(scenario: LoopScenario, actual, expected) -> str:
    """A norm below the oracle's in a run with two param groups: measured (and clipped) over one group only."""
    if not scenario.two_param_groups or actual is None or expected is None or not 0 < actual < expected:
        return ""
    return ("a norm below the oracle's in a run with two param groups: measure and clip the gradients of every "
            "parameter (clip_grad_norm_(model.parameters(), grad_clip)), not one param group's")


def host_copy_hint(extra, scaler_enabled: bool = False) -> str:
    """Name the per-micro-step syncs of ``train_one_epoch_syncs_once_per_epoch`` (method names counted); with
    ``scaler_enabled``, the ones only an enabled GradScaler shows (the run with scaler=None had none)."""
    if not extra:
        return ""
    if scaler_enabled:
        return ("only with an enabled GradScaler: its scale lives on the device, so get_scale() (or reading "
                "scaler's state) at every micro-step syncs each time; read it where an update closes, or not at all")
    copies = sorted({name for name in extra if name in ("cpu", "numpy", "to")})
    return ((f"a host copy ({', '.join(copies)}) per micro-step waits for the device like .item(): " if copies else "")
            + "keep detached tensors during the epoch and convert them after the loop")


def warning_hint(message: str) -> str:
    if "GradScaler" in message:
        return ("the loop emits no warnings: torch.amp.GradScaler() without a device is built for CUDA (enabled "
                "there, even in an fp32 or bf16 run); build it for torch.device(device).type, and scaler=None means "
                "a disabled one")
    return "the loop emits no warnings: a warning there means a misconfigured part; fix what it warns about"


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


# A ratio "exactly" K or 1/K: the same gradients scaled (float rounding only); any other cause lands farther off.
EXACT_RATIO = 1e-3


def norm_hint(actual, expected, k: int) -> str:
    """K micro-batch gradients summed are K to sqrt(K) times one of them (aligned to random directions); the
    gradients of a loss divided by K twice are exactly 1/K of the right ones."""
    ratio = _ratio(actual, expected, k)
    if ratio is None:
        return ""
    if abs(ratio / k - 1) < 0.01:
        return f"norm = K x expected (K={k}): is the loss divided by K (scale_loss_for_accumulation) before backward?"
    if abs(ratio * k - 1) < EXACT_RATIO:
        return (f"norm = expected / K exactly (K={k}): the loss is divided by K twice; scale_loss_for_accumulation "
                "already divides it, backpropagate its result as it is")
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


def frozen_weights_hint(actual_params: dict, expected_params: dict, initial: dict) -> str:
    """The run's parameters end where they started although the oracle's moved: no step found a gradient."""
    if all(torch.equal(actual_params[n], p) for n, p in initial.items() if n in actual_params) and \
            not all(torch.equal(expected_params[n], p) for n, p in initial.items()):
        return ("the weights never moved although updates closed: the optimizer step found no gradients. Clear the "
                "gradients last (zero_grad after the step), never before the step")
    return ""


def forward_lr_hint(forward_lrs: list, expected_records: list) -> str:
    """The rule that the param groups' lr at the forward passes break: groups that disagree, the previous
    micro-step's lr wherever one differs (the run's first forward may still hold the optimizer's initial lr), or
    a stale one."""
    wrong = [(index, lrs) for index, (lrs, want) in enumerate(zip(forward_lrs, expected_records))
             if not all(math.isclose(lr, want["lr"], rel_tol=1e-12) for lr in lrs)]
    if not wrong:
        return ""
    if any(not math.isclose(lr, lrs[0], rel_tol=1e-12) for _, lrs in wrong for lr in lrs):
        return ("the param groups hold different lrs at a forward pass: write the lr into EVERY "
                "optimizer.param_groups entry, not only the first")
    late = [index for index, lrs in wrong if index > 0
            and math.isclose(lrs[0], expected_records[index - 1]["lr"], rel_tol=1e-12)]
    if late and len(late) == len([index for index, _ in wrong if index > 0]):
        return ("each forward runs at the previous micro-step's lr, one micro-step late: write micro-step s's lr "
                "into the param groups before its forward (and so before its update), not after")
    return ("a stale lr at a forward pass: write each micro-step's lr into every param group at EVERY micro-step, "
            "before its forward, not only before an update")


def update_hint(scenario: LoopScenario, records, index: int, run_cause: str = "") -> str:
    """The loss, a norm or the parameters first differ at ``index`` while every earlier lr, loss and norm matched:
    name ``run_cause`` (what the whole run shows: weights that never moved, a wrong lr at the forward passes) or
    what only the updates before it use (the clipping)."""
    if run_cause:
        return f"all earlier records matched; likely {run_cause}"
    clipped = [(r["epoch"], r["step"]) for r in records[:index] if r["update_closed"] and r["grad_norm"] is not None
               and math.isfinite(r["grad_norm"]) and r["grad_norm"] > scenario.grad_clip]
    if clipped:
        return (f"all earlier records matched; likely no clipping to the grad_clip passed: the updates at (epoch, "
                f"step) {clipped} had pre-clip norms above grad_clip={scenario.grad_clip} "
                "(clip_grad_norm_(model.parameters(), grad_clip), after unscale_)")
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
