"""``POST /v1/feedback`` on the OTLP/HTTP receiver, against a stand-in pipeline."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from pydantic import SecretStr

from ragtrace import semconv
from ragtrace_collector.component.consumer import Refused
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.ingest import FeedbackIntake, TokenBucket, parse_feedback
from ragtrace_collector.feedback.record import Feedback, from_span
from ragtrace_collector.otlp.codec import SplitRequest
from ragtrace_collector.receivers.auth import BearerAuth
from ragtrace_collector.receivers.config import HttpReceiverConfig
from ragtrace_collector.receivers.http import HttpReceiver

TOKEN = "feedback-token"
TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
SECRET = "do-not-echo-4711"


class _Pipeline:
    """Records what the receiver hands over; refuses when told to."""

    def __init__(self) -> None:
        self.taken: list[tuple[SplitRequest, str, bytes | Message]] = []
        self.refuse: Refused | None = None

    async def accept(self, split: SplitRequest, receiver: str, payload: bytes | Message) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.taken.append((split, receiver, payload))


class _Endpoint:
    def __init__(self, receiver: HttpReceiver, pipeline: _Pipeline, invalid: list[str]) -> None:
        assert receiver.address is not None
        host, port = receiver.address
        self.url = f"http://{host}:{port}/v1/feedback"
        self.pipeline = pipeline
        self.invalid = invalid

    async def post(
        self,
        body: Any,
        *,
        token: str | None = TOKEN,
        raw: bytes | None = None,
        content_type: str = "application/json",
        origin: str | None = None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        headers = {"Content-Type": content_type}
        if origin is not None:
            headers["Origin"] = origin
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else json.dumps(body).encode()
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url, data=data, headers=headers) as resp,
        ):
            text = await resp.read()
            return resp.status, json.loads(text) if text else {}, dict(resp.headers)

    async def preflight(self, origin: str) -> tuple[int, dict[str, str]]:
        """A browser's CORS preflight for a POST with a bearer token and a JSON body."""
        headers = {
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        async with (
            aiohttp.ClientSession() as session,
            session.options(self.url, headers=headers) as resp,
        ):
            return resp.status, dict(resp.headers)

    def feedback(self) -> list[Feedback]:
        out = []
        for split, receiver, payload in self.pipeline.taken:
            assert receiver == "feedback_http"
            assert isinstance(payload, bytes)
            request = ExportTraceServiceRequest.FromString(payload)  # what the log keeps
            (resource_spans,) = request.resource_spans
            (span,) = resource_spans.scope_spans[0].spans
            read = from_span(span, resource_spans.resource)
            assert isinstance(read, Feedback)
            assert split.span_count == 1
            out.append(read)
        return out


async def _endpoint(
    rate: float = 1000.0, max_body: int = 8192, origins: frozenset[str] = frozenset()
) -> AsyncIterator[_Endpoint]:
    pipeline = _Pipeline()
    invalid: list[str] = []
    receiver = HttpReceiver(
        HttpReceiverConfig(endpoint="127.0.0.1:0"),
        pipeline=pipeline,
        auth=BearerAuth([SecretStr(TOKEN)]),
        telemetry=Telemetry(),
        feedback=FeedbackIntake(
            max_body=max_body, rate=rate, invalid=invalid.append, allowed_origins=origins
        ),
    )
    await receiver.start()
    try:
        yield _Endpoint(receiver, pipeline, invalid)
    finally:
        await receiver.stop()


@pytest.fixture
async def endpoint() -> AsyncIterator[_Endpoint]:
    async for e in _endpoint():
        yield e


async def test_accepted_feedback_is_one_feedback_span_in_the_request_trace(
    endpoint: _Endpoint,
) -> None:
    status, answer, _ = await endpoint.post(
        {
            "trace_id": TRACE.upper(),
            "span_id": SPAN,
            "value": False,
            "comment": "wrong article",
            "user_id": "u-1",
            "correction": "see kb_reset",
            "service": "support-bot",
        }
    )
    assert status == 202, answer
    (feedback,) = endpoint.feedback()
    assert feedback.trace_id == TRACE
    assert feedback.span_id == SPAN
    assert feedback.name == semconv.FEEDBACK_DEFAULT_NAME
    assert (feedback.value, feedback.value_type) == (0.0, semconv.FEEDBACK_TYPE_BOOLEAN)
    assert feedback.negative
    assert (feedback.comment, feedback.user_id) == ("wrong article", "u-1")
    assert feedback.correction == "see kb_reset"
    assert feedback.service == "support-bot"
    assert feedback.time_unix_nano > 0


async def test_a_number_with_no_span_id_and_no_service(endpoint: _Endpoint) -> None:
    status, _, _ = await endpoint.post({"trace_id": TRACE, "value": 0.75, "name": "stars"})
    assert status == 202
    (feedback,) = endpoint.feedback()
    assert (feedback.span_id, feedback.service, feedback.name) == (None, "", "stars")
    assert (feedback.value, feedback.value_type) == (0.75, semconv.FEEDBACK_TYPE_NUMERIC)
    assert not feedback.negative


async def test_a_huge_comment_is_cut_at_the_documented_size() -> None:
    async for endpoint in _endpoint(max_body=64 * 1024):
        comment = "x" * (semconv.FEEDBACK_MAX_TEXT_CHARS + 500)
        status, _, _ = await endpoint.post({"trace_id": TRACE, "value": 1, "comment": comment})
        assert status == 202
        (feedback,) = endpoint.feedback()
        assert feedback.comment == "x" * semconv.FEEDBACK_MAX_TEXT_CHARS


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"value": 1}, "trace_id"),
        ({"trace_id": TRACE}, "value"),
        ({"trace_id": SECRET, "value": 1}, "trace_id"),
        ({"trace_id": "0" * 32, "value": 1}, "trace_id"),
        ({"trace_id": TRACE, "span_id": SECRET, "value": 1}, "span_id"),
        ({"trace_id": TRACE, "value": SECRET}, "value"),
        ({"trace_id": TRACE, "value": 1.5}, "value"),
        ({"trace_id": TRACE, "value": -0.1}, "value"),
        ({"trace_id": TRACE, "value": 10**400}, "value"),
        ({"trace_id": TRACE, "value": 1, "name": ""}, "name"),
        ({"trace_id": TRACE, "value": 1, "name": SECRET * 100}, "name"),
        ({"trace_id": TRACE, "value": 1, "user_id": [SECRET]}, "user_id"),
        ({"trace_id": TRACE, "value": 1, "comment": {"x": SECRET}}, "comment"),
        ({"trace_id": TRACE, "value": 1, "service": 7}, "service"),
        ([TRACE, 1], "body"),
    ],
)
async def test_bad_input_gets_a_400_naming_the_field_never_its_value(
    endpoint: _Endpoint, body: Any, field: str
) -> None:
    status, answer, _ = await endpoint.post(body)
    assert status == 400
    assert answer["error"]["field"] == field
    assert SECRET not in json.dumps(answer)
    assert endpoint.pipeline.taken == []
    assert endpoint.invalid == [f"bad {field}"]


