"""Build OTLP protobuf spans the way the ragtrace SDK writes them."""

from __future__ import annotations

import json
import os
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.otlp.spanattrs import set_attributes


def make_span(
    trace_id: bytes,
    kind: str,
    *,
    parent: trace_pb2.Span | None = None,
    start: int = 1_000,
    end: int = 2_000,
    attrs: dict[str, Any] | None = None,
    docs: list[tuple[str | None, str | None]] | None = None,
    doc_prefix: str = semconv.RETRIEVAL_DOCUMENTS,
) -> trace_pb2.Span:
    span = named_span(kind, {}, tid=trace_id, parent=parent, start=start, end=end)
    values: list[tuple[str, Any]] = [(semconv.RAGTRACE_SPAN_KIND, kind)]
    values += list((attrs or {}).items())
    for i, (doc_id, content) in enumerate(docs or []):
        if doc_id is not None:
            values.append((semconv.document_attr(doc_prefix, i, semconv.DOCUMENT_ID), doc_id))
        if content is not None:
            values.append((semconv.document_attr(doc_prefix, i, semconv.DOCUMENT_CONTENT), content))
        values.append(
            (semconv.document_attr(doc_prefix, i, semconv.DOCUMENT_METADATA), json.dumps({"i": i}))
        )
    set_attributes(span.attributes, values)
    return span


def named_span(
    name: str,
    attrs: dict[str, Any],
    *,
    tid: bytes,
    parent: trace_pb2.Span | None = None,
    start: int = 1_000,
    end: int = 2_000,
) -> trace_pb2.Span:
    """A span of any instrumentation: a name and attributes, nothing ragtrace adds."""
    span = trace_pb2.Span(
        trace_id=tid,
        span_id=os.urandom(8),
        parent_span_id=parent.span_id if parent is not None else b"",
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
    )
    set_attributes(span.attributes, attrs.items())
    return span
