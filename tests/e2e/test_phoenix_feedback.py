"""User feedback in a real Arize Phoenix: SDK app -> collector (evaluation on, a
``type: phoenix`` exporter) -> Phoenix.  The feedback is a HUMAN span annotation on
the request span beside the metrics' CODE/LLM ones; a user's second feedback replaces
the first (``identifier`` = user id); feedback posted with a trace id only lands on
the trace's root span."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

import ragtrace
from tests.e2e import _app
from tests.e2e._support import evaluating_collector
from tests.e2e.test_phoenix_annotations import _phoenix_exporter, _span_annotations
from tests.fakes.harness import collector_config
from tests.fakes.phoenix import PhoenixServer

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(600)]

QUESTION = "What is the capital of France?"


@ragtrace.rag(input="question")
def ask(question: str) -> ragtrace.RequestHandle:
    _app.search(question)
    ragtrace.set_reference(reference_context_ids=["doc_paris"])
    request = ragtrace.current_request()
    assert request is not None
    return request


def _post(http_url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        http_url.removesuffix("/v1/traces") + "/v1/feedback",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


def test_feedback_is_a_human_annotation_on_the_request_span(phoenix: PhoenixServer) -> None:
    project = "ragtrace-feedback"
    config = collector_config(
        exporters={"phoenix": _phoenix_exporter(phoenix, project)},
        sampling={"rate": 1.0},
        metrics={"id_context_recall": {}},
        assembly={"max_trace_wait": "1s"},
    )
    _app.route(QUESTION, ["doc_paris", "doc_louvre"])
    with evaluating_collector(config) as collector:
        ragtrace.configure(service_name="phoenix-bot", endpoint=collector.http_url)
        request = ask(QUESTION)
        assert ragtrace.flush(30)
        stored = len(phoenix.wait_for_spans(project, [request.trace_id], count=1))
        assert ragtrace.feedback(request, False, comment="wrong city", user_id="u-1")
        assert ragtrace.flush(30)
        # The first feedback is stored (and annotated) before the second is sent.
        phoenix.wait_for_spans(project, [request.trace_id], count=stored + 1)
        assert ragtrace.feedback(request, True, user_id="u-1")  # changed their mind
        assert ragtrace.flush(30)
        assert _post(collector.http_url, {"trace_id": request.trace_id, "value": 0.25}) == 202
    # Leaving the block stopped the collector: spans and annotations were posted.
    annotations = _span_annotations(phoenix, project, [request.span_id])
    human = [a for a in annotations if a["annotator_kind"] == "HUMAN"]
    by_user = {a["identifier"]: a for a in human}
    assert set(by_user) == {"u-1", ""}
    assert all(a["span_id"] == request.span_id and a["name"] == "user_feedback" for a in human)
    assert by_user["u-1"]["result"]["score"] == 1.0
    assert by_user["u-1"]["result"]["label"] == "positive"
    assert by_user[""]["result"]["score"] == 0.25  # by trace id: on the root, the request
    assert any(a["name"] == "id_context_recall" for a in annotations)  # beside CODE ones
