"""OTLP/HTTP receiver: ``POST /v1/traces``, protobuf or JSON, optional gzip.

Answers, per the OTLP/HTTP specification (the body is always in the request's
encoding; a ``google.rpc.Status`` for errors):

=====================================  ======  ======================================
situation                              status  notes
=====================================  ======  ======================================
accepted                               200     ExportTraceServiceResponse (partial
                                               success lists spans with bad ids)
missing or wrong bearer token          401     ``WWW-Authenticate: Bearer``
Content-Type not protobuf or JSON      415     also an unknown Content-Encoding
body (or its decompression) too large  413
malformed protobuf / JSON / gzip       400
queue full (back-pressure)             429     ``Retry-After``; retryable
shutting down                          503     ``Retry-After``; retryable
=====================================  ======  ======================================

aiohttp's automatic request decompression is off: the receiver inflates the body
itself, so a gzip bomb stops at ``max_request_bytes`` and bad gzip gets a clear 400.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import zlib
from typing import Final

from aiohttp import web
from google.protobuf.message import Message

from ragtrace_collector.config import HttpReceiverConfig, ServerTLSConfig, split_host_port
from ragtrace_collector.logs import get_logger
from ragtrace_collector.otlp import (
    CODE_INVALID_ARGUMENT,
    CODE_RESOURCE_EXHAUSTED,
    CODE_UNAUTHENTICATED,
    CODE_UNAVAILABLE,
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_PROTOBUF,
    OtlpDecodeError,
    decode_json_request,
    decode_protobuf_request,
    encode_json,
    export_response,
    rpc_status,
    split_request,
)
from ragtrace_collector.pipeline import Pipeline, Refused
from ragtrace_collector.receivers.auth import BearerAuth
from ragtrace_collector.telemetry import Telemetry

__all__ = ["HttpReceiver", "server_ssl_context"]

_PATH: Final = "/v1/traces"
_RECEIVER: Final = "otlp_http"
#: OTLP/JSON bodies larger than this are decoded in a worker thread.
_JSON_INLINE_BYTES: Final = 64 * 1024


class _BadRequest(Exception):
    def __init__(self, http_status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.reason = reason
        self.message = message


def server_ssl_context(tls: ServerTLSConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    if tls.client_ca_file is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(str(tls.client_ca_file))
    return context


def _inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """Decompress a gzip (possibly multi-member) or zlib body, at most ``limit`` bytes."""
    wbits = 31 if encoding == "gzip" else 15
    out = bytearray()
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            out += inflater.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise _BadRequest(400, "bad_compression", f"invalid {encoding} body: {exc}") from None
        if len(out) > limit:
            raise _BadRequest(
                413, "too_large", f"decompressed body exceeds the limit of {limit} bytes"
            )
        if not inflater.eof:
            raise _BadRequest(400, "bad_compression", f"truncated {encoding} body")
        data = inflater.unused_data
        if not data:
            return bytes(out)
        if encoding != "gzip":
            raise _BadRequest(400, "bad_compression", f"trailing bytes after the {encoding} stream")


class HttpReceiver:
    """The OTLP/HTTP server (aiohttp) feeding a :class:`Pipeline`."""

    def __init__(
        self,
        config: HttpReceiverConfig,
        *,
        pipeline: Pipeline,
        auth: BearerAuth,
        telemetry: Telemetry,
        grace: float = 5.0,
    ) -> None:
        self._config = config
        self._grace = grace
        self._pipeline = pipeline
        self._auth = auth
        self._telemetry = telemetry
        self._limit = config.max_request_bytes
        self._log = get_logger("receiver").bind(receiver=_RECEIVER)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        app = web.Application(client_max_size=self._limit)
        app.router.add_post(_PATH, self._handle)
        runner = web.AppRunner(
            app,
            access_log=None,
            auto_decompress=False,
            handle_signals=False,
            shutdown_timeout=self._grace,
        )
        await runner.setup()
        host, port = split_host_port(self._config.endpoint)
        ssl_context = server_ssl_context(self._config.tls) if self._config.tls else None
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        sockname = runner.addresses[0]
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    async def stop_listening(self) -> None:
        """Close the listening socket; requests already in progress continue."""
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish (within the grace period)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ----------------------------------------------------------------- handle
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw_type = request.headers.get("Content-Type", "")
        content_type = raw_type.split(";", 1)[0].strip().lower()
        as_json = content_type == CONTENT_TYPE_JSON
        if not self._auth.check(request.headers.get("Authorization")):
            return self._reject(
                401,
                "unauthenticated",
                CODE_UNAUTHENTICATED,
                "missing or invalid bearer token",
                as_json,
                extra_headers={"WWW-Authenticate": "Bearer"},
            )
        if content_type not in (CONTENT_TYPE_PROTOBUF, CONTENT_TYPE_JSON):
            return self._reject(
                415,
                "content_type",
                CODE_INVALID_ARGUMENT,
                f"unsupported Content-Type {raw_type!r}: use "
                f"{CONTENT_TYPE_PROTOBUF} or {CONTENT_TYPE_JSON}",
                False,
            )
        try:
            body = await self._read_body(request)
            if not as_json:
                export = decode_protobuf_request(body)
            elif len(body) <= _JSON_INLINE_BYTES:
                export = decode_json_request(body)
            else:  # pure-Python parsing: keep the event loop responsive meanwhile
                export = await asyncio.to_thread(decode_json_request, body)
        except _BadRequest as exc:
            return self._reject(
                exc.http_status, exc.reason, CODE_INVALID_ARGUMENT, exc.message, as_json
            )
        except OtlpDecodeError as exc:
            return self._reject(400, "malformed", CODE_INVALID_ARGUMENT, str(exc), as_json)
        except Exception as exc:  # whatever a hostile body provokes: still a 400
            return self._reject(
                400,
                "malformed",
                CODE_INVALID_ARGUMENT,
                f"cannot decode the request: {exc!r}",
                as_json,
            )
        split = split_request(export)
        try:
            await self._pipeline.accept(split, _RECEIVER, export if as_json else body)
        except Refused as refused:
            status = 503 if refused.reason == "shutting_down" else 429
            code = CODE_UNAVAILABLE if status == 503 else CODE_RESOURCE_EXHAUSTED
            seconds = max(1, math.ceil(refused.retry_after))
            return self._encode(
                status,
                rpc_status(code, refused.message, retry_delay=refused.retry_after),
                as_json,
                {"Retry-After": str(seconds)},
            )
        return self._encode(
            200, export_response(split.rejected_spans, split.error_message), as_json
        )

    async def _read_body(self, request: web.Request) -> bytes:
        length = request.content_length
        if length is not None and length > self._limit:
            raise _BadRequest(
                413, "too_large", f"body of {length} bytes exceeds the limit of {self._limit} bytes"
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _BadRequest(
                413, "too_large", f"body exceeds the limit of {self._limit} bytes"
            ) from None
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            return body
        if encoding in ("gzip", "deflate"):
            return _inflate(body, encoding, self._limit)
        raise _BadRequest(
            415, "content_encoding", f"unsupported Content-Encoding {encoding!r}: use gzip"
        )

    # -------------------------------------------------------------- responses
    def _reject(
        self,
        http_status: int,
        reason: str,
        code: int,
        message: str,
        as_json: bool,
        *,
        extra_headers: dict[str, str] | None = None,
    ) -> web.Response:
        self._telemetry.requests_rejected.labels(_RECEIVER, reason).inc()
        self._log.info("request_rejected", status=http_status, reason=reason, error=message)
        return self._encode(http_status, rpc_status(code, message), as_json, extra_headers)

    @staticmethod
    def _encode(
        status: int,
        message: Message,
        as_json: bool,
        extra_headers: dict[str, str] | None = None,
    ) -> web.Response:
        if as_json:
            body, content_type = encode_json(message), CONTENT_TYPE_JSON
        else:
            body, content_type = message.SerializeToString(), CONTENT_TYPE_PROTOBUF
        return web.Response(
            status=status, body=body, content_type=content_type, headers=extra_headers
        )
