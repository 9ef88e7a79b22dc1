"""A real ``redis-server`` killed in the middle of a conversation, then restarted, then
hung: the case metrics are scored all along, the conversation metrics say the session
store is unavailable, the ``session_store`` status goes to ``recoverable_error`` and
back to ``ok`` by itself, and the first window after the restart names the turns it
lacks."""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import Iterator

import pytest

import ragtrace
from ragtrace import semconv
from tests.e2e import _app
from tests.e2e._support import EvalCollector, eval_config, evaluating_collector, flat, rag_spans
from tests.fakes.harness import admin_json
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.fakes.redis_server import RedisServer

CASE = "contextual_relevancy"
CONVERSATION = "turn_contextual_relevancy"
SCRIPT = [
    ("How do I reset my password?", ["kb_reset"]),
    ("How long is the link valid?", ["kb_expiry"]),
    ("Are codes sent by text?", ["kb_2fa"]),
    ("Can I export my data?", ["kb_export"]),
    ("When are invoices sent?", ["kb_invoice"]),
    ("And the reset link again?", ["kb_expiry", "kb_reset"]),
]


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _status(collector: EvalCollector) -> tuple[int, dict[str, object]]:
    code, body = admin_json(collector.admin_url + "/healthz")
    component = body["components"]["session_store"]
    assert isinstance(component, dict)
    return code, component


def _turn(sink: OtlpSink, session: str, index: int) -> ReceivedSpan:
    """Answer turn ``index`` and return its @rag span as the backend received it."""
    question, _ = SCRIPT[index]
    _app.answer(question)
    assert ragtrace.flush(30)

    def mine() -> list[ReceivedSpan]:
        return [
            s
            for s in rag_spans(sink.spans)
            if s.attributes.get(semconv.SESSION_ID) == session
            and s.attributes.get(semconv.TURN_INDEX) == index
        ]

    sink.wait_until(lambda: bool(mine()), timeout=60)
    return mine()[0]


@pytest.mark.services
def test_redis_killed_mid_conversation_then_restarted_then_hung(
    sink: OtlpSink, redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    for question, ids in SCRIPT:
        _app.route(question, ids)
    session = f"outage-{uuid.uuid4().hex[:8]}"
    config = eval_config(
        sink,
        metrics={CASE: {}, CONVERSATION: {"window_size": 5}},
        session_store={"backend": "redis", "url": redis.url, "socket_timeout": "500ms"},
        evaluation={"metric_timeout": "20s", "trace_timeout": "30s"},
    )
    with evaluating_collector(config) as collector:
        ragtrace.configure(service_name="outage-bot", endpoint=collector.http_url)
        with ragtrace.session(session, user_id="u-1"):
            # Turns 0-1 with Redis up: everything scored.
            for index in (0, 1):
                span = _turn(sink, session, index)
                assert flat(span, CASE, semconv.EVAL_FIELD_SCORE) is not None
                assert flat(span, CONVERSATION, semconv.EVAL_FIELD_SCORE) is not None
            assert _status(collector)[1]["status"] == "ok"

            # Redis is killed: turns 2-3 keep their case metric; the conversation
            # metric carries the error, and nothing else is lost.
            redis.crash()
            for index in (2, 3):
                span = _turn(sink, session, index)
                assert flat(span, CASE, semconv.EVAL_FIELD_SCORE) is not None
                assert flat(span, CONVERSATION, semconv.EVAL_FIELD_ERROR) == (
                    "session store unavailable"
                )
                assert flat(span, CONVERSATION, semconv.EVAL_FIELD_SCORE) is None
                reason = flat(span, CONVERSATION, semconv.EVAL_FIELD_REASON)
                assert "redis" in reason
            code, component = _status(collector)
            assert component["status"] == "recoverable_error"
            assert "session store" in str(component["last_error"])
            assert code == 200  # not yet longer than admin.unhealthy_after
            gauge = collector.metric(
                "ragtrace_component_status",
                {"component": "session_store", "status": "recoverable_error"},
            )
            assert gauge == 1

            # Restarted (empty: it never saved): back to ok by itself, and the first
            # window says which turns it lacks.
            redis.restart()
            span = _turn(sink, session, 4)
            assert flat(span, CASE, semconv.EVAL_FIELD_SCORE) is not None
            assert flat(span, CONVERSATION, semconv.EVAL_FIELD_SCORE) is not None
            reason = flat(span, CONVERSATION, semconv.EVAL_FIELD_REASON)
            assert "turns 0\u20133 missing" in reason
            assert _status(collector)[1]["status"] == "ok"

            # Hung (SIGSTOP): bounded by socket_timeout, not by the metric timeouts.
            redis.pause()
            try:
                started = time.monotonic()
                span = _turn(sink, session, 5)
                elapsed = time.monotonic() - started
            finally:
                redis.resume()
            assert flat(span, CASE, semconv.EVAL_FIELD_SCORE) is not None
            assert flat(span, CONVERSATION, semconv.EVAL_FIELD_ERROR) == (
                "session store unavailable"
            )
            assert elapsed < 15, f"a hung Redis stalled evaluation for {elapsed:.1f}s"
    gc.collect()
    assert not any("never retrieved" in r.getMessage() for r in caplog.records)
