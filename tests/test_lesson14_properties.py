"""Property tests of lesson 14's pure functions over their whole argument ranges (the checks try chosen
points): cosine_lr against the oracle's get_lr, should_step_optimizer and should_flush_tail against the
contract's formulas, and each argument rule at both sides of its limit. Derandomized: the same examples on
every run."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course.checks import get_lesson
from course.minimind import get_lr

LESSON = get_lesson("14")
# The impl fixture returns the same cached module for every example: sharing it is safe.
PROPERTIES = settings(derandomize=True, max_examples=40, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])
positive = st.integers(min_value=1, max_value=10 ** 6)
learning_rates = st.floats(min_value=1e-8, max_value=10.0, allow_nan=False)


@pytest.fixture
def impl(impl_module, impl_name):
    module = impl_module(LESSON)
    try:
        module.cosine_lr(0, 1, 1.0)
        module.should_step_optimizer(1, 1)
        module.should_flush_tail(0, 0, 1)
    except NotImplementedError as exc:
        if impl_name == "reference":
            raise
        pytest.skip(f"TODO: {exc}")
    return module


@given(data=st.data(), total=positive, base_lr=learning_rates)
@PROPERTIES
def test_cosine_lr_is_get_lr_between_its_endpoints(impl, data, total, base_lr):
    """Any step in [0, T] gives get_lr's value, within [0.1, 1] x base_lr, never rising along the run."""
    step = data.draw(st.integers(min_value=0, max_value=total))
    lr = impl.cosine_lr(step, total, base_lr)
    assert math.isclose(lr, get_lr(step, total, base_lr), rel_tol=1e-12)
    assert 0.1 * base_lr * (1 - 1e-12) <= lr <= base_lr * (1 + 1e-12)
    if step < total:
        assert impl.cosine_lr(step + 1, total, base_lr) <= lr * (1 + 1e-12)


@given(data=st.data(), total=st.integers(min_value=-10 ** 6, max_value=10 ** 6))
@PROPERTIES
def test_cosine_lr_rejects_outside_its_range(impl, data, total):
    """total_steps <= 0 names total_steps; otherwise a step outside [0, T] names current_step."""
    if total <= 0:
        with pytest.raises(ValueError, match="total_steps"):
            impl.cosine_lr(0, total, 1e-3)
        return
    step = data.draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=total + 1)))
    with pytest.raises(ValueError, match="current_step"):
        impl.cosine_lr(step, total, 1e-3)


@given(step=positive, k=st.integers(min_value=1, max_value=64))
@PROPERTIES
def test_should_step_optimizer_closes_every_kth_micro_step(impl, step, k):
    """True iff step is a multiple of K; exactly one True in any K consecutive micro-steps."""
    assert bool(impl.should_step_optimizer(step, k)) == (step % k == 0)
    assert sum(bool(impl.should_step_optimizer(s, k)) for s in range(step, step + k)) == 1


@given(step=st.integers(max_value=10 ** 6), k=st.integers(min_value=-64, max_value=64))
@PROPERTIES
def test_should_step_optimizer_rejects_k_first_then_step(impl, step, k):
    """K <= 0 names accumulation_steps (whatever step is); a valid K with step <= 0 names step."""
    if k <= 0:
        with pytest.raises(ValueError, match="^accumulation_steps"):
            impl.should_step_optimizer(step, k)
    elif step <= 0:
        with pytest.raises(ValueError, match="^step"):
            impl.should_step_optimizer(step, k)


@given(data=st.data(), start=st.integers(min_value=0, max_value=10 ** 4), k=st.integers(min_value=1, max_value=64))
@PROPERTIES
def test_should_flush_tail_iff_something_ran_and_ended_mid_window(impl, data, start, k):
    """Flush iff last > start and last % K != 0 (windows count from micro-step 1, not from start_step)."""
    last = data.draw(st.integers(min_value=start, max_value=start + 3 * k))
    assert bool(impl.should_flush_tail(last, start, k)) == (last > start and last % k != 0)


@given(last=st.integers(min_value=-100, max_value=100), start=st.integers(min_value=-100, max_value=100),
       k=st.integers(min_value=-8, max_value=8))
@PROPERTIES
def test_should_flush_tail_rejects_in_order(impl, last, start, k):
    """K first, then start_step, then last_step: the first bad argument is the one named."""
    expected = ("accumulation_steps" if k <= 0 else "start_step" if start < 0 else "last_step" if last < start
                else None)
    if expected is None:
        impl.should_flush_tail(last, start, k)
        return
    with pytest.raises(ValueError, match=f"^{expected}"):
        impl.should_flush_tail(last, start, k)
