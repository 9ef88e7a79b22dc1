"""Writing evaluation results onto spans, in the three forms of DESIGN.md.

1. Flat keys ``ragtrace.eval.<metric>.{score,reason,passed,threshold,error}`` plus the
   per-span summary (model, sample rate, cost, latency): searchable in Jaeger, Tempo
   TraceQL and Grafana.
2. OpenInference inline evaluations ``evaluations.N.evaluation.*``: for Phoenix.
3. One OTel GenAI ``gen_ai.evaluation.result`` span event per metric.

Each form can be switched off.  A result that arrives after its span was forwarded
goes on a *carrier span*: same trace, child of the evaluated span, OpenInference kind
``EVALUATOR``, one span link to the evaluated span, the same attributes and events.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry.proto.trace.v1 import trace_pb2
from pydantic import BaseModel, ConfigDict, Field

from ragtrace import semconv
from ragtrace_collector.results import MetricResult
from ragtrace_collector.spanattrs import set_attribute, set_attributes

__all__ = [
    "CARRIER_SPAN_NAME",
    "EnrichmentConfig",
    "EvalSummary",
    "annotator_kind",
    "enrich_span",
    "make_carrier_span",
]

CARRIER_SPAN_NAME = "ragtrace.evaluation"
_CARRIED_KEYS = frozenset(
    {semconv.SESSION_ID, semconv.GEN_AI_CONVERSATION_ID, semconv.USER_ID, semconv.TURN_INDEX}
)


class EnrichmentConfig(BaseModel):
    """``enrichment:`` section of the collector config."""

    model_config = ConfigDict(extra="forbid")

    flat: bool = Field(True, description="write ragtrace.eval.<metric>.* attributes")
    openinference: bool = Field(True, description="write evaluations.N.evaluation.* attributes")
    events: bool = Field(True, description="add one gen_ai.evaluation.result event per metric")
    attach: Literal["span", "carrier"] = Field(
        "span",
        description="span: results go on the evaluated @rag span; carrier: always on a "
        "separate EVALUATOR span linked to it",
    )
    max_reason_chars: int = Field(
        1000, ge=16, description="longer reasons are truncated on the span"
    )


@dataclass
class EvalSummary:
    """Per-span summary written next to the metric results."""

    model: str
    sample_rate: float
    latency_ms: float
    cost_usd: float | None = None
    #: metric -> {field: value}: extra flat keys such as ``conversation_score``
    #: or contextual_precision's ``reference``.
    extra: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def annotator_kind(judge: str, *, heuristic: bool = False) -> str:
    """``LLM`` for a result an LLM judge produced, else ``CODE`` (no judge, or the
    offline judge's lexical rules)."""
    return "LLM" if (judge not in ("none", "offline") and not heuristic) else "CODE"


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _flat_items(
    results: Sequence[MetricResult], summary: EvalSummary, limit: int
) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = [
        (semconv.EVAL_MODEL, summary.model),
        (semconv.EVAL_SAMPLE_RATE, float(summary.sample_rate)),
        (semconv.EVAL_LATENCY_MS, float(summary.latency_ms)),
    ]
    if summary.cost_usd is not None:
        items.append((semconv.EVAL_COST_USD, float(summary.cost_usd)))
    for r in results:
        m = r.metric
        items.append((semconv.eval_attr(m, semconv.EVAL_FIELD_THRESHOLD), float(r.threshold)))
        items.append((semconv.eval_attr(m, semconv.EVAL_FIELD_JUDGE), r.judge))
        if r.reason:
            items.append(
                (semconv.eval_attr(m, semconv.EVAL_FIELD_REASON), _truncate(r.reason, limit))
            )
        if r.score is not None:
            items.append((semconv.eval_attr(m, semconv.EVAL_FIELD_SCORE), float(r.score)))
            items.append((semconv.eval_attr(m, semconv.EVAL_FIELD_PASSED), bool(r.passed)))
        if r.error is not None:
            items.append(
                (semconv.eval_attr(m, semconv.EVAL_FIELD_ERROR), _truncate(r.error, limit))
            )
        elif r.skipped:
            items.append((semconv.eval_attr(m, semconv.EVAL_FIELD_SKIPPED), True))
        for fld, value in summary.extra.get(m, {}).items():
            if value is not None:
                items.append((semconv.eval_attr(m, fld), value))
    return items


def _label(r: MetricResult) -> str | None:
    if r.score is None:
        return None
    return semconv.LABEL_PASS if r.passed else semconv.LABEL_FAIL


def _explanation(r: MetricResult, limit: int) -> str:
    if r.error is not None:
        return _truncate(f"error: {r.error}", limit)
    return _truncate(r.reason, limit)


def _openinference_items(
    span_attrs: Any, results: Sequence[MetricResult], limit: int
) -> list[tuple[str, Any]]:
    # Continue numbering after evaluations already on the span (a second pass, or
    # another evaluator upstream).
    taken = {
        int(kv.key.split(".", 2)[1])
        for kv in span_attrs
        if kv.key.startswith(semconv.EVALUATIONS + ".") and kv.key.split(".", 2)[1].isdigit()
    }
    start = max(taken) + 1 if taken else 0
    items: list[tuple[str, Any]] = []
    for offset, r in enumerate(results):
        i = start + offset
        items.append((semconv.evaluation_attr(i, semconv.EVALUATION_NAME), r.metric))
        if r.score is not None:
            items.append((semconv.evaluation_attr(i, semconv.EVALUATION_SCORE), float(r.score)))
        label = _label(r) or ("error" if r.error is not None else "skipped")
        items.append((semconv.evaluation_attr(i, semconv.EVALUATION_LABEL), label))
        items.append(
            (semconv.evaluation_attr(i, semconv.EVALUATION_EXPLANATION), _explanation(r, limit))
        )
        kind = annotator_kind(r.judge, heuristic=r.heuristic)
        items.append((semconv.evaluation_attr(i, semconv.EVALUATION_ANNOTATOR_KIND), kind))
    return items


def _add_events(
    span: trace_pb2.Span, results: Sequence[MetricResult], limit: int, now_ns: int
) -> None:
    for r in results:
        event = span.events.add(time_unix_nano=now_ns, name=semconv.GEN_AI_EVALUATION_RESULT_EVENT)
        values: list[tuple[str, Any]] = [(semconv.GEN_AI_EVALUATION_NAME, r.metric)]
        if r.score is not None:
            values.append((semconv.GEN_AI_EVALUATION_SCORE_VALUE, float(r.score)))
        label = _label(r)
        if label is not None:
            values.append((semconv.GEN_AI_EVALUATION_SCORE_LABEL, label))
        values.append((semconv.GEN_AI_EVALUATION_EXPLANATION, _explanation(r, limit)))
        if r.error is not None:
            values.append((semconv.ERROR_TYPE, r.error.split(":", 1)[0]))
        set_attributes(event.attributes, values)


def enrich_span(
    span: trace_pb2.Span,
    results: Sequence[MetricResult],
    summary: EvalSummary,
    config: EnrichmentConfig,
    *,
    now_ns: int | None = None,
) -> None:
    """Write ``results`` onto ``span`` in the enabled forms (in place)."""
    limit = config.max_reason_chars
    if config.flat:
        set_attributes(span.attributes, _flat_items(results, summary, limit))
    if config.openinference:
        set_attributes(span.attributes, _openinference_items(span.attributes, results, limit))
    if config.events:
        _add_events(span, results, limit, now_ns if now_ns is not None else time.time_ns())


def make_carrier_span(
    target: trace_pb2.Span,
    results: Sequence[MetricResult],
    summary: EvalSummary,
    config: EnrichmentConfig,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> trace_pb2.Span:
    """A new EVALUATOR span carrying ``results`` for ``target``, in the same trace."""
    end = end_ns if end_ns is not None else time.time_ns()
    start = start_ns if start_ns is not None else end
    carrier = trace_pb2.Span(
        trace_id=target.trace_id,
        span_id=os.urandom(8),
        parent_span_id=target.span_id,
        name=CARRIER_SPAN_NAME,
        kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
    )
    carrier.links.add(trace_id=target.trace_id, span_id=target.span_id)
    set_attribute(carrier.attributes, semconv.OPENINFERENCE_SPAN_KIND, semconv.OI_KIND_EVALUATOR)
    # The conversation the results belong to (session-level results need it).
    for kv in target.attributes:
        if kv.key in _CARRIED_KEYS:
            carrier.attributes.add().CopyFrom(kv)
    enrich_span(carrier, results, summary, config, now_ns=end)
    return carrier
