"""Lesson 16 on a GPU: the reference ``TrainingSession``, the run driver and the loss readback under CUDA
bf16 autocast, and under fp16 autocast with an enabled GradScaler and an injected overflow.

* One update of the masked micro-batches: its gradient points like the fp32 global-batch gradient and its
  loss sum is the fp32 one, within the 16-bit tolerances below.
* fp16 + GradScaler, an inf gradient: the update reports ``overflow_skipped``, the scale halves, the
  parameters are bitwise unchanged, and the next update steps. (bf16 runs without a GradScaler, as upstream
  does: it has fp32's exponent range; an inf there is not skipped, so the overflow case is fp16's.)
* The driver: update records and ``LossReadback`` values are finite and track a CPU fp32 run of the same
  data, with the same overflow skipped (GradScaler('cpu'), no autocast), within the loose tolerances below:
  another device's kernels and 16-bit matmuls never give fp32's bits. CUDA batches arrive pinned.

Each test also runs on the CPU (CPU autocast bf16 / fp16, GradScaler('cpu')): that twin proves the logic on
machines without a GPU. It is not a duplicate of tests/test_lesson16_train_session.py (which checks the
overflow without autocast and the trainer's losses without an overflow), and each takes 1-7 s on a loaded
2-core machine, so it stays in the default run. Only the ``cuda`` twin is marked ``cuda`` and skipped without CUDA.
"""
from __future__ import annotations

import math

import pytest
import torch

from course.checks.framework import expect_close, expect_equal, expect_tensors_close
from course.protocol.driver import LossReadback, run_text_training
from course.protocol.text import token_weighted_step
from course.protocol.types import TrainingRunState
from course.reference import train_session as ref
from course.runs import (SESSION_SCENARIO, capture_grads, global_batch_gradients, inject_overflow,
                         masked_micro_batches, new_session, params_of, run_update, tiny_batches)

DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
               not torch.cuda.is_available(), reason="no CUDA device on this machine")])]
PRECISIONS = {"bf16": torch.bfloat16, "fp16+GradScaler": torch.float16}
INIT_SCALE = 2.0 ** 10
# 16-bit tolerances against fp32 on a random-init model. Autocast rounds each matmul input to 8 (bf16) or 11
# (fp16) mantissa bits, eps 7.8e-3 / 9.8e-4; sums over tens of tokens average much of that out. Measured on the
# CPU twin (bf16 / fp16): cosine 0.99999 / 0.9999998, NLL sum rel 1.7e-6 / 6.6e-7, driver loss |diff| <= 9.4e-5 /
# 4.1e-6, grad norm rel <= 3.5e-3 / 1.0e-4. The bounds leave 10-100x room for CUDA's other kernels.
GRAD_COSINE_MIN = 0.999      # the update's gradient direction
LOSS_RTOL = 1e-2             # an update's NLL sum, relative
LOSS_ATOL = 1e-2             # a driver record's mean loss per token (ln 6400 = 8.76)
GRAD_NORM_RTOL = 5e-2        # a driver record's pre-clip gradient norm


def amp_session(device: str, precision: str, k: int = 4, **kwargs):
    """The reference session (``k`` micro-steps) on ``device`` under autocast(``precision``); an enabled GradScaler
    for fp16."""
    device_type = torch.device(device).type
    scaler = torch.amp.GradScaler(device_type, init_scale=INIT_SCALE, enabled=precision == "fp16+GradScaler")
    autocast = torch.autocast(device_type, dtype=PRECISIONS[precision])
    return new_session(ref, k, device=device, scaler=scaler, autocast=autocast, **kwargs)


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.detach().cpu().double().flatten() for _, g in sorted(grads.items())])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_session_update_under_autocast_points_like_fp32(device, precision):
    batches = masked_micro_batches()
    expected_grads, expected_nll_sum, units = global_batch_gradients(batches)
    session = amp_session(device, precision)
    captured: dict = {}
    report = run_update(session, batches, clip=1.0, before_update=capture_grads(session, captured))[-1]
    expect_equal(f"{device} {precision}: (parameters_updated, overflow_skipped, optimizer_step)",
                 (report.parameters_updated, report.overflow_skipped, session.optimizer_step), (True, False, 1))
    expect_equal(f"{device} {precision}: loss_sum stays on the model's device", report.loss_sum.device.type,
                 torch.device(device).type)
    expect_close(f"{device} {precision}: update NLL sum vs fp32 global batch (rtol {LOSS_RTOL}: 16-bit matmuls)",
                 float(report.loss_sum), float(expected_nll_sum), rtol=LOSS_RTOL)
    # captured before unscale_: a GradScaler's factor scales every gradient alike, the cosine ignores it
    cosine = float(torch.nn.functional.cosine_similarity(flat(captured), flat(expected_grads), dim=0))
    assert cosine > GRAD_COSINE_MIN, (f"{device} {precision} vs fp32 global-batch gradient cosine: ACTUAL "
                                      f"{cosine:.6f}, EXPECTED > {GRAD_COSINE_MIN} (16-bit rounding only)")
    expect_equal(f"{device} {precision}: units of the update", report.loss_units, units)


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_overflow_skips_the_update_and_halves_the_scale(device):
    session = amp_session(device, "fp16+GradScaler")
    batches = masked_micro_batches()
    first = run_update(session, batches, clip=1.0)[-1]
    expect_equal(f"{device}: clean first update (parameters_updated, optimizer_step, scale)",
                 (first.parameters_updated, session.optimizer_step, session.scaler.get_scale()), (True, 1, INIT_SCALE))
    before = params_of(session.model)
    hook = session.model.model.norm.weight.register_hook(lambda g: g + float("inf"))
    skipped = run_update(session, batches, clip=1.0)[-1]
    hook.remove()
    expect_equal(f"{device}: update with an inf gradient (parameters_updated, overflow_skipped, update_closed, "
                 "optimizer_step)", (skipped.parameters_updated, skipped.overflow_skipped, skipped.update_closed,
                                     session.optimizer_step), (False, True, True, 1))
    expect_equal(f"{device}: GradScaler scale after the overflow", session.scaler.get_scale(), INIT_SCALE / 2)
    expect_tensors_close(f"{device}: parameters after the skipped update (bitwise: no step ran)",
                         {n: p.cpu() for n, p in params_of(session.model).items()},
                         {n: p.cpu() for n, p in before.items()}, rtol=0.0, atol=0.0)
    after = run_update(session, batches, clip=1.0)[-1]
    expect_equal(f"{device}: update after the overflow (parameters_updated, overflow_skipped, optimizer_step)",
                 (after.parameters_updated, after.overflow_skipped, session.optimizer_step), (True, False, 2))
    assert math.isfinite(float(after.loss_sum)), f"{device}: loss_sum after the overflow ACTUAL {after.loss_sum}"


