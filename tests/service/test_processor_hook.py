"""The trace-processor hook: hold, mutate, add spans, late spans, drain, admission."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Iterator

import aiohttp
import pytest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from ragtrace import semconv
from ragtrace_collector.service.pipeline import AssembledTrace, Forward, ReleaseReason
from ragtrace_collector.service.server import CollectorService
from tests.fakes.harness import (
    CollectorThread,
    collector_config,
    http_get,
    running_collector,
    wait_for,
)
from tests.fakes.otlp_data import make_request, make_span, new_span_id, rag_trace
from tests.fakes.otlp_sink import OtlpSink, attributes_of


def _post(collector: CollectorThread, spans: list[Span]) -> int:
    req = urllib.request.Request(
        collector.http_url,
        data=make_request(spans).SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


class Evaluating:
    """Holds each trace for a while (like a judge call), scores the root, adds a carrier."""

    def __init__(self, hold: float = 0.1) -> None:
        self.hold = hold
        self.seen: list[tuple[str, bool, ReleaseReason]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.drained = False

    def submit(self, trace: AssembledTrace, forward: Forward) -> None:
        self.seen.append((trace.trace_id_hex, trace.late, trace.reason))
        task = asyncio.get_running_loop().create_task(self._evaluate(trace, forward))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _evaluate(self, trace: AssembledTrace, forward: Forward) -> None:
        await asyncio.sleep(self.hold)
        if not trace.late:
            for span in trace.root_spans():
                kv = span.attributes.add()
                kv.key = semconv.eval_attr("context_recall", semconv.EVAL_FIELD_SCORE)
                kv.value.double_value = 0.75
                event = span.events.add()
                event.name = semconv.GEN_AI_EVALUATION_RESULT_EVENT
                carrier = Span(
                    trace_id=trace.trace_id,
                    span_id=new_span_id(),
                    parent_span_id=span.span_id,
                    name="ragtrace.evaluation",
                    start_time_unix_nano=span.end_time_unix_nano,
                    end_time_unix_nano=span.end_time_unix_nano,
                )
                carrier.links.add(trace_id=trace.trace_id, span_id=span.span_id)
                kind = carrier.attributes.add()
                kind.key, kind.value.string_value = (
                    semconv.OPENINFERENCE_SPAN_KIND,
                    semconv.OI_KIND_EVALUATOR,
                )
                resource = Resource()
                rkv = resource.attributes.add()
                rkv.key, rkv.value.string_value = "service.name", "ragtrace-collector"
                trace.add_span(
                    carrier, resource=resource, scope=InstrumentationScope(name="ragtrace")
                )
        forward(trace)

    async def drain(self) -> None:
        await asyncio.gather(*self._tasks)
        self.drained = True


def test_processor_mutates_spans_adds_a_carrier_and_sees_late_spans(sink: OtlpSink) -> None:
    processor = Evaluating()
    config = collector_config(sink=sink, assembly={"decision_wait": "20ms"})
    with running_collector(config, processor) as collector:
        spans = rag_trace(children=2)
        trace_id = spans[0].trace_id
        assert _post(collector, spans) == 200
        got = sink.wait_for_spans(4)
        by_name = {r.span.name: r for r in got}
        root = by_name["rag"]
        score_key = semconv.eval_attr("context_recall", semconv.EVAL_FIELD_SCORE)
        assert root.attributes[score_key] == 0.75
        assert root.attributes[semconv.RAGTRACE_SPAN_KIND] == semconv.KIND_RAG
        assert [e.name for e in root.span.events] == [semconv.GEN_AI_EVALUATION_RESULT_EVENT]
        carrier = by_name["ragtrace.evaluation"]
        assert carrier.span.trace_id == trace_id
        assert carrier.span.links[0].span_id == root.span.span_id
        assert carrier.service_name == "ragtrace-collector"
        assert carrier.scope.name == "ragtrace"
        assert by_name["retrieve-0"].service_name == "svc"
        # A late span goes through the processor too, flagged as late.
        late = make_span(trace_id, parent=root.span.span_id, name="late")
        assert _post(collector, [late]) == 200
        sink.wait_for_spans(5)
        assert processor.seen[-1] == (trace_id.hex(), True, ReleaseReason.LATE)
        assert processor.seen[0][1:] == (False, ReleaseReason.READY)
    assert processor.drained


class Stubborn:
    """Never forwards and never finishes draining: the pipeline must cope."""

    def __init__(self) -> None:
        self.held = 0

    def submit(self, trace: AssembledTrace, forward: Forward) -> None:
        self.held += 1

    async def drain(self) -> None:
        await asyncio.sleep(3600)


def test_drain_timeout_forwards_held_traces_unchanged(sink: OtlpSink) -> None:
    config = collector_config(sink=sink, shutdown={"processor_timeout": "300ms"})
    processor = Stubborn()
    collector = CollectorThread(config, processor).start()
    try:
        for _ in range(5):
            assert _post(collector, rag_trace(children=1)) == 200
        wait_for(lambda: processor.held == 5, what="traces submitted")
        assert sink.span_count == 0
    finally:
        collector.stop()
    assert sink.span_count == 10


def test_processor_holding_too_much_turns_on_back_pressure(sink: OtlpSink) -> None:
    config = collector_config(
        sink=sink,
        assembly={"decision_wait": 0, "max_buffered_spans": 6},
        shutdown={"processor_timeout": "300ms"},
    )
    processor = Stubborn()
    collector = CollectorThread(config, processor).start()
    try:
        assert _post(collector, rag_trace(children=2)) == 200
        assert _post(collector, rag_trace(children=2)) == 200
        wait_for(lambda: processor.held == 2, what="traces submitted")
        assert _post(collector, rag_trace(children=2)) == 429
        assert (
            collector.metric(
                "ragtrace_spans_refused_total",
                {"receiver": "otlp_http", "reason": "processor_busy"},
            )
            == 3
        )
    finally:
        collector.stop()
    assert sink.span_count == 6


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def submit(self, trace: AssembledTrace, forward: Forward) -> None:
        self.calls += 1
        if self.calls == 2:
            forward(trace)
            forward(trace)  # twice: ignored
            return
        raise RuntimeError("processor bug")

    async def drain(self) -> None:
        return None


def test_a_failing_processor_loses_nothing(sink: OtlpSink) -> None:
    processor = Broken()
    with running_collector(collector_config(sink=sink), processor) as collector:
        for _ in range(3):
            assert _post(collector, rag_trace(children=1)) == 200
        sink.wait_for_spans(6)
        wait_for(
            lambda: (
                collector.metric("ragtrace_spans_forwarded_total", {"exporter": "backend"}) == 6
            ),
            what="forwarded counter",
        )
    assert sink.span_count == 6


class Gate:
    """Holds every trace until released; lets a test watch the service mid-shutdown."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._held: list[tuple[AssembledTrace, Forward]] = []

    def submit(self, trace: AssembledTrace, forward: Forward) -> None:
        self._held.append((trace, forward))

    async def drain(self) -> None:
        await asyncio.to_thread(self.release.wait, 60)
        for trace, forward in self._held:
            forward(trace)


