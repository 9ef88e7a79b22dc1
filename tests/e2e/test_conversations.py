"""A multi-turn ``ragtrace.session`` through the collector: window scores per turn and
the running ``conversation_score``, checked against the offline metric
(``measure_conversation``) on each prefix of the same conversation, with the in-memory
and the Redis session store; turn by turn, in one export batch, and with a judge that
makes the windows finish in reverse order."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import ragtrace
from ragtrace import semconv
from ragtrace_collector.cases import ContextItem, Conversation, Turn
from ragtrace_collector.judges.base import Judge
from ragtrace_collector.judges.config import JudgeConfig
from ragtrace_collector.judges.llm import LLMJudge
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import ConversationMetric, build_metric
from tests.e2e import _app
from tests.e2e._app import KB
from tests.e2e._support import (
    JudgeServer,
    eval_config,
    evaluating_collector,
    flat,
    llm_judge,
    rag_spans,
)
from tests.fakes.openai_server import RecordedRequest, Reply, auto_reply
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.fakes.redis_server import RedisServer

#: Metric -> options, as configured in the collector and used offline.
METRICS: dict[str, dict[str, Any]] = {
    "turn_contextual_precision": {"window_size": 2},
    "turn_contextual_recall": {"strict": True},
    "turn_contextual_relevancy": {"window_size": 1},
}
OUTCOME = (
    "The user resets the password from Settings and Security. "
    "The password reset link expires after 24 hours."
)
#: (question, retrieved ids); the second turn retrieves nothing.
SCRIPT: list[tuple[str, list[str]]] = [
    ("I forgot my password, how do I reset it?", ["kb_reset", "kb_invoice"]),
    ("Thanks, that worked.", []),
    ("How long is the reset link valid?", ["kb_2fa", "kb_expiry"]),
    ("Can I export my invoices as a file?", ["kb_export", "kb_invoice"]),
    ("And the password link, again?", ["kb_expiry", "kb_reset", "kb_2fa"]),
]


def _offline_conversation(upto: int) -> Conversation:
    """The same conversation, first ``upto`` turns, built from what the app did."""
    turns: list[Turn] = []
    for question, ids in SCRIPT[:upto]:
        contexts = [KB[d] for d in ids]
        turns.append(Turn(role="user", content=question))
        turns.append(
            Turn(
                role="assistant",
                content=_app.generate.__wrapped__(question, contexts),  # type: ignore[attr-defined]
                retrieval_context=[
                    ContextItem(content=KB[d], id=d, score=1.0 / (i + 1)) for i, d in enumerate(ids)
                ],
            )
        )
    return Conversation(turns=turns, expected_outcome=OUTCOME)


def _offline_scores(judge: Judge) -> dict[str, list[tuple[float, float]]]:
    """Metric -> (window score, conversation score so far) after each turn, from
    ``measure_conversation`` on each prefix of the conversation."""

    async def one(name: str, k: int) -> tuple[float, float]:
        metric = build_metric(name, METRICS[name])
        assert isinstance(metric, ConversationMetric)
        result = await metric.measure_conversation(_offline_conversation(k), judge)
        assert result.score is not None, result.reason
        window = result.details["window_scores"][-1]
        if metric.options.strict:  # the window's own result is strict too
            window = 1.0 if window >= 1.0 else 0.0
        return window, result.score

    async def every() -> dict[str, list[tuple[float, float]]]:
        turns = range(1, len(SCRIPT) + 1)
        scores = await asyncio.gather(*(one(name, k) for name in METRICS for k in turns))
        return {
            name: scores[i * len(SCRIPT) : (i + 1) * len(SCRIPT)] for i, name in enumerate(METRICS)
        }

    return asyncio.run(every())


def _turn_spans(spans: list[ReceivedSpan], session_id: str) -> list[ReceivedSpan]:
    mine = [s for s in rag_spans(spans) if s.attributes.get(semconv.SESSION_ID) == session_id]
    return sorted(mine, key=lambda s: s.attributes[semconv.TURN_INDEX])


def _run(
    sink: OtlpSink, session_store: dict[str, Any], *, burst: bool, **sections: Any
) -> list[ReceivedSpan]:
    """The scripted session through a collector; returns its @rag spans by turn."""
    for question, ids in SCRIPT:
        _app.route(question, ids)
    session_id = f"conv-{uuid.uuid4().hex[:8]}"
    config = eval_config(sink, metrics=METRICS, session_store=session_store, **sections)
    with evaluating_collector(config) as collector:
        ragtrace.configure(service_name="e2e-bot", endpoint=collector.http_url)
        with ragtrace.session(session_id, user_id="u-1", expected_outcome=OUTCOME):
            for n, (question, _) in enumerate(SCRIPT, 1):
                _app.answer(question)
                if not burst:  # a user waits for each answer
                    assert ragtrace.flush(30)
                    sink.wait_for_spans(3 * n)
        assert ragtrace.flush(30)
        spans = sink.wait_for_spans(3 * len(SCRIPT))
    turns = _turn_spans(spans, session_id)
    assert [t.attributes[semconv.TURN_INDEX] for t in turns] == list(range(len(SCRIPT)))
    return turns


def _check(turns: list[ReceivedSpan], judge: Judge | None = None) -> None:
    expected = _offline_scores(judge if judge is not None else OfflineJudge())
    for name in METRICS:
        for turn, (window, running) in zip(turns, expected[name], strict=True):
            where = f"{name} turn {turn.attributes[semconv.TURN_INDEX]}"
            assert flat(turn, name, semconv.EVAL_FIELD_SCORE) == pytest.approx(window), where
            got = flat(turn, name, semconv.EVAL_FIELD_CONVERSATION_SCORE)
            assert got == pytest.approx(running), where
            assert flat(turn, name, semconv.EVAL_FIELD_REASON)
        # So the last turn's conversation score is the offline metric's, whatever the
        # order the turns were evaluated in.
        final = flat(turns[-1], name, semconv.EVAL_FIELD_CONVERSATION_SCORE)
        assert final == pytest.approx(expected[name][-1][1]), name
    # The scores are not all trivially 1: the script exercises the windows.
    assert any(flat(t, name, semconv.EVAL_FIELD_SCORE) < 1.0 for t in turns for name in METRICS)


def test_conversation_memory_store(sink: OtlpSink) -> None:
    _check(_run(sink, {"backend": "memory"}, burst=False))


@pytest.mark.services
def test_conversation_redis_store(sink: OtlpSink, redis_server: RedisServer) -> None:
    store = {"backend": "redis", "url": redis_server.url, "key_prefix": "e2e:conv:"}
    _check(_run(sink, store, burst=False))


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.services)])
def test_conversation_sent_in_one_batch(
    sink: OtlpSink, request: pytest.FixtureRequest, backend: str
) -> None:
    """The SDK exports a whole conversation in one batch: the turns become ready
    together and are evaluated concurrently; the final score still matches."""
    store: dict[str, Any] = {"backend": backend}
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        store.update(url=server.url, key_prefix="e2e:burst:")
    _check(_run(sink, store, burst=True))


@pytest.mark.slow
def test_turns_finishing_out_of_order(sink: OtlpSink, judge_server: JudgeServer) -> None:
    """An LLM judge that answers later turns faster: the windows finish in reverse
    order, yet each turn's conversation score is the mean over the windows up to it."""

    def later_is_faster(request: RecordedRequest) -> Reply:
        text = request.prompt_text
        last = max((i for i, (q, _) in enumerate(SCRIPT) if q in text), default=0)
        return Reply(content=auto_reply(request).content, delay_s=0.1 * (len(SCRIPT) - last))

    judge_server.handler = later_is_faster
    turns = _run(sink, {"backend": "memory"}, burst=True, judge=llm_judge(judge_server))
    # The same conversation, offline, with a judge on the same (deterministic) server.
    _check(turns, LLMJudge(JudgeConfig(**llm_judge(judge_server))))