async def test_unknown_fields_are_named(endpoint: _Endpoint) -> None:
    status, answer, _ = await endpoint.post(
        {"trace_id": TRACE, "value": 1, "comments": "typo", SECRET + " <b>": 1}
    )
    assert status == 400
    message = answer["error"]["message"]
    assert "comments" in message
    assert "1 more" in message  # a name that does not look like a field is not quoted
    assert SECRET not in message
    status, answer, _ = await endpoint.post(None, raw=b"{not json")
    assert (status, answer["error"]["field"]) == (400, "body")


async def test_without_the_token_401_and_nothing_taken(endpoint: _Endpoint) -> None:
    for token in (None, "wrong"):
        status, answer, headers = await endpoint.post({"trace_id": TRACE, "value": 1}, token=token)
        assert status == 401
        assert headers["WWW-Authenticate"] == "Bearer"
        assert answer["error"]["field"] == "authorization"
    assert endpoint.pipeline.taken == []


async def test_body_bound_and_content_type(endpoint: _Endpoint) -> None:
    big = json.dumps({"trace_id": TRACE, "value": 1, "comment": "y" * 9000}).encode()
    status, answer, _ = await endpoint.post(None, raw=big)
    assert status == 413
    assert answer["error"]["field"] == "body"
    status, _, _ = await endpoint.post(None, raw=b"trace_id=x", content_type="application/x-www")
    assert status == 415
    # navigator.sendBeacon sends a string as text/plain: read as JSON.
    ok = json.dumps({"trace_id": TRACE, "value": True}).encode()
    status, _, _ = await endpoint.post(None, raw=ok, content_type="text/plain;charset=UTF-8")
    assert status == 202
    assert len(endpoint.pipeline.taken) == 1


async def test_a_flood_gets_429_with_retry_after_before_the_body_is_read() -> None:
    async for endpoint in _endpoint(rate=5.0):
        statuses = []
        for _ in range(20):  # far faster than 5 a second
            status, answer, headers = await endpoint.post({"trace_id": TRACE, "value": 1})
            statuses.append(status)
            if status == 429:
                assert int(headers["Retry-After"]) >= 1
                assert answer["error"]["message"].startswith("too many feedback")
        assert statuses.count(202) >= 5
        assert statuses.count(429) >= 10
        assert len(endpoint.pipeline.taken) == statuses.count(202)
        assert endpoint.invalid.count("rate_limited") == statuses.count(429)


