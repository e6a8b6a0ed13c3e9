"""Lesson 14 beyond its checks (those run in tests/test_lesson_checks.py): the alignment report that
``python -m course align 14`` prints, for each implementation, the hints of failure messages (the core tier's:
tests/test_hint_rules.py) and the host-sync counter."""
from __future__ import annotations

import pytest
import torch

from mistake_results import mistake_result

from course.checks import get_lesson
from course.checks.framework import expect_equal
from course.checks.host_syncs import count_host_syncs
from course.checks.lesson14.loop_hints import aux_backward_hint, loss_hint, norm_hint, update_hint
from course.runs.scenarios import LOOP_BASE

LESSON = get_lesson("14")
# MiniMind's get_lr minus cosine_lr at six steps of a 20-step run, loss 8 over K=4, K=4 over 8 micro-steps.
EXPECTED_REPORT = [f"lr_step_{s}_diff=0.000000000000" for s in (0, 1, 5, 10, 19, 20)] + [
    "scaled_loss=2.000000", "optimizer_step_micro_steps=[4, 8]"]


def test_alignment_report(impl_module, impl_name):
    """Zero lr differences from get_lr, scaled_loss 2.0, optimizer steps at [4, 8]."""
    try:
        lines = LESSON.report(impl_module(LESSON))
    except NotImplementedError as exc:
        if impl_name == "reference":
            raise
        pytest.skip(f"TODO: {exc}")
    expect_equal("alignment report lines", lines, EXPECTED_REPORT)


@pytest.mark.parametrize("mistake_name, rule", [
    ("epochs_checked_by_epoch", "check epochs itself"),
    ("k_checked_by_scale_loss", "check every argument before touching the loader"),
    ("zero_grad_keeps_zeros", "every .grad is None, not a tensor of zeros"),
    ("scaler_none_for_cuda", "the loop emits no warnings"),
    ("records_loss_tensors", "records hold Python values"),
    ("step_returns_int", "return a bool"),
    ("cosine_returns_tensor", "return a Python float"),
])
def test_a_hardening_failure_names_its_convention(mistake_name, rule):
    """A catalogued mistake of the hardening tier fails with a hint naming the convention it breaks (a core
    mistake's hint names its rule: ``rule=`` in the catalogue, held by tests/test_hint_rules.py)."""
    mistake = next(m for m in LESSON.mistakes if m.name == mistake_name)
    result = mistake_result(mistake)
    assert result.status == "FAIL", f"{mistake_name}: {mistake.caught_by} says {result.status}"
    assert rule in result.message, f"{mistake_name}\n  ACTUAL: {result.message}\n  EXPECTED: ...{rule}..."


def test_no_hint_when_the_ratio_points_nowhere():
    """A norm off by an unrelated factor, or K = 1, gets no guess."""
    assert norm_hint(1.0, 1.1, 4) == "" and norm_hint(0.25, 1.0, 1) == "" and loss_hint(None, 8.0, 4) == ""
    assert "zeroed" in norm_hint(0.3, 1.0, 4) and "divided by K" in norm_hint(4.0, 1.0, 4)
    assert "divided by K twice" in norm_hint(0.25, 1.0, 4) and "twice" not in norm_hint(0.26, 1.0, 4)


def test_no_cause_named_where_nothing_points_at_one():
    """No aux loss in the run, or a large difference: no aux guess; no tail flush before and no clipped update:
    no update guess."""
    dense = [{"aux_loss": 0.0}]
    moe = [{"aux_loss": 1e-3}]
    assert aux_backward_hint(1.001, 1.0, dense) == "" and aux_backward_hint(1.5, 1.0, moe) == ""
    assert "not in the backward" in aux_backward_hint(1.001, 1.0, moe)
    unclipped = [{"epoch": 0, "step": 4, "update_closed": True, "tail_flush": False, "grad_norm": 0.5}]
    assert update_hint(LOOP_BASE, unclipped, 1) == "" and update_hint(LOOP_BASE, unclipped, 0) == ""
    assert "no clipping" in update_hint(LOOP_BASE.with_(grad_clip=0.1), unclipped, 1)


def test_host_copies_are_counted_but_a_move_to_the_training_device_is_not():
    """.cpu() and .numpy() count on any tensor that may live on the device (graded on the CPU, they copy from an
    accelerator on a GPU); a .to() that leaves a CPU tensor on the CPU (.to(device) of a batch) does not, and
    neither does a conversion of a tensor born on the host inside the block; each method is restored afterwards."""
    calls = []
    loss = torch.tensor(2.0)   # made before the block: a loss the loop may hold on the device
    with count_host_syncs(calls):
        loss.cpu(), loss.numpy(), loss.to("cpu"), loss.to(torch.float64), loss.item()
        float(loss * 2)                                   # computed from a device tensor: counts
        born = torch.tensor(0.5, dtype=torch.float64)     # made on the host without a device
        float(born), float(torch.cos(born)), born.item()  # waits for nothing: none counts
        moved = born.to("cpu")                            # named a device: from here on it may live there
        moved.item()
    assert calls == ["cpu", "numpy", "item", "__float__", "item"], calls
    loss.cpu()
    assert calls == ["cpu", "numpy", "item", "__float__", "item"], "the counter must stop counting when the block ends"