# One epoch of 12 samples, global batch 4 / accum 2: 3 updates of 2 micro-steps (kept short: CPU bf16 is slow).
SAMPLES, GLOBAL_BATCH, ACCUM = 12, 4, 2
OVERFLOW_BACKWARD = 4   # the last micro-step of update 2


def driven(session, *, overflow: bool, step_fn=token_weighted_step):
    """The run driver over one epoch; the readback and the records."""
    if overflow:
        inject_overflow(session.model, OVERFLOW_BACKWARD)
    input_ids, labels = tiny_batches(SAMPLES, SESSION_SCENARIO.max_length, 1, 3)[0]
    readback = LossReadback()
    records = run_text_training(session, list(zip(input_ids, labels)), TrainingRunState(base_lr=1e-3),
                                global_batch_size=GLOBAL_BATCH, accumulation_steps=ACCUM, epochs=1, impl=ref,
                                readback=readback, step_fn=step_fn)
    return readback, records


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_driver_and_readback_under_autocast_track_a_cpu_fp32_run(device, precision):
    overflow = precision == "fp16+GradScaler"
    pinned = []

    def step_recording_pinning(model, batch):
        pinned.append(batch.input_ids.is_pinned())
        return token_weighted_step(model, batch)
    session = amp_session(device, precision, ACCUM, optimizer_cls=torch.optim.AdamW)
    readback, records = driven(session, overflow=overflow, step_fn=step_recording_pinning)
    fp32 = new_session(ref, ACCUM, optimizer_cls=torch.optim.AdamW,
                       scaler=torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, enabled=overflow))
    _, expected = driven(fp32, overflow=overflow)
    where = f"{device} {precision}{', inf gradient in update 2' if overflow else ''}"

    expect_equal(f"{where}: (global_step, parameters_updated) per update",
                 [(r["global_step"], r["parameters_updated"]) for r in records],
                 [(1, True), (2, not overflow), (3, True)])
    expect_equal(f"{where}: loss values read back (one per update)", readback.values_read, 3)
    expect_equal(f"{where}: optimizer steps", session.optimizer_step, 2 if overflow else 3)
    if overflow:
        expect_equal(f"{where}: GradScaler scale at the end", session.scaler.get_scale(), INIT_SCALE / 2)
    for got, want in zip(records, expected):
        step = got["global_step"]
        assert isinstance(got["loss"], float) and math.isfinite(got["loss"]), (
            f"{where}, update {step}: loss ACTUAL {got['loss']!r}, EXPECTED a finite float")
        assert abs(got["loss"] - want["loss"]) <= LOSS_ATOL, (
            f"{where}, update {step}: loss ACTUAL {got['loss']!r} vs CPU fp32 EXPECTED {want['loss']!r} (within "
            f"{LOSS_ATOL}: other kernels and 16-bit matmuls)")
        if got["parameters_updated"]:
            expect_close(f"{where}, update {step}: pre-clip grad norm vs CPU fp32 (rtol {GRAD_NORM_RTOL})",
                         got["grad_norm"], want["grad_norm"], rtol=GRAD_NORM_RTOL)
        else:
            assert not math.isfinite(got["grad_norm"]), (
                f"{where}, update {step} (skipped): grad norm ACTUAL {got['grad_norm']!r}, EXPECTED inf or nan")
    # One update's mean loss can round to the fp32 bits by chance (seen for fp16 on an AMD EPYC); all cannot.
    assert [r["loss"] for r in records] != [r["loss"] for r in expected], (
        f"{where}: every loss is the CPU fp32 run's bit for bit: autocast did not run")
    expect_equal(f"{where}: batches in pinned host memory (CUDA only)", set(pinned), {device == "cuda"})
