"""Test harness for the collector: run it in a thread, build configs, emit SDK traces."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from ragtrace import semconv
from ragtrace_collector.config import CollectorConfig, parse_config
from ragtrace_collector.service.pipeline import PassThroughProcessor, TraceProcessor
from ragtrace_collector.service.server import CollectorService
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan, attributes_of

T = TypeVar("T")

#: The installed ``ragtrace-collector`` console script of this environment.
COLLECTOR = Path(sys.executable).with_name("ragtrace-collector")


def collector_config(
    *,
    exporters: dict[str, dict[str, Any]] | None = None,
    sink: OtlpSink | None = None,
    sink_protocol: str = "otlp_grpc",
    **sections: dict[str, Any],
) -> CollectorConfig:
    """A config on free loopback ports; by default one exporter to ``sink``."""
    data: dict[str, Any] = {
        "receivers": {
            "grpc": {"endpoint": "127.0.0.1:0"},
            "http": {"endpoint": "127.0.0.1:0"},
        },
        "admin": {"endpoint": "127.0.0.1:0"},
        "assembly": {"decision_wait": "50ms", "max_trace_wait": "5s"},
        "shutdown": {"receiver_grace": 1, "processor_timeout": 5, "flush_timeout": 10},
    }
    if exporters is None:
        assert sink is not None, "give a sink or exporters"
        exporters = {"backend": sink_exporter(sink, sink_protocol)}
    data["exporters"] = exporters
    for key, value in sections.items():
        base = data.setdefault(key, {})
        if isinstance(base, dict):
            _merge(base, value)
        else:
            data[key] = value
    return parse_config(data, env={})


def sink_exporter(sink: OtlpSink, protocol: str = "otlp_grpc", **extra: Any) -> dict[str, Any]:
    endpoint = sink.grpc_endpoint if protocol == "otlp_grpc" else sink.http_url
    section: dict[str, Any] = {
        "type": protocol,
        "endpoint": endpoint,
        "retry": {"initial_interval": "50ms", "max_interval": "300ms"},
    }
    _merge(section, extra)
    return section


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def passthrough_sections() -> dict[str, Any]:
    """Config sections that keep ``serve`` a pure pass-through (no evaluation stage).

    These tests check the transport: spans must come out exactly as they went in.
    """
    if "evaluation" in CollectorConfig.model_fields:
        return {"evaluation": {"enabled": False}}
    return {}


class CollectorThread:
    """A :class:`CollectorService` on its own event loop in a background thread.

    Without a ``processor`` it runs :class:`PassThroughProcessor`: these tests check
    the transport, not evaluation.
    """

    def __init__(self, config: CollectorConfig, processor: TraceProcessor | None = None) -> None:
        self.config = config
        self._processor = processor if processor is not None else PassThroughProcessor()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.service: CollectorService | None = None
        self._stopped = False

    def start(self) -> CollectorThread:
        self._thread.start()

        async def _start() -> CollectorService:
            service = CollectorService(self.config, processor=self._processor)
            await service.start()
            return service

        self.service = self.run(_start)
        return self

    def run(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
        """Run a coroutine on the collector's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(factory(), self._loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 30) -> T:
        """Run a plain function on the collector's loop (for reading its state safely)."""
        fut: Future[T] = Future()

        def _do() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

        self._loop.call_soon_threadsafe(_do)
        return fut.result(timeout)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.service is not None:
            service = self.service
            self.run(service.stop, timeout=120)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    # ---------------------------------------------------------- addresses
    @property
    def svc(self) -> CollectorService:
        assert self.service is not None
        return self.service

    @property
    def http_url(self) -> str:
        addr = self.svc.http_address
        assert addr is not None
        return f"http://{addr[0]}:{addr[1]}/v1/traces"

    @property
    def grpc_endpoint(self) -> str:
        addr = self.svc.grpc_address
        assert addr is not None
        return f"{addr[0]}:{addr[1]}"

    @property
    def admin_url(self) -> str:
        addr = self.svc.admin_address
        assert addr is not None
        return f"http://{addr[0]}:{addr[1]}"

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample of the collector's own Prometheus registry (0 if absent)."""
        value = self.svc.telemetry.registry.get_sample_value(name, labels or {})
        return float(value or 0.0)


