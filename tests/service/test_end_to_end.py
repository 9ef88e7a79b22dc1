"""SDK -> collector -> backend over real loopback sockets, both OTLP transports."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)

import ragtrace
from ragtrace import semconv
from ragtrace_collector.otlp.codec import encode_json
from tests.fakes.harness import (
    assert_delivered_exactly,
    collector_config,
    emit_rag_request,
    make_app,
    running_collector,
    wait_for,
)
from tests.fakes.otlp_data import make_request, rag_trace
from tests.fakes.otlp_sink import OtlpSink


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


@pytest.mark.parametrize(
    ("sdk_protocol", "backend_protocol"),
    [("http", "otlp_grpc"), ("grpc", "otlp_http"), ("http-gzip", "otlp_http")],
)
def test_every_span_arrives_with_all_attributes(
    sink: OtlpSink, sdk_protocol: str, backend_protocol: str
) -> None:
    config = collector_config(sink=sink, sink_protocol=backend_protocol)
    with running_collector(config) as collector:
        exporter: Any
        if sdk_protocol == "grpc":
            exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
        else:
            exporter = HttpSpanExporter(
                endpoint=collector.http_url,
                compression=Compression.Gzip if sdk_protocol.endswith("gzip") else None,
            )
        app = make_app(exporter)
        for n in range(40):
            emit_rag_request(app.provider, n)
        app.shutdown()
        emitted = app.emitted()
        assert len(emitted) == 120
        received = sink.wait_for_spans(len(emitted), timeout=30)
        assert_delivered_exactly(emitted, received)
        receiver = "otlp_grpc" if sdk_protocol == "grpc" else "otlp_http"
        assert collector.metric("ragtrace_spans_received_total", {"receiver": receiver}) == 120
        wait_for(
            lambda: (
                collector.metric("ragtrace_spans_forwarded_total", {"exporter": "backend"}) == 120
            ),
            what="forwarded counter",
        )
        # Whole traces were released by the assembler (root + decision_wait), not split.
        assert collector.metric("ragtrace_traces_released_total", {"reason": "ready"}) == 40
    assert {r.via for r in received} == {backend_protocol.removeprefix("otlp_")}


def _decorated_app() -> Any:
    @ragtrace.retriever
    def search(query: str) -> list[dict[str, Any]]:
        return [
            {"id": f"doc-{i}", "content": f"{query} is answered in part {i}.", "score": 1 - i / 10}
            for i in range(3)
        ]

    @ragtrace.generator
    def generate(question: str, contexts: list[dict[str, Any]]) -> str:
        return f"{question} -> {len(contexts)} contexts"

    @ragtrace.rag
    def answer(question: str) -> str:
        if question.endswith("3?"):
            ragtrace.set_reference(expected_output="three", reference_context_ids=["doc-0"])
        return generate(question, search(question))

    return answer


def test_ragtrace_sdk_decorators_through_the_collector(sink: OtlpSink) -> None:
    """The real SDK (decorators, sessions, references) -> collector -> backend."""
    with running_collector(collector_config(sink=sink)) as collector:
        app = make_app(HttpSpanExporter(endpoint=collector.http_url))
        ragtrace.configure(tracer_provider=app.provider)
        try:
            answer = _decorated_app()
            with ragtrace.session("conv-42", user_id="u-7"):
                for n in range(6):
                    answer(f"question {n}?")
        finally:
            ragtrace.shutdown()
        app.shutdown()
        emitted = app.emitted()
        assert len(emitted) == 18
        received = sink.wait_for_spans(18)
        assert_delivered_exactly(emitted, received)
    kinds = sorted(r.attributes[semconv.RAGTRACE_SPAN_KIND] for r in received)
    assert kinds == sorted([semconv.KIND_RAG, semconv.KIND_RETRIEVER, semconv.KIND_GENERATOR] * 6)
    rag_spans = [
        r for r in received if r.attributes[semconv.RAGTRACE_SPAN_KIND] == semconv.KIND_RAG
    ]
    assert {r.attributes[semconv.SESSION_ID] for r in rag_spans} == {"conv-42"}
    assert sum(semconv.EXPECTED_OUTPUT in r.attributes for r in rag_spans) == 1


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_ragtrace_configure_exports_to_the_collector(sink: OtlpSink, protocol: str) -> None:
    """``ragtrace.configure(endpoint=...)`` with the SDK's own exporter reaches the collector."""
    with running_collector(collector_config(sink=sink)) as collector:
        if protocol == "grpc":
            endpoint = f"http://{collector.grpc_endpoint}"
        else:
            endpoint = collector.http_url.removesuffix("/v1/traces")
        ragtrace.configure(service_name="support-bot", endpoint=endpoint, protocol=protocol)
        try:
            answer = _decorated_app()
            for n in range(5):
                answer(f"q{n}?")
            assert ragtrace.flush(30)
        finally:
            ragtrace.shutdown()
        received = sink.wait_for_spans(15)
        assert len(received) == 15
        assert {r.service_name for r in received} == {"support-bot"}
        retrievers = [
            r
            for r in received
            if r.span.name
            and r.attributes.get(semconv.RAGTRACE_SPAN_KIND) == semconv.KIND_RETRIEVER
        ]
        assert len(retrievers) == 5
        doc_id = semconv.document_attr(semconv.RETRIEVAL_DOCUMENTS, 0, semconv.DOCUMENT_ID)
        assert {r.attributes[doc_id] for r in retrievers} == {"doc-0"}


def test_large_otlp_json_request(sink: OtlpSink) -> None:
    """A JSON body big enough to be decoded off the event loop; ids survive as hex."""
    spans = [s for _ in range(60) for s in rag_trace(children=4)]
    for span in spans:
        kv = span.attributes.add()
        kv.key, kv.value.string_value = semconv.OUTPUT_VALUE, "x" * 300
    body = encode_json(make_request(spans))
    assert len(body) > 100_000
    with running_collector(collector_config(sink=sink)) as collector:
        req = urllib.request.Request(
            collector.http_url, data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        got = sink.wait_for_spans(len(spans))
    assert sorted(r.key for r in got) == sorted((s.trace_id.hex(), s.span_id.hex()) for s in spans)
