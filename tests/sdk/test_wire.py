"""ragtrace's OTLP encoder writes exactly what OpenTelemetry's own encoder builds."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

import ragtrace
from ragtrace._wire import encode_request


def _provider(resource: Resource) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _same(spans: list[ReadableSpan]) -> None:
    ours = ExportTraceServiceRequest()
    ours.ParseFromString(encode_request(spans))
    theirs = encode_spans(spans)
    assert ours == theirs, f"\nours:\n{ours}\ntheirs:\n{theirs}"
    # Byte-level equality is not required (field order may differ), but the encoded
    # size must be the same: nothing missing, nothing extra.
    assert ours.ByteSize() == theirs.ByteSize()


def test_every_span_shape_matches_the_otel_encoder() -> None:
    provider, exporter = _provider(
        Resource.create({"service.name": "svc", "deploy.n": 3, "tags": ("a", "b")}, "https://s/1")
    )
    tracer = provider.get_tracer("scope-a", "1.2.3", schema_url="https://schema/a")
    other = provider.get_tracer("scope-b")
    remote_parent = SpanContext(
        0xABC,
        0xDEF,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("k", "v")]),
    )
    attrs: dict[str, Any] = {
        "s": "text é ✓",
        "empty": "",
        "b": True,
        "f": False,
        "i": 42,
        "neg": -7,
        "big": 2**62,
        "d": 3.25,
        "nan-ish": float("inf"),
        "strs": ["x", "y"],
        "ints": [1, -2, 3],
        "floats": [0.5],
        "bools": [True, False],
        "long": "z" * 5000,
    }
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER, attributes=attrs) as root:
        root.add_event("evt", {"at": 1, "why": "because"})
        root.add_event("bare")
        with other.start_as_current_span(
            "child",
            kind=SpanKind.CLIENT,
            links=[Link(remote_parent, {"link.attr": "x"}), Link(root.get_span_context())],
        ) as child:
            child.set_status(Status(StatusCode.ERROR, "it broke"))
            try:
                raise ValueError("boom")
            except ValueError as exc:
                child.record_exception(exc)
        root.set_status(Status(StatusCode.OK))
    ctx = set_span_in_context(NonRecordingSpan(remote_parent))
    for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.INTERNAL):
        tracer.start_span(f"remote-{kind.name}", context=ctx, kind=kind).end()
    spans = list(exporter.get_finished_spans())
    assert len(spans) == 5
    _same(spans)
    for span in spans:
        _same([span])


def test_two_resources_and_no_scope_attributes() -> None:
    p1, e1 = _provider(Resource.create({"service.name": "one"}))
    p2, e2 = _provider(Resource.create({"service.name": "two"}))
    p1.get_tracer("x").start_span("a").end()
    p2.get_tracer("y").start_span("b").end()
    p1.get_tracer("x").start_span("c").end()
    spans = [*e1.get_finished_spans(), *e2.get_finished_spans()]
    _same(spans)


def test_ragtrace_spans_match(
    configured: Any,
) -> None:
    @ragtrace.retriever
    def search(query: str) -> list[dict[str, Any]]:
        return [
            {"id": f"d{i}", "content": "c" * 300, "score": 0.5, "metadata": {"i": i}}
            for i in range(5)
        ]

    @ragtrace.rag
    def answer(question: str) -> str:
        search(question)
        return "answer"

    with ragtrace.session("s-1", user_id="u"):
        answer("q?")
    spans = list(configured.get_finished_spans())
    assert len(spans) == 2
    _same(spans)


@pytest.fixture
def configured() -> Any:
    provider, exporter = _provider(Resource.create({"service.name": "rt"}))
    ragtrace.configure(tracer_provider=provider)
    yield exporter
    ragtrace._config._reset_for_tests()
