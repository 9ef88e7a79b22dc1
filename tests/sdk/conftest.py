"""Shared fixtures for the SDK tests: an in-memory tracer provider and clean state."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import ragtrace
from tests.fakes.sdk_state import clean_sdk  # noqa: F401  (autouse fixture)


class Recorder:
    """An in-memory provider wired into ragtrace, plus span lookup helpers."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def configure(self, **options: Any) -> None:
        ragtrace.configure(tracer_provider=self.provider, **options)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans() if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"expected one span {name!r}, got {[s.name for s in self.spans()]}"
        return found[0]

    def attrs(self, name: str) -> dict[str, Any]:
        return dict(self.one(name).attributes or {})

    def clear(self) -> None:
        self.exporter.clear()


@pytest.fixture
def recorder() -> Recorder:
    rec = Recorder()
    rec.configure()
    return rec
