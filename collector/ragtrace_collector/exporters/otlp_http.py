"""OTLP/HTTP (protobuf) exporter, on aiohttp.

Retryable answers, per the OTLP specification: 429, 502, 503 and 504 (honouring
``Retry-After``), and connection failures or timeouts (a connection reset mid-answer,
bytes that are not HTTP).  Any other 4xx/5xx is permanent: the batch is dropped and
counted, with the backend's ``google.rpc.Status`` message in the log.

Answers are read up to ``_MAX_ANSWER_BYTES``.  A 2xx whose body is not an
``ExportTraceServiceResponse`` (HTML from a proxy, garbage) counts as delivered, since
the status is the protocol's verdict, and is logged.
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

from ragtrace_collector.component import Supervisor
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters.base import (
    Exporter,
    ExportError,
    UndecodableAnswer,
    rejected_in_answer,
)
from ragtrace_collector.exporters.config import (
    ClientTLSConfig,
    OtlpHttpExporterConfig,
    PhoenixExporterConfig,
)
from ragtrace_collector.otlp.codec import (
    CONTENT_TYPE_PROTOBUF,
    ExportTraceServiceRequest,
    SpanGroup,
    build_request,
)

__all__ = ["OtlpHttpExporter", "client_ssl_context", "parse_retry_after"]

_RETRYABLE_STATUS: Final = frozenset({429, 502, 503, 504})
_USER_AGENT: Final = "ragtrace-collector"
#: An answer is read up to this size; the rest is not needed and never buffered.
_MAX_ANSWER_BYTES: Final = 1024 * 1024


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
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        super().__init__(name, config, telemetry, supervisor=supervisor)
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

    def _encode(self, groups: Sequence[SpanGroup]) -> bytes:
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
                body, truncated = await _read_bounded(resp)
                status = resp.status
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                content_type = resp.headers.get("Content-Type", "")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ExportError(
                f"cannot reach {self._url}: {type(exc).__name__}: {exc}", retryable=True
            ) from None
        if 200 <= status < 300:
            return self._rejected_spans(body, content_type, truncated)
        message = _status_message(body, content_type) or f"HTTP {status}"
        raise ExportError(
            f"{self._url} answered {status}: {message}",
            retryable=status in _RETRYABLE_STATUS,
            retry_after=retry_after if status in _RETRYABLE_STATUS else None,
        )

    def _rejected_spans(self, body: bytes, content_type: str, truncated: bool) -> int:
        """Spans a 2xx answer says were rejected; an odd answer is logged, and counts
        as fully delivered (the status code is the protocol's verdict)."""
        if not body:
            return 0
        if truncated:
            self.odd_answer("export_answer_too_large", limit_bytes=_MAX_ANSWER_BYTES)
            return 0
        if "protobuf" not in content_type:
            self.odd_answer(
                "export_answer_unexpected",
                content_type=content_type[:100],
                body=_printable(body),
                detail="a 2xx without an OTLP protobuf body; counted as delivered",
            )
            return 0
        try:
            return rejected_in_answer(body)
        except UndecodableAnswer as exc:
            self.odd_answer(
                "export_answer_undecodable",
                error=str(exc),
                detail="a 2xx whose body does not decode; counted as delivered",
            )
            return 0


async def _read_bounded(resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The answer body, at most ``_MAX_ANSWER_BYTES``; True when there was more."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > _MAX_ANSWER_BYTES:
            return b"".join(chunks), True
        chunks.append(chunk)
    return b"".join(chunks), False


def _printable(body: bytes, limit: int = 200) -> str:
    return body[:limit].decode("utf-8", "replace").strip()


def _status_message(body: bytes, content_type: str) -> str:
    if not body:
        return ""
    if "protobuf" in content_type:
        status = status_pb2.Status()
        try:
            status.ParseFromString(body)
        except (DecodeError, ValueError):
            return f"undecodable google.rpc.Status ({len(body)} bytes)"
        return str(status.message)[:300]
    return _printable(body, 300)
