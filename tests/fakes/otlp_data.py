"""Build OTLP export requests by hand, for tests that need exact control."""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from ragtrace import semconv


def new_trace_id() -> bytes:
    return os.urandom(16)


def new_span_id() -> bytes:
    return os.urandom(8)


def make_span(
    trace_id: bytes,
    *,
    span_id: bytes | None = None,
    parent: bytes = b"",
    name: str = "span",
    attrs: dict[str, str | int | float | bool] | None = None,
) -> Span:
    span = Span(
        trace_id=trace_id,
        span_id=span_id or new_span_id(),
        parent_span_id=parent,
        name=name,
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=1_700_000_000_000_000_000,
        end_time_unix_nano=1_700_000_000_500_000_000,
    )
    for key, value in (attrs or {}).items():
        kv = span.attributes.add()
        kv.key = key
        if isinstance(value, bool):
            kv.value.bool_value = value
        elif isinstance(value, int):
            kv.value.int_value = value
        elif isinstance(value, float):
            kv.value.double_value = value
        else:
            kv.value.string_value = value
    return span


def make_request(
    spans: Sequence[Span], *, service: str = "svc", scope: str = "scope"
) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    rs.schema_url = "https://opentelemetry.io/schemas/1.26.0"
    ss = rs.scope_spans.add()
    ss.scope.name = scope
    ss.scope.version = "1.2.3"
    ss.spans.extend(spans)
    return request


def rag_trace(trace_id: bytes | None = None, *, children: int = 2) -> list[Span]:
    """A root ``@rag`` span and ``children`` retriever spans under it."""
    tid = trace_id or new_trace_id()
    root = make_span(
        tid,
        name="rag",
        attrs={
            semconv.RAGTRACE_SPAN_KIND: semconv.KIND_RAG,
            semconv.INPUT_VALUE: "question?",
        },
    )
    kids = [
        make_span(
            tid,
            parent=root.span_id,
            name=f"retrieve-{i}",
            attrs={semconv.RAGTRACE_SPAN_KIND: semconv.KIND_RETRIEVER},
        )
        for i in range(children)
    ]
    return [*kids, root]
