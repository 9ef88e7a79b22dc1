"""Exporters against real receivers: retries, delays, permanent errors, queues, files."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)

from ragtrace_collector.exporters.file import rotated_paths
from ragtrace_collector.otlp.codec import decode_json_request, iter_spans
from tests.fakes.harness import (
    collector_config,
    emit_rag_request,
    make_app,
    running_collector,
    sink_exporter,
    span_key,
    wait_for,
)
from tests.fakes.otlp_data import make_request, rag_trace
from tests.fakes.otlp_sink import OtlpSink


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


def _send(collector_http: str, traces: int, *, start: int = 0) -> list[tuple[str, str]]:
    app = make_app(HttpSpanExporter(endpoint=collector_http))
    for n in range(start, start + traces):
        emit_rag_request(app.provider, n)
    app.shutdown()
    return [span_key(s) for s in app.emitted()]


@pytest.mark.parametrize("protocol", ["otlp_http", "otlp_grpc"])
def test_headers_and_compression_reach_the_backend(sink: OtlpSink, protocol: str) -> None:
    exporter = sink_exporter(sink, protocol, headers={"X-Tenant": "acme", "api-key": "k-123456"})
    with running_collector(collector_config(exporters={"b": exporter})) as collector:
        _send(collector.http_url, 2)
        sink.wait_for_spans(6)
    headers = sink.headers[-1]
    assert headers["x-tenant"] == "acme"
    assert headers["api-key"] == "k-123456"
    if protocol == "otlp_http":
        assert headers["content-encoding"] == "gzip"
        assert headers["content-type"] == "application/x-protobuf"


def test_http_retry_after_is_honoured(sink: OtlpSink) -> None:
    config = collector_config(sink=sink, sink_protocol="otlp_http")
    with running_collector(config) as collector:
        sink.fail_next(1, http_status=429, retry_after=1)
        started = time.monotonic()
        _send(collector.http_url, 1)
        sink.wait_for_spans(3)
        # The base backoff is 50ms; the backend asked for 1s.
        assert time.monotonic() - started >= 0.9
        assert collector.metric("ragtrace_spans_retried_total", {"exporter": "backend"}) == 3


def test_grpc_resource_exhausted_is_retried_only_with_retry_info(sink: OtlpSink) -> None:
    config = collector_config(sink=sink, sink_protocol="otlp_grpc")
    with running_collector(config) as collector:
        sink.fail_next(1, grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after=0.6)
        started = time.monotonic()
        _send(collector.http_url, 1)
        sink.wait_for_spans(3)
        assert time.monotonic() - started >= 0.55
        # Without RetryInfo, RESOURCE_EXHAUSTED is permanent (OTLP spec): dropped, counted.
        sink.clear()
        sink.fail_next(1, grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED)
        _send(collector.http_url, 1, start=1)
        wait_for(
            lambda: (
                collector.metric(
                    "ragtrace_spans_dropped_total", {"exporter": "backend", "reason": "rejected"}
                )
                == 3
            ),
            what="dropped counter",
        )
        assert sink.span_count == 0
        # And the exporter carries on.
        _send(collector.http_url, 1, start=2)
        sink.wait_for_spans(3)


def test_permanent_http_error_drops_and_counts_then_carries_on(sink: OtlpSink) -> None:
    config = collector_config(sink=sink, sink_protocol="otlp_http")
    with running_collector(config) as collector:
        sink.fail_next(1, http_status=400, message="schema says no")
        _send(collector.http_url, 1)
        wait_for(
            lambda: (
                collector.metric(
                    "ragtrace_spans_dropped_total", {"exporter": "backend", "reason": "rejected"}
                )
                == 3
            ),
            what="dropped counter",
        )
        assert sink.failures_served == 1
        keys = _send(collector.http_url, 2, start=5)
        got = sink.wait_for_spans(6)
        assert sorted(r.key for r in got) == sorted(keys)


def test_max_elapsed_time_gives_up_and_counts(sink: OtlpSink) -> None:
    exporter = sink_exporter(sink, "otlp_grpc", retry={"max_elapsed_time": "300ms"})
    with running_collector(collector_config(exporters={"backend": exporter})) as collector:
        sink.go_down()
        _send(collector.http_url, 1)
        wait_for(
            lambda: (
                collector.metric(
                    "ragtrace_spans_dropped_total",
                    {"exporter": "backend", "reason": "retry_timeout"},
                )
                == 3
            ),
            what="retry_timeout counter",
        )
        sink.come_up()


def test_drop_oldest_policy_drops_counted_and_never_refuses(sink: OtlpSink) -> None:
    exporter = sink_exporter(
        sink, "otlp_grpc", queue={"max_spans": 30, "on_full": "drop_oldest"}, concurrency=1
    )
    config = collector_config(exporters={"backend": exporter}, assembly={"decision_wait": 0})
    with running_collector(config) as collector:
        sink.go_down()
        keys = _send(collector.http_url, 40)  # 120 spans into a 30-span queue
        wait_for(
            lambda: (
                collector.metric("ragtrace_spans_received_total", {"receiver": "otlp_http"}) == 120
            )
        )
        assert (
            collector.metric(
                "ragtrace_spans_refused_total", {"receiver": "otlp_http", "reason": "queue_full"}
            )
            == 0
        )
        sink.come_up()

        def accounted() -> bool:
            dropped = collector.metric(
                "ragtrace_spans_dropped_total", {"exporter": "backend", "reason": "queue_full"}
            )
            return dropped + sink.span_count == 120

        wait_for(accounted, what="delivered + dropped == sent")
        delivered = {r.key for r in sink.spans}
        assert delivered <= set(keys)
        assert len(delivered) == sink.span_count
        # The newest spans are the ones kept.
        assert set(keys[-27:]) <= delivered


def test_file_exporter_writes_otlp_json_lines_and_rotates(tmp_path: Path) -> None:
    path = tmp_path / "out" / "spans.jsonl"
    config = collector_config(
        exporters={
            "file": {
                "type": "file",
                "path": str(path),
                "max_bytes": "8KiB",
                "keep": 100,
                "max_batch_spans": 6,
            }
        },
        assembly={"decision_wait": 0},
    )
    with running_collector(config) as collector:
        keys = _send(collector.http_url, 30)
    files = [p for p in rotated_paths(path, 100) if p.exists()]
    assert len(files) > 3, "rotation never happened"
    seen: list[tuple[str, str]] = []
    for file in files:
        assert file.stat().st_size <= 8 * 1024
        for line in file.read_bytes().splitlines():
            json.loads(line)  # whole lines, never split across files
            request = decode_json_request(line)
            seen += [(s.trace_id.hex(), s.span_id.hex()) for s in iter_spans(request)]
    assert sorted(seen) == sorted(keys)
    # Ids are hex in OTLP/JSON.
    first = json.loads(path.read_bytes().splitlines()[0])
    span = first["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32
    assert len(span["spanId"]) == 16


def test_file_rotation_keeps_only_n_files(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    config = collector_config(
        exporters={
            "file": {
                "type": "file",
                "path": str(path),
                "max_bytes": 2000,
                "keep": 2,
                "max_batch_spans": 3,
            }
        },
        assembly={"decision_wait": 0},
    )
    with running_collector(config) as collector:
        host, port = collector.svc.http_address or ("", 0)
        import urllib.request

        for _ in range(20):
            body = make_request(rag_trace(children=2)).SerializeToString()
            req = urllib.request.Request(
                f"http://{host}:{port}/v1/traces",
                data=body,
                headers={"Content-Type": "application/x-protobuf"},
            )
            urllib.request.urlopen(req, timeout=10).read()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["spans.jsonl", "spans.jsonl.1", "spans.jsonl.2"]
