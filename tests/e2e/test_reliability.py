"""A misbehaving judge, an overload and SIGTERM, through the running collector:
no span is lost, delays stay bounded, failures are written on the span."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

import ragtrace
from ragtrace import semconv
from tests.e2e import _app
from tests.e2e._support import (
    EvalCollector,
    JudgeServer,
    Serve,
    assert_errored,
    assert_scored,
    eval_config,
    evaluating_collector,
    flat,
    llm_judge,
    rag_spans,
    sample,
    serve_config,
)
from tests.fakes.harness import wait_for
from tests.fakes.openai_server import RecordedRequest, Reply, auto_reply
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan

METRIC_TIMEOUT = 0.5
TRACE_TIMEOUT = 1.0
#: How long a judge that hangs holds its answer, and the metric timeout that lets it
#: run past the trace timeout: far beyond the bound below, so that a trace held by
#: either, instead of released by trace_timeout, cannot pass it.
HANG_S = 60.0
LONG_METRIC_TIMEOUT = 30.0
#: The bound on a trace's delay: ~10x what it measures (at most 1.07 s from the flush
#: to the last span at the sink, 1.0 s of pipeline latency with trace_timeout=1 s),
#: a histogram bucket edge, and well under LONG_METRIC_TIMEOUT.
DELAY_BOUND_S = 10.0


def _questions(n: int, prefix: str = "q") -> list[str]:
    questions = [f"{prefix} {i}: how do I reset my password?" for i in range(n)]
    for q in questions:
        _app.route(q, ["kb_reset", "kb_invoice"])
    return questions


def _send(endpoint: str, questions: list[str]) -> None:
    ragtrace.configure(service_name="e2e-bot", endpoint=endpoint)
    for q in questions:
        # A distinct expected output per question: no two judge prompts are the same.
        reference = {
            "expected_output": f"Open Settings. {q}",
            "reference_context_ids": ["kb_reset"],
        }
        _app.answer(q, reference)
    assert ragtrace.flush(30)


def _bucket_le(collector: EvalCollector, name: str, le: str) -> tuple[float, float]:
    """(observations <= le, all observations) of a histogram."""
    samples = collector.scrape()
    return sample(samples, f"{name}_bucket", le=le), sample(samples, f"{name}_count")


def _hang(request: RecordedRequest) -> Reply:
    return Reply.json({"verdicts": [], "reason": "too late"}, delay_s=HANG_S)


def _junk(request: RecordedRequest) -> Reply:
    return Reply.text("I think the answer is yes, mostly. {{{ definitely not JSON")


def _rate_limited(request: RecordedRequest) -> Reply:
    return Reply.error(429, "slow down", retry_after=0.05)


#: Judge retries per scenario (tests/judges covers the retry policy).
MAX_RETRIES = {"hangs": 2, "hangs-past-trace-timeout": 2, "junk": 2, "429": 1}
#: For a judge that answers at once (junk, 429): timeouts that its retries cannot reach
#: (they take 0.2-0.4 s), so that the error recorded is the judge's, on any machine.
ANSWERS_S = 5.0


@pytest.mark.parametrize(
    ("behaviour", "handler", "error_kind", "metric_timeout", "trace_timeout"),
    [
        ("hangs", _hang, "timeout", METRIC_TIMEOUT, TRACE_TIMEOUT),
        # The metric would wait longer than the trace may: trace_timeout cuts it.
        ("hangs-past-trace-timeout", _hang, "timeout", LONG_METRIC_TIMEOUT, TRACE_TIMEOUT),
        ("junk", _junk, "invalid_response", ANSWERS_S, ANSWERS_S + 1),
        ("429", _rate_limited, "rate_limited", ANSWERS_S, ANSWERS_S + 1),
    ],
)
def test_failing_judge_loses_nothing_and_records_the_error(
    sink: OtlpSink,
    judge_server: JudgeServer,
    behaviour: str,
    handler: Any,
    error_kind: str,
    metric_timeout: float,
    trace_timeout: float,
) -> None:
    judge_server.handler = handler
    questions = _questions(6, behaviour)
    config = eval_config(
        sink,
        judge=llm_judge(judge_server, max_retries=MAX_RETRIES[behaviour], timeout_s=20),
        metrics={"contextual_recall": {}, "id_context_recall": {}},
        evaluation={"metric_timeout": metric_timeout, "trace_timeout": trace_timeout},
    )
    with evaluating_collector(config) as collector:
        _send(collector.http_url, questions)
        sent_at = time.monotonic()
        spans = sink.wait_for_spans(3 * len(questions), timeout=30)
        elapsed = time.monotonic() - sent_at
        within, total = _bucket_le(
            collector, "ragtrace_pipeline_latency_seconds", f"{DELAY_BOUND_S:.1f}"
        )
        samples = collector.scrape()
    # Zero spans lost, none doubled.
    assert len(spans) == 3 * len(questions)
    assert len({s.key for s in spans}) == len(spans)
    # Bounded delay: every trace left long before the judge or a metric timeout would
    # have let it go (trace_timeout released it).
    assert total == len(questions)
    assert within == total
    assert elapsed < DELAY_BOUND_S
    for span in rag_spans(spans):
        error = assert_errored(span, "contextual_recall")
        assert error.startswith(error_kind), error
        assert_scored(span, "id_context_recall", 1.0)  # no judge: unaffected
    assert sample(samples, "ragtrace_eval_results_total", metric="contextual_recall") == len(
        questions
    )
    assert sample(
        samples, "ragtrace_eval_results_total", metric="contextual_recall", outcome="error"
    ) == len(questions)
    if behaviour.startswith("hangs"):
        assert sample(samples, "ragtrace_eval_timeouts_total", metric="contextual_recall") == len(
            questions
        )
    if behaviour == "429":  # retried, then given up: 1 + max_retries attempts each
        assert judge_server.request_count == (1 + MAX_RETRIES[behaviour]) * len(questions)


def test_overload_forwards_everything_and_counts_it(
    sink: OtlpSink, judge_server: JudgeServer
) -> None:
    slow = 0.5

    def slow_judge(request: RecordedRequest) -> Reply:
        reply = auto_reply(request)
        return Reply(content=reply.content, delay_s=slow)

    judge_server.handler = slow_judge
    questions = _questions(24, "burst")
    config = eval_config(
        sink,
        judge=llm_judge(judge_server),
        metrics={"contextual_recall": {}},
        evaluation={"workers": 1, "queue_size": 1, "metric_timeout": 5, "trace_timeout": 10},
    )
    with evaluating_collector(config) as collector:
        _send(collector.http_url, questions)
        spans = sink.wait_for_spans(3 * len(questions), timeout=60)
        samples = collector.scrape()
    assert len(spans) == 3 * len(questions)
    assert len({s.key for s in spans}) == len(spans)
    evaluated = [s for s in rag_spans(spans) if flat(s, "contextual_recall", "score") is not None]
    unevaluated = [s for s in rag_spans(spans) if s not in evaluated]
    overload = sample(samples, "ragtrace_eval_skipped_total", reason="overload")
    assert overload == len(unevaluated)
    assert overload >= len(questions) // 2  # one worker, one queue slot, one burst
    assert len(evaluated) + overload == len(questions)
    for span in unevaluated:  # forwarded at once, as they came, marked as sampled
        assert span.attributes[semconv.EVAL_SAMPLED] is True
        assert not any(k.startswith(semconv.EVAL_PREFIX + ".contextual") for k in span.attributes)
        assert not span.span.events


@pytest.mark.slow
def test_sigterm_mid_evaluation_exits_0_and_delivers_everything(
    sink: OtlpSink, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_delay = 1.5

    def slow_judge(request: RecordedRequest) -> Reply:
        reply = auto_reply(request)
        return Reply(content=reply.content, delay_s=judge_delay)

    judge_server.handler = slow_judge
    questions = _questions(8, "sigterm")
    config = serve_config(
        sink,
        judge=llm_judge(judge_server),
        metrics={"contextual_recall": {}, "id_context_recall": {}},
        evaluation={"workers": 2, "metric_timeout": 10, "trace_timeout": 10},
        shutdown={"processor_timeout": 8, "flush_timeout": 10},
    )
    serve = Serve(config, tmp_path)
    try:
        _send(serve.http_url, questions)
        # Two traces are being evaluated (the judge holds them), the rest wait.
        wait_for(lambda: judge_server.request_count >= 2, timeout=30, what="judge calls")
        assert sink.span_count < 3 * len(questions)
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(timeout=60) == 0
    finally:
        serve.kill()
    spans = sink.wait_for_spans(3 * len(questions), timeout=5)
    assert len(spans) == 3 * len(questions)
    assert len({s.key for s in spans}) == len(spans)
    # The evaluations in flight finished and were written; the queued traces went out
    # unevaluated (counted as shutdown).
    scored = [s for s in rag_spans(spans) if flat(s, "contextual_recall", "score") is not None]
    assert len(scored) >= 2
    for span in scored:
        assert_scored(span, "id_context_recall", 1.0)
    names = [e.get("event") for e in serve.events]
    assert names.index("signal_received") < names.index("shutdown_complete")
    done = next(e for e in serve.events if e.get("event") == "shutdown_complete")
    assert done["spans_dropped"] == 0
    assert done["processor_timed_out"] is False
    _assert_all_arrived(spans, questions)


def _assert_all_arrived(spans: list[ReceivedSpan], questions: list[str]) -> None:
    got = sorted(str(s.attributes[semconv.INPUT_VALUE]) for s in rag_spans(spans))
    assert got == sorted(questions)
