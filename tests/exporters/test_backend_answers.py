"""A backend whose answers are wrong in every way the protocol allows and some it does
not: the exporter keeps delivering, reports its status, and /healthz tells the truth."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)

from ragtrace_collector.component import ComponentHost, Status, Supervisor
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters.config import OtlpHttpExporterConfig
from ragtrace_collector.exporters.otlp_http import OtlpHttpExporter
from ragtrace_collector.otlp.codec import SpanGroup, split_request
from tests.fakes.harness import (
    CollectorThread,
    admin_json,
    collector_config,
    emit_rag_request,
    make_app,
    passthrough_sections,
    running_collector,
    sink_exporter,
    span_key,
    wait_for,
)
from tests.fakes.otlp_data import make_request, rag_trace
from tests.fakes.otlp_sink import OtlpSink, partial_success

EXPORTER = "exporter:backend"


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


def _exporter_status(collector: CollectorThread) -> tuple[int, str, str | None]:
    status, body = admin_json(collector.admin_url + "/healthz")
    component = body["components"][EXPORTER]
    return status, component["status"], component["last_error"]


def _gauge(collector: CollectorThread, status: str) -> float:
    return collector.metric("ragtrace_component_status", {"component": EXPORTER, "status": status})


def _send(collector: CollectorThread, first: int, count: int) -> list[tuple[str, str]]:
    app = make_app(HttpSpanExporter(endpoint=collector.http_url))
    for n in range(first, first + count):
        emit_rag_request(app.provider, n)
    app.shutdown()
    return [span_key(s) for s in app.emitted()]


def test_odd_answers_never_stop_delivery_and_health_follows_the_status(sink: OtlpSink) -> None:
    config = collector_config(
        exporters={"backend": sink_exporter(sink, "otlp_http", max_batch_spans=3)},
        admin={"unhealthy_after": "1s"},
        **passthrough_sections(),
    )
    with running_collector(config) as collector:
        sent: list[tuple[str, str]] = []
        # 1. partial_success out of range, both ways: the spans reached the backend and
        #    its count is clamped (a negative count once killed the worker).
        sink.answer_next(2, body=partial_success(-7, "negative"))
        sink.answer_next(2, body=partial_success(10**12, "more than sent"))
        sent += _send(collector, 0, 4)
        wait_for(lambda: sink.answers_served >= 4, what="odd partial successes served")
        wait_for(lambda: {r.key for r in sink.spans} >= set(sent), what="first spans")
        assert _exporter_status(collector)[1] == "ok"
        clamped = collector.metric(
            "ragtrace_spans_dropped_total", {"exporter": "backend", "reason": "rejected"}
        )
        assert clamped == 6  # two batches of 3 counted as rejected: clamped to the batch

        # 2. The backend breaks: connections closed without an answer, then bytes that
        #    are not HTTP, then 503s with a garbage body.  The exporter retries, its
        #    status is recoverable_error, and /healthz turns 503 after unhealthy_after.
        sink.answer_next(3, record=False, close=True)
        sink.answer_next(3, record=False, raw=b"\x00\xffnot http at all\r\n\r\n")
        sink.answer_next(10**6, status=503, body=b"\x08\x96\x01garbage", record=False)
        sent += _send(collector, 100, 5)
        wait_for(
            lambda: _exporter_status(collector)[1] == "recoverable_error",
            what="exporter in recoverable_error",
        )
        assert _gauge(collector, "recoverable_error") == 1
        assert _gauge(collector, "ok") == 0
        wait_for(lambda: _exporter_status(collector)[0] == 503, what="/healthz 503")
        error = _exporter_status(collector)[2]
        assert error is not None
        assert "503" in error
        _, body = admin_json(collector.admin_url + "/healthz")
        assert body["status"] == "unavailable"
        assert EXPORTER in body["reason"]

        # 3. Recovery, through a 2xx whose body is garbage (counted as delivered).
        sink.stop_answering()
        sink.answer_next(1, body=b"\xff\xfe\xfd garbage", content_type="application/x-protobuf")
        sink.answer_next(1, body=b"<html>ok</html>", content_type="text/html")
        wait_for(lambda: {r.key for r in sink.spans} >= set(sent), what="every span", timeout=60)
        wait_for(lambda: _exporter_status(collector)[:2] == (200, "ok"), what="back to ok")
        assert _gauge(collector, "ok") == 1
        assert _gauge(collector, "recoverable_error") == 0

        # Every span was delivered (counted by span id); nothing else was dropped.
        assert {r.key for r in sink.spans} >= set(sent)
        for reason in ("retry_timeout", "encode_error", "closed", "queue_full"):
            labels = {"exporter": "backend", "reason": reason}
            assert collector.metric("ragtrace_spans_dropped_total", labels) == 0
        # The workers never died: nothing needed restarting.
        assert collector.metric("ragtrace_component_failures_total", {"component": EXPORTER}) == 0
        assert collector.svc.exporters[0].depth == 0


class _BuggyExporter(OtlpHttpExporter):
    """A real OTLP/HTTP exporter whose send raises an unexpected exception at times."""

    raise_next = 0

    async def _send(self, payload: bytes, spans: int) -> int:
        if self.raise_next:
            self.raise_next -= 1
            raise RuntimeError("an exporter bug")
        return await super()._send(payload, spans)


def _groups(traces: int) -> list[tuple[list[SpanGroup], int, set[tuple[str, str]]]]:
    out = []
    for _ in range(traces):
        spans = rag_trace(children=2)
        split = split_request(make_request(spans))
        for chunk in split.traces.values():
            keys = {(s.trace_id.hex(), s.span_id.hex()) for s in spans}
            out.append((chunk.groups, chunk.span_count, keys))
    return out


async def _run_buggy(
    sink: OtlpSink,
) -> tuple[Telemetry, _BuggyExporter, Sequence[set[tuple[str, str]]]]:
    telemetry = Telemetry()
    host = ComponentHost(telemetry)
    supervisor = Supervisor(host, initial_backoff=0.05, max_backoff=0.2)
    config = OtlpHttpExporterConfig.model_validate(
        sink_exporter(sink, "otlp_http", max_batch_spans=3, concurrency=1)
    )
    exporter = _BuggyExporter("buggy", config, telemetry, supervisor=supervisor)
    host.register(exporter)
    exporter.raise_next = 2
    await exporter.start()
    batches = _groups(4)
    for groups, count, _ in batches:
        exporter.enqueue(groups, count)
    # close() delivers everything queued before its deadline: the restarts happen
    # inside it, and nothing may be left over.
    assert await exporter.close(asyncio.get_running_loop().time() + 30) == 0
    await supervisor.stop(wait=5)
    return telemetry, exporter, [keys for _, _, keys in batches]


def test_an_unexpected_exception_requeues_the_batch_and_restarts_the_worker(
    sink: OtlpSink, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry, exporter, keys = asyncio.run(_run_buggy(sink))
    delivered = [r.key for r in sink.spans]
    expected = set().union(*keys)
    # Every span arrived exactly once: the batch in hand went back to the queue.
    assert sorted(delivered) == sorted(expected)
    failures = telemetry.registry.get_sample_value(
        "ragtrace_component_failures_total", {"component": "exporter:buggy"}
    )
    assert failures == 2
    assert exporter.status is Status.STOPPED
    assert exporter.last_error == "RuntimeError: an exporter bug"
    assert not any("never retrieved" in r.getMessage() for r in caplog.records)


def test_healthz_body_lists_every_component(sink: OtlpSink) -> None:
    config = collector_config(sink=sink, **passthrough_sections())
    with running_collector(config) as collector:
        status, body = admin_json(collector.admin_url + "/healthz")
        assert status == 200
        assert body["components"][EXPORTER]["status"] == "ok"
        assert body["components"]["assembler"]["status"] == "ok"
        ready_status, ready = admin_json(collector.admin_url + "/readyz")
        assert ready_status == 200, ready
        assert json.dumps(ready)  # a JSON body with the same components
        assert set(ready["components"]) == set(body["components"])


def test_readyz_says_not_ready_while_the_pipeline_refuses_everything(sink: OtlpSink) -> None:
    exporter = sink_exporter(sink, "otlp_http", queue={"max_spans": 6})
    config = collector_config(
        exporters={"backend": exporter}, assembly={"decision_wait": 0}, **passthrough_sections()
    )
    with running_collector(config) as collector:
        assert admin_json(collector.admin_url + "/readyz")[0] == 200
        sink.go_down()
        sent = _send(collector, 0, 3)  # 9 spans: the 6-span queue is full
        wait_for(lambda: admin_json(collector.admin_url + "/readyz")[0] == 503, what="/readyz 503")
        _, body = admin_json(collector.admin_url + "/readyz")
        assert "queue_full" in body["reason"]
        # Liveness is another question: the process is fine, only the backend is down.
        assert admin_json(collector.admin_url + "/healthz")[0] == 200
        sink.come_up()
        wait_for(lambda: {r.key for r in sink.spans} >= set(sent), what="delivered")
        wait_for(lambda: admin_json(collector.admin_url + "/readyz")[0] == 200, what="/readyz 200")
