"""Fixtures for the example-app tests: clean ragtrace state and an in-memory span recorder."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import ragtrace
from ragtrace import semconv as sc
from tests.fakes.openai_server import openai_server  # noqa: F401  (fixture)
from tests.fakes.sdk_state import clean_sdk  # noqa: F401  (autouse fixture)


class SpanRecorder:
    """ragtrace configured with an InMemorySpanExporter-backed TracerProvider."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        ragtrace.configure(tracer_provider=self.provider)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def of_kind(self, kind: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if (s.attributes or {}).get(sc.RAGTRACE_SPAN_KIND) == kind]

    def clear(self) -> None:
        self.exporter.clear()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.fixture
def recorder() -> SpanRecorder:
    return SpanRecorder()
