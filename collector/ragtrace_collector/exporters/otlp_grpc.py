"""OTLP/gRPC exporter, on grpc.aio with a raw-bytes unary call (no generated stubs).

Retryable codes, per the OTLP specification: CANCELLED, DEADLINE_EXCEEDED, ABORTED,
OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS, and RESOURCE_EXHAUSTED only when the server
sent a RetryInfo (it then says how long to wait).  Everything else is permanent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from ragtrace_collector.component import Supervisor
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters.base import (
    Exporter,
    ExportError,
    UndecodableAnswer,
    rejected_in_answer,
)
from ragtrace_collector.exporters.config import OtlpGrpcExporterConfig
from ragtrace_collector.otlp.codec import (
    GRPC_EXPORT_METHOD,
    SpanGroup,
    build_request,
    retry_delay_from_status,
)

__all__ = ["OtlpGrpcExporter", "retry_delay_from_metadata"]

_RETRYABLE: Final = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
_MAX_MESSAGE: Final = 64 * 1024 * 1024


def retry_delay_from_metadata(metadata: Any) -> float | None:
    """The RetryInfo delay in gRPC trailing metadata, if any.

    Reads the standard ``grpc-status-details-bin`` (a google.rpc.Status with details)
    and the ``google.rpc.retryinfo-bin`` key some servers send on its own.
    """
    if not metadata:
        return None
    for key, value in metadata:
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except (DecodeError, ValueError):
                continue
            delay = retry_delay_from_status(status)
            if delay is not None:
                return delay
        elif key == "google.rpc.retryinfo-bin" and isinstance(value, bytes):
            info = error_details_pb2.RetryInfo()
            try:
                info.ParseFromString(value)
            except (DecodeError, ValueError):
                continue
            return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


class OtlpGrpcExporter(Exporter[bytes]):
    kind = "otlp_grpc"

    def __init__(
        self,
        name: str,
        config: OtlpGrpcExporterConfig,
        telemetry: Telemetry,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        super().__init__(name, config, telemetry, supervisor=supervisor)
        self._config = config
        self._target = config.target()
        self._metadata = tuple(config.headers.items())
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None

    async def _open(self) -> None:
        options = [
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.primary_user_agent", "ragtrace-collector"),
        ]
        compression = (
            grpc.Compression.Gzip
            if self._config.compression == "gzip"
            else grpc.Compression.NoCompression
        )
        if self._config.use_tls():
            tls = self._config.tls
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca_file.read_bytes() if tls.ca_file else None,
                private_key=tls.key_file.read_bytes() if tls.key_file else None,
                certificate_chain=tls.cert_file.read_bytes() if tls.cert_file else None,
            )
            self._channel = grpc.aio.secure_channel(
                self._target, credentials, options=options, compression=compression
            )
        else:
            self._channel = grpc.aio.insecure_channel(
                self._target, options=options, compression=compression
            )
        self._call = self._channel.unary_unary(
            GRPC_EXPORT_METHOD, request_serializer=None, response_deserializer=None
        )

    async def _close_client(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def _encode(self, groups: Sequence[SpanGroup]) -> bytes:
        payload: bytes = build_request(groups).SerializeToString()
        return payload

    async def _send(self, payload: bytes, spans: int) -> int:
        assert self._call is not None, "exporter not started"
        try:
            answer = await self._call(
                payload, metadata=self._metadata, timeout=self._config.timeout
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            delay = retry_delay_from_metadata(exc.trailing_metadata())
            retryable = code in _RETRYABLE or (
                code is grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None
            )
            raise ExportError(
                f"{self._target} answered {code.name}: {str(exc.details())[:300]}",
                retryable=retryable,
                retry_after=delay if retryable else None,
            ) from None
        if not isinstance(answer, bytes):
            self.odd_answer("export_answer_unexpected", answer_type=type(answer).__name__)
            return 0
        try:
            return rejected_in_answer(answer)
        except UndecodableAnswer as exc:
            # An OK status is the protocol's verdict: delivered, and the odd body logged.
            self.odd_answer("export_answer_undecodable", error=str(exc))
            return 0
