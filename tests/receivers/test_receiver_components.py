"""Receivers and the loop-lag monitor are components: statuses through their lifecycle.

Real sockets on loopback; the collector runs on its own event loop in a thread.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from ragtrace_collector.component import Status
from ragtrace_collector.service.pipeline import PassThroughProcessor
from ragtrace_collector.service.ports import StartupError
from ragtrace_collector.service.server import CollectorService
from tests.fakes.harness import CollectorThread, collector_config, wait_for
from tests.fakes.otlp_sink import OtlpSink

RECEIVERS = ("receiver:otlp_http", "receiver:otlp_grpc")


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


def _status(collector: CollectorThread, component: str) -> Status:
    return collector.call(lambda: collector.svc.host.components[component].status)


def test_receivers_report_ok_once_listening_then_stopped(sink: OtlpSink) -> None:
    config = collector_config(sink=sink)
    collector = CollectorThread(config).start()
    try:
        for name in RECEIVERS:
            assert _status(collector, name) is Status.OK
            gauge = {"component": name, "status": "ok"}
            assert collector.metric("ragtrace_component_status", gauge) == 1.0
        # The loop-lag monitor runs under the service's supervisor and observes.
        assert _status(collector, "event_loop") is Status.OK
        wait_for(
            lambda: collector.metric("ragtrace_event_loop_lag_seconds_count") >= 3,
            timeout=10,
            what="loop-lag observations",
        )
        service = collector.svc
    finally:
        collector.stop()
    for name in RECEIVERS:
        assert service.host.components[name].status is Status.STOPPED
    assert service.host.components["event_loop"].status is Status.STOPPED


@pytest.mark.parametrize("receiver", ["http", "grpc"])
def test_a_port_in_use_is_a_permanent_error(sink: OtlpSink, receiver: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoint = {"endpoint": f"127.0.0.1:{port}"}
        config = collector_config(sink=sink, receivers={receiver: endpoint})

        async def attempt() -> CollectorService:
            service = CollectorService(config, processor=PassThroughProcessor())
            # Found before anything listens (StartupError), or when binding (OSError).
            with pytest.raises((OSError, StartupError)):
                await service.start()
            return service

        service = asyncio.run(attempt())
    component = service.host.components[f"receiver:otlp_{receiver}"]
    assert component.status is Status.PERMANENT_ERROR
    assert str(port) in (component.last_error or "")
    health = service.host.health(recoverable_grace=60)
    assert not health.ok
    assert f"receiver:otlp_{receiver}: permanent_error" in health.reason