@contextmanager
def running_collector(
    config: CollectorConfig, processor: TraceProcessor | None = None
) -> Iterator[CollectorThread]:
    thread = CollectorThread(config, processor).start()
    try:
        yield thread
    finally:
        thread.stop()


def http_get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def wait_for(predicate: Callable[[], bool], timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------------- the app
@dataclass
class App:
    """A RAG app instrumented with the OTel SDK, exporting over OTLP to the collector.

    Every span also goes to an in-memory exporter: that record is the oracle the
    sink's content is compared with.
    """

    provider: TracerProvider
    memory: InMemorySpanExporter

    def emitted(self) -> list[ReadableSpan]:
        return list(self.memory.get_finished_spans())

    def shutdown(self) -> None:
        self.provider.force_flush(60_000)
        self.provider.shutdown()


def make_app(
    exporter: SpanExporter,
    *,
    service_name: str = "rag-app",
    max_queue_size: int = 20_000,
    max_export_batch_size: int = 256,
    schedule_delay_millis: int = 50,
    resource_attributes: dict[str, str] | None = None,
) -> App:
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, **(resource_attributes or {})})
    )
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=max_queue_size,
            max_export_batch_size=max_export_batch_size,
            schedule_delay_millis=schedule_delay_millis,
        )
    )
    return App(provider, memory)


def emit_rag_request(provider: TracerProvider, n: int, *, docs: int = 3) -> None:
    """One @rag-shaped trace of 3 spans: rag (root) -> retriever, generator."""
    tracer = provider.get_tracer("rag-app.instrumentation", "1.0")
    question = f"what is item {n}?"
    with tracer.start_as_current_span(f"rag {n}") as rag:
        rag.set_attribute(semconv.OPENINFERENCE_SPAN_KIND, semconv.OI_KIND_CHAIN)
        rag.set_attribute(semconv.RAGTRACE_SPAN_KIND, semconv.KIND_RAG)
        rag.set_attribute(semconv.INPUT_VALUE, question)
        rag.set_attribute(semconv.SESSION_ID, f"session-{n % 7}")
        rag.set_attribute(semconv.TURN_INDEX, n % 5)
        with tracer.start_as_current_span("retrieve", kind=SpanKind.CLIENT) as ret:
            ret.set_attribute(semconv.OPENINFERENCE_SPAN_KIND, semconv.OI_KIND_RETRIEVER)
            ret.set_attribute(semconv.RAGTRACE_SPAN_KIND, semconv.KIND_RETRIEVER)
            ret.set_attribute(semconv.GEN_AI_OPERATION_NAME, semconv.GEN_AI_OPERATION_RETRIEVAL)
            ret.set_attribute(semconv.GEN_AI_RETRIEVAL_QUERY_TEXT, question)
            for i in range(docs):
                prefix = semconv.RETRIEVAL_DOCUMENTS
                ret.set_attribute(
                    semconv.document_attr(prefix, i, semconv.DOCUMENT_ID), f"d{n}-{i}"
                )
                ret.set_attribute(
                    semconv.document_attr(prefix, i, semconv.DOCUMENT_CONTENT),
                    f"Item {n} is described in document {i}. ünïcödé ✓",
                )
                ret.set_attribute(
                    semconv.document_attr(prefix, i, semconv.DOCUMENT_SCORE), 1.0 / (i + 1)
                )
            ret.add_event("retrieved", {"count": docs, "ids": [f"d{n}-{i}" for i in range(docs)]})
        with tracer.start_as_current_span("generate") as gen:
            gen.set_attribute(semconv.OPENINFERENCE_SPAN_KIND, semconv.OI_KIND_LLM)
            gen.set_attribute(semconv.RAGTRACE_SPAN_KIND, semconv.KIND_GENERATOR)
            gen.set_attribute(semconv.LLM_MODEL_NAME, "offline")
            gen.set_attribute("flag.bool", n % 2 == 0)
            gen.set_attribute("list.int", [1, 2, n])
            gen.set_status(Status(StatusCode.OK))
        rag.set_attribute(semconv.OUTPUT_VALUE, f"item {n} is fine")


