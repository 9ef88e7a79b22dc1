"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

The method is registered as a generic handler that takes raw bytes, so decoding is
ours: a malformed message gets INVALID_ARGUMENT with a clear message.  Statuses:

* missing or wrong bearer token (``authorization`` metadata): UNAUTHENTICATED;
* malformed request: INVALID_ARGUMENT;
* message over ``max_request_bytes``: RESOURCE_EXHAUSTED (from gRPC itself);
* queue full: RESOURCE_EXHAUSTED with a RetryInfo (retryable per the OTLP spec);
* shutting down: UNAVAILABLE with a RetryInfo.

RetryInfo travels in ``grpc-status-details-bin`` (a google.rpc.Status, the standard
place) and also alone under ``google.rpc.retryinfo-bin``, which is where the
OpenTelemetry Python exporter looks for it.

gRPC itself inflates compressed messages (in its C core, bounded by
``max_request_bytes``); decoding and splitting a large message run on the shared
:class:`~ragtrace_collector.receivers.decode.Decoder`, off the event loop.  Connections
are bounded by ``max_concurrent_streams`` (calls per connection) and closed after
``keepalive_timeout`` without a call; keep-alive pings probe dead peers.

The receiver is the component ``receiver:otlp_grpc`` (``starting``, ``ok`` once it
listens, ``permanent_error`` when its port cannot be bound, ``stopping``,
``stopped``).
"""

from __future__ import annotations

from typing import Any, Final

import grpc

from ragtrace_collector.component import Component, Status
from ragtrace_collector.component.consumer import Refused, TraceConsumer
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.configbase import split_host_port
from ragtrace_collector.otlp.codec import (
    OtlpDecodeError,
    decode_failure,
    export_response,
    retry_info,
    rpc_status,
)
from ragtrace_collector.receivers.auth import BearerAuth
from ragtrace_collector.receivers.config import GrpcReceiverConfig
from ragtrace_collector.receivers.decode import Decoder, InflateBudget

__all__ = ["GrpcReceiver"]

_RECEIVER: Final = "otlp_grpc"
_SERVICE: Final = "opentelemetry.proto.collector.trace.v1.TraceService"


class GrpcReceiver(Component):
    """The OTLP/gRPC server (grpc.aio) feeding the pipeline (a
    :class:`~ragtrace_collector.component.consumer.TraceConsumer`)."""

    component_name = f"receiver:{_RECEIVER}"

    def __init__(
        self,
        config: GrpcReceiverConfig,
        *,
        pipeline: TraceConsumer,
        auth: BearerAuth,
        telemetry: Telemetry,
        grace: float = 5.0,
        decoder: Decoder | None = None,
    ) -> None:
        self._config = config
        self._decoder = decoder if decoder is not None else Decoder()
        self._owns_decoder = decoder is None
        self._budget = InflateBudget(config.max_request_bytes)
        self._pipeline = pipeline
        self._auth = auth
        self._telemetry = telemetry
        self._grace = grace
        self._log = get_logger("receiver").bind(receiver=_RECEIVER)
        self._server: grpc.aio.Server | None = None
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        self.report(Status.STARTING)
        limit = self._config.max_request_bytes
        idle_ms = int(self._config.keepalive_timeout * 1000)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
                ("grpc.max_concurrent_streams", self._config.max_concurrent_streams),
                ("grpc.max_connection_idle_ms", idle_ms),
                # Ping an idle peer now and then; drop it when the ping goes unanswered.
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
                # Clients may ping (OTel SDKs do) but not flood the server with pings.
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
            ]
        )
        handler = grpc.method_handlers_generic_handler(
            _SERVICE,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export, request_deserializer=None, response_serializer=None
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        host, port = split_host_port(self._config.endpoint)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if self._config.tls is not None:
                tls = self._config.tls
                credentials = grpc.ssl_server_credentials(
                    [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())],
                    root_certificates=tls.client_ca_file.read_bytes()
                    if tls.client_ca_file
                    else None,
                    require_client_auth=tls.client_ca_file is not None,
                )
                bound = server.add_secure_port(target, credentials)
            else:
                bound = server.add_insecure_port(target)
        except RuntimeError as exc:
            error = OSError(f"cannot listen on {target}: {exc}")
            self.report(Status.PERMANENT_ERROR, error)
            raise error from None
        if not bound:
            error = OSError(f"cannot listen on {target} (address in use?)")
            self.report(Status.PERMANENT_ERROR, error)
            raise error
        await server.start()
        self._server = server
        self.address = (host, bound)
        self.report(Status.OK)
        return self.address

    async def stop(self) -> None:
        """Stop accepting calls; calls in progress may finish within the grace period."""
        if self._server is not None:
            self.report(Status.STOPPING)
            await self._server.stop(self._grace)
            self._server = None
            self.report(Status.STOPPED)
        if self._owns_decoder:
            await self._decoder.aclose()

    async def _export(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        if self._auth.enabled:
            header = None
            for key, value in context.invocation_metadata() or ():
                if key == "authorization":
                    header = value if isinstance(value, str) else value.decode("latin-1")
                    break
            if not self._auth.check(header):
                self._reject("unauthenticated", "missing or invalid bearer token")
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token"
                )
        try:
            split = await self._decoder.decode(
                request, encoding="identity", as_json=False, budget=self._budget
            )
        except OtlpDecodeError as exc:
            self._reject("malformed", str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # whatever a hostile message provokes: still INVALID_ARGUMENT
            message = decode_failure(exc)
            self._reject("malformed", message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        try:
            await self._pipeline.accept(split, _RECEIVER, request)
        except Refused as refused:
            code = (
                grpc.StatusCode.UNAVAILABLE
                if refused.reason == "shutting_down"
                else grpc.StatusCode.RESOURCE_EXHAUSTED
            )
            status = rpc_status(code.value[0], refused.message, retry_delay=refused.retry_after)
            await context.abort(
                code,
                refused.message,
                trailing_metadata=(
                    ("grpc-status-details-bin", status.SerializeToString()),
                    (
                        "google.rpc.retryinfo-bin",
                        retry_info(refused.retry_after).SerializeToString(),
                    ),
                ),
            )
        response: bytes = export_response(
            split.rejected_spans, split.error_message
        ).SerializeToString()
        return response

    def _reject(self, reason: str, message: str) -> None:
        self._telemetry.requests_rejected.labels(_RECEIVER, reason).inc()
        self._log.info("request_rejected", reason=reason, error=message)
