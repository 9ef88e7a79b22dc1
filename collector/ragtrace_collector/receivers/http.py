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
body (or its decompression) too large  413     also a gzip of too many members
malformed protobuf / JSON / gzip       400
body not received in read_timeout      408
queue full (back-pressure)             429     ``Retry-After``; retryable
shutting down                          503     ``Retry-After``; retryable
=====================================  ======  ======================================

The same port serves ``POST /v1/feedback`` (user feedback as JSON,
:mod:`ragtrace_collector.feedback.ingest`) when feedback is on: the same bearer token,
its own body bound (``feedback.max_body``, 413) and rate bound (``feedback.rate``: 429
with ``Retry-After``, checked before the body is read), 400 with a JSON error naming the
field, 415 for a body that is not JSON, and 202 once the feedback span is as durable as
an acknowledged span (written to the write-ahead log by the same
:meth:`TraceConsumer.accept`); 429/503 when the pipeline refuses, as for OTLP.  Errors
are ``{"error": {"field": ..., "message": ...}}``.  A browser page on another origin
may call it when ``feedback.allowed_origins`` lists that origin (CORS: its preflight
answered, ``Access-Control-Allow-Origin`` on every answer); no CORS header otherwise.

aiohttp's automatic request decompression is off: the receiver inflates the body
itself (:mod:`ragtrace_collector.receivers.decode`, off the event loop, within a budget
of output size, gzip members and CPU), so a gzip bomb stops at ``max_request_bytes``
and bad gzip gets a clear 400.  Slow and surplus connections are handled by
:mod:`ragtrace_collector.receivers.connections`.

The receiver is the component ``receiver:otlp_http``: ``starting``, ``ok`` once it
listens, ``permanent_error`` when its port cannot be bound, then ``stopping`` and
``stopped``.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler
from google.protobuf.message import Message

from ragtrace_collector.component import Component, Status
from ragtrace_collector.component.consumer import Refused, TraceConsumer
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.configbase import split_host_port
from ragtrace_collector.feedback.ingest import (
    BadFeedback,
    FeedbackIntake,
    TokenBucket,
    feedback_request,
    parse_feedback,
)
from ragtrace_collector.otlp.codec import (
    CODE_INVALID_ARGUMENT,
    CODE_RESOURCE_EXHAUSTED,
    CODE_UNAUTHENTICATED,
    CODE_UNAVAILABLE,
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_PROTOBUF,
    OtlpDecodeError,
    decode_failure,
    encode_json,
    export_response,
    rpc_status,
)
from ragtrace_collector.receivers.auth import BearerAuth
from ragtrace_collector.receivers.config import HttpReceiverConfig, ServerTLSConfig
from ragtrace_collector.receivers.connections import ConnectionGuard
from ragtrace_collector.receivers.decode import BodyError, Decoder, InflateBudget

__all__ = ["HttpReceiver", "server_ssl_context"]

_PATH: Final = "/v1/traces"
_RECEIVER: Final = "otlp_http"
_FEEDBACK_PATH: Final = "/v1/feedback"
_FEEDBACK: Final = "feedback_http"
#: Content types ``POST /v1/feedback`` reads as JSON (``text/plain``: what a browser's
#: ``navigator.sendBeacon`` sends for a string).
_FEEDBACK_TYPES: Final = frozenset({CONTENT_TYPE_JSON, "text/plain"})


