"""The Phoenix exporter without Phoenix: annotations read off enriched spans (made by
the real case builder, metrics and enrichment), and the REST behaviour (retry while
the span is not stored, bounded wait, one bad item does not sink the rest) against a
scripted loopback server.  The real-Phoenix test is tests/e2e/test_phoenix_annotations.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.config import ConfigError, parse_config
from ragtrace_collector.evaluation.case_builder import build_cases
from ragtrace_collector.evaluation.document_verdicts import decode_verdicts, document_verdicts
from ragtrace_collector.evaluation.enrichment import (
    EnrichmentConfig,
    EvalSummary,
    enrich_span,
    make_carrier_span,
)
from ragtrace_collector.exporters import build_exporter
from ragtrace_collector.exporters.config import PhoenixExporterConfig
from ragtrace_collector.exporters.phoenix import PhoenixExporter, is_carrier, read_annotations
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import build_metrics
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.otlp.spanattrs import set_attributes
from ragtrace_collector.results import MetricResult
from tests.fakes.spans import make_span

DOCS = [
    ("doc_paris", "Paris is the capital of France."),
    ("doc_louvre", "The Louvre is a museum in Paris."),
    ("doc_berlin", "Berlin is the capital of Germany."),
]


def _trace() -> tuple[trace_pb2.Span, trace_pb2.Span, list[trace_pb2.Span]]:
    trace_id = os.urandom(16)
    rag = make_span(
        trace_id,
        semconv.KIND_RAG,
        attrs={
            semconv.INPUT_VALUE: "What is the capital of France?",
            semconv.OUTPUT_VALUE: "Paris.",
            semconv.EXPECTED_OUTPUT: "Paris is the capital of France.",
            semconv.REFERENCE_CONTEXT_IDS: json.dumps(["doc_paris", "doc_eiffel"]),
            semconv.REFERENCE_CONTEXTS: json.dumps(["Paris is the capital of France."]),
            semconv.SESSION_ID: "s-1",
            semconv.TURN_INDEX: 2,
        },
    )
    retriever = make_span(trace_id, semconv.KIND_RETRIEVER, parent=rag, docs=list(DOCS))
    return rag, retriever, [rag, retriever]


async def _enriched(
    names: tuple[str, ...] = ("id_context_precision", "contextual_precision"),
) -> tuple[trace_pb2.Span, trace_pb2.Span, list[MetricResult]]:
    """A trace scored by the real metrics with the offline judge, results written on the
    @rag span exactly as the evaluator does."""
    rag, retriever, spans = _trace()
    (built,) = build_cases(spans)
    judge = OfflineJudge()
    results: list[MetricResult] = []
    extra: dict[str, dict[str, Any]] = {}
    for metric in build_metrics(list(names), {n: {} for n in names}):
        result = await metric.measure(built.case, judge)
        results.append(result)
        verdicts = document_verdicts(result, built.case, built.document_sources or [])
        if verdicts:
            extra[result.metric] = {
                semconv.EVAL_FIELD_DOCUMENTS: json.dumps([v.model_dump() for v in verdicts])
            }
    summary = EvalSummary(model="offline", sample_rate=1.0, latency_ms=1.0, extra=extra)
    enrich_span(rag, results, summary, EnrichmentConfig())
    return rag, retriever, results


async def test_span_and_document_annotations_read_off_an_enriched_span() -> None:
    rag, retriever, results = await _enriched()
    got = read_annotations(rag)
    by_name = {a["name"]: a for a in got.spans}
    assert set(by_name) == {"id_context_precision", "contextual_precision"}
    ids = by_name["id_context_precision"]
    assert ids == {
        "span_id": rag.span_id.hex(),
        "name": "id_context_precision",
        "annotator_kind": "CODE",
        "result": {
            "score": pytest.approx(1 / 3),
            "label": "fail",
            "explanation": next(r.reason for r in results if r.metric == ids["name"]),
        },
        "metadata": {"source": "ragtrace", "judge": "none", "threshold": 0.5, "model": "offline"},
        "identifier": "ragtrace",
    }
    # Document verdicts sit on the retriever span, at each document's index.
    docs = [d for d in got.documents if d["name"] == "id_context_precision"]
    assert [(d["span_id"], d["document_position"], d["result"]["score"]) for d in docs] == [
        (retriever.span_id.hex(), 0, 1.0),
        (retriever.span_id.hex(), 1, 0.0),
        (retriever.span_id.hex(), 2, 0.0),
    ]
    assert all(d["identifier"] == "" for d in got.documents)  # Phoenix refuses others
    precision = [d for d in got.documents if d["name"] == "contextual_precision"]
    assert [d["document_position"] for d in precision] == [0, 1, 2]
    assert got.sessions == []  # no conversation score on this span


async def test_skipped_results_are_left_out_and_errors_are_labelled() -> None:
    rag, _, spans = _trace()
    results = [
        MetricResult(metric="contextual_recall", score=None, skipped=True, reason="no output"),
        MetricResult(metric="faithfulness", score=None, error="timeout", reason="slow"),
        MetricResult(metric="contextual_relevancy", score=0.25, passed=False, judge="gpt-4o"),
    ]
    enrich_span(rag, results, EvalSummary("gpt-4o", 1.0, 1.0), EnrichmentConfig())
    got = {a["name"]: a for a in read_annotations(rag).spans}
    assert set(got) == {"faithfulness", "contextual_relevancy"}
    assert got["faithfulness"]["result"] == {"label": "error", "explanation": "error: timeout"}
    assert got["contextual_relevancy"]["annotator_kind"] == "LLM"
    assert got["contextual_relevancy"]["result"]["label"] == "fail"
    # A span without results yields nothing.
    assert not read_annotations(spans[1])


async def test_a_carrier_spans_results_land_on_the_evaluated_span() -> None:
    rag, _, _ = _trace()
    result = MetricResult(metric="turn_contextual_precision", score=0.5, passed=True)
    summary = EvalSummary(
        "offline",
        1.0,
        1.0,
        extra={"turn_contextual_precision": {semconv.EVAL_FIELD_CONVERSATION_SCORE: 0.75}},
    )
    carrier = make_carrier_span(rag, [result], summary, EnrichmentConfig())
    assert is_carrier(carrier)
    assert not is_carrier(rag)
    got = read_annotations(carrier)
    assert [a["span_id"] for a in got.spans] == [rag.span_id.hex()]
    ((session, metric, turn, item),) = got.sessions
    assert (session, metric, turn) == ("s-1", "turn_contextual_precision", 2)
    assert item["result"]["score"] == 0.75
    assert item["result"]["label"] == "pass"
    assert item["metadata"]["turn_index"] == 2
    assert item["identifier"] == "ragtrace"


def test_malformed_attributes_are_ignored_not_fatal() -> None:
    span = trace_pb2.Span(span_id=os.urandom(8), trace_id=os.urandom(16), name="x")
    set_attributes(
        span.attributes,
        [
            (semconv.eval_attr("m", semconv.EVAL_FIELD_SCORE), "high"),  # not a number
            (semconv.eval_attr("n", semconv.EVAL_FIELD_SCORE), 0.5),
            (semconv.eval_attr("n", semconv.EVAL_FIELD_DOCUMENTS), '[{"span_id": "zz"}]'),
            (semconv.eval_attr("n", semconv.EVAL_FIELD_CONVERSATION_SCORE), float("nan")),
        ],
    )
    got = read_annotations(span)
    assert [a["name"] for a in got.spans] == ["n"]
    assert got.documents == []
    assert got.sessions == []
    assert decode_verdicts("not json") == []
    assert decode_verdicts(3) == []


def test_phoenix_needs_the_flat_keys() -> None:
    base = {"exporters": {"px": {"type": "phoenix", "endpoint": "http://127.0.0.1:6006"}}}
    parse_config(base, env={})
    with pytest.raises(ConfigError, match=r"enrichment\.flat"):
        parse_config({**base, "enrichment": {"flat": False}}, env={})
    config = parse_config(
        {"exporters": {"px": {**base["exporters"]["px"], "api_key": "${K}"}}}, env={"K": "s3"}
    )
    assert "s3" in config.secrets()


# --------------------------------------------------------------- REST behaviour
Script = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


class _FakePhoenix:
    """Loopback HTTP server: records every request, answers as ``script`` says."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[tuple[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if request.path == "/v1/traces":
            parsed = trace_service_pb2.ExportTraceServiceRequest()
            parsed.ParseFromString(raw)
            self.requests.append((request.path, parsed))
            return web.Response(status=200)
        body = json.loads(raw)
        self.requests.append((request.path, body))
        status, answer = self.script(request.path, body)
        return web.json_response(answer, status=status)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]


