"""Components: every long-lived part of the collector, with a lifecycle and a status.

The model follows the OpenTelemetry Collector's component status reporting
(``componentstatus``): each part reports one of six statuses, the host keeps the latest
report of each, and health is computed from those reports, never from a constant.

* :class:`Status`: ``starting``, ``ok``, ``recoverable_error``, ``permanent_error``,
  ``stopping``, ``stopped``.
* :class:`Component`: a base class (or mixin) with a ``component_name`` and
  :meth:`Component.report`.  Subclasses implement their own ``start``/``shutdown``
  (sync or async, whatever their owner awaits) and report as they go: ``ok`` once they
  work, ``recoverable_error`` while a dependency fails (a backend down, Redis away),
  ``permanent_error`` when nothing will fix it without an operator (a file that cannot
  be written).  Reporting the same status again is cheap, so a hot path may call
  :meth:`Component.report_ok` after every success.
* :class:`ComponentHost`: the registry.  It exports ``ragtrace_component_status`` (one
  gauge series per component and status, 1 for the current one), and answers two
  questions from the statuses.  Liveness (:meth:`ComponentHost.health`): has a
  component failed for good, or for too long?  Readiness
  (:meth:`ComponentHost.readiness`): is every component running?  ``starting``,
  ``stopping`` and ``stopped`` are not running, so a component reports ``ok`` (or an
  error) by the end of its ``start``, even when its work comes later.  The error
  statuses do not block readiness: a part whose dependency is away still runs, and
  when that makes the collector refuse data the service's refusal check says so.
  Neither answer calls a component healthy unless its status is ``ok``.
* :class:`Supervisor`: runs every background task.  An unexpected exception is logged
  once with its traceback, counted in ``ragtrace_component_failures_total{component}``,
  the owning component is put in ``recoverable_error``, and the task is started again
  after a jittered, growing delay.  No task is ever left to die unobserved, so
  "Task exception was never retrieved" cannot appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ragtrace_collector.component.lazylog import LazyLogger

__all__ = [
    "Component",
    "ComponentHost",
    "HealthReport",
    "Status",
    "StatusEvent",
    "Supervisor",
]


class Status(enum.StrEnum):
    STARTING = "starting"
    OK = "ok"
    RECOVERABLE_ERROR = "recoverable_error"
    PERMANENT_ERROR = "permanent_error"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """One status report: what, why, and since when (monotonic and wall clock)."""

    status: Status
    error: str | None
    since: float
    timestamp: float

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "last_error": self.error,
            "since_s": round(max(0.0, now - self.since), 3),
            "timestamp": self.timestamp,
        }


class Component:
    """Something with a lifecycle whose status the host reads.

    A subclass sets ``component_name`` (``exporter:otlp``, ``receiver:otlp_http``,
    ``session_store`` ...) before it reports, usually in ``__init__``.  A component that
    is not registered with a host still keeps its own status, so it can be used and
    tested alone.
    """

    component_name: str = "component"
    _status_event: StatusEvent | None = None
    _host: ComponentHost | None = None
    _last_error: str | None = None

    @property
    def status(self) -> Status:
        event = self._status_event
        return Status.STARTING if event is None else event.status

    @property
    def status_event(self) -> StatusEvent:
        if self._status_event is None:
            self._status_event = StatusEvent(Status.STARTING, None, time.monotonic(), time.time())
        return self._status_event

    @property
    def last_error(self) -> str | None:
        """The last error reported, kept after the component recovered."""
        return self._last_error

    def report(self, status: Status, error: str | BaseException | None = None) -> None:
        """Record a status.  The same status again (with no new error) is a no-op."""
        current = self._status_event
        text = _error_text(error)
        unchanged = text is None or (current is not None and text == current.error)
        if current is not None and current.status is status and unchanged:
            return
        if text is not None:
            self._last_error = text
        event = StatusEvent(status, text, time.monotonic(), time.time())
        self._status_event = event
        if self._host is not None:
            self._host._changed(self, current, event)

    def report_ok(self) -> None:
        """Shorthand for the hot path: back to (or still) ``ok``."""
        current = self._status_event
        if current is None or current.status is not Status.OK:
            self.report(Status.OK)

    @property
    def status_detail(self) -> str | None:
        """A warning for operators that is not an error (health is unaffected), shown
        as ``detail`` next to the status on ``/healthz``; None: nothing to say."""
        return None


#: Statuses of a component that is not running: readiness waits while one has them.
_NOT_RUNNING = frozenset({Status.STARTING, Status.STOPPING, Status.STOPPED})


def _describe(name: str, event: StatusEvent, now: float) -> str:
    """``name: status``; an error status with how long and why."""
    if event.status is Status.PERMANENT_ERROR:
        return f"{name}: permanent_error ({event.error or 'no detail'})"
    if event.status is Status.RECOVERABLE_ERROR:
        return (
            f"{name}: recoverable_error for {now - event.since:.0f}s ({event.error or 'no detail'})"
        )
    return f"{name}: {event.status.value}"


def _error_text(error: str | BaseException | None) -> str | None:
    if error is None:
        return None
    if isinstance(error, BaseException):
        message = str(error)
        return f"{type(error).__name__}: {message}" if message else type(error).__name__
    return error


@dataclass(frozen=True, slots=True)
class HealthReport:
    """What ``/healthz`` and ``/readyz`` answer: ok, a reason, and every component."""

    ok: bool
    reason: str
    components: dict[str, dict[str, Any]]


class ComponentHost:
    """The registry of components: status gauge, failure counter and health.

    ``telemetry`` is optional so that parts can be tested without a Prometheus
    registry; with one, ``ragtrace_component_status{component,status}`` and
    ``ragtrace_component_failures_total{component}`` are kept current.
    """

    def __init__(self, telemetry: Any | None = None) -> None:
        self._components: dict[str, Component] = {}
        self._telemetry = telemetry
        self._log = LazyLogger("component")

    # ---------------------------------------------------------------- registry
    def register(self, component: Component) -> Component:
        name = component.component_name
        existing = self._components.get(name)
        if existing is not None and existing is not component:
            raise ValueError(f"two components are named {name!r}")
        self._components[name] = component
        component._host = self
        self._export(component, None, component.status_event)
        return component

    def register_all(self, components: Iterable[Component]) -> None:
        for component in components:
            self.register(component)

    @property
    def components(self) -> dict[str, Component]:
        return dict(self._components)

    def failed(self, component: Component | str) -> None:
        """Count one unexpected failure of ``component`` (the supervisor calls this)."""
        if self._telemetry is not None:
            name = component if isinstance(component, str) else component.component_name
            self._telemetry.component_failures.labels(name).inc()

    # ------------------------------------------------------------------ health
    def health(self, *, recoverable_grace: float, now: float | None = None) -> HealthReport:
        """Liveness: unhealthy if a component is in ``permanent_error``, or has been in
        ``recoverable_error`` for longer than ``recoverable_grace`` seconds.  Healthy
        otherwise; the reason then names every component that is not ``ok``."""
        at = time.monotonic() if now is None else now
        problems: list[str] = []
        others: list[str] = []
        for name, event in self._not_ok():
            failed = event.status is Status.PERMANENT_ERROR or (
                event.status is Status.RECOVERABLE_ERROR and at - event.since > recoverable_grace
            )
            (problems if failed else others).append(_describe(name, event, at))
        if problems:
            reason = "; ".join(problems)
        elif others:
            reason = "no component calls for a restart; not ok: " + "; ".join(others)
        else:
            reason = "every component is ok"
        return HealthReport(not problems, reason, self.snapshot(at))

    def readiness(self, *, now: float | None = None) -> HealthReport:
        """Readiness, as far as the components tell: not ready while one of them is
        not running (``starting``, ``stopping``, ``stopped``).  The error statuses do
        not count here (they are :meth:`health`'s), but the reason names them."""
        at = time.monotonic() if now is None else now
        waiting: list[str] = []
        errors: list[str] = []
        for name, event in self._not_ok():
            (waiting if event.status in _NOT_RUNNING else errors).append(_describe(name, event, at))
        if waiting:
            reason = "not every component is running: " + "; ".join(waiting)
        elif errors:
            reason = "every component is running; not ok: " + "; ".join(errors)
        else:
            reason = "every component is running"
        return HealthReport(not waiting, reason, self.snapshot(at))

    def _not_ok(self) -> list[tuple[str, StatusEvent]]:
        """(name, status) of every component whose status is not ``ok``, by name."""
        return [
            (name, component.status_event)
            for name, component in sorted(self._components.items())
            if component.status_event.status is not Status.OK
        ]

    def snapshot(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        at = time.monotonic() if now is None else now
        out: dict[str, dict[str, Any]] = {}
        for name, component in sorted(self._components.items()):
            body = component.status_event.as_dict(at)
            body["last_error"] = component.last_error
            detail = component.status_detail
            if detail is not None:
                body["detail"] = detail
            out[name] = body
        return out

    # ------------------------------------------------------------------ events
    def _changed(self, component: Component, old: StatusEvent | None, new: StatusEvent) -> None:
        self._export(component, old, new)
        name = component.component_name
        if new.status in (Status.RECOVERABLE_ERROR, Status.PERMANENT_ERROR):
            self._log.warning(
                "component_status", component=name, status=new.status.value, error=new.error
            )
        elif (
            new.status is Status.OK
            and old is not None
            and old.status in (Status.RECOVERABLE_ERROR, Status.PERMANENT_ERROR)
        ):
            self._log.info("component_recovered", component=name, status=new.status.value)

    def _export(self, component: Component, old: StatusEvent | None, new: StatusEvent) -> None:
        if self._telemetry is None:
            return
        gauge = self._telemetry.component_status
        name = component.component_name
        if old is None:
            for status in Status:
                gauge.labels(name, status.value).set(1 if status is new.status else 0)
            return
        gauge.labels(name, old.status.value).set(0)
        gauge.labels(name, new.status.value).set(1)


#: Makes the coroutine a supervised task runs; called again on every restart.
TaskFactory = Callable[[], Awaitable[None]]


class Supervisor:
    """Runs background tasks, restarting any that fails, and stops them all at the end.

    ``spawn(component, factory, name=...)`` starts ``factory()`` as a task.  When the
    coroutine raises anything but :class:`asyncio.CancelledError`, the supervisor logs
    it once with its traceback, counts it, reports ``recoverable_error`` on the
    component, waits (``initial_backoff`` doubling up to ``max_backoff``, with jitter)
    and calls ``factory()`` again.  The delay resets after a run that lasted longer
    than ``max_backoff``.  A coroutine that returns normally is finished.

    Whoever owns the work must make a restart lossless: a worker puts the batch it
    holds back on its queue (in a ``finally`` or an ``except``) before the exception
    leaves it.
    """

    def __init__(
        self,
        host: ComponentHost | None = None,
        *,
        initial_backoff: float = 0.1,
        max_backoff: float = 10.0,
        rng: random.Random | None = None,
    ) -> None:
        self._host = host
        self._initial = initial_backoff
        self._max = max_backoff
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = LazyLogger("supervisor")
        #: Unexpected failures seen, per task name (for tests and /healthz detail).
        self.failures: dict[str, int] = {}

    def spawn(
        self, component: Component | None, factory: TaskFactory, *, name: str
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(self._run(component, factory, name), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def run_once(
        self, component: Component | None, work: Awaitable[None], *, name: str
    ) -> asyncio.Task[None]:
        """Run one piece of short-lived work (a request, a retry loop) as a task whose
        unexpected exception is logged with its traceback, counted and reported like a
        supervised task's, but not restarted: the owner awaits or cancels the task
        and decides what the failure means.  Its exception never escapes the task."""
        return asyncio.create_task(self._once(component, work, name), name=name)

    @property
    def tasks(self) -> frozenset[asyncio.Task[None]]:
        return frozenset(self._tasks)

    async def _once(self, component: Component | None, work: Awaitable[None], name: str) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(component, name, exc)

    async def _run(self, component: Component | None, factory: TaskFactory, name: str) -> None:
        delay = self._initial
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(component, name, exc, restart_in_s=round(delay, 3))
            if loop.time() - started > self._max:
                delay = self._initial
            await asyncio.sleep(delay * (0.5 + self._rng.random()))
            delay = min(delay * 2.0, self._max)

    def _failed(
        self, component: Component | None, name: str, exc: Exception, **detail: object
    ) -> None:
        """Log (with the traceback: called inside ``except``), count and report."""
        self.failures[name] = self.failures.get(name, 0) + 1
        owner = component.component_name if component is not None else name
        self._log.exception("task_failed", task=name, component=owner, **detail)
        if self._host is not None:
            self._host.failed(owner)
        if component is not None:
            component.report(Status.RECOVERABLE_ERROR, exc)

    async def stop(self, wait: float | None = None) -> None:
        """Cancel every task and wait for them (at most ``wait`` seconds)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=wait)
