"""Feedback spans from ``ragtrace.feedback()`` through today's collector.

The collector does not join feedback yet (issue 30's collector side); until it does,
what it must do is pass feedback spans through in the request's trace, untouched, and
never take one for a request: the request is scored once, feedback sent during the
request travels with its trace, and feedback sent after the trace was forwarded
follows on its own, with its parent and link intact.
"""

from __future__ import annotations

from typing import Any

import ragtrace
from ragtrace import semconv
from tests.e2e import _app
from tests.e2e._support import assert_scored, eval_config, evaluating_collector, rag_spans
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan

QUESTION = "How do I reset my password?"


@ragtrace.rag(input="question")
def ask(question: str) -> tuple[str, Any]:
    docs = _app.search(question)
    ragtrace.set_reference(reference_context_ids=["kb_reset", "kb_expiry"])  # id recall 1/2
    request = ragtrace.current_request()
    assert request is not None
    assert ragtrace.feedback(request, 1.0, name="inline_check")  # during the request
    return docs[0]["content"], request


def _feedback(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    out = {}
    for s in spans:
        if s.attributes.get(semconv.RAGTRACE_SPAN_KIND) == semconv.KIND_FEEDBACK:
            out[s.attributes[semconv.FEEDBACK_NAME]] = s
    return out


def test_feedback_spans_pass_through_in_the_request_trace(sink: OtlpSink) -> None:
    config = eval_config(sink, metrics={"id_context_recall": {}})
    with evaluating_collector(config) as collector:
        _app.route(QUESTION, ["kb_reset", "kb_invoice"])
        ragtrace.configure(service_name="e2e-bot", endpoint=collector.http_url)
        _, request = ask(QUESTION)
        assert ragtrace.flush(30)
        sink.wait_until(lambda: bool(rag_spans(sink.spans)), timeout=30)
        # The request's trace has been forwarded: this feedback comes "later".
        assert ragtrace.feedback(request, False, comment="wrong article", user_id="u-1")
        assert ragtrace.feedback(request.trace_id, 0.3, name="stars")
        assert ragtrace.flush(30)
        sink.wait_until(lambda: len(_feedback(sink.spans)) == 3, timeout=30)
        spans = sink.spans

    (rag,) = rag_spans(spans)  # scored once: no feedback span was taken for a request
    assert_scored(rag, "id_context_recall", 0.5)
    feedback = _feedback(spans)
    assert set(feedback) == {"inline_check", "user_feedback", "stars"}
    for received in feedback.values():
        assert received.span.trace_id == rag.span.trace_id
        assert received.service_name == "e2e-bot"
        assert not any(k.startswith(semconv.EVAL_PREFIX + ".") for k in received.attributes)
    for name in ("inline_check", "user_feedback"):
        span = feedback[name].span
        assert span.parent_span_id == rag.span.span_id
        assert [(link.trace_id, link.span_id) for link in span.links] == [
            (rag.span.trace_id, rag.span.span_id)
        ]
    late = feedback["user_feedback"].attributes
    assert late[semconv.FEEDBACK_OUTCOME] == semconv.FEEDBACK_NEGATIVE
    assert late[semconv.FEEDBACK_COMMENT] == "wrong article"
    assert late[semconv.FEEDBACK_USER_ID] == "u-1"
    stars = feedback["stars"].span
    assert not stars.links
    assert stars.parent_span_id != rag.span.span_id
