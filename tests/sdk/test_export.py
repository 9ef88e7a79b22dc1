"""Real export: OTLP/HTTP and OTLP/gRPC to receivers on 127.0.0.1, decoded protobuf."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

import ragtrace
from ragtrace import semconv
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan, attributes_of


@ragtrace.retriever
def search(query: str) -> list[dict[str, Any]]:
    return [
        {"id": "kb-1", "content": "Refunds take 5 days.", "score": 0.91, "metadata": {"p": 1}},
        {"content": "No id here.", "score": 0.5},
    ]


@ragtrace.rag
def answer(question: str) -> str:
    search(question)
    ragtrace.set_reference(reference_context_ids=["kb-1"])
    return "Five days."


def _check_trace(spans: list[ReceivedSpan], service: str) -> None:
    by_name = {received.span.name: received for received in spans}
    rag_received = by_name["answer"]
    rag_span, retr_span = rag_received.span, by_name["search"].span
    resource = attributes_of(rag_received.resource)
    assert resource["service.name"] == service
    assert resource[semconv.RAGTRACE_SDK_VERSION] == ragtrace.__version__
    assert rag_received.scope.name == "ragtrace"
    assert retr_span.parent_span_id == rag_span.span_id
    assert retr_span.trace_id == rag_span.trace_id

    rag = rag_received.attributes
    assert rag[semconv.RAGTRACE_SPAN_KIND] == "rag"
    assert rag[semconv.INPUT_VALUE] == "How long do refunds take?"
    assert rag[semconv.OUTPUT_VALUE] == "Five days."
    assert rag[semconv.SESSION_ID] == "conv-7"
    assert rag[semconv.TURN_INDEX] == 0  # int_value on the wire
    assert json.loads(rag[semconv.REFERENCE_CONTEXT_IDS]) == ["kb-1"]

    retr = attributes_of(retr_span)
    assert retr[semconv.OPENINFERENCE_SPAN_KIND] == "RETRIEVER"
    assert retr[semconv.GEN_AI_OPERATION_NAME] == "retrieval"
    assert retr["retrieval.documents.0.document.id"] == "kb-1"
    assert retr["retrieval.documents.0.document.score"] == pytest.approx(0.91)
    assert retr["retrieval.documents.0.document.content"] == "Refunds take 5 days."
    assert json.loads(retr["retrieval.documents.0.document.metadata"]) == {"p": 1}
    assert "retrieval.documents.1.document.id" not in retr
    assert retr[semconv.RETRIEVAL_DOCUMENT_COUNT] == 2


def _run_conversation() -> None:
    with ragtrace.session("conv-7", user_id="u-1"):
        assert answer("How long do refunds take?") == "Five days."
    assert ragtrace.flush(timeout=30) is True


def test_export_over_otlp_http() -> None:
    with OtlpSink() as sink:
        ragtrace.configure(
            service_name="svc-http",
            endpoint=sink.http_url,
            headers={"Authorization": "Bearer s3cret"},
        )
        _run_conversation()
        sink.wait_for_spans(2)
        ragtrace.shutdown()
    assert sink.paths[0] == "/v1/traces"
    headers = sink.headers[0]
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["authorization"] == "Bearer s3cret"
    _check_trace(sink.spans, "svc-http")


def test_export_configured_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with OtlpSink() as sink:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.http_url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "svc-from-otel-env")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=otel")
        monkeypatch.setenv("RAGTRACE_HEADERS", "x-team=ragtrace")
        ragtrace.configure()
        _run_conversation()
        sink.wait_for_spans(2)
        ragtrace.shutdown()
    assert sink.headers[0]["x-team"] == "ragtrace"
    _check_trace(sink.spans, "svc-from-otel-env")


def test_export_over_otlp_grpc() -> None:
    with OtlpSink() as sink:
        ragtrace.configure(
            service_name="svc-grpc",
            protocol="grpc",
            endpoint=f"http://{sink.grpc_endpoint}",
            headers={"X-Api-Key": "k-123"},
        )
        _run_conversation()
        sink.wait_for_spans(2)
        ragtrace.shutdown()
    assert sink.headers[0]["x-api-key"] == "k-123"
    _check_trace(sink.spans, "svc-grpc")


def test_backend_errors_never_reach_the_app() -> None:
    with OtlpSink() as sink:
        sink.fail_next(1000, http_status=500)  # every call fails
        ragtrace.configure(service_name="svc", endpoint=sink.http_url)
        for _ in range(3):
            assert answer("q") == "Five days."
        ragtrace.flush(timeout=30)
        sink.wait_until(lambda: sink.refused_span_count >= 6)
        assert answer("after a failed export") == "Five days."
        ragtrace.shutdown()


def test_request_path_does_not_wait_on_a_stuck_backend() -> None:
    hold = threading.Event()
    with OtlpSink() as sink:
        sink.hold = hold
        ragtrace.configure(service_name="svc", endpoint=sink.http_url)
        answer("first")
        flusher = threading.Thread(target=ragtrace.flush, kwargs={"timeout": 30})
        flusher.start()
        assert sink.holding.wait(30), "the export never reached the backend"
        # The backend is now holding the export request open.  Requests keep flowing:
        for i in range(50):
            assert answer(f"while stuck {i}") == "Five days."
        assert not hold.is_set()
        assert sink.headers
        hold.set()
        flusher.join(timeout=30)
        ragtrace.flush(timeout=30)
        sink.wait_for_spans(2 * 51)
        ragtrace.shutdown()