def server_ssl_context(tls: ServerTLSConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    if tls.client_ca_file is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(str(tls.client_ca_file))
    return context


class HttpReceiver(Component):
    """The OTLP/HTTP server (aiohttp) feeding the pipeline (a
    :class:`~ragtrace_collector.component.consumer.TraceConsumer`)."""

    component_name = f"receiver:{_RECEIVER}"

    def __init__(
        self,
        config: HttpReceiverConfig,
        *,
        pipeline: TraceConsumer,
        auth: BearerAuth,
        telemetry: Telemetry,
        grace: float = 5.0,
        decoder: Decoder | None = None,
        feedback: FeedbackIntake | None = None,
    ) -> None:
        self._config = config
        #: ``POST /v1/feedback`` is served when set.
        self._feedback = feedback
        self._bucket = TokenBucket(feedback.rate) if feedback is not None else None
        #: Whether feedback is being refused for its rate (logged once per stretch).
        self._throttling = False
        #: Shared with the gRPC receiver by the service; a private one otherwise.
        self._decoder = decoder if decoder is not None else Decoder()
        self._owns_decoder = decoder is None
        self._budget = InflateBudget(config.max_request_bytes, config.max_gzip_members)
        self._grace = grace
        self._pipeline = pipeline
        self._auth = auth
        self._telemetry = telemetry
        self._limit = config.max_request_bytes
        self._log = get_logger("receiver").bind(receiver=_RECEIVER)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._guard: ConnectionGuard | None = None
        self.address: tuple[str, int] | None = None

    @property
    def open_connections(self) -> int:
        return self._guard.open_connections if self._guard is not None else 0

    async def start(self) -> tuple[str, int]:
        self.report(Status.STARTING)
        app = web.Application(client_max_size=self._limit, middlewares=[self._head_received])
        app.router.add_post(_PATH, self._handle)
        if self._feedback is not None:
            app.router.add_post(_FEEDBACK_PATH, self._handle_feedback)
            app.router.add_route("OPTIONS", _FEEDBACK_PATH, self._feedback_preflight)
        runner = web.AppRunner(
            app,
            access_log=None,
            auto_decompress=False,
            handle_signals=False,
            shutdown_timeout=self._grace,
            keepalive_timeout=self._config.keepalive_timeout,
        )
        await runner.setup()
        assert runner.server is not None
        guard = ConnectionGuard(
            runner.server,
            header_timeout=self._config.read_header_timeout,
            max_connections=self._config.max_connections,
            name=_RECEIVER,
            rejected=self._connection_rejected,
        )
        host, port = split_host_port(self._config.endpoint)
        try:
            ssl_context = server_ssl_context(self._config.tls) if self._config.tls else None
            listener = await asyncio.get_running_loop().create_server(
                guard.protocol_factory,
                host or None,
                port,
                ssl=ssl_context,
                reuse_address=True,
                backlog=min(1024, self._config.max_connections),
            )
        except BaseException as exc:
            await runner.cleanup()
            self.report(Status.PERMANENT_ERROR, f"cannot listen on {host}:{port}: {exc}")
            raise
        self._runner, self._listener, self._guard = runner, listener, guard
        sockname = listener.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        self.report(Status.OK)
        return self.address

    async def stop_listening(self) -> None:
        """Close the listening socket; requests already in progress continue."""
        if self._listener is not None:
            self.report(Status.STOPPING)
            self._listener.close()
            self._listener = None

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish (within the grace period)."""
        await self.stop_listening()
        if self._runner is not None:
            self.report(Status.STOPPING)
            await self._runner.cleanup()
            self._runner = None
            self.report(Status.STOPPED)
        if self._owns_decoder:
            await self._decoder.aclose()

    def _connection_rejected(self, reason: str) -> None:
        self._telemetry.requests_rejected.labels(_RECEIVER, reason).inc()

    # ----------------------------------------------------------------- handle
    @web.middleware
    async def _head_received(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every routed request (404 and 405 too) disarms its connection's header deadline."""
        if self._guard is not None:
            self._guard.request_started(request.protocol)
        return await handler(request)

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
                f"unsupported Content-Type: use {CONTENT_TYPE_PROTOBUF} or {CONTENT_TYPE_JSON}",
                False,
            )
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        try:
            body = await self._read_body(request)
            split = await self._decoder.decode(
                body, encoding=encoding, as_json=as_json, budget=self._budget
            )
        except BodyError as exc:
            answer = self._reject(
                exc.http_status, exc.reason, CODE_INVALID_ARGUMENT, exc.message, as_json
            )
            if exc.http_status == 408:  # the rest of the body may still be on its way
                answer.force_close()
            return answer
        except OtlpDecodeError as exc:
            return self._reject(400, "malformed", CODE_INVALID_ARGUMENT, str(exc), as_json)
        except Exception as exc:  # whatever a hostile body provokes: still a 400
            message = decode_failure(exc)
            return self._reject(400, "malformed", CODE_INVALID_ARGUMENT, message, as_json)
        try:
            payload = split.payload if split.payload is not None else body
            await self._pipeline.accept(split, _RECEIVER, payload)
        except Refused as refused:
            status, retry_after = _retry_answer(refused)
            code = CODE_UNAVAILABLE if status == 503 else CODE_RESOURCE_EXHAUSTED
            return self._encode(
                status,
                rpc_status(code, refused.message, retry_delay=refused.retry_after),
                as_json,
                retry_after,
            )
        return self._encode(
            200, export_response(split.rejected_spans, split.error_message), as_json
        )

    async def _read_body(self, request: web.Request, limit: int | None = None) -> bytes:
        """The body, within ``read_timeout`` and ``limit`` bytes (default: the OTLP
        bound, ``max_request_bytes``)."""
        bound = self._limit if limit is None else limit
        length = request.content_length
        if length is not None and length > bound:
            raise BodyError(
                413, "too_large", f"body of {length} bytes exceeds the limit of {bound} bytes"
            )
        timeout = self._config.read_timeout
        try:
            async with asyncio.timeout(timeout):
                if limit is None:
                    return await request.read()
                body = await _read_at_most(request, bound + 1)
        except web.HTTPRequestEntityTooLarge:
            raise BodyError(413, "too_large", f"body exceeds the limit of {bound} bytes") from None
        except TimeoutError:
            raise BodyError(
                408, "read_timeout", f"the body did not arrive within {timeout}s"
            ) from None
        if len(body) > bound:
            raise BodyError(413, "too_large", f"body exceeds the limit of {bound} bytes")
        return body

    # --------------------------------------------------------------- feedback
    async def _feedback_preflight(self, request: web.Request) -> web.StreamResponse:
        """A browser's CORS preflight for ``POST /v1/feedback``: allowed origins get the
        methods and headers they may send; any other gets 403 and no CORS header, so
        the browser does not send the request."""
        assert self._feedback is not None
        allowed = self._feedback.cors_origin(request.headers.get("Origin"))
        if allowed is None:
            return web.Response(status=403, headers={"Vary": "Origin"})
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": allowed,
                "Access-Control-Allow-Methods": "POST",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Max-Age": "600",
                "Vary": "Origin",
            },
        )

    async def _handle_feedback(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/feedback``, with its CORS header for an allowed origin (a page on
        another origin reads the answer only then, errors included)."""
        assert self._feedback is not None
        answer = await self._answer_feedback(request)
        allowed = self._feedback.cors_origin(request.headers.get("Origin"))
        if allowed is not None:
            answer.headers["Access-Control-Allow-Origin"] = allowed
            answer.headers["Access-Control-Expose-Headers"] = "Retry-After"
            answer.headers["Vary"] = "Origin"
        return answer

    async def _answer_feedback(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/feedback`` (see the module docstring)."""
        assert self._feedback is not None
        assert self._bucket is not None
        if not self._auth.check(request.headers.get("Authorization")):
            return self._feedback_error(
                401,
                "unauthenticated",
                "authorization",
                "missing or invalid bearer token",
                {"WWW-Authenticate": "Bearer"},
            )
        # The rate bound comes before the body is read: a flood costs no memory.
        wait = self._bucket.take(asyncio.get_running_loop().time())
        if wait > 0:
            self._feedback.invalid("rate_limited")
            if not self._throttling:  # a flood is counted, and logged once
                self._throttling = True
                self._log.warning("feedback_rate_limited", rate=self._bucket.rate)
            answer = self._feedback_error(
                429,
                "rate_limited",
                "body",
                "too many feedback requests (feedback.rate); retry later",
                {"Retry-After": str(max(1, math.ceil(wait)))},
                log=False,
            )
            length = request.content_length
            if length is None or length > self._feedback.max_body:
                # aiohttp would read the unread body to reuse the connection: only a
                # small one, of a known size, is worth it (a flood keeps its
                # connections instead of reconnecting).
                answer.force_close()
            return answer
        if self._throttling:
            self._throttling = False
            self._log.info("feedback_rate_limit_over")
        content_type = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if content_type not in _FEEDBACK_TYPES or encoding != "identity":
            answer = self._feedback_error(
                415,
                "content_type",
                "content-type",
                f"send an uncompressed {CONTENT_TYPE_JSON} body",
            )
            answer.force_close()
            return answer
        try:
            body = await self._read_body(request, self._feedback.max_body)
        except BodyError as exc:
            answer = self._feedback_error(exc.http_status, exc.reason, "body", exc.message)
            answer.force_close()
            return answer
        try:
            feedback = parse_feedback(body)
        except BadFeedback as exc:
            self._feedback.invalid(f"bad {exc.field}")
            self._telemetry.requests_rejected.labels(_FEEDBACK, "malformed").inc()
            return web.json_response(exc.answer(), status=400)
        split, payload = feedback_request(feedback)
        try:
            await self._pipeline.accept(split, _FEEDBACK, payload)
        except Refused as refused:
            status, retry_after = _retry_answer(refused)
            return web.json_response(
                {"error": {"field": "body", "message": refused.message}},
                status=status,
                headers=retry_after,
            )
        return web.json_response({"status": "accepted"}, status=202)

    def _feedback_error(
        self,
        status: int,
        reason: str,
        field: str,
        message: str,
        headers: dict[str, str] | None = None,
        *,
        log: bool = True,
    ) -> web.Response:
        self._telemetry.requests_rejected.labels(_FEEDBACK, reason).inc()
        if log:
            self._log.info("feedback_rejected", status=status, reason=reason)
        return web.json_response(
            {"error": {"field": field, "message": message}}, status=status, headers=headers
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


def _retry_answer(refused: Refused) -> tuple[int, dict[str, str]]:
    """The HTTP status (503 shutting down, else 429) and ``Retry-After`` header for a
    pipeline refusal."""
    status = 503 if refused.reason == "shutting_down" else 429
    return status, {"Retry-After": str(max(1, math.ceil(refused.retry_after)))}


async def _read_at_most(request: web.Request, size: int) -> bytes:
    """The body's first ``size`` bytes (all of it when shorter)."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        chunk = await request.content.read(size - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
