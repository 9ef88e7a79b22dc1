"""Sampling through running collectors: consistent across instances, a lower rate's
sample inside a higher rate's, the per-minute evaluation budget under a burst, and
ground truth (span or reference store) evaluated whatever the rate."""

from __future__ import annotations

from contextlib import ExitStack
from hashlib import blake2b
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import ragtrace
from ragtrace import semconv
from tests.e2e import _app
from tests.e2e._support import (
    EvalCollector,
    eval_config,
    evaluating_collector,
    flat,
    rag_spans,
    sample,
)
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan

METRICS: dict[str, dict[str, object]] = {"id_context_recall": {}}


def _questions(n: int) -> list[str]:
    questions = [f"question {i}: where is the invoice?" for i in range(n)]
    for q in questions:
        _app.route(q, ["kb_invoice"])
    return questions


def _sampled(spans: list[ReceivedSpan]) -> dict[str, bool]:
    """trace id -> ragtrace.eval.sampled, from the @rag spans."""
    return {
        s.span.trace_id.hex(): bool(s.attributes[semconv.EVAL_SAMPLED]) for s in rag_spans(spans)
    }


def _in_sample(trace_id_hex: str, rate: float) -> bool:
    """The documented rule, computed independently: unkeyed 8-byte BLAKE2b of the raw
    trace id, big-endian, below floor(rate * 2**64)."""
    h = int.from_bytes(blake2b(bytes.fromhex(trace_id_hex), digest_size=8).digest(), "big")
    return h < int(rate * 2**64)


def test_consistent_across_instances_and_lower_rate_is_a_subset() -> None:
    rates = {"a": 0.5, "b": 0.5, "low": 0.2}
    questions = _questions(60)
    with ExitStack() as stack:
        sinks = {name: stack.enter_context(OtlpSink()) for name in rates}
        collectors: dict[str, EvalCollector] = {
            name: stack.enter_context(
                evaluating_collector(
                    eval_config(sinks[name], metrics=METRICS, sampling={"rate": rate})
                )
            )
            for name, rate in rates.items()
        }
        # One app, the same traces exported to all three collectors.
        provider = TracerProvider(resource=Resource.create({"service.name": "e2e-bot"}))
        for collector in collectors.values():
            provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=collector.http_url))
            )
        ragtrace.configure(tracer_provider=provider)
        for q in questions:
            _app.answer(q)
        assert provider.force_flush(30_000)
        got = {name: _sampled(sinks[name].wait_for_spans(3 * len(questions))) for name in rates}
        provider.shutdown()

    trace_ids = set(got["a"])
    assert len(trace_ids) == len(questions)
    assert set(got["b"]) == set(got["low"]) == trace_ids
    # Consistent: two replicas decide the same for every trace, as documented.
    assert got["a"] == got["b"]
    for trace_id, sampled in got["a"].items():
        assert sampled is _in_sample(trace_id, 0.5)
    # Subset: what 0.2 samples, 0.5 samples too.
    low = {t for t, s in got["low"].items() if s}
    high = {t for t, s in got["a"].items() if s}
    assert low <= high
    assert 0 < len(low) < len(high) < len(questions)
    # The sampled traces were evaluated, the others only marked.
    for name, rate in rates.items():
        for span in rag_spans(sinks[name].spans):
            assert span.attributes[semconv.EVAL_SAMPLE_RATE] == rate
            evaluated = flat(span, "id_context_recall", semconv.EVAL_FIELD_REASON) is not None
            assert evaluated is span.attributes[semconv.EVAL_SAMPLED]


def test_evaluations_per_minute_budget_holds_under_a_burst(sink: OtlpSink) -> None:
    budget = 5
    questions = _questions(20)
    config = eval_config(
        sink,
        metrics=METRICS,
        sampling={"rate": 1.0, "max_evaluations_per_minute": budget},
    )
    with evaluating_collector(config) as collector:
        ragtrace.configure(service_name="e2e-bot", endpoint=collector.http_url)
        for q in questions:
            _app.answer(q, {"reference_context_ids": ["kb_invoice"]})
        assert ragtrace.flush(30)
        spans = sink.wait_for_spans(3 * len(questions))
        samples = collector.scrape()
    assert len(spans) == 3 * len(questions)
    rags = rag_spans(spans)
    evaluated = [s for s in rags if flat(s, "id_context_recall", "score") is not None]
    refused = [s for s in rags if s not in evaluated]
    assert len(evaluated) == budget
    for span in evaluated:
        assert span.attributes[semconv.EVAL_SAMPLED] is True
        assert flat(span, "id_context_recall", "score") == 1.0
    for span in refused:  # forwarded, marked, not evaluated
        assert span.attributes[semconv.EVAL_SAMPLED] is False
        assert span.attributes[semconv.EVAL_SAMPLE_RATE] == 1.0
        assert flat(span, "id_context_recall", "reason") is None
        assert not span.span.events
    over = len(questions) - budget
    assert sample(samples, "ragtrace_eval_traces_total", decision="budget") == over
    assert sample(samples, "ragtrace_eval_traces_total", decision="sampled") == budget
    assert sample(samples, "ragtrace_eval_skipped_total", reason="budget") == over
    assert sample(samples, "ragtrace_eval_results_total", metric="id_context_recall") == budget


def test_ground_truth_is_always_evaluated_at_rate_zero(sink: OtlpSink, tmp_path: Path) -> None:
    """The default rule: ground truth, from the span or from the reference store,
    overrides ``rate: 0``."""
    store = tmp_path / "refs.yaml"
    store.write_text('- {input: "question 1: where is the invoice?", reference_context_ids: [x]}\n')
    questions = _questions(3)
    config = eval_config(
        sink,
        metrics=METRICS,
        sampling={"rate": 0.0},
        reference_store={"path": str(store), "reload_interval": 0},
    )
    with evaluating_collector(config) as collector:
        ragtrace.configure(service_name="e2e-bot", endpoint=collector.http_url)
        _app.answer(questions[0], {"reference_context_ids": ["kb_invoice"]})  # on the span
        _app.answer(questions[1])  # in the store
        _app.answer(questions[2])  # none
        assert ragtrace.flush(30)
        spans = sink.wait_for_spans(9)
    by_question = {s.attributes[semconv.INPUT_VALUE]: s for s in rag_spans(spans)}
    first, second, third = (by_question[q] for q in questions)
    assert flat(first, "id_context_recall", "score") == 1.0
    assert flat(second, "id_context_recall", "score") == 0.0  # retrieved kb_invoice, not x
    for span in (first, second):
        assert span.attributes[semconv.EVAL_SAMPLED] is True
        assert span.attributes[semconv.EVAL_SAMPLE_RATE] == 1.0  # the rule's rate
    assert third.attributes[semconv.EVAL_SAMPLED] is False
    assert third.attributes[semconv.EVAL_SAMPLE_RATE] == 0.0
    assert flat(third, "id_context_recall", "reason") is None