def span_key(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _normalise(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_normalise(v) for v in value]
    return value


def assert_delivered_exactly(emitted: list[ReadableSpan], received: list[ReceivedSpan]) -> None:
    """Every emitted span arrived exactly once, with all its attributes and events."""
    by_key: dict[tuple[str, str], list[ReceivedSpan]] = {}
    for r in received:
        by_key.setdefault(r.key, []).append(r)
    dupes = {k: len(v) for k, v in by_key.items() if len(v) > 1}
    assert not dupes, f"{len(dupes)} spans delivered more than once, e.g. {next(iter(dupes))}"
    assert len(received) == len(emitted), f"received {len(received)} spans, emitted {len(emitted)}"
    for span in emitted:
        key = span_key(span)
        assert key in by_key, f"span {span.name} {key} never arrived"
        got = by_key[key][0]
        assert got.span.name == span.name
        want_attrs = {k: _normalise(v) for k, v in (span.attributes or {}).items()}
        assert got.attributes == want_attrs, f"attributes differ for {span.name}"
        parent = span.parent
        assert got.span.parent_span_id.hex() == (f"{parent.span_id:016x}" if parent else "")
        assert got.span.start_time_unix_nano == span.start_time
        assert got.span.end_time_unix_nano == span.end_time
        assert [e.name for e in got.span.events] == [e.name for e in span.events]
        for got_event, want_event in zip(got.span.events, span.events, strict=True):
            want = {k: _normalise(v) for k, v in (want_event.attributes or {}).items()}
            assert attributes_of(got_event) == want
        assert got.span.status.code == span.status.status_code.value
        want_res = {k: _normalise(v) for k, v in span.resource.attributes.items()}
        assert attributes_of(got.resource) == want_res
        assert got.scope.name == (
            span.instrumentation_scope.name if span.instrumentation_scope else ""
        )


def admin_json(url: str) -> tuple[int, dict[str, Any]]:
    status, body = http_get(url)
    return status, json.loads(body)


def serve_until_exit(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``ragtrace-collector serve --config config`` run to its exit (a collector that
    refuses to start), with its output."""
    return subprocess.run(
        [
            str(Path(sys.executable).with_name("ragtrace-collector")),
            "serve",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


class ServeProcess:
    """``ragtrace-collector serve`` as a subprocess; ports come from its JSON logs.

    The config is written as given plus, with ``passthrough`` (the default), the
    sections that keep it a pure pass-through.  ``wait_ready=False`` returns at once
    (for a process expected to refuse to start).
    """

    def __init__(
        self,
        config: dict[str, Any],
        directory: Path,
        *,
        env: dict[str, str] | None = None,
        passthrough: bool = True,
        wait_ready: bool = True,
        timeout: float = 30,
    ) -> None:
        path = directory / "collector.yaml"
        path.write_text(
            yaml.safe_dump({**config, **passthrough_sections()} if passthrough else config)
        )
        self.proc = subprocess.Popen(
            [str(COLLECTOR), "serve", "--config", str(path)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.events: list[dict[str, Any]] = []
        self.endpoints: dict[str, str] = {}
        self._ready = threading.Event()
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()
        if not wait_ready:
            return
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"collector did not start: {self.events[-10:]}")

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = None
            if not isinstance(event, dict):
                event = {"event": "raw", "line": line}
            self.events.append(event)
            if event.get("event") == "receiver_listening":
                self.endpoints[event["receiver"]] = event["endpoint"]
            if event.get("event") == "admin_listening":
                self.endpoints["admin"] = event["endpoint"]
            if event.get("event") == "collector_ready":
                self._ready.set()

    @property
    def http_url(self) -> str:
        return f"http://{self.endpoints['otlp_http']}"

    def event(self, name: str) -> dict[str, Any] | None:
        """The first log event called ``name``, if any."""
        return next((e for e in self.events if e.get("event") == name), None)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit and its log to be read; the exit code."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._reader.join(timeout=10)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of the samples of ``name`` on /metrics (matching ``labels`` if given)."""
        _, body = http_get(f"http://{self.endpoints['admin']}/metrics")
        want = [f'{k}="{v}"' for k, v in (labels or {}).items()]
        total = 0.0
        for line in body.decode().splitlines():
            if line.startswith((name + " ", name + "{")) and all(w in line for w in want):
                total += float(line.split()[-1])
        return total
