"""Results on a carrier span, through the collector: ``attach: carrier``, and a late
result (``late_results: carrier``) arriving after its trace was forwarded."""

from __future__ import annotations

import asyncio
import threading

import ragtrace
from ragtrace import semconv
from tests.e2e import _app
from tests.e2e._support import (
    JudgeServer,
    assert_scored,
    eval_config,
    evaluating_collector,
    flat,
    llm_judge,
    rag_spans,
)
from tests.fakes.openai_server import RecordedRequest, Reply, auto_reply
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan

QUESTION = "How do I reset my password?"
REFERENCE = {
    "expected_output": "Open Settings and choose Security.",
    "reference_context_ids": ["kb_reset", "kb_expiry"],  # id recall 1/2
}


def _send(endpoint: str) -> None:
    _app.route(QUESTION, ["kb_reset", "kb_invoice"])
    ragtrace.configure(service_name="e2e-bot", endpoint=endpoint)
    _app.answer(QUESTION, REFERENCE)
    assert ragtrace.flush(30)


def _carriers(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.attributes.get(semconv.OPENINFERENCE_SPAN_KIND) == semconv.OI_KIND_EVALUATOR
    ]


def _check_carrier(carrier: ReceivedSpan, rag: ReceivedSpan) -> None:
    assert carrier.span.trace_id == rag.span.trace_id
    assert carrier.span.parent_span_id == rag.span.span_id
    assert [(link.trace_id, link.span_id) for link in carrier.span.links] == [
        (rag.span.trace_id, rag.span.span_id)
    ]
    assert carrier.service_name == rag.service_name


def test_attach_carrier_sends_results_on_a_linked_evaluator_span(sink: OtlpSink) -> None:
    config = eval_config(sink, metrics={"id_context_recall": {}}, enrichment={"attach": "carrier"})
    with evaluating_collector(config) as collector:
        _send(collector.http_url)
        spans = sink.wait_for_spans(4)
    (rag,) = rag_spans(spans)
    (carrier,) = _carriers(spans)
    _check_carrier(carrier, rag)
    assert_scored(carrier, "id_context_recall", 0.5)
    assert carrier.attributes[semconv.EVAL_MODEL] == "offline"
    # The evaluated span went out untouched, apart from the sampling decision.
    assert flat(rag, "id_context_recall", semconv.EVAL_FIELD_SCORE) is None
    assert rag.attributes[semconv.EVAL_SAMPLED] is True
    assert not rag.span.events


def test_late_result_follows_on_a_carrier(sink: OtlpSink, judge_server: JudgeServer) -> None:
    # The judge answers only once the trace has reached the backend: a trace that waited
    # for the judge would never get there, whatever the machine's speed.
    forwarded = threading.Event()

    async def after_the_trace(request: RecordedRequest) -> Reply:
        await asyncio.to_thread(forwarded.wait, 30)
        return Reply(content=auto_reply(request).content)

    judge_server.handler = after_the_trace
    config = eval_config(
        sink,
        judge=llm_judge(judge_server),
        metrics={"contextual_recall": {}, "id_context_recall": {}},
        evaluation={"trace_timeout": 0.3, "metric_timeout": 10, "late_results": "carrier"},
    )
    try:
        with evaluating_collector(config) as collector:
            _send(collector.http_url)
            # The trace did not wait for the slow judge ...
            spans = sink.wait_for_spans(3)
            assert not _carriers(spans)
            forwarded.set()
            spans = sink.wait_for_spans(4, timeout=30)
    finally:
        forwarded.set()
    (rag,) = rag_spans(spans)
    assert_scored(rag, "id_context_recall", 0.5)
    assert flat(rag, "contextual_recall", semconv.EVAL_FIELD_SCORE) is None
    assert flat(rag, "contextual_recall", semconv.EVAL_FIELD_ERROR) is None
    # ... and the late result came after it, on a carrier in the same trace.
    (carrier,) = _carriers(spans)
    _check_carrier(carrier, rag)
    assert flat(carrier, "contextual_recall", semconv.EVAL_FIELD_SCORE) is not None
    assert flat(carrier, "contextual_recall", semconv.EVAL_FIELD_REASON)
    assert flat(carrier, "id_context_recall", semconv.EVAL_FIELD_SCORE) is None
