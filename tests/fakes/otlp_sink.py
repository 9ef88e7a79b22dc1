"""A real OTLP backend for tests: gRPC and HTTP receivers on loopback that record spans.

It runs its own event loop in a background thread, so synchronous test code (and the
OTel SDK's blocking exporters) can use it directly.  It can be scripted to misbehave:

* ``fail_next(n, ...)``: answer the next ``n`` export calls with a retryable (or any)
  error status, optionally with Retry-After / RetryInfo;
* ``go_down()`` / ``come_up()``: close the listening sockets and every connection
  (clients see "connection refused"), then listen again on the same ports;
* ``delay``: seconds to wait before answering each call (a slow backend);
* ``hold``: a ``threading.Event``; each call waits until it is set (a backend that
  hangs), and ``holding`` is set once a call is waiting;
* ``answer_next(n, ...)`` (HTTP): answer the next ``n`` calls with what a broken
  backend sends: any status and body (``partial_success`` out of range, garbage), bytes
  that are not HTTP at all, or a connection closed without an answer; the spans are
  recorded only when ``record`` says the backend kept them.  ``stop_answering()``
  clears the script.

Spans of a call answered with a scripted failure are not recorded, only counted
(``refused_span_count``).

It decodes only what an OTLP exporter sends: protobuf, optionally gzip.  It is
deliberately independent of ``ragtrace_collector`` so it can judge the collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from aiohttp import web
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["OtlpSink", "ReceivedSpan", "attributes_of", "partial_success"]

_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def attributes_of(message: Any) -> dict[str, Any]:
    """A span's (resource's, event's) attributes as a plain dict."""
    return {kv.key: _value(kv.value) for kv in message.attributes}


@dataclass(frozen=True)
class ReceivedSpan:
    span: Span
    resource: Resource
    scope: InstrumentationScope
    via: str  # "grpc" or "http"

    @property
    def key(self) -> tuple[str, str]:
        return self.span.trace_id.hex(), self.span.span_id.hex()

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes_of(self.span)

    @property
    def service_name(self) -> str | None:
        return attributes_of(self.resource).get("service.name")


@dataclass
class _Answer:
    remaining: int
    status: int
    body: bytes
    content_type: str
    record: bool
    raw: bytes | None  # written to the socket instead of an HTTP response
    close: bool  # close the connection without an answer


@dataclass
class _Failure:
    remaining: int
    http_status: int
    grpc_code: grpc.StatusCode
    retry_after: float | None
    message: str