async def test_not_ready_until_the_receivers_listen(sink: OtlpSink) -> None:
    service = CollectorService(collector_config(sink=sink))
    assert service.admin is not None
    host, port = await service.admin.start()  # the admin port comes up first
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://{host}:{port}/readyz") as resp:
            assert resp.status == 503
            assert "not listening" in (await resp.json())["reason"]
        async with client.get(f"http://{host}:{port}/healthz") as resp:
            assert resp.status == 200
        await service.admin.stop()
        await service.start()
        host, port = service.admin_address or ("", 0)
        try:
            async with client.get(f"http://{host}:{port}/readyz") as resp:
                assert resp.status == 200
        finally:
            await service.stop()


def test_not_ready_during_shutdown(sink: OtlpSink) -> None:
    processor = Gate()
    config = collector_config(
        sink=sink, assembly={"decision_wait": "60s", "max_trace_wait": "120s"}
    )
    with running_collector(config, processor) as running:
        assert http_get(running.admin_url + "/readyz")[0] == 200
        assert _post(running, rag_trace(children=1)) == 200
        stopping = threading.Thread(target=running.stop)
        stopping.start()
        # Shutdown waits on the processor's drain: not ready, but alive.
        wait_for(lambda: http_get(running.admin_url + "/readyz")[0] == 503, what="not ready")
        assert b"shutting down" in http_get(running.admin_url + "/readyz")[1]
        assert http_get(running.admin_url + "/healthz")[0] == 200
        metrics = http_get(running.admin_url + "/metrics")[1].decode()
        assert "ragtrace_spans_received_total" in metrics
        assert sink.span_count == 0
        processor.release.set()
        stopping.join(30)
    # The buffered trace went through the processor's drain, then out.
    assert sink.span_count == 2
    assert attributes_of(sink.spans[0].resource)["service.name"] == "svc"


class _SyncStart(Evaluating):
    def start(self) -> None:
        self.started_in_loop = asyncio.get_running_loop() is not None


class _AsyncStart(Evaluating):
    async def start(self) -> None:
        await asyncio.sleep(0)
        self.started_in_loop = True


@pytest.mark.parametrize("kind", [_SyncStart, _AsyncStart])
def test_processor_start_hook_runs_before_receivers_listen(
    sink: OtlpSink, kind: type[Evaluating]
) -> None:
    processor = kind(hold=0)
    with running_collector(collector_config(sink=sink), processor) as collector:
        assert getattr(processor, "started_in_loop", False)
        assert _post(collector, rag_trace(children=1)) == 200
        sink.wait_for_spans(3)  # root + child + the carrier span
