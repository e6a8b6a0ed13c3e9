"""Lesson 18 checks of ``ThroughputMeter`` and ``mfu``: tokens/s measured on a fake asynchronous device.

``course/runs/fake_device.py::FakeDevice`` is a fake clock and a device that runs queued work in order while the
host goes on: a clock read without a sync sees the launches only. A scenario says, step by step, what the host
does (load a batch, launch the step's kernels) and how long the device works; the expected tokens/s follow from
the scenario's own numbers (a synchronized step lasts its host work, its launch and its device time), never from
our meter. Times are sums of a few floats: compared with rtol 1e-9.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from course.runs.fake_device import FakeDevice
from course.runs.peak_flops import PEAK_FLOPS

from ..framework import check, expect_raises, expect_type, fail

RTOL = 1e-9


@dataclass(frozen=True)
class Step:
    tokens: int            # tokens trained on (not padding)
    device_seconds: float  # the device's work
    host_seconds: float = 0.1     # the host loads the batch
    launch_seconds: float = 0.02  # the host queues the kernels

    @property
    def seconds(self) -> float:
        """How long the step lasts when the host waits for the device at its end."""
        return self.host_seconds + self.launch_seconds + self.device_seconds


# Two slow warm-up steps (a compile, the allocator's first blocks), then steps of unequal length and size.
SCENARIO = (Step(96, 4.0), Step(128, 2.5), Step(128, 1.0), Step(100, 1.5), Step(64, 0.5), Step(128, 1.0),
            Step(90, 2.0), Step(128, 0.25, host_seconds=0.6))


def expected_rates(steps, warmup_steps: int, window: int) -> list[Optional[float]]:
    """tokens/s after each step: the tokens of the last ``window`` steps after the warm-up over their time."""
    rates = []
    for done in range(1, len(steps) + 1):
        measured = steps[warmup_steps:done][-window:]
        rates.append(sum(s.tokens for s in measured) / sum(s.seconds for s in measured) if measured else None)
    return rates


def mean_of_rates(steps, warmup_steps: int, window: int) -> Optional[float]:
    measured = steps[warmup_steps:][-window:]
    return sum(s.tokens / s.seconds for s in measured) / len(measured) if measured else None


def meter_hint(device: FakeDevice, done, warmup_steps: int, window: int, actual) -> str:
    """The rule a wrong rate after the steps ``done`` points at: a clock read without a sync before it (the fake
    device's log says), else the wrong policy whose rate ``actual`` is."""
    events = [name for name, _ in device.events]
    if any(name == "clock" and (i == 0 or events[i - 1] != "synchronize") for i, name in enumerate(events)):
        return ("synchronize the device before each clock read (the one at the meter's creation too): a read without "
                "it measures the launches queued so far, not the work")

    def matches(rate):
        return rate is not None and actual is not None and abs(actual - rate) <= 1e-6 * rate
    if matches(expected_rates(done, 0, window)[-1]) or matches(expected_rates(done, 0, len(done))[-1]):
        return "the first warmup_steps steps are left out (their time and their tokens)"
    if matches(mean_of_rates(done, warmup_steps, window)):
        return ("tokens_per_second is the total tokens of the window over its total time: a ratio of sums, not a "
                "mean of per-step rates")
    if any(matches(expected_rates(done, warmup_steps, w)[-1]) for w in (len(done), max(window - 1, 1), window + 1)):
        return "the rate is over the last window steps (fewer while fewer were measured), the older ones dropped"
    return "a step's time runs from the previous clock read (the meter's creation for the first step)"


def run_scenario(impl, steps, warmup_steps: int, window: int, *, synchronized: bool = True,
                 queued_before: float = 0.0) -> None:
    """Drive a meter through ``steps`` on a fake device, ``queued_before`` seconds of work queued before the meter
    is created (the model's copy to the device, say); compare tokens_per_second after each step."""
    device = FakeDevice(start=100.0)
    device.launch(queued_before)
    meter = impl.ThroughputMeter(warmup_steps=warmup_steps, window=window, clock=device.clock,
                                 synchronize=device.synchronize if synchronized else None)
    for number, (step, expected) in enumerate(zip(steps, expected_rates(steps, warmup_steps, window)), start=1):
        device.host_work(step.host_seconds)
        device.launch(step.device_seconds, step.launch_seconds)
        if not synchronized:
            device.synchronize()   # a synchronous device: the host waits in every launch
        meter.step(step.tokens)
        actual = meter.tokens_per_second()
        what = (f"ThroughputMeter(warmup_steps={warmup_steps}, window={window}) after step {number} of "
                f"{[(s.tokens, s.seconds) for s in steps]} (tokens, seconds on a "
                f"{'fake asynchronous' if synchronized else 'synchronous'} device): tokens_per_second()")
        if expected is None or actual is None:
            if actual is not expected:
                fail(what, actual, expected, "hint: the rule: " + (
                    "the first warmup_steps steps are left out: None until a step after the warm-up has been taken"
                    if expected is None else "a rate from the first step after the warm-up on"))
            continue
        if not abs(actual - expected) <= RTOL * expected:
            fail(what, actual, expected,
                 f"hint: the rule: {meter_hint(device, steps[:number], warmup_steps, window, actual)}")


@check("ThroughputMeter", objective="throughput")
def meter_times_synchronized_steps_after_the_warm_up(impl):
    """On a fake asynchronous device (the host runs ahead of the work it queues): two slow warm-up steps left out,
    a window of 3 steps of unequal tokens and length, each clock read after a sync; None during the warm-up."""
    run_scenario(impl, SCENARIO, warmup_steps=2, window=3)


@check("ThroughputMeter", objective="throughput")
def meter_on_a_synchronous_device(impl):
    """No synchronize (a CPU, where every op is done when it returns: synchronize=None is a no-op): one warm-up
    step, a window of 4 larger than the steps measured at first (the rate is over those)."""
    run_scenario(impl, SCENARIO[:6], warmup_steps=1, window=4, synchronized=False)


@check("ThroughputMeter", objective="throughput", hidden=True)
def meter_without_warm_up_and_a_window_of_one(impl):
    """warmup_steps=0: the first step is timed from the meter's creation, 1.5 s of work queued before it (synchronized
    away by then); window=1: the last step alone."""
    run_scenario(impl, SCENARIO[2:6], warmup_steps=0, window=2, queued_before=1.5)
    run_scenario(impl, SCENARIO, warmup_steps=3, window=1)


@check("ThroughputMeter")
def meter_reports_a_float_and_refuses_bad_arguments(impl):
    """tokens_per_second() is a Python float; a step of 0 tokens is taken; warmup_steps below 0, window below 1
    and a negative tokens count are each a ValueError naming the argument."""
    device = FakeDevice()
    meter = impl.ThroughputMeter(warmup_steps=0, window=2, clock=device.clock)
    device.host_work(0.5)
    meter.step(64)
    expect_type("ThroughputMeter.tokens_per_second()", meter.tokens_per_second(), float)
    meter.step(0)   # a step that trained on no token (every sample masked) is a step
    expect_raises("ThroughputMeter(...).step(-1)", lambda: meter.step(-1), ValueError, "tokens")
    for kwargs, name in (({"warmup_steps": -1, "window": 2}, "warmup_steps"),
                         ({"warmup_steps": 0, "window": 0}, "window")):
        expect_raises(f"ThroughputMeter({kwargs})", lambda: impl.ThroughputMeter(clock=device.clock, **kwargs),
                      ValueError, name, ("warmup_steps", "window"))


# (FLOPs per token, tokens/s, peak FLOP/s): a GPU from the table, this CPU-like peak, a tiny rate
MFU_CASES = ((6.0e8, 2.0e5, PEAK_FLOPS["NVIDIA H100 SXM"].flops_per_second),
             (3 * 3_342_336 / 32, 3_900.0, 5.0e10),
             (1.2e6, 1.0, 3.0e12))


@check("mfu", objective="mfu")
def mfu_is_the_achieved_fraction_of_the_peak(impl):
    """FLOPs per token x tokens/s over the peak, as a fraction: against an H100's dense bf16 peak from
    PEAK_FLOPS, a CPU's measured-like peak, a rate far below any peak."""
    for flops, rate, peak in MFU_CASES:
        actual, expected = impl.mfu(flops, rate, peak), flops * rate / peak
        if not abs(actual - expected) <= 1e-12 * expected:
            percent = abs(actual - 100 * expected) <= 1e-9 * 100 * expected
            fail(f"mfu(flops_per_token={flops:g}, tokens_per_second={rate:g}, peak_flops_per_second={peak:g})",
                 actual, expected, "hint: the rule: " + (
                     "a fraction (0.36 for 36 %), not a percentage" if percent else
                     "the FLOP/s achieved (flops_per_token x tokens_per_second) over the peak FLOP/s"))


@check("mfu")
def mfu_is_a_float_and_refuses_a_peak_of_zero(impl):
    """mfu(...) is a Python float, for any peak > 0; a peak that is not is a ValueError naming
    peak_flops_per_second."""
    expect_type("mfu(1e6, 100.0, 1e9)", impl.mfu(1e6, 100.0, 1e9), float)
    expect_type("mfu(1e6, 100.0, peak_flops_per_second=0.5)", impl.mfu(1e6, 100.0, 0.5), float)   # any peak > 0
    for peak in (0.0, -1.0):
        expect_raises(f"mfu(1e6, 100.0, peak_flops_per_second={peak})", lambda: impl.mfu(1e6, 100.0, peak),
                      ValueError, "peak_flops_per_second")
