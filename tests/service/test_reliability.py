"""Zero spans lost: backend outage, SIGTERM with spans buffered, a flood, a failing exporter."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)

from tests.fakes.harness import (
    ServeProcess,
    assert_delivered_exactly,
    collector_config,
    emit_rag_request,
    make_app,
    running_collector,
    sink_exporter,
    wait_for,
)
from tests.fakes.otlp_sink import OtlpSink


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


@pytest.mark.parametrize("protocol", ["otlp_grpc", "otlp_http"])
def test_backend_down_for_a_while_then_back(sink: OtlpSink, protocol: str) -> None:
    config = collector_config(sink=sink, sink_protocol=protocol)
    with running_collector(config) as collector:
        sink.go_down()
        app = make_app(HttpSpanExporter(endpoint=collector.http_url))
        for n in range(30):
            emit_rag_request(app.provider, n)
        app.provider.force_flush(30_000)
        # The collector took everything and keeps retrying the unreachable backend.
        wait_for(
            lambda: collector.metric("ragtrace_spans_retried_total", {"exporter": "backend"}) > 0,
            what="export retries",
        )
        assert sink.span_count == 0
        assert collector.metric("ragtrace_spans_received_total", {"receiver": "otlp_http"}) == 90
        sink.come_up()
        app.shutdown()
        assert_delivered_exactly(app.emitted(), sink.wait_for_spans(90, timeout=30))
        assert (
            collector.metric(
                "ragtrace_spans_dropped_total", {"exporter": "backend", "reason": "rejected"}
            )
            == 0
        )
        # Retryable answers (503 + Retry-After) are retried too, honouring the delay.
        sink.clear()
        sink.fail_next(2, http_status=503, retry_after=0.2)
        app = make_app(HttpSpanExporter(endpoint=collector.http_url))
        emit_rag_request(app.provider, 99)
        app.shutdown()
        assert_delivered_exactly(app.emitted(), sink.wait_for_spans(3, timeout=30))


def test_one_failing_exporter_does_not_block_another() -> None:
    with OtlpSink() as down, OtlpSink() as healthy:
        config = collector_config(
            exporters={
                "down": sink_exporter(down, "otlp_http"),
                "healthy": sink_exporter(healthy, "otlp_grpc"),
            }
        )
        with running_collector(config) as collector:
            down.go_down()
            app = make_app(GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True))
            for n in range(50):
                emit_rag_request(app.provider, n)
            app.provider.force_flush(30_000)
            emitted = app.emitted()
            # Everything reaches the healthy backend while the other one is down.
            assert_delivered_exactly(emitted, healthy.wait_for_spans(150, timeout=30))
            assert down.span_count == 0
            assert collector.metric("ragtrace_spans_retried_total", {"exporter": "down"}) > 0
            down.come_up()
            assert_delivered_exactly(emitted, down.wait_for_spans(150, timeout=30))
            app.shutdown()


# OTLP/HTTP's exporter backs off for seconds after each refusal (gRPC's does not).
@pytest.mark.parametrize("sdk_protocol", [pytest.param("http", marks=pytest.mark.slow), "grpc"])
def test_flood_far_beyond_capacity_is_throttled_and_nothing_is_lost(
    sink: OtlpSink, sdk_protocol: str
) -> None:
    queue_max, buffer_max = 150, 200
    config = collector_config(
        sink=sink,
        exporters={
            "backend": sink_exporter(
                sink,
                "otlp_grpc",
                queue={"max_spans": queue_max},
                max_batch_spans=100,
                concurrency=1,
            )
        },
        assembly={"decision_wait": 0, "max_buffered_spans": buffer_max},
        receivers={"retry_after": "300ms"},
    )
    sink.delay = 0.03  # a slow backend: ~3,000 spans/s at 100 spans per call
    traces = 1000  # 3,000 spans, ~9x what the collector may hold
    with running_collector(config) as collector:
        if sdk_protocol == "http":
            exporter: Any = HttpSpanExporter(endpoint=collector.http_url, timeout=60)
        else:
            exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=60)
        app = make_app(
            exporter, max_queue_size=50_000, max_export_batch_size=300, schedule_delay_millis=5
        )
        started = time.monotonic()
        for n in range(traces):
            emit_rag_request(app.provider, n, docs=1)
        app.shutdown()
        emitted = app.emitted()
        assert len(emitted) == 3 * traces
        assert_delivered_exactly(emitted, sink.wait_for_spans(len(emitted), timeout=60))
        elapsed = time.monotonic() - started
        receiver = "otlp_http" if sdk_protocol == "http" else "otlp_grpc"
        refused = collector.metric(
            "ragtrace_spans_refused_total", {"receiver": receiver, "reason": "queue_full"}
        )
        # Back-pressure happened, and the SDK's exporter retried every refused batch.
        assert refused > 0
        assert collector.metric("ragtrace_spans_received_total", {"receiver": receiver}) == len(
            emitted
        )
        exporter_state = collector.svc.exporters[0]
        # Memory stayed bounded: the queue passed its bound only by what was in flight.
        assert exporter_state.peak_depth <= queue_max + buffer_max + 300
        assert collector.svc.pipeline.assembler.peak_buffered_spans <= buffer_max + 300
        assert elapsed < 60


# ----------------------------------------------------------------- SIGTERM
def test_sigterm_with_spans_buffered_delivers_everything_and_exits_0(
    sink: OtlpSink, tmp_path: Path
) -> None:
    config = {
        "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
        "admin": {"endpoint": "127.0.0.1:0"},
        # Traces would wait a minute: SIGTERM must release them.
        "assembly": {"decision_wait": "60s", "max_trace_wait": "120s"},
        "exporters": {"backend": sink_exporter(sink, "otlp_http")},
        "shutdown": {"flush_timeout": "20s"},
    }
    serve = ServeProcess(config, tmp_path)
    try:
        app = make_app(
            HttpSpanExporter(endpoint=f"http://{serve.endpoints['otlp_http']}/v1/traces")
        )
        for n in range(100):
            emit_rag_request(app.provider, n)
        app.shutdown()
        wait_for(lambda: serve.metric("ragtrace_spans_buffered") == 300, what="300 buffered spans")
        assert sink.span_count == 0
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(timeout=60) == 0
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    assert_delivered_exactly(app.emitted(), sink.wait_for_spans(300, timeout=5))
    names = [e.get("event") for e in serve.events]
    assert (
        names.index("signal_received")
        < names.index("shutdown_started")
        < names.index("shutdown_complete")
    )
    done = next(e for e in serve.events if e.get("event") == "shutdown_complete")
    assert done["traces_flushed"] == 100
    assert done["spans_dropped"] == 0


def test_sigint_while_backend_down_counts_what_the_deadline_cut(
    sink: OtlpSink, tmp_path: Path
) -> None:
    """The flush deadline is honoured: in time, undelivered spans counted, exit 3 (spans
    were lost: there is no write-ahead log and no spill file)."""
    config = {
        "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
        "admin": {"endpoint": "127.0.0.1:0"},
        "assembly": {"decision_wait": 0},
        "exporters": {"backend": sink_exporter(sink, "otlp_grpc")},
        "shutdown": {"flush_timeout": "1s"},
    }
    sink.go_down()
    serve = ServeProcess(config, tmp_path)
    try:
        app = make_app(GrpcSpanExporter(endpoint=serve.endpoints["otlp_grpc"], insecure=True))
        for n in range(10):
            emit_rag_request(app.provider, n)
        app.shutdown()
        wait_for(lambda: serve.metric("ragtrace_spans_received_total") == 30, what="spans received")
        started = time.monotonic()
        serve.proc.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 3
        assert time.monotonic() - started < 15
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    done = next(e for e in serve.events if e.get("event") == "shutdown_complete")
    assert done["spans_dropped"] == 30
    assert any(e.get("event") == "export_deadline_passed" for e in serve.events)
    lost = serve.event("spans_lost_at_shutdown")
    assert lost is not None
    assert lost["spans"] == 30
