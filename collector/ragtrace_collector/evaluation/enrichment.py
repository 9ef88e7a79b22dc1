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

import functools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry.proto.trace.v1 import trace_pb2
from pydantic import BaseModel, ConfigDict, Field

from ragtrace import semconv
from ragtrace_collector.cases import RAGCase
from ragtrace_collector.evaluation.case_builder import DocumentSource
from ragtrace_collector.evaluation.document_verdicts import verdicts_json
from ragtrace_collector.otlp import protowire
from ragtrace_collector.otlp.spanattrs import set_attribute
from ragtrace_collector.results import MetricResult

__all__ = [
    "CARRIER_SPAN_NAME",
    "EnrichmentConfig",
    "EvalSummary",
    "annotator_kind",
    "case_extra",
    "encode_result",
    "enrich_span",
    "is_carrier",
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
    max_text_chars: int = Field(
        2000,
        ge=0,
        description="the judged question and answer (ragtrace.eval.input / "
        "ragtrace.eval.output) are cut to this many characters on the span; 0 leaves "
        "them off",
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
    #: The question and the answer the metrics judged (None: the case had none).
    input: str | None = None
    output: str | None = None


def case_extra(
    result: MetricResult, case: RAGCase, sources: Sequence[DocumentSource] | None
) -> dict[str, Any]:
    """Extra flat keys of a case metric's result: contextual_precision's reference, and
    the per-document verdicts (document annotations in Phoenix); ``sources`` are the
    case's documents in rank order (:attr:`BuiltCase.document_sources`)."""
    extra: dict[str, Any] = {}
    if result.metric == "contextual_precision":
        used = result.details.get("reference")
        if isinstance(used, str):
            extra[semconv.EVAL_FIELD_REFERENCE] = used
    verdicts = verdicts_json(result, case, sources or [])
    if verdicts is not None:
        extra[semconv.EVAL_FIELD_DOCUMENTS] = verdicts
    return extra


def annotator_kind(judge: str, *, heuristic: bool = False) -> str:
    """``LLM`` for a result an LLM judge produced, else ``CODE`` (no judge, or the
    offline judge's lexical rules)."""
    return "LLM" if (judge not in ("none", "offline") and not heuristic) else "CODE"


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@functools.lru_cache(maxsize=1024)
def _flat_keys(metric: str) -> tuple[str, str, str, str, str, str, str]:
    """threshold, reason, score, passed, error, skipped, judge keys of ``metric``."""
    return (
        semconv.eval_attr(metric, semconv.EVAL_FIELD_THRESHOLD),
        semconv.eval_attr(metric, semconv.EVAL_FIELD_REASON),
        semconv.eval_attr(metric, semconv.EVAL_FIELD_SCORE),
        semconv.eval_attr(metric, semconv.EVAL_FIELD_PASSED),
        semconv.eval_attr(metric, semconv.EVAL_FIELD_ERROR),
        semconv.eval_attr(metric, semconv.EVAL_FIELD_SKIPPED),
        semconv.eval_attr(metric, semconv.EVAL_FIELD_JUDGE),
    )


@functools.lru_cache(maxsize=1024)
def _evaluation_keys(index: int) -> tuple[str, str, str, str, str]:
    """name, score, label, explanation, annotator kind keys of evaluation ``index``."""
    return (
        semconv.evaluation_attr(index, semconv.EVALUATION_NAME),
        semconv.evaluation_attr(index, semconv.EVALUATION_SCORE),
        semconv.evaluation_attr(index, semconv.EVALUATION_LABEL),
        semconv.evaluation_attr(index, semconv.EVALUATION_EXPLANATION),
        semconv.evaluation_attr(index, semconv.EVALUATION_ANNOTATOR_KIND),
    )


def _summary_items(summary: EvalSummary, text_limit: int) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = [
        (semconv.EVAL_MODEL, summary.model),
        (semconv.EVAL_SAMPLE_RATE, float(summary.sample_rate)),
        (semconv.EVAL_LATENCY_MS, float(summary.latency_ms)),
    ]
    if summary.cost_usd is not None:
        items.append((semconv.EVAL_COST_USD, float(summary.cost_usd)))
    if text_limit:
        for key, text in (
            (semconv.EVAL_INPUT, summary.input),
            (semconv.EVAL_OUTPUT, summary.output),
        ):
            if text:
                items.append((key, _truncate(text, text_limit)))
    return items


def _flat_items(
    r: MetricResult, extra: Mapping[str, Any] | None, limit: int
) -> list[tuple[str, Any]]:
    m = r.metric
    k_threshold, k_reason, k_score, k_passed, k_error, k_skipped, k_judge = _flat_keys(m)
    items: list[tuple[str, Any]] = [(k_threshold, float(r.threshold)), (k_judge, r.judge)]
    if r.reason:
        items.append((k_reason, _truncate(r.reason, limit)))
    if r.score is not None:
        items.append((k_score, float(r.score)))
        items.append((k_passed, bool(r.passed)))
    if r.error is not None:
        items.append((k_error, _truncate(r.error, limit)))
    elif r.skipped:
        items.append((k_skipped, True))
    if extra:
        for fld, value in extra.items():
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


def _next_evaluation(span_keys: set[str]) -> int:
    """The first free ``evaluations.N`` index: numbering continues after evaluations
    already on the span (a second pass, or another evaluator upstream)."""
    lead = semconv.EVALUATIONS + "."
    taken = {
        int(key.split(".", 2)[1])
        for key in span_keys
        if key.startswith(lead) and key.split(".", 2)[1].isdigit()
    }
    return max(taken) + 1 if taken else 0


def _openinference_items(r: MetricResult, index: int, limit: int) -> list[tuple[str, Any]]:
    k_name, k_score, k_label, k_explanation, k_kind = _evaluation_keys(index)
    items: list[tuple[str, Any]] = [(k_name, r.metric)]
    if r.score is not None:
        items.append((k_score, float(r.score)))
    label = _label(r) or ("error" if r.error is not None else "skipped")
    items.append((k_label, label))
    items.append((k_explanation, _explanation(r, limit)))
    items.append((k_kind, annotator_kind(r.judge, heuristic=r.heuristic)))
    return items


def _event(r: MetricResult, limit: int) -> tuple[bytes, bytes]:
    values: list[tuple[str, Any]] = [(semconv.GEN_AI_EVALUATION_NAME, r.metric)]
    if r.score is not None:
        values.append((semconv.GEN_AI_EVALUATION_SCORE_VALUE, float(r.score)))
    label = _label(r)
    if label is not None:
        values.append((semconv.GEN_AI_EVALUATION_SCORE_LABEL, label))
    values.append((semconv.GEN_AI_EVALUATION_EXPLANATION, _explanation(r, limit)))
    if r.error is not None:
        values.append((semconv.ERROR_TYPE, r.error.split(":", 1)[0]))
    return protowire.event_parts(semconv.GEN_AI_EVALUATION_RESULT_EVENT, values)


def encode_result(
    r: MetricResult,
    index: int,
    extra: Mapping[str, Any] | None,
    config: EnrichmentConfig,
    now_ns: int,
) -> bytes:
    """The wire bytes (span attribute and event entries) that :func:`enrich_span` merges
    into a span for one result that is OpenInference evaluation number ``index``:
    encoded once, wherever the result was computed (the evaluation workers encode their
    results, so that the collector process only concatenates them)."""
    if r.skipped and r.score is None and r.error is None and not extra:
        # Skipped results repeat from case to case (same metric, same reason): encoded
        # once, only the event time differs.
        key = (r.metric, r.reason, r.threshold, r.judge, r.heuristic, index, _flags(config))
        parts = _SKIPPED.get(key)
        if parts is None:
            if len(_SKIPPED) >= 1024:
                _SKIPPED.clear()
            parts = _SKIPPED[key] = _encode_parts(r, index, extra, config)
    else:
        parts = _encode_parts(r, index, extra, config)
    attrs, head, tail = parts
    return attrs + head + protowire.fixed64(now_ns) + tail if head else attrs


_SKIPPED: dict[tuple[Any, ...], tuple[bytes, bytes, bytes]] = {}


def _flags(config: EnrichmentConfig) -> tuple[bool, bool, bool, int]:
    return (config.flat, config.openinference, config.events, config.max_reason_chars)


def _encode_parts(
    r: MetricResult, index: int, extra: Mapping[str, Any] | None, config: EnrichmentConfig
) -> tuple[bytes, bytes, bytes]:
    """A result's attribute entries, and its event's head and tail (empty without events)."""
    limit = config.max_reason_chars
    attribute = protowire.attribute
    tag = protowire.SPAN_ATTRIBUTE
    out: list[bytes] = []
    if config.flat:
        out.extend(attribute(tag, k, v) for k, v in _flat_items(r, extra, limit))
    if config.openinference:
        out.extend(attribute(tag, k, v) for k, v in _openinference_items(r, index, limit))
    head = tail = b""
    if config.events:
        head, tail = _event(r, limit)
    return b"".join(out), head, tail


#: Encoded results by (metric, OpenInference evaluation index): see :func:`enrich_span`.
Encoded = Mapping[tuple[str, int], bytes]


def enrich_span(
    span: trace_pb2.Span,
    results: Sequence[MetricResult],
    summary: EvalSummary,
    config: EnrichmentConfig,
    *,
    now_ns: int | None = None,
    encoded: Encoded | None = None,
) -> None:
    """Write ``results`` onto ``span`` in the enabled forms (in place).

    ``encoded`` holds results already encoded by :func:`encode_result` with the same
    ``config`` and the same extra keys, by (metric, evaluation index); a result is used
    from there when its index is the one it gets on this span, and encoded here
    otherwise."""
    limit = config.max_reason_chars
    now = now_ns if now_ns is not None else time.time_ns()
    attributes = span.attributes
    existing = {kv.key for kv in attributes} if (config.flat or config.openinference) else set()
    start = _next_evaluation(existing) if config.openinference else 0
    out: list[bytes] = []
    if config.flat:
        summary_items = _summary_items(summary, config.max_text_chars)
        out += protowire.span_attribute_entries(attributes, summary_items, existing)
    if config.flat and any(k.startswith(_EVAL_LEAD) and k not in _SPAN_KEYS for k in existing):
        # A second pass: this span already has flat results, which are replaced in place.
        for r in results:
            flat = _flat_items(r, summary.extra.get(r.metric), limit)
            out += protowire.span_attribute_entries(attributes, flat, existing)
        flat_done = config.model_copy(update={"flat": False})
        for offset, r in enumerate(results):
            out.append(encode_result(r, start + offset, None, flat_done, now))
    else:
        for offset, r in enumerate(results):
            blob = encoded.get((r.metric, start + offset)) if encoded else None
            if blob is None:
                blob = encode_result(r, start + offset, summary.extra.get(r.metric), config, now)
            out.append(blob)
    if out:
        span.MergeFromString(b"".join(out))  # appends to attributes and events


_EVAL_LEAD = semconv.EVAL_PREFIX + "."
#: ``ragtrace.eval.*`` keys that are not a metric's (the sampling decision, the summary).
_SPAN_KEYS = frozenset(
    {
        semconv.EVAL_SAMPLE_RATE,
        semconv.EVAL_SAMPLED,
        semconv.EVAL_MODEL,
        semconv.EVAL_LATENCY_MS,
        semconv.EVAL_COST_USD,
        semconv.EVAL_INPUT,
        semconv.EVAL_OUTPUT,
    }
)


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


def is_carrier(span: trace_pb2.Span) -> bool:
    """An EVALUATOR carrier span made by :func:`make_carrier_span`."""
    if span.name != CARRIER_SPAN_NAME or not span.links:
        return False
    return any(
        kv.key == semconv.OPENINFERENCE_SPAN_KIND
        and kv.value.string_value == semconv.OI_KIND_EVALUATOR
        for kv in span.attributes
    )
