from __future__ import annotations

import os

from ragtrace import semconv
from ragtrace_collector.evaluation.enrichment import (
    EnrichmentConfig,
    EvalSummary,
    enrich_span,
    make_carrier_span,
)
from ragtrace_collector.otlp.spanattrs import attributes_to_dict
from ragtrace_collector.results import MetricResult
from tests.fakes.spans import make_span


def _results() -> list[MetricResult]:
    return [
        MetricResult(metric="id_context_recall", score=0.25, reason="1 of 4", passed=False),
        MetricResult(
            metric="non_llm_context_recall", score=None, skipped=True, reason="no reference"
        ),
        MetricResult(
            metric="contextual_recall",
            score=None,
            error="timeout: judge did not answer in 5s",
            judge="openai/gpt-4o-mini",
        ),
    ]


def _summary() -> EvalSummary:
    return EvalSummary(
        model="offline",
        sample_rate=0.25,
        latency_ms=12.5,
        cost_usd=0.001,
        extra={"id_context_recall": {"conversation_score": 0.5}},
    )


def test_all_three_forms_written() -> None:
    span = make_span(os.urandom(16), "rag")
    enrich_span(span, _results(), _summary(), EnrichmentConfig(), now_ns=42)
    attrs = attributes_to_dict(span.attributes)

    assert attrs["ragtrace.eval.id_context_recall.score"] == 0.25
    assert attrs["ragtrace.eval.id_context_recall.passed"] is False
    assert attrs["ragtrace.eval.id_context_recall.threshold"] == 0.5
    assert attrs["ragtrace.eval.id_context_recall.reason"] == "1 of 4"
    assert attrs["ragtrace.eval.id_context_recall.conversation_score"] == 0.5
    assert "ragtrace.eval.non_llm_context_recall.score" not in attrs
    assert attrs["ragtrace.eval.non_llm_context_recall.skipped"] is True
    assert attrs["ragtrace.eval.contextual_recall.error"].startswith("timeout")
    assert attrs[semconv.EVAL_MODEL] == "offline"
    assert attrs[semconv.EVAL_SAMPLE_RATE] == 0.25
    assert attrs[semconv.EVAL_COST_USD] == 0.001
    assert attrs[semconv.EVAL_LATENCY_MS] == 12.5

    assert attrs["evaluations.0.evaluation.name"] == "id_context_recall"
    assert attrs["evaluations.0.evaluation.score"] == 0.25
    assert attrs["evaluations.0.evaluation.label"] == "fail"
    assert attrs["evaluations.0.evaluation.annotator_kind"] == "CODE"
    assert attrs["evaluations.1.evaluation.label"] == "skipped"
    assert attrs["evaluations.2.evaluation.label"] == "error"
    assert attrs["evaluations.2.evaluation.annotator_kind"] == "LLM"

    events = [e for e in span.events if e.name == semconv.GEN_AI_EVALUATION_RESULT_EVENT]
    assert len(events) == 3
    first = attributes_to_dict(events[0].attributes)
    assert first == {
        semconv.GEN_AI_EVALUATION_NAME: "id_context_recall",
        semconv.GEN_AI_EVALUATION_SCORE_VALUE: 0.25,
        semconv.GEN_AI_EVALUATION_SCORE_LABEL: "fail",
        semconv.GEN_AI_EVALUATION_EXPLANATION: "1 of 4",
    }
    assert events[0].time_unix_nano == 42
    third = attributes_to_dict(events[2].attributes)
    assert third[semconv.ERROR_TYPE] == "timeout"
    assert semconv.GEN_AI_EVALUATION_SCORE_VALUE not in third


def test_forms_can_be_switched_off() -> None:
    span = make_span(os.urandom(16), "rag")
    cfg = EnrichmentConfig(flat=False, openinference=False, events=True)
    enrich_span(span, _results(), _summary(), cfg)
    keys = set(attributes_to_dict(span.attributes))
    assert not any(k.startswith("ragtrace.eval") or k.startswith("evaluations.") for k in keys)
    assert len(span.events) == 3

    span2 = make_span(os.urandom(16), "rag")
    enrich_span(span2, _results(), _summary(), EnrichmentConfig(events=False))
    assert len(span2.events) == 0


def test_second_pass_appends_openinference_and_overwrites_flat_keys() -> None:
    span = make_span(os.urandom(16), "rag")
    enrich_span(span, _results()[:1], _summary(), EnrichmentConfig())
    again = [MetricResult(metric="id_context_recall", score=1.0, passed=True)]
    enrich_span(span, again, _summary(), EnrichmentConfig())
    attrs = attributes_to_dict(span.attributes)
    assert attrs["ragtrace.eval.id_context_recall.score"] == 1.0
    assert attrs["evaluations.1.evaluation.score"] == 1.0
    keys = [kv.key for kv in span.attributes]
    assert len(keys) == len(set(keys)), "OTLP attribute keys must stay unique"


def test_long_reason_truncated() -> None:
    span = make_span(os.urandom(16), "rag")
    long = [MetricResult(metric="m", score=1.0, passed=True, reason="x" * 5000)]
    enrich_span(span, long, _summary(), EnrichmentConfig(max_reason_chars=100))
    assert len(attributes_to_dict(span.attributes)["ragtrace.eval.m.reason"]) == 100


def test_carrier_span_same_trace_linked_evaluator() -> None:
    target = make_span(os.urandom(16), "rag")
    carrier = make_carrier_span(target, _results(), _summary(), EnrichmentConfig(), end_ns=99)
    assert carrier.trace_id == target.trace_id
    assert carrier.span_id != target.span_id
    assert carrier.parent_span_id == target.span_id
    assert len(carrier.links) == 1
    assert carrier.links[0].span_id == target.span_id
    assert carrier.links[0].trace_id == target.trace_id
    attrs = attributes_to_dict(carrier.attributes)
    assert attrs[semconv.OPENINFERENCE_SPAN_KIND] == "EVALUATOR"
    assert attrs["ragtrace.eval.id_context_recall.score"] == 0.25
    assert len(carrier.events) == 3
    assert carrier.end_time_unix_nano == 99
