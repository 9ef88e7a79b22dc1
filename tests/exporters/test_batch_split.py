"""A trace larger than ``max_batch_spans`` is cut into several bounded export requests.

Real exporters against the loopback OTLP sink: every span of a huge trace arrives,
once, in order, in requests of at most ``max_batch_spans`` spans, with its resource
and scope; the trace is settled (write-ahead log, spill tracking) once, with its
original groups, only after its last piece was delivered, including when pieces are
retried.  Then the same through a running collector over both export protocols.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest

from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.config import parse_config
from ragtrace_collector.exporters.otlp_grpc import OtlpGrpcExporter
from ragtrace_collector.exporters.otlp_http import OtlpHttpExporter
from ragtrace_collector.otlp.codec import SpanGroup, split_request
from tests.fakes.harness import collector_config, running_collector, sink_exporter
from tests.fakes.hostile import PROTOBUF, post, wide_trace
from tests.fakes.otlp_data import make_request, make_span, new_trace_id
from tests.fakes.otlp_sink import OtlpSink


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


def _exporter(
    sink: OtlpSink, protocol: str, *, max_batch: int, concurrency: int
) -> OtlpHttpExporter | OtlpGrpcExporter:
    section = sink_exporter(sink, protocol, max_batch_spans=max_batch, concurrency=concurrency)
    config = parse_config(
        {"receivers": {"http": {"endpoint": "127.0.0.1:0"}}, "exporters": {"backend": section}},
        env={},
    ).exporters["backend"]
    if protocol == "otlp_http":
        return OtlpHttpExporter("backend", config, Telemetry())  # type: ignore[arg-type]
    return OtlpGrpcExporter("backend", config, Telemetry())  # type: ignore[arg-type]


def _two_scope_trace(spans: int) -> tuple[list[SpanGroup], list[bytes]]:
    """One trace whose spans sit in two scopes of one resource, as split_request gives it."""
    tid = new_trace_id()
    request = make_request([make_span(tid, name=f"a{i}") for i in range(spans // 2)], scope="a")
    second = make_request(
        [make_span(tid, name=f"b{i}") for i in range(spans - spans // 2)], scope="b"
    )
    request.resource_spans[0].scope_spans.append(second.resource_spans[0].scope_spans[0])
    groups = split_request(request).traces[tid].groups
    assert len(groups) == 2
    return groups, [s.span_id for g in groups for s in g.spans]


async def _deliver(
    exporter: OtlpHttpExporter | OtlpGrpcExporter, batches: list[list[SpanGroup]]
) -> list[list[SpanGroup]]:
    settled: list[list[SpanGroup]] = []
    exporter.on_settled = settled.append
    await exporter.start()
    for groups in batches:
        exporter.enqueue(groups, sum(len(g.spans) for g in groups))
    # close() delivers what is queued before its deadline and counts what it could not.
    dropped = await exporter.close(asyncio.get_running_loop().time() + 60)
    assert dropped == 0
    return settled


@pytest.mark.parametrize("protocol", ["otlp_http", "otlp_grpc"])
def test_a_huge_trace_goes_out_in_bounded_requests_in_order(sink: OtlpSink, protocol: str) -> None:
    groups, ids = _two_scope_trace(10_501)
    small, small_ids = _two_scope_trace(10)
    exporter = _exporter(sink, protocol, max_batch=1000, concurrency=1)
    settled = asyncio.run(_deliver(exporter, [groups, small]))

    received = sink.wait_for_spans(10_511)
    assert [r.span.span_id for r in received] == ids + small_ids  # once each, in order
    assert max(sink.request_spans) <= 1000
    assert sum(sink.request_spans) == 10_511
    # 11 pieces of the big trace; the small one rides with its last piece (501 + 10).
    assert len(sink.request_spans) == math.ceil(10_501 / 1000)
    assert {r.scope.name for r in received[:5250]} == {"a"}
    assert {r.scope.name for r in received[5250:10_501]} == {"b"}
    assert {r.service_name for r in received} == {"svc"}
    # Settled with the original groups (what the write-ahead log counts), once each.
    flat = [g for call in settled for g in call]
    assert len(flat) == 4
    assert [id(g) for g in flat] == [id(g) for g in (*groups, *small)]


def test_a_cut_trace_is_settled_only_after_every_piece_including_retried_ones(
    sink: OtlpSink,
) -> None:
    groups, ids = _two_scope_trace(5_000)
    sink.fail_next(3, http_status=503)  # three pieces fail first and are retried
    exporter = _exporter(sink, "otlp_http", max_batch=500, concurrency=2)
    settled = asyncio.run(_deliver(exporter, [groups]))

    received = sink.wait_for_spans(5_000)
    assert sorted(r.span.span_id for r in received) == sorted(ids)
    assert len({r.span.span_id for r in received}) == 5_000
    assert max(sink.request_spans) <= 500
    assert sink.failures_served == 3
    assert len(settled) == 1
    assert [id(g) for g in settled[0]] == [id(g) for g in groups]


@pytest.mark.parametrize("protocol", ["otlp_http", "otlp_grpc"])
def test_a_100k_span_trace_through_the_collector(sink: OtlpSink, protocol: str) -> None:
    config = collector_config(
        exporters={"backend": sink_exporter(sink, protocol, max_batch_spans=4096)},
        assembly={"decision_wait": 0},
    )
    request = wide_trace(100_000)
    sent = [s.span_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    with running_collector(config) as collector:
        status = post(collector.http_url, request.SerializeToString(), PROTOBUF)
        assert status.status == 200
        received = sink.wait_for_spans(100_000, timeout=120)
    assert sorted(r.span.span_id for r in received) == sorted(sent)
    assert max(sink.request_spans) <= 4096
    assert len(sink.request_spans) >= math.ceil(100_000 / 4096)