class OtlpSink:
    """OTLP/gRPC + OTLP/HTTP receivers on 127.0.0.1 that record every span."""

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.grpc_port = 0
        self.http_port = 0
        self.delay = 0.0
        #: When set, every export call waits (at most 30 s) until the event is set.
        self.hold: threading.Event | None = None
        #: Set once an export call is waiting on ``hold``.
        self.holding = threading.Event()
        self._lock = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self._requests = 0
        self._refused_spans = 0
        #: Spans in each export call recorded, in arrival order.
        self.request_spans: list[int] = []
        #: Headers (HTTP) or metadata (gRPC) of every export call, lower-cased keys.
        self.headers: list[dict[str, str]] = []
        #: Path (HTTP) or method (gRPC) of every export call.
        self.paths: list[str] = []
        self._failures: list[_Failure] = []
        self.failures_served = 0
        self._answers: list[_Answer] = []
        self.answers_served = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._grpc_server: grpc.aio.Server | None = None
        self._http_runner: web.AppRunner | None = None
        self._up = False

    # ------------------------------------------------------------- lifecycle
    def start(self) -> OtlpSink:
        ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.result(timeout=30)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        if self.hold is not None:
            self.hold.set()
        self._call(self._stop_servers)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop = None

    def __enter__(self) -> OtlpSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def go_down(self) -> None:
        """Close listeners and connections: clients get connection refused."""
        self._call(self._stop_servers)

    def come_up(self) -> None:
        """Listen again, on the same ports."""
        self._call(self._start_servers)

    @property
    def is_up(self) -> bool:
        return self._up

    # ------------------------------------------------------------- endpoints
    @property
    def grpc_endpoint(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    # ------------------------------------------------------------- recording
    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    @property
    def span_count(self) -> int:
        with self._lock:
            return len(self._spans)

    @property
    def requests(self) -> int:
        """Export calls that were answered with success."""
        with self._lock:
            return self._requests

    @property
    def refused_span_count(self) -> int:
        """Spans of the export calls answered with a scripted failure."""
        with self._lock:
            return self._refused_spans

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()
            self._requests = 0
            self.request_spans.clear()

    def wait_for_spans(self, count: int, timeout: float = 30.0) -> list[ReceivedSpan]:
        """Block until at least ``count`` spans arrived; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self._spans) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"sink got {len(self._spans)} spans, expected {count} within {timeout}s"
                    )
                self._lock.wait(left)
            return list(self._spans)

    def wait_for_traces(
        self, trace_ids: Collection[bytes], count: int, timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """Block until at least ``count`` spans of these traces arrived, and return them:
        a sink shared by several tests may also get another test's spans, even late."""
        wanted = set(trace_ids)

        def mine() -> list[ReceivedSpan]:
            return [r for r in self._spans if r.span.trace_id in wanted]

        deadline = time.monotonic() + timeout
        with self._lock:
            while len(found := mine()) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"sink got {len(found)} spans of these traces, expected {count} "
                        f"within {timeout}s"
                    )
                self._lock.wait(left)
            return found

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("sink condition not met in time")
                self._lock.wait(min(left, 0.05))

    # ------------------------------------------------------------- scripting
    def fail_next(
        self,
        count: int,
        *,
        http_status: int = 503,
        grpc_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        retry_after: float | None = None,
        message: str = "scripted failure",
    ) -> None:
        with self._lock:
            self._failures.append(_Failure(count, http_status, grpc_code, retry_after, message))

    def answer_next(
        self,
        count: int,
        *,
        status: int = 200,
        body: bytes = b"",
        content_type: str = "application/x-protobuf",
        record: bool = True,
        raw: bytes | None = None,
        close: bool = False,
    ) -> None:
        """Script the next ``count`` HTTP answers (see the module docstring)."""
        with self._lock:
            self._answers.append(_Answer(count, status, body, content_type, record, raw, close))

    def stop_answering(self) -> None:
        with self._lock:
            self._answers.clear()

    def _next_answer(self) -> _Answer | None:
        with self._lock:
            answer = _take_scripted(self._answers)
            self.answers_served += answer is not None
            return answer

    def _next_failure(self) -> _Failure | None:
        with self._lock:
            failure = _take_scripted(self._failures)
            self.failures_served += failure is not None
            return failure

    def _record(self, request: ExportTraceServiceRequest, via: str) -> None:
        received = [
            ReceivedSpan(span, rs.resource, ss.scope, via)
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]
        with self._lock:
            self._spans.extend(received)
            self._requests += 1
            self.request_spans.append(len(received))
            self._lock.notify_all()

    def _refuse(self, body: bytes) -> None:
        count = _span_count(body)
        with self._lock:
            self._refused_spans += count
            self._lock.notify_all()

    def _arrived(self, headers: dict[str, str], path: str) -> None:
        with self._lock:
            self.headers.append(headers)
            self.paths.append(path)

    async def _stall(self) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        hold = self.hold
        if hold is not None and not hold.is_set():
            self.holding.set()
            await asyncio.to_thread(hold.wait, 30.0)

    # ----------------------------------------------------------------- loop
    def _run(self, ready: Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start_servers())
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def _call(self, factory: Callable[[], Any]) -> Any:
        assert self._loop is not None, "sink not started"
        return asyncio.run_coroutine_threadsafe(factory(), self._loop).result(timeout=30)

    async def _start_servers(self) -> None:
        if self._up:
            return
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            _SERVICE,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._grpc_export, request_deserializer=None, response_serializer=None
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        self.grpc_port = server.add_insecure_port(f"{self.host}:{self.grpc_port}")
        await server.start()
        self._grpc_server = server

        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._http_export)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, auto_decompress=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.http_port, reuse_address=True)
        await site.start()
        self.http_port = int(runner.addresses[0][1])
        self._http_runner = runner
        self._up = True

    async def _stop_servers(self) -> None:
        self._up = False
        if self._grpc_server is not None:
            await self._grpc_server.stop(0)
            self._grpc_server = None
        if self._http_runner is not None:
            await self._http_runner.cleanup()
            self._http_runner = None

    # ------------------------------------------------------------- handlers
    async def _grpc_export(self, body: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self._arrived(
            {
                k: v if isinstance(v, str) else v.decode()
                for k, v in context.invocation_metadata() or ()
            },
            f"/{_SERVICE}/Export",
        )
        await self._stall()
        failure = self._next_failure()
        if failure is not None:
            self._refuse(body)
            trailing: tuple[tuple[str, bytes], ...] = ()
            if failure.retry_after is not None:
                info = _retry_info(failure.retry_after)
                status = status_pb2.Status(code=failure.grpc_code.value[0], message=failure.message)
                status.details.add().Pack(info)
                trailing = (("grpc-status-details-bin", status.SerializeToString()),)
            await context.abort(failure.grpc_code, failure.message, trailing_metadata=trailing)
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sink: bad request: {exc}")
        self._record(request, "grpc")
        response: bytes = ExportTraceServiceResponse().SerializeToString()
        return response

    async def _http_export(self, request: web.Request) -> web.Response:
        self._arrived({k.lower(): v for k, v in request.headers.items()}, request.path)
        await self._stall()
        failure = self._next_failure()
        if failure is not None:
            with contextlib.suppress(Exception):
                self._refuse(_http_body(await request.read(), request))
            headers = {}
            if failure.retry_after is not None:
                headers["Retry-After"] = str(max(0, round(failure.retry_after)))
            status = status_pb2.Status(code=failure.grpc_code.value[0], message=failure.message)
            return web.Response(
                status=failure.http_status,
                body=status.SerializeToString(),
                content_type="application/x-protobuf",
                headers=headers,
            )
        body = _http_body(await request.read(), request)
        scripted = self._next_answer()
        if scripted is not None:
            return await self._scripted(request, body, scripted)
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415, text="sink: protobuf only")
        export = ExportTraceServiceRequest()
        try:
            export.ParseFromString(body)
        except Exception as exc:
            return web.Response(status=400, text=f"sink: bad request: {exc}")
        self._record(export, "http")
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def _scripted(self, request: web.Request, body: bytes, answer: _Answer) -> web.Response:
        if answer.record:
            export = ExportTraceServiceRequest()
            export.ParseFromString(body)
            self._record(export, "http")
        else:
            self._refuse(body)
        transport = request.transport
        if (answer.raw is not None or answer.close) and transport is not None:
            if answer.raw is not None:
                transport.write(answer.raw)
            transport.close()
            # The connection is gone; aiohttp's attempt to answer fails quietly.
            raise asyncio.CancelledError
        return web.Response(
            status=answer.status, body=answer.body, content_type=answer.content_type
        )


_Scripted = TypeVar("_Scripted", _Answer, _Failure)


def _take_scripted(script: list[_Scripted]) -> _Scripted | None:
    """The next scripted entry with uses left (one use taken), or None."""
    while script and script[0].remaining <= 0:
        script.pop(0)
    if not script:
        return None
    script[0].remaining -= 1
    return script[0]


def partial_success(rejected_spans: int, message: str = "") -> bytes:
    """An encoded ``ExportTraceServiceResponse`` with a partial success (any value)."""
    response = ExportTraceServiceResponse()
    response.partial_success.rejected_spans = rejected_spans
    response.partial_success.error_message = message
    encoded: bytes = response.SerializeToString()
    return encoded


def _http_body(body: bytes, request: web.Request) -> bytes:
    if request.headers.get("Content-Encoding", "").lower() == "gzip":
        return gzip.decompress(body)
    return body


def _span_count(body: bytes) -> int:
    """Spans in an encoded export request; 0 when it does not parse."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except Exception:
        return 0
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def _retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    whole = int(seconds)
    return error_details_pb2.RetryInfo(
        retry_delay=Duration(seconds=whole, nanos=int((seconds - whole) * 1e9))
    )
