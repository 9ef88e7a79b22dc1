"""Feedback through a running collector: recorded from the SDK or ``POST /v1/feedback``,
exported on the request's trace, joined to the request's scores (``GET /feedback``),
and kept through a kill -9 once answered 202."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import ragtrace
from ragtrace import semconv
from tests.e2e import _app
from tests.e2e._support import (
    EvalCollector,
    Serve,
    eval_config,
    evaluating_collector,
    rag_spans,
    serve_config,
)
from tests.fakes.harness import admin_json, wait_for
from tests.fakes.otlp_sink import OtlpSink

QUESTION = "How do I reset my password?"
TOKEN = "feedback-e2e-token"
METRIC = "id_context_recall"


@ragtrace.rag(input="question")
def ask(question: str) -> ragtrace.RequestHandle:
    _app.search(question)
    ragtrace.set_reference(reference_context_ids=["kb_reset", "kb_expiry"])  # recall 1/2
    request = ragtrace.current_request()
    assert request is not None
    return request


def post_feedback(
    base_url: str, body: dict[str, Any], token: str | None = TOKEN
) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    root = base_url.removesuffix("/v1/traces")
    request = urllib.request.Request(
        f"{root}/v1/feedback", data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status), json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return int(err.code), json.loads(err.read()), dict(err.headers)


def _file_spans(path: Path) -> list[dict[str, Any]]:
    """Every span of the file exporter's OTLP/JSON lines (hex ids)."""
    if not path.exists():
        return []
    spans = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                spans.extend(ss.get("spans", []))
    return spans


def _attr(span: dict[str, Any], key: str) -> Any:
    for kv in span.get("attributes", []):
        if kv["key"] == key:
            return next(iter(kv["value"].values()))
    return None


def _is_feedback(span: dict[str, Any]) -> bool:
    return bool(_attr(span, semconv.RAGTRACE_SPAN_KIND) == semconv.KIND_FEEDBACK)


def _pairs(admin_url: str) -> int:
    status, report = admin_json(f"{admin_url}/feedback")
    assert status == 200, report
    return int(report["counts"]["pairs"])


def _scored_request(collector: EvalCollector | Serve, sink: OtlpSink, url: str) -> Any:
    """One request sent through the SDK and scored; its handle."""
    _app.route(QUESTION, ["kb_reset", "kb_invoice"])
    ragtrace.configure(service_name="e2e-bot", endpoint=url)
    request = ask(QUESTION)
    assert ragtrace.flush(30)
    sink.wait_until(lambda: bool(rag_spans(sink.spans)), timeout=30)
    return request


def test_sdk_feedback_reaches_the_file_exporter_linked_and_joins_the_score(
    sink: OtlpSink, tmp_path: Path
) -> None:
    out = tmp_path / "spans.jsonl"
    config = eval_config(
        sink,
        metrics={METRIC: {}},
        exporters={
            "backend": {"type": "otlp_grpc", "endpoint": sink.grpc_endpoint},
            "file": {"type": "file", "path": str(out)},
        },
    )
    with evaluating_collector(config) as collector:
        request = _scored_request(collector, sink, collector.http_url)
        assert ragtrace.feedback(request, False, comment="wrong article", user_id="u-1")
        assert ragtrace.flush(30)
        wait_for(lambda: any(_is_feedback(s) for s in _file_spans(out)), 30, "feedback in file")
        wait_for(lambda: _pairs(collector.admin_url) == 1, 10, "the pair joined")
        _, report = admin_json(f"{collector.admin_url}/feedback")
    spans = _file_spans(out)
    (request_span,) = [s for s in spans if s["spanId"] == request.span_id]
    (feedback,) = [s for s in spans if _is_feedback(s)]
    assert feedback["traceId"] == request_span["traceId"] == request.trace_id
    assert feedback["parentSpanId"] == request.span_id
    assert [(link["traceId"], link["spanId"]) for link in feedback["links"]] == [
        (request.trace_id, request.span_id)
    ]
    assert _attr(feedback, semconv.FEEDBACK_COMMENT) == "wrong article"
    assert _attr(feedback, semconv.FEEDBACK_USER_ID) == "u-1"
    assert _attr(feedback, semconv.FEEDBACK_OUTCOME) == semconv.FEEDBACK_NEGATIVE
    assert report["counts"]["recorded"] == 1
    assert report["held"]["scores"] >= 1


_SHOP = "https://shop.example.com"