@pytest.mark.parametrize(("reason", "status"), [("storage_full", 429), ("shutting_down", 503)])
async def test_a_pipeline_refusal_is_answered_like_otlp(
    endpoint: _Endpoint, reason: str, status: int
) -> None:
    endpoint.pipeline.refuse = Refused(reason, "the write-ahead log is full", 2.5)
    got, answer, headers = await endpoint.post({"trace_id": TRACE, "value": 1})
    assert got == status
    assert headers["Retry-After"] == "3"
    assert "write-ahead log" in answer["error"]["message"]


async def test_without_feedback_the_route_is_absent() -> None:
    receiver = HttpReceiver(
        HttpReceiverConfig(endpoint="127.0.0.1:0"),
        pipeline=_Pipeline(),
        auth=BearerAuth([]),
        telemetry=Telemetry(),
    )
    host, port = await receiver.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://{host}:{port}/v1/feedback", json={}) as resp,
        ):
            assert resp.status == 404
    finally:
        await receiver.stop()


def test_token_bucket_spends_refills_and_says_how_long_to_wait() -> None:
    bucket = TokenBucket(rate=2.0)
    assert [bucket.take(0.0) for _ in range(2)] == [0.0, 0.0]  # a burst of one second
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) == 0.0  # one token back after 1/rate
    assert bucket.take(0.5) > 0
    assert bucket.take(100.0) == 0.0
    assert bucket.take(100.0) == 0.0
    assert bucket.take(100.0) > 0  # never more than the burst saved


def test_parse_is_timed_now_unless_told() -> None:
    feedback = parse_feedback(b'{"trace_id": "%s", "value": 0}' % TRACE.encode(), now_ns=42)
    assert feedback.time_unix_nano == 42


_SHOP = "https://shop.example.com"


async def test_a_page_of_an_allowed_origin_may_post_and_read_every_answer() -> None:
    """CORS: the preflight names what the page may send; every answer, errors included,
    carries the origin, so the page can read a 400 or a 429 too."""
    async for endpoint in _endpoint(origins=frozenset({_SHOP})):
        status, headers = await endpoint.preflight(_SHOP)
        assert status == 204
        assert headers["Access-Control-Allow-Origin"] == _SHOP
        assert headers["Access-Control-Allow-Methods"] == "POST"
        assert {h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")} >= {
            "authorization",
            "content-type",
        }
        body = {"trace_id": TRACE, "value": True}
        status, _, headers = await endpoint.post(body, origin=_SHOP)
        assert status == 202
        assert headers["Access-Control-Allow-Origin"] == _SHOP
        assert "Origin" in headers["Vary"]
        status, _, headers = await endpoint.post({"trace_id": "nope", "value": 1}, origin=_SHOP)
        assert status == 400
        assert headers["Access-Control-Allow-Origin"] == _SHOP
        status, _, headers = await endpoint.post(body, origin=_SHOP, token=None)
        assert status == 401
        assert headers["Access-Control-Allow-Origin"] == _SHOP
        assert len(endpoint.pipeline.taken) == 1


@pytest.mark.parametrize("origins", [frozenset(), frozenset({_SHOP})])
async def test_any_other_origin_gets_no_cors_header(origins: frozenset[str]) -> None:
    """With no allowed origins (the default), or another one, a browser is told nothing:
    the preflight is refused and no answer carries an origin."""
    async for endpoint in _endpoint(origins=origins):
        status, headers = await endpoint.preflight("https://evil.example.net")
        assert status == 403
        assert "Access-Control-Allow-Origin" not in headers
        body = {"trace_id": TRACE, "value": True}
        status, _, headers = await endpoint.post(body, origin="https://evil.example.net")
        assert "Access-Control-Allow-Origin" not in headers
        status, _, headers = await endpoint.post(body)  # a server, no Origin: as before
        assert status == 202
        assert "Access-Control-Allow-Origin" not in headers


async def test_a_star_allows_every_origin() -> None:
    async for endpoint in _endpoint(origins=frozenset({"*"})):
        status, headers = await endpoint.preflight("http://localhost:3000")
        assert status == 204
        assert headers["Access-Control-Allow-Origin"] == "*"


@pytest.mark.parametrize(
    "origin", ["shop.example.com", "https://shop.example.com/", "https://x.com/path", "ftp://x"]
)
def test_an_origin_that_is_not_one_is_a_config_error_naming_it(origin: str) -> None:
    with pytest.raises(ValueError, match="is not an origin") as caught:
        FeedbackConfig(allowed_origins=[origin])
    assert repr(origin) in str(caught.value)
    assert FeedbackConfig(allowed_origins=["http://localhost:3000", "*"]).allowed_origins
