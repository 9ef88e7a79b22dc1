"""The exporter guard: export failures are logged once by ragtrace and never escape.

The ``BatchSpanProcessor`` already runs export on its own thread; this wrapper makes sure
an exporter that *raises* (rather than returning FAILURE) is reported through the
``ragtrace`` logger once per cause instead of once per batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ragtrace._safety import report

__all__ = ["GuardedExporter"]


class GuardedExporter(SpanExporter):
    """Delegates to ``inner``; any exception becomes ``FAILURE`` plus one log record."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            return self.inner.export(spans)
        except Exception as exc:
            report("span export", exc)
            return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()
        except Exception as exc:
            report("exporter shutdown", exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return bool(self.inner.force_flush(timeout_millis))
        except Exception as exc:
            report("exporter flush", exc)
            return False
