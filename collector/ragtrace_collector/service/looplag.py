"""Event-loop lag: how late the loop runs a timer, observed as a histogram.

Every ``interval`` the monitor sleeps and measures how much later than asked it woke
up.  Whatever held the loop meanwhile (a CPU-bound parse, a blocking call) shows up
as lag in ``ragtrace_event_loop_lag_seconds``.  The collector keeps its loop for I/O,
so the histogram should stay in its first buckets; a tail there names a bug.

The monitor is the component ``event_loop`` and runs as a supervised task.
"""

from __future__ import annotations

import asyncio

from ragtrace_collector.component import Component, Status, Supervisor
from ragtrace_collector.component.telemetry import Telemetry

__all__ = ["LoopLagMonitor"]


class LoopLagMonitor(Component):
    """Samples the event loop's lag every ``interval`` seconds."""

    component_name = "event_loop"

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        interval: float = 0.1,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._histogram = telemetry.event_loop_lag
        self._interval = interval
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._task: asyncio.Task[None] | None = None
        #: The largest lag seen, in seconds (for logs and tests).
        self.max_lag = 0.0

    def start(self) -> None:
        if self._task is None:
            self._task = self._supervisor.spawn(self, self._run, name="event-loop-lag")
            self.report_ok()  # running from here on: readiness need not wait for a sample

    async def shutdown(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self.report(Status.STOPPING)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.report(Status.STOPPED)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._interval
        self.report_ok()
        while True:
            asked = loop.time() + interval
            await asyncio.sleep(interval)
            lag = max(0.0, loop.time() - asked)
            if lag > self.max_lag:
                self.max_lag = lag
            self._histogram.observe(lag)