@pytest.fixture
async def fake_phoenix() -> AsyncIterator[Callable[[Script], Any]]:
    servers: list[_FakePhoenix] = []

    async def make(script: Script) -> _FakePhoenix:
        server = _FakePhoenix(script)
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()


async def _export(
    server: _FakePhoenix, groups: list[SpanGroup], count: int, **extra: Any
) -> tuple[PhoenixExporter, Telemetry]:
    telemetry = Telemetry()
    config = PhoenixExporterConfig.model_validate(
        {"type": "phoenix", "endpoint": server.url, "compression": "none", **extra}
    )
    exporter = build_exporter("px", config, telemetry)
    assert isinstance(exporter, PhoenixExporter)
    await exporter.start()
    exporter.enqueue(groups, count)
    loop = asyncio.get_running_loop()
    assert await exporter.close(loop.time() + 20) == 0
    return exporter, telemetry


def _counted(telemetry: Telemetry, kind: str, outcome: str) -> float:
    value = telemetry.annotations.labels("px", kind, outcome)._value.get()
    return float(value)


async def test_retries_while_the_span_is_not_stored_then_posts(fake_phoenix: Any) -> None:
    misses = {"n": 0}

    def script(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/v1/span_annotations" and misses["n"] < 3:
            misses["n"] += 1
            return 404, {"detail": "Spans with IDs ... do not exist."}
        return 200, {"data": [{"id": "x"}] * len(body["data"])}

    server = await fake_phoenix(script)
    rag, retriever, _ = await _enriched()
    group = SpanGroup(None, "", None, "", [rag, retriever])
    _, telemetry = await _export(server, [group], 2, project="proj-a")
    paths = server.paths()
    # Spans once, then span annotations until stored, then documents.
    assert paths[0] == "/v1/traces"
    assert paths.count("/v1/traces") == 1
    assert paths.count("/v1/span_annotations") == 4
    assert paths[-1] == "/v1/document_annotations"
    sent = server.requests[0][1]
    (resource_spans,) = sent.resource_spans
    project = [
        kv.value.string_value
        for kv in resource_spans.resource.attributes
        if kv.key == semconv.OPENINFERENCE_PROJECT_NAME
    ]
    assert project == ["proj-a"]
    assert _counted(telemetry, "span", "posted") == 2
    assert _counted(telemetry, "document", "posted") == 6


async def test_gives_up_after_max_wait_and_splits_a_rejected_batch(fake_phoenix: Any) -> None:
    def script(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/v1/span_annotations":
            return 404, {"detail": "never stored"}
        items = body["data"]
        if any(i.get("document_position") == 1 for i in items):
            return 422, {"detail": "Document position 1 is out of bounds"}
        return 200, {"data": []}

    server = await fake_phoenix(script)
    rag, retriever, _ = await _enriched(("id_context_precision",))
    group = SpanGroup(None, "", None, "", [rag, retriever])
    started = asyncio.get_running_loop().time()
    _, telemetry = await _export(server, [group], 2, annotations={"max_wait": "500ms"})
    assert asyncio.get_running_loop().time() - started < 10
    assert _counted(telemetry, "span", "gave_up") == 1
    # One document refused: the other two are still posted, one by one.
    assert _counted(telemetry, "document", "rejected") == 1
    assert _counted(telemetry, "document", "posted") == 2


async def test_carrier_spans_are_not_sent_and_older_turns_never_replace_newer(
    fake_phoenix: Any,
) -> None:
    server = await fake_phoenix(lambda path, body: (200, {"data": []}))
    rag, _, _ = _trace()
    carriers = []
    for turn, score in ((3, 0.9), (2, 0.1)):  # turn 2's result arrives after turn 3's
        set_attributes(rag.attributes, [(semconv.TURN_INDEX, turn)])
        summary = EvalSummary(
            "offline",
            1.0,
            1.0,
            extra={"turn_contextual_precision": {semconv.EVAL_FIELD_CONVERSATION_SCORE: score}},
        )
        result = MetricResult(metric="turn_contextual_precision", score=score, passed=True)
        carriers.append(make_carrier_span(rag, [result], summary, EnrichmentConfig()))
    groups = [SpanGroup(None, "", None, "", [c]) for c in carriers]
    await _export(server, groups, 2, max_batch_spans=1, concurrency=1)
    assert "/v1/traces" not in server.paths()
    sessions = [b for p, b in server.requests if p == "/v1/session_annotations"]
    assert [s["data"][0]["result"]["score"] for s in sessions] == [0.9]


async def test_a_slow_earlier_turn_does_not_overwrite_a_later_conversation_score(
    fake_phoenix: Any,
) -> None:
    slow_span: dict[str, str] = {}
    misses = {"n": 0}

    def script(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        slow = path == "/v1/span_annotations" and body["data"][0]["span_id"] == slow_span["id"]
        if slow and misses["n"] < 3:  # Phoenix stores the earlier turn's span late
            misses["n"] += 1
            return 404, {"detail": "not stored yet"}
        return 200, {"data": []}

    server = await fake_phoenix(script)
    groups = []
    for turn, score in ((1, 0.2), (2, 0.8)):
        rag, _, _ = _trace()
        set_attributes(rag.attributes, [(semconv.TURN_INDEX, turn)])
        summary = EvalSummary(
            "offline",
            1.0,
            1.0,
            extra={"turn_contextual_precision": {semconv.EVAL_FIELD_CONVERSATION_SCORE: score}},
        )
        result = MetricResult(metric="turn_contextual_precision", score=score, passed=True)
        enrich_span(rag, [result], summary, EnrichmentConfig())
        slow_span.setdefault("id", rag.span_id.hex())
        groups.append(SpanGroup(None, "", None, "", [rag]))
    telemetry = Telemetry()
    config = PhoenixExporterConfig.model_validate(
        {"type": "phoenix", "endpoint": server.url, "max_batch_spans": 1, "concurrency": 2}
    )
    exporter = PhoenixExporter("px", config, telemetry)
    await exporter.start()
    for group in groups:
        exporter.enqueue([group], 1)
    assert await exporter.close(asyncio.get_running_loop().time() + 20) == 0
    sessions = [b for p, b in server.requests if p == "/v1/session_annotations"]
    assert [s["data"][0]["result"]["score"] for s in sessions] == [0.8]
    assert misses["n"] == 3
