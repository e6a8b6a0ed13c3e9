"""Lesson 14 on a GPU: the loop under CUDA bf16 autocast, and fp16 autocast with an enabled GradScaler
(including an injected overflow), graded against the oracle run on the same device.

Skipped with a reason on machines without CUDA. Tolerances are the grading ones; both runs execute the
same kernels in the same order, so the reference is expected to match exactly here too.
"""
from __future__ import annotations

import pytest
import torch

from course.checks.lesson14 import LESSON
from course.checks.lesson14.loop import compare_runs, observed
from course.runs import run_impl, run_oracle
from course.runs.scenarios import LOOP_BASE

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")]

CUDA_SCENARIOS = [
    LOOP_BASE.with_(name="CUDA bf16 autocast, K=4", device="cuda", autocast_dtype="bfloat16"),
    LOOP_BASE.with_(name="CUDA fp16 autocast + GradScaler", device="cuda", autocast_dtype="float16", scaler_enabled=True),
    LOOP_BASE.with_(name="CUDA fp16 + GradScaler, overflow in micro-step 6", device="cuda", autocast_dtype="float16",
               scaler_enabled=True, overflow_at_backward=6),
    LOOP_BASE.with_(name="CUDA MoE bf16", device="cuda", autocast_dtype="bfloat16", use_moe=True),
]


@pytest.mark.parametrize("scenario", CUDA_SCENARIOS, ids=lambda s: s.name)
def test_train_one_epoch_on_cuda(impl_module, impl_name, scenario):
    module, forward_lrs = impl_module(LESSON), []
    try:
        actual = run_impl(observed(module.train_one_epoch, forward_lrs), scenario)
    except NotImplementedError as exc:
        if impl_name == "reference":
            raise
        pytest.skip(f"TODO: {exc}")
    compare_runs(scenario, actual, run_oracle(scenario), forward_lrs)
