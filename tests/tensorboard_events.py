"""Reading a run's TensorBoard event files back with TensorBoard's own reader (the stage assembly's tests)."""
from __future__ import annotations

from pathlib import Path

from course.checks.framework import expect_equal


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the one event file in ``log_dir``, read by TensorBoard's own reader: tag -> (step, value)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    files = sorted(log_dir.glob("events.out.tfevents.*"))
    expect_equal(f"event files in {log_dir}", len(files), 1)
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def expect_float32_close(name: str, actual: list, expected: list) -> None:
    """(step, value) lists equal in their steps, their values to TensorBoard's float32 (relative 1e-6)."""
    expect_equal(f"{name}: steps", [step for step, _ in actual], [step for step, _ in expected])
    for (step, a), (_, e) in zip(actual, expected):
        assert abs(a - e) <= 1e-6 * abs(e), f"{name} at update {step}: ACTUAL {a!r}, EXPECTED {e!r} (relative 1e-6)"
