"""Reading the scores back from the enriched spans the collector wrote.

The file exporter writes OTLP/JSON lines: one ``ExportTraceServiceRequest`` per line
(``resourceSpans[].scopeSpans[].spans[]``, attributes as ``{key, value: {xValue}}``).
The collector puts each score on the evaluated span as
``ragtrace.eval.<metric>.score`` (or on a carrier span of the same trace, for late
results).  Each trace belongs to the phase its ``@rag`` span started in: the demo
records the wall-clock instant at which it switched the fault on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragtrace import semconv

__all__ = [
    "MetricPhaseStats",
    "MetricSummary",
    "SpanRecord",
    "SpanReport",
    "read_spans",
    "summarise",
]

_EVAL_PREFIX = semconv.EVAL_PREFIX + "."


@dataclass(frozen=True, slots=True)
class SpanRecord:
    trace_id: str
    span_id: str
    name: str
    start_ns: int
    attributes: dict[str, Any]


def _value(value: dict[str, Any]) -> Any:
    """The Python value of an OTLP/JSON ``AnyValue``."""
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])  # int64 is a JSON string in OTLP/JSON
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return {kv["key"]: _value(kv.get("value", {})) for kv in value["kvlistValue"]["values"]}
    return None


def _files(path: Path) -> list[Path]:
    """``path`` and its rotated predecessors (``path.1`` is older than ``path``)."""
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*rotated, path] if path.exists() else rotated


def read_spans(path: Path) -> Iterator[SpanRecord]:
    """Every span in the collector's OTLP/JSON lines file (and its rotations).

    A line that is not valid JSON (a partly written last line) raises ``ValueError``
    naming the file and line.
    """
    for file in _files(path):
        with open(file, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    request = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{file}:{number}: not an OTLP/JSON line: {exc}") from None
                for resource_spans in request.get("resourceSpans", []):
                    for scope_spans in resource_spans.get("scopeSpans", []):
                        for span in scope_spans.get("spans", []):
                            yield SpanRecord(
                                trace_id=str(span.get("traceId", "")),
                                span_id=str(span.get("spanId", "")),
                                name=str(span.get("name", "")),
                                start_ns=int(span.get("startTimeUnixNano", 0)),
                                attributes={
                                    kv["key"]: _value(kv.get("value", {}))
                                    for kv in span.get("attributes", [])
                                },
                            )


@dataclass(slots=True)
class MetricPhaseStats:
    """Scores of one metric in one phase."""

    count: int = 0
    total: float = 0.0
    skipped: int = 0
    errors: int = 0

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "count": self.count,
            "skipped": self.skipped,
            "errors": self.errors,
        }


@dataclass(slots=True)
class MetricSummary:
    name: str
    before: MetricPhaseStats = field(default_factory=MetricPhaseStats)
    after: MetricPhaseStats = field(default_factory=MetricPhaseStats)
    #: after the fault, per value of the split attribute (a rollout's index versions)
    after_by: dict[str, MetricPhaseStats] = field(default_factory=dict)

    @property
    def delta(self) -> float | None:
        if self.before.mean is None or self.after.mean is None:
            return None
        return self.after.mean - self.before.mean

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "delta": self.delta,
        }
        if self.after_by:
            data["after_by"] = {k: v.to_dict() for k, v in sorted(self.after_by.items())}
        return data


@dataclass(slots=True)
class SpanReport:
    """What the enriched span file holds, split into before and after the fault."""

    metrics: dict[str, MetricSummary]
    spans: int = 0
    traces: int = 0
    enriched_spans: int = 0
    #: traces with no ``@rag`` span, whose phase is unknown (their scores are left out)
    unassigned_traces: int = 0
    traces_before: int = 0
    traces_after: int = 0
    #: metric -> (lowest score, span id hex of the span that carries it)
    lowest: dict[str, tuple[float, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The counts (the per-metric figures are in :attr:`metrics`)."""
        return {
            "spans": self.spans,
            "traces": self.traces,
            "traces_before": self.traces_before,
            "traces_after": self.traces_after,
            "enriched_spans": self.enriched_spans,
            "unassigned_traces": self.unassigned_traces,
        }


def summarise(
    spans: Iterable[SpanRecord],
    metrics: Sequence[str],
    boundary_ns: int,
    *,
    split_by: str | None = None,
) -> SpanReport:
    """Per-metric scores before and after ``boundary_ns`` (the fault switch).

    A trace is "before" when its earliest ``@rag`` span started before the boundary.
    With ``split_by`` (an attribute of the ``@rag`` span), the scores after the
    boundary are also summed per value of that attribute.
    """
    records = list(spans)
    rag_start: dict[str, int] = {}
    split: dict[str, str] = {}
    for span in records:
        if span.attributes.get(semconv.RAGTRACE_SPAN_KIND) == semconv.KIND_RAG:
            known = rag_start.get(span.trace_id)
            rag_start[span.trace_id] = span.start_ns if known is None else min(known, span.start_ns)
            if split_by is not None and split_by in span.attributes:
                split[span.trace_id] = str(span.attributes[split_by])
    report = SpanReport(metrics={name: MetricSummary(name) for name in metrics})
    report.spans = len(records)
    trace_ids = {span.trace_id for span in records}
    report.traces = len(trace_ids)
    report.unassigned_traces = len(trace_ids - rag_start.keys())
    report.traces_before = sum(1 for start in rag_start.values() if start < boundary_ns)
    report.traces_after = len(rag_start) - report.traces_before
    for span in records:
        if any(key.startswith(_EVAL_PREFIX) for key in span.attributes):
            report.enriched_spans += 1
        start = rag_start.get(span.trace_id)
        if start is None:
            continue
        for name, summary in report.metrics.items():
            stats = summary.before if start < boundary_ns else summary.after
            score = span.attributes.get(semconv.eval_attr(name, semconv.EVAL_FIELD_SCORE))
            if isinstance(score, int | float) and not isinstance(score, bool):
                stats.count += 1
                stats.total += float(score)
                value = split.get(span.trace_id)
                if start >= boundary_ns and value is not None:
                    by = summary.after_by.setdefault(value, MetricPhaseStats())
                    by.count += 1
                    by.total += float(score)
                low = report.lowest.get(name)
                if low is None or float(score) < low[0]:
                    report.lowest[name] = (float(score), span.span_id)
            elif span.attributes.get(semconv.eval_attr(name, semconv.EVAL_FIELD_SKIPPED)):
                stats.skipped += 1
            elif span.attributes.get(semconv.eval_attr(name, semconv.EVAL_FIELD_ERROR)):
                stats.errors += 1
    return report
