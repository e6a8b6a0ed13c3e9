"""A fake clock and a fake asynchronous device (lesson 18 §5.2): what a GPU does to a timer, on any CPU.

On a GPU, launching a kernel returns as soon as the kernel is queued; the host runs ahead and waits only when it
synchronizes (``torch.cuda.synchronize()``, or a ``.item()``). A clock read without a sync measures the launches,
not the work. ``FakeDevice`` keeps that behaviour in plain numbers: ``launch`` advances the host clock by the launch
cost and queues the device time behind the work already queued; ``synchronize`` advances the host clock to the end
of the queue. Its ``clock`` and ``synchronize`` are what a ``ThroughputMeter`` takes. Every clock read and sync is
logged in ``events`` so that a report can say which read came before its sync.
"""
from __future__ import annotations


class FakeDevice:
    """Host time starts at ``start`` seconds; the device is idle."""

    def __init__(self, start: float = 0.0):
        self.host_time = float(start)      # what clock() returns
        self.queue_ends = float(start)     # when the work queued so far is done
        self.events: list[tuple[str, float]] = []

    def clock(self) -> float:
        self.events.append(("clock", self.host_time))
        return self.host_time

    def synchronize(self) -> None:
        """Wait on the host until the device has run everything queued."""
        self.host_time = max(self.host_time, self.queue_ends)
        self.events.append(("synchronize", self.host_time))

    def launch(self, device_seconds: float, launch_seconds: float = 0.0) -> None:
        """Queue ``device_seconds`` of device work; the host spends ``launch_seconds`` launching it."""
        self.host_time += launch_seconds
        self.queue_ends = max(self.queue_ends, self.host_time) + device_seconds

    def host_work(self, seconds: float) -> None:
        """Time the host spends on its own (loading a batch), while the device runs what is queued."""
        self.host_time += seconds
