"""The app never breaks: ragtrace failures are logged once and swallowed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

import ragtrace
from ragtrace import semconv
from ragtrace._export import ExportQueue

from .conftest import Recorder


class BadStr:
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")

    __repr__ = __str__


class BadProperty:
    @property
    def content(self) -> str:
        raise ValueError("property exploded")


def _ragtrace_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ragtrace"]


def test_unprintable_input_and_output(recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    bad = BadStr()

    @ragtrace.rag(input="payload")
    def handle(payload: Any) -> Any:
        return payload

    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        for _ in range(3):
            assert handle(bad) is bad
    spans = recorder.named("handle")
    assert len(spans) == 3
    for span in spans:
        assert semconv.INPUT_VALUE not in (span.attributes or {})
        assert span.attributes is not None
        assert span.attributes[semconv.RAGTRACE_SPAN_KIND] == "rag"
        assert span.status.status_code is StatusCode.UNSET
    records = _ragtrace_records(caplog)
    # one record per cause (input, output), not one per call
    assert len(records) == 2
    assert all("__str__ exploded" in r.getMessage() for r in records)


def test_circular_output_is_skipped(recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    loop: list[Any] = []
    loop.append(loop)

    @ragtrace.generator
    def produce(prompt: str) -> list[Any]:
        return loop

    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        assert produce("p") is loop
    attrs = recorder.attrs("produce")
    assert attrs[semconv.INPUT_VALUE] == "p"
    assert semconv.OUTPUT_VALUE not in attrs
    assert len(_ragtrace_records(caplog)) == 1


def test_output_callable_raising_is_swallowed(recorder: Recorder) -> None:
    @ragtrace.rag(output=lambda result: result["missing"])
    def handle(question: str) -> dict[str, str]:
        return {"answer": "a"}

    assert handle("q") == {"answer": "a"}
    assert semconv.OUTPUT_VALUE not in recorder.attrs("handle")


def test_bad_document_is_skipped_others_kept(recorder: Recorder) -> None:
    @ragtrace.retriever
    def search(query: str) -> list[Any]:
        return ["good one", BadProperty(), BadStr(), {"id": "d3", "text": "fine"}]

    docs = search("q")
    assert len(docs) == 4
    attrs = recorder.attrs("search")
    assert attrs["retrieval.documents.0.document.content"] == "good one"
    assert "retrieval.documents.1.document.content" not in attrs
    assert "retrieval.documents.2.document.content" not in attrs
    assert attrs["retrieval.documents.3.document.id"] == "d3"
    assert attrs[semconv.RETRIEVAL_DOCUMENT_COUNT] == 4


def test_unserialisable_metadata(recorder: Recorder) -> None:
    @ragtrace.retriever
    def search(query: str) -> list[dict[str, Any]]:
        return [{"id": "m", "text": "t", "metadata": {"obj": BadStr()}}]

    search("q")
    attrs = recorder.attrs("search")
    assert attrs["retrieval.documents.0.document.id"] == "m"
    assert "retrieval.documents.0.document.metadata" not in attrs


def test_user_exception_with_broken_str_still_propagates(recorder: Recorder) -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    error = Weird()

    @ragtrace.rag
    def explode(question: str) -> str:
        raise error

    with pytest.raises(Weird) as info:
        explode("q")
    assert info.value is error
    span = recorder.one("explode")
    assert span.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in span.events)


class _BrokenTracer(trace_api.Tracer):
    def start_span(self, *args: Any, **kwargs: Any) -> trace_api.Span:
        raise RuntimeError("tracer is broken")

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracer is broken")


class _BrokenProvider(trace_api.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace_api.Tracer:
        return _BrokenTracer()


async def test_broken_tracer_runs_the_function_untraced(caplog: pytest.LogCaptureFixture) -> None:
    ragtrace.configure(tracer_provider=_BrokenProvider())

    @ragtrace.rag
    def sync(question: str) -> str:
        return "s"

    @ragtrace.rag
    async def coro(question: str) -> str:
        return "c"

    @ragtrace.rag
    def gen(question: str) -> Any:
        yield "g"

    @ragtrace.rag
    async def agen(question: str) -> Any:
        yield "a"

    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        assert sync("q") == "s"
        assert await coro("q") == "c"
        assert list(gen("q")) == ["g"]
        assert [x async for x in agen("q")] == ["a"]
    assert len(_ragtrace_records(caplog)) == 1


class _RaisingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise ConnectionError("backend unreachable")

    def shutdown(self) -> None:
        raise RuntimeError("shutdown failed too")


def test_raising_exporter_is_contained_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    inner = _RaisingExporter()
    queue = ExportQueue(inner, schedule_delay=0.01)
    provider = TracerProvider()
    provider.add_span_processor(queue)
    tracer = provider.get_tracer("t")
    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        with tracer.start_as_current_span("one"):
            pass
        assert queue.force_flush(5_000) is False
        with tracer.start_as_current_span("two"):
            pass
        assert queue.force_flush(5_000) is False
        queue.shutdown(1_000)
    assert inner.calls == 2
    assert queue.stats().spans_dropped == {"export_failed": 2}
    messages = [r.getMessage() for r in _ragtrace_records(caplog)]
    assert any("span export failed (ConnectionError: backend unreachable)" in m for m in messages)
    assert sum("span export failed" in m for m in messages) == 1
    assert sum("exporter shutdown failed" in m for m in messages) == 1


def test_sdk_never_configures_logging() -> None:
    logger = logging.getLogger("ragtrace")
    assert logger.handlers == []
    assert logger.level == logging.NOTSET
