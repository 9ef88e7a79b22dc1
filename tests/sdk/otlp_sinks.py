"""Real OTLP receivers on loopback for the export tests: HTTP/protobuf and gRPC.

Each records the decoded ``ExportTraceServiceRequest`` messages (and the request
headers / gRPC metadata) and lets a test wait, event-driven, for a number of spans.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

WAIT_SECONDS = 30.0


def any_value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass
class Received:
    requests: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def add(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        headers: dict[str, str],
        path: str,
    ) -> None:
        with self.cond:
            self.requests.append(request)
            self.headers.append(headers)
            self.paths.append(path)
            self.cond.notify_all()

    def spans(self) -> list[tuple[dict[str, Any], trace_pb2.ScopeSpans, trace_pb2.Span]]:
        """(resource attributes, scope spans, span) for every span received."""
        out = []
        with self.cond:
            requests = list(self.requests)
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append((resource, scope_spans, span))
        return out

    def wait_for_spans(self, count: int, timeout: float = WAIT_SECONDS) -> None:
        def enough() -> bool:
            return (
                sum(
                    len(ss.spans)
                    for r in self.requests
                    for rs in r.resource_spans
                    for ss in rs.scope_spans
                )
                >= count
            )

        with self.cond:
            if not self.cond.wait_for(enough, timeout=timeout):
                raise AssertionError(f"fewer than {count} spans arrived within {timeout}s")


@dataclass
class HttpSink:
    url: str
    received: Received
    status: int = 200
    #: when set, each request blocks until this event is set
    hold: threading.Event | None = None
    in_handler: threading.Event = field(default_factory=threading.Event)


@contextmanager
def http_sink(status: int = 200, hold: threading.Event | None = None) -> Iterator[HttpSink]:
    received = Received()
    sink_ref: list[HttpSink] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            sink = sink_ref[0]
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.add(request, {k.lower(): v for k, v in self.headers.items()}, self.path)
            if sink.hold is not None:
                sink.in_handler.set()
                sink.hold.wait(WAIT_SECONDS)
            payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(sink.status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    sink = HttpSink(url=f"http://127.0.0.1:{port}", received=received, status=status, hold=hold)
    sink_ref.append(sink)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield sink
    finally:
        if hold is not None:
            hold.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@dataclass
class GrpcSink:
    endpoint: str
    received: Received


@contextmanager
def grpc_sink() -> Iterator[GrpcSink]:
    received = Received()

    class Servicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(
            self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
        ) -> trace_service_pb2.ExportTraceServiceResponse:
            metadata = {k: v for k, v in context.invocation_metadata()}
            received.add(request, metadata, "TraceService/Export")
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield GrpcSink(endpoint=f"http://127.0.0.1:{port}", received=received)
    finally:
        server.stop(grace=None).wait(10)
