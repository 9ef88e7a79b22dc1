"""OTLP/HTTP (protobuf) exporter, on aiohttp.

Retryable answers, per the OTLP specification: 429, 502, 503 and 504 (honouring
``Retry-After``), and connection failures or timeouts.  Any other 4xx/5xx is
permanent: the batch is dropped and counted, with the backend's ``google.rpc.Status``
message in the log.
"""

from __future__ import annotations

import gzip
import ssl
import time
from collections.abc import Sequence
from email.utils import parsedate_to_datetime
from typing import Final

import aiohttp
from google.protobuf.message import DecodeError
from google.rpc import status_pb2  # type: ignore[import-untyped]

from ragtrace_collector.config import (
    ClientTLSConfig,
    OtlpHttpExporterConfig,
    PhoenixExporterConfig,
)
from ragtrace_collector.exporters.base import Exporter, ExportError
from ragtrace_collector.otlp import (
    CONTENT_TYPE_PROTOBUF,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
    SpanGroup,
    build_request,
)
from ragtrace_collector.telemetry import Telemetry

__all__ = ["OtlpHttpExporter", "client_ssl_context", "parse_retry_after"]

_RETRYABLE_STATUS: Final = frozenset({429, 502, 503, 504})
_USER_AGENT: Final = "ragtrace-collector"


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delay-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if seconds == seconds and seconds != float("inf") else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def client_ssl_context(tls: ClientTLSConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=str(tls.ca_file) if tls.ca_file is not None else None
    )
    if tls.cert_file is not None and tls.key_file is not None:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class OtlpHttpExporter(Exporter[bytes]):
    kind = "otlp_http"

    def __init__(
        self,
        name: str,
        config: OtlpHttpExporterConfig | PhoenixExporterConfig,
        telemetry: Telemetry,
    ) -> None:
        super().__init__(name, config, telemetry)
        self._config = config
        self._url = config.traces_url()
        self._gzip = config.compression == "gzip"
        self._headers = {
            "Content-Type": CONTENT_TYPE_PROTOBUF,
            "User-Agent": _USER_AGENT,
            **config.headers,
        }
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._session: aiohttp.ClientSession | None = None

    async def _open(self) -> None:
        ssl_arg: ssl.SSLContext | bool = True
        if self._url.startswith("https://"):
            ssl_arg = client_ssl_context(self._config.tls)
        connector = aiohttp.TCPConnector(limit=self._config.concurrency * 2, ssl=ssl_arg)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self._config.timeout),
            auto_decompress=True,
        )

    async def _close_client(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _encode(self, groups: Sequence[SpanGroup]) -> bytes:
        return self._serialize(build_request(groups))

    def _serialize(self, request: ExportTraceServiceRequest) -> bytes:
        return self._compress(request.SerializeToString())

    def _compress(self, body: bytes) -> bytes:
        if self._gzip:
            body = gzip.compress(body, compresslevel=1)
        return body

    async def _send(self, payload: bytes, spans: int) -> int:
        assert self._session is not None, "exporter not started"
        try:
            async with self._session.post(self._url, data=payload, headers=self._headers) as resp:
                body = await resp.read()
                status = resp.status
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                content_type = resp.headers.get("Content-Type", "")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ExportError(
                f"cannot reach {self._url}: {type(exc).__name__}: {exc}", retryable=True
            ) from None
        if 200 <= status < 300:
            return _rejected_spans(body, content_type)
        message = _status_message(body, content_type) or f"HTTP {status}"
        raise ExportError(
            f"{self._url} answered {status}: {message}",
            retryable=status in _RETRYABLE_STATUS,
            retry_after=retry_after if status in _RETRYABLE_STATUS else None,
        )


def _rejected_spans(body: bytes, content_type: str) -> int:
    if not body or "protobuf" not in content_type:
        return 0
    response = ExportTraceServiceResponse()
    try:
        response.ParseFromString(body)
    except DecodeError:
        return 0
    return int(response.partial_success.rejected_spans)


def _status_message(body: bytes, content_type: str) -> str:
    if not body:
        return ""
    if "protobuf" in content_type:
        status = status_pb2.Status()
        try:
            status.ParseFromString(body)
        except DecodeError:
            return ""
        return str(status.message)
    return body[:300].decode("utf-8", "replace").strip()
