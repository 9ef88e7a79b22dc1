"""The component model: statuses, the host's health answer, and the supervisor."""

from __future__ import annotations

import asyncio
import logging

import pytest
import structlog.testing

from ragtrace_collector.component import Component, ComponentHost, Status, Supervisor
from ragtrace_collector.component.telemetry import Telemetry


class _Part(Component):
    def __init__(self, name: str) -> None:
        self.component_name = name


def _gauge(telemetry: Telemetry, component: str, status: str) -> float | None:
    return telemetry.registry.get_sample_value(
        "ragtrace_component_status", {"component": component, "status": status}
    )


def test_status_gauge_follows_reports() -> None:
    telemetry = Telemetry()
    host = ComponentHost(telemetry)
    part = host.register(_Part("exporter:a"))
    assert part.status is Status.STARTING
    assert _gauge(telemetry, "exporter:a", "starting") == 1
    part.report(Status.RECOVERABLE_ERROR, ConnectionError("refused"))
    assert _gauge(telemetry, "exporter:a", "starting") == 0
    assert _gauge(telemetry, "exporter:a", "recoverable_error") == 1
    part.report_ok()
    assert _gauge(telemetry, "exporter:a", "recoverable_error") == 0
    assert _gauge(telemetry, "exporter:a", "ok") == 1
    snap = host.snapshot()["exporter:a"]
    assert snap["status"] == "ok"
    assert snap["last_error"] == "ConnectionError: refused"


def test_health_permanent_error_and_stuck_recoverable() -> None:
    host = ComponentHost()
    a = host.register(_Part("a"))
    b = host.register(_Part("b"))
    a.report_ok()
    b.report_ok()
    assert host.health(recoverable_grace=30).ok
    b.report(Status.RECOVERABLE_ERROR, "backend down")
    since = b.status_event.since
    assert host.health(recoverable_grace=30, now=since + 5).ok
    late = host.health(recoverable_grace=30, now=since + 31)
    assert not late.ok
    assert "b: recoverable_error" in late.reason
    assert "backend down" in late.reason
    a.report(Status.PERMANENT_ERROR, "disk full")
    now = host.health(recoverable_grace=30, now=since + 1)
    assert not now.ok
    assert "a: permanent_error (disk full)" in now.reason
    assert set(now.components) == {"a", "b"}


def test_readiness_waits_for_components_not_running_but_not_for_errors() -> None:
    host = ComponentHost()
    a = host.register(_Part("a"))
    b = host.register(_Part("b"))
    a.report_ok()
    # b never reported: it is starting.  Not ready, and b is named; alive all the same,
    # and neither answer calls every component healthy.
    ready = host.readiness()
    assert not ready.ok
    assert "b: starting" in ready.reason
    alive = host.health(recoverable_grace=30)
    assert alive.ok
    assert "healthy" not in alive.reason
    assert "b: starting" in alive.reason
    b.report_ok()
    assert host.readiness().ok
    assert host.health(recoverable_grace=30).reason == "every component is ok"
    # Errors are liveness's question: ready, and the text says which one is not ok.
    for status in (Status.RECOVERABLE_ERROR, Status.PERMANENT_ERROR):
        b.report(status, "backend down")
        ready = host.readiness()
        assert ready.ok
        assert f"b: {status.value}" in ready.reason
        assert "healthy" not in ready.reason
    # Stopping or stopped: not running, not ready.
    for status in (Status.STOPPING, Status.STOPPED):
        b.report(status)
        ready = host.readiness()
        assert not ready.ok
        assert f"b: {status.value}" in ready.reason


def test_duplicate_names_refused() -> None:
    host = ComponentHost()
    host.register(_Part("x"))
    with pytest.raises(ValueError, match="two components"):
        host.register(_Part("x"))


async def test_supervisor_restarts_logs_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    telemetry = Telemetry()
    host = ComponentHost(telemetry)
    part = host.register(_Part("worker"))
    sup = Supervisor(host, initial_backoff=0.01, max_backoff=0.05)
    runs: list[int] = []
    done = asyncio.Event()

    async def work() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError(f"boom {len(runs)}")
        part.report_ok()
        done.set()
        await asyncio.sleep(3600)

    sup.spawn(part, work, name="worker-task")
    await asyncio.wait_for(done.wait(), 5)
    assert len(runs) == 3
    assert sup.failures == {"worker-task": 2}
    failures = telemetry.registry.get_sample_value(
        "ragtrace_component_failures_total", {"component": "worker"}
    )
    assert failures == 2
    assert part.status is Status.OK
    assert part.last_error == "RuntimeError: boom 2"
    await sup.stop(wait=2)
    assert not sup.tasks


async def test_supervised_failure_never_unretrieved(caplog: pytest.LogCaptureFixture) -> None:
    """A task that always fails is retried and never surfaces as an unretrieved exception."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    sup = Supervisor(None, initial_backoff=0.005, max_backoff=0.01)
    count = 0

    async def bad() -> None:
        nonlocal count
        count += 1
        raise ValueError("always")

    with caplog.at_level(logging.ERROR):
        sup.spawn(None, bad, name="bad")
        for _ in range(200):
            await asyncio.sleep(0.01)
            if count >= 3:
                break
        await sup.stop(wait=2)
    assert count >= 3
    assert seen == []


async def test_run_once_failure_is_logged_counted_reported_and_not_restarted() -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    telemetry = Telemetry()
    host = ComponentHost(telemetry)
    part = host.register(_Part("exporter:phoenix"))
    part.report_ok()
    sup = Supervisor(host)
    calls = 0

    async def post() -> None:
        nonlocal calls
        calls += 1
        raise KeyError("annotation bug")

    with structlog.testing.capture_logs() as logs:
        await sup.run_once(part, post(), name="annotate")  # the exception stays inside
    await asyncio.sleep(0.05)
    assert calls == 1  # one-shot: not restarted
    assert sup.failures == {"annotate": 1}
    assert (
        telemetry.registry.get_sample_value(
            "ragtrace_component_failures_total", {"component": "exporter:phoenix"}
        )
        == 1
    )
    assert part.status is Status.RECOVERABLE_ERROR
    assert part.last_error == "KeyError: 'annotation bug'"
    (logged,) = [e for e in logs if e["event"] == "task_failed"]
    assert logged["task"] == "annotate"
    assert logged["component"] == "exporter:phoenix"
    assert logged["exc_info"] is True  # with its traceback
    assert unhandled == []
    # Cancelling is the owner's business: it propagates and counts nothing.
    blocked = sup.run_once(part, asyncio.sleep(3600), name="slow")
    await asyncio.sleep(0)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert sup.failures == {"annotate": 1}
