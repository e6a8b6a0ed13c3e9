"""Lesson 15 on a GPU: exact resume under CUDA bf16 autocast, and under fp16 autocast with an enabled
GradScaler whose scale an injected overflow halved before the interruption.

A tiny dense run (K=2, one epoch of 6 micro-batches) is interrupted at the update boundary epoch 0 step 4,
saved with the reference ``save_checkpoint``, loaded into fresh objects and finished; records,
parameters, AdamW state and the GradScaler scale must equal the uninterrupted run BITWISE. One process,
one GPU, the same kernels in the same order on the same inputs: the dense model uses no atomics-based
(nondeterministic) kernel, so there is no arithmetic to excuse a difference; one points at a kernel that
is not run-to-run deterministic, or at state the checkpoint lost.

The same body runs on the CPU (CPU autocast bf16 / fp16, GradScaler('cpu')): that twin proves the test's
logic on machines without a GPU, and it is not a duplicate (tests/test_lesson15_checkpoint.py resumes fp32
runs only), so it stays in the default run (about 3 s each on a loaded 2-core machine: one epoch, not two;
crossing an epoch is the fp32 tests' business). Only the ``cuda`` twin is marked ``cuda``
and skipped with a reason without CUDA.
"""
from __future__ import annotations

import math

import pytest
import torch

from course.checks.lesson15.checks import compare_resumed
from course.implementations import load_implementation
from course.runs import compute_oracle, resume_and_finish, run_oracle, save_objects, train_until
from course.runs.scenarios import RESUME_BASE

REFERENCE = load_implementation("checkpoint.py", "reference")
DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
               not torch.cuda.is_available(), reason="no CUDA device on this machine")])]
OVERFLOW_AT = 2   # the backward of micro-step 2 closes update 1 (K=2): that update is skipped, the scale halves
PRECISIONS = {
    "bf16 autocast": dict(autocast_dtype="bfloat16"),
    f"fp16 autocast + GradScaler, overflow in micro-step {OVERFLOW_AT}": dict(
        autocast_dtype="float16", scaler_enabled=True, overflow_at_backward=OVERFLOW_AT),
}
STOP_EPOCH, STOP_STEP = 0, 4   # an update boundary (K=2) after the overflow
# The first micro-batch's loss under autocast vs fp32 (same weights, same batch): 16-bit matmuls move it,
# by far less than this on a random-init model (ln 6400 = 8.76).
FIRST_LOSS_ATOL = 5e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_exact_resume_under_autocast(tmp_path, device, precision):
    scenario = RESUME_BASE.with_(name=f"{device} {precision}, K=2, 1 epoch, stopped at step {STOP_STEP}", epochs=1,
                                 device=device, **PRECISIONS[precision])
    objects, records_before = train_until(scenario, STOP_EPOCH, STOP_STEP)
    path = tmp_path / "resume.pth"
    save_objects(REFERENCE, path, objects, STOP_EPOCH, STOP_STEP)
    resumed = resume_and_finish(REFERENCE, scenario, path)
    uninterrupted = compute_oracle(scenario)

    # The scenario runs what it names: autocast moved the loss, the injected overflow was skipped.
    autocast_loss, fp32_loss = uninterrupted.records[0]["loss"], run_oracle(RESUME_BASE).records[0]["loss"]
    assert autocast_loss != fp32_loss and abs(autocast_loss - fp32_loss) <= FIRST_LOSS_ATOL, (
        f"[{scenario.name}] first loss ACTUAL {autocast_loss!r} vs fp32 EXPECTED {fp32_loss!r}: within "
        f"{FIRST_LOSS_ATOL} but not bitwise equal (autocast must really run)")
    if scenario.scaler_enabled:
        skipped = [r["step"] for r in uninterrupted.records if r["overflow_skipped"]]
        assert OVERFLOW_AT in skipped and math.isinf(records_before[OVERFLOW_AT - 1]["grad_norm"]), (
            f"[{scenario.name}] skipped updates ACTUAL {skipped}, EXPECTED to include step {OVERFLOW_AT} (the "
            "injected inf), so the saved GradScaler state differs from a fresh one")
    compare_resumed(f"[{scenario.name}]", records_before, resumed, uninterrupted)