def _preflight(http_url: str, origin: str) -> tuple[int, str | None]:
    """A browser's CORS preflight for POST /v1/feedback: the status and the allowed origin."""
    request = urllib.request.Request(
        f"{http_url.removesuffix('/v1/traces')}/v1/feedback",
        method="OPTIONS",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.headers.get("Access-Control-Allow-Origin")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Access-Control-Allow-Origin")


def test_http_feedback_202_exported_joined_and_refusals(sink: OtlpSink) -> None:
    config = eval_config(
        sink,
        metrics={METRIC: {}},
        receivers={"auth": {"bearer_tokens": [TOKEN]}},
        feedback={"rate": 5, "allowed_origins": [_SHOP]},
    )
    with evaluating_collector(config) as collector:
        _app.route(QUESTION, ["kb_reset", "kb_invoice"])
        ragtrace.configure(
            service_name="e2e-bot",
            endpoint=collector.http_url,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        request = ask(QUESTION)
        assert ragtrace.flush(30)
        sink.wait_until(lambda: bool(rag_spans(sink.spans)), timeout=30)
        body = {"trace_id": request.trace_id, "span_id": request.span_id, "value": 0.2}
        status, answer, _ = post_feedback(collector.http_url, {**body, "name": "stars"})
        assert status == 202, answer
        sink.wait_until(
            lambda: any(s.attributes.get(semconv.FEEDBACK_NAME) == "stars" for s in sink.spans),
            timeout=30,
        )
        wait_for(lambda: _pairs(collector.admin_url) == 1, 10, "the pair joined")
        (rag,) = rag_spans(sink.spans)  # the feedback span was not taken for a request
        (carried,) = [s for s in sink.spans if s.attributes.get(semconv.FEEDBACK_NAME)]
        assert carried.span.trace_id == rag.span.trace_id
        assert carried.span.parent_span_id == rag.span.span_id

        status, answer, _ = post_feedback(collector.http_url, {**body, "value": "good"})
        assert (status, answer["error"]["field"]) == (400, "value")
        assert "good" not in json.dumps(answer)
        status, _, headers = post_feedback(collector.http_url, body, token=None)
        assert (status, headers.get("WWW-Authenticate")) == (401, "Bearer")
        # feedback.allowed_origins reaches the receiver: a page of that origin may ask.
        assert _preflight(collector.http_url, _SHOP) == (204, _SHOP)
        assert _preflight(collector.http_url, "https://elsewhere.example") == (403, None)

        statuses = [post_feedback(collector.http_url, body)[0] for _ in range(30)]
        assert 429 in statuses
        _, report = admin_json(f"{collector.admin_url}/feedback")
        assert report["counts"]["invalid"]["rate_limited"] == statuses.count(429)
        assert report["counts"]["invalid"]["bad value"] == 1


def test_feedback_only_trace_is_not_evaluated(sink: OtlpSink) -> None:
    """Feedback for a request this collector never saw (a trace of feedback spans only)
    is exported, counted as unjoined, and never scored as a case."""
    config = eval_config(sink, metrics={METRIC: {}}, assembly={"max_trace_wait": "1s"})
    with evaluating_collector(config) as collector:
        trace_id = "5b8efff798038103d269b633813fc60c"
        status, _, _ = post_feedback(collector.http_url, {"trace_id": trace_id, "value": 1})
        assert status == 202
        sink.wait_until(lambda: len(sink.spans) == 1, timeout=30)
        time.sleep(0.5)  # anything the evaluator would add comes within this
        assert collector.metric("ragtrace_eval_traces_total") == 0
        (span,) = sink.spans
        assert not any(k.startswith(semconv.EVAL_PREFIX + ".") for k in span.attributes)
        _, report = admin_json(f"{collector.admin_url}/feedback")
        assert report["counts"]["recorded"] == 1
        assert report["counts"]["pairs"] == 0


@pytest.mark.slow
def test_feedback_answered_202_survives_kill_9(sink: OtlpSink, tmp_path: Path) -> None:
    """202, then SIGKILL at once, then a restart on the same log: the feedback is
    joined to the request's score.  Once with the request scored before the feedback,
    once with the feedback before its request (pending through the crash)."""
    config = serve_config(
        sink,
        storage={"directory": str(tmp_path / "wal")},
        metrics={METRIC: {}},
    )
    first = Serve(config, tmp_path)
    try:
        request = _scored_request(first, sink, first.http_url)
        early = "7c4f9ee9a3b14bb38f5b0a52e6b2d0aa"
        for body in (
            {"trace_id": request.trace_id, "span_id": request.span_id, "value": False},
            {"trace_id": early, "value": True},
        ):
            status, answer, _ = post_feedback(first.http_url, body, token=None)
            assert status == 202, answer
    finally:
        first.kill()  # SIGKILL right after the 202s
    second = Serve(config, tmp_path)
    try:
        admin = f"http://{second.endpoints['admin']}"
        wait_for(lambda: _pairs(admin) >= 1, 15, "the scored request's pair after restart")
        # The early feedback's trace has no root span: it is released after
        # assembly.max_trace_wait, then waits in the join for its request's scores.
        wait_for(
            lambda: admin_json(f"{admin}/feedback")[1]["held"]["pending"] >= 1,
            15,
            "the early feedback pending after restart",
        )
    finally:
        second.kill()


def test_feedback_reaches_an_alert_rule_on_its_name(sink: OtlpSink) -> None:
    """The service wires the feedback stage to the drop detector: a rule on
    ``feedback:user_feedback`` counts each feedback (once per user) in its window."""
    rule = {"name": "unhappy", "metric": "feedback:user_feedback", "min_samples": 2}
    config = eval_config(
        sink,
        metrics={METRIC: {}},
        alerts={"rules": [rule]},
        assembly={"max_trace_wait": "300ms"},
    )
    with evaluating_collector(config) as collector:
        for user, value in (("u-1", False), ("u-2", True), ("u-1", True)):  # u-1 again
            body = {"trace_id": "5b8efff798038103d269b633813fc60c", "value": value}
            status, _, _ = post_feedback(
                collector.http_url, {**body, "user_id": user, "service": "bot"}
            )
            assert status == 202

        def counted() -> int:
            stage = collector.svc.stage
            assert stage is not None
            assert stage.detector is not None
            statuses = collector.call(stage.detector.status)
            return sum(s.window_count for s in statuses if s.rule == "unhappy")

        wait_for(lambda: counted() == 2, 15, "two feedback keys in the rule's window")
        time.sleep(0.5)
        assert counted() == 2
