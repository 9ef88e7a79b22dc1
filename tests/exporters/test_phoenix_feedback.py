"""User feedback in Phoenix: a HUMAN span annotation on the request span, beside
ragtrace's CODE/LLM ones, against the scripted loopback Phoenix of
test_phoenix_exporter.py."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ragtrace import semconv
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters import build_exporter
from ragtrace_collector.exporters.config import PhoenixExporterConfig
from ragtrace_collector.exporters.phoenix import PhoenixExporter, read_feedback
from ragtrace_collector.feedback.record import Feedback, to_span
from ragtrace_collector.otlp.codec import SpanGroup
from tests.exporters.test_phoenix_exporter import (
    _counted,
    _FakePhoenix,
    fake_phoenix,  # noqa: F401  (the fixture)
)
from tests.fakes.spans import make_span


def _feedback(trace_id: bytes, span_id: bytes | None, **changes: Any) -> Feedback:
    fields: dict[str, Any] = {
        "trace_id": trace_id.hex(),
        "span_id": span_id.hex() if span_id is not None else None,
        "name": "user_feedback",
        "value": 0.0,
        "value_type": semconv.FEEDBACK_TYPE_BOOLEAN,
        "comment": "wrong article",
        "user_id": "u-1",
        "correction": "see kb_reset",
        "time_unix_nano": 1,
    }
    fields.update(changes)
    return Feedback(**fields)


def test_feedback_is_a_human_annotation_keyed_by_user() -> None:
    trace_id, span_id = os.urandom(16), os.urandom(8)
    got = read_feedback(to_span(_feedback(trace_id, span_id)))
    assert got.spans == [
        {
            "span_id": span_id.hex(),
            "name": "user_feedback",
            "annotator_kind": "HUMAN",
            "result": {"score": 0.0, "label": "negative", "explanation": "wrong article"},
            "metadata": {"source": "user", "value_type": "boolean", "correction": "see kb_reset"},
            "identifier": "u-1",
        }
    ]
    anonymous = read_feedback(to_span(_feedback(trace_id, span_id, user_id=None, comment=None)))
    (item,) = anonymous.spans
    assert item["identifier"] == ""
    assert item["result"] == {"score": 0.0, "label": "negative"}
    assert read_feedback(make_span(trace_id, semconv.KIND_RAG)).spans == []


async def test_feedback_lands_on_the_request_span_or_the_known_root(
    fake_phoenix: Any,  # noqa: F811
) -> None:
    def script(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"data": [{"id": "x"}] * len(body.get("data", []))}

    server: _FakePhoenix = await fake_phoenix(script)
    telemetry = Telemetry()
    config = PhoenixExporterConfig.model_validate(
        {"type": "phoenix", "endpoint": server.url, "compression": "none"}
    )
    exporter = build_exporter("px", config, telemetry)
    assert isinstance(exporter, PhoenixExporter)
    await exporter.start()
    seen, unseen = os.urandom(16), os.urandom(16)
    request = make_span(seen, semconv.KIND_RAG)
    exporter.enqueue([SpanGroup(None, "", None, "", [request])], 1)
    for _ in range(200):  # the request's batch goes first
        if server.paths():
            break
        await asyncio.sleep(0.01)
    feedback = [
        to_span(_feedback(seen, request.span_id, name="linked")),
        to_span(_feedback(seen, None, name="by_trace", value=1.0, user_id=None)),
        to_span(_feedback(unseen, None, name="unknown_trace")),
    ]
    resource = Resource()
    exporter.enqueue([SpanGroup(resource, "", None, "", feedback)], len(feedback))
    assert await exporter.close(asyncio.get_running_loop().time() + 20) == 0

    posted = [
        item
        for path, body in server.requests
        if path == "/v1/span_annotations"
        for item in body["data"]
    ]
    by_name = {item["name"]: item for item in posted}
    assert set(by_name) == {"linked", "by_trace"}
    assert all(item["annotator_kind"] == "HUMAN" for item in posted)
    assert by_name["linked"]["span_id"] == request.span_id.hex()
    assert by_name["by_trace"]["span_id"] == request.span_id.hex()  # the root sent before
    assert by_name["by_trace"]["result"]["label"] == "positive"
    assert _counted(telemetry, "span", "no_span") == 1
    assert _counted(telemetry, "span", "posted") == 2
    sent = sum(
        len(ss.spans)
        for path, body in server.requests
        if path == "/v1/traces"
        for rs in body.resource_spans
        for ss in rs.scope_spans
    )
    assert sent == 4  # the feedback spans go to Phoenix too


async def test_a_repeat_in_one_batch_is_sent_once_the_last_one(
    fake_phoenix: Any,  # noqa: F811
) -> None:
    def script(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"data": [{"id": "x"}] * len(body.get("data", []))}

    server: _FakePhoenix = await fake_phoenix(script)
    telemetry = Telemetry()
    config = PhoenixExporterConfig.model_validate(
        {"type": "phoenix", "endpoint": server.url, "compression": "none"}
    )
    exporter = build_exporter("px", config, telemetry)
    assert isinstance(exporter, PhoenixExporter)
    await exporter.start()
    trace_id, span_id = os.urandom(16), os.urandom(8)
    spans = [
        to_span(_feedback(trace_id, span_id, value=0.0)),
        to_span(_feedback(trace_id, span_id, value=1.0)),  # the user changed their mind
        to_span(_feedback(trace_id, span_id, value=0.0, user_id="u-2")),
    ]
    exporter.enqueue([SpanGroup(None, "", None, "", spans)], len(spans))
    assert await exporter.close(asyncio.get_running_loop().time() + 20) == 0
    posted = [
        item
        for path, body in server.requests
        if path == "/v1/span_annotations"
        for item in body["data"]
    ]
    assert sorted((i["identifier"], i["result"]["score"]) for i in posted) == [
        ("u-1", 1.0),
        ("u-2", 0.0),
    ]
