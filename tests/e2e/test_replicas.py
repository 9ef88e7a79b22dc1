"""Scale-out on one machine: three collector processes, one real Redis session store.

DESIGN.md's scale-out runs N replicas behind the OTel Collector's ``load_balancing``
exporter, which routes by trace id: one trace (one turn) lands whole on one replica,
and the turns of a conversation land on different ones.  Here the app sends each turn
of several conversations to the next replica in turn, and single-turn traffic round
robin across all three.  The test checks what the design promises:

* every span reaches the backend exactly once;
* every sampling decision is the one a single replica makes (``Sampler`` on the same
  ids and attributes): consistent hashing needs no coordination;
* each sampled conversation's final ``conversation_score`` equals the offline metric on
  the whole conversation, although no replica saw more than a third of its turns.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import ragtrace
from ragtrace import semconv
from ragtrace_collector.cases import ContextItem, Conversation, Turn
from ragtrace_collector.evaluation.sampling import Sampler, SamplingConfig
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import ConversationMetric, build_metric
from tests.e2e import _app
from tests.e2e._app import KB
from tests.e2e._support import Serve, flat, rag_spans, serve_config
from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.redis_server import RedisServer

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPLICAS = 3
RATE = 0.5
CONVERSATION_METRICS: dict[str, dict[str, Any]] = {
    "turn_contextual_precision": {"window_size": 2},
    "turn_contextual_recall": {},
    "turn_contextual_relevancy": {"window_size": 1},
}
METRICS: dict[str, dict[str, Any]] = {**CONVERSATION_METRICS, "id_context_recall": {}}
OUTCOME = (
    "The user resets the password from Settings and Security. "
    "The password reset link expires after 24 hours."
)
SCRIPT: list[tuple[str, list[str]]] = [
    ("I forgot my password, how do I reset it?", ["kb_reset", "kb_invoice"]),
    ("Thanks, that worked.", []),
    ("How long is the reset link valid?", ["kb_2fa", "kb_expiry"]),
    ("Can I export my invoices as a file?", ["kb_export", "kb_invoice"]),
    ("And the password link, again?", ["kb_expiry", "kb_reset", "kb_2fa"]),
]
SINGLE_TURN: list[tuple[str, list[str]]] = [
    ("What is the capital of France?", ["doc_paris", "doc_louvre"]),
    ("Where is the Louvre?", ["doc_louvre", "doc_berlin"]),
    ("Name a landmark in Paris.", ["doc_berlin", "doc_eiffel"]),
]
SPANS_PER_TRACE = 3  # @rag, @retriever, @generator


def _offline_final(metric_name: str) -> float:
    turns: list[Turn] = []
    for question, ids in SCRIPT:
        turns.append(Turn(role="user", content=question))
        turns.append(
            Turn(
                role="assistant",
                content=KB[ids[0]] if ids else "I do not know.",
                retrieval_context=[
                    ContextItem(content=KB[d], id=d, score=1.0 / (i + 1)) for i, d in enumerate(ids)
                ],
            )
        )
    metric = build_metric(metric_name, CONVERSATION_METRICS[metric_name])
    assert isinstance(metric, ConversationMetric)
    conversation = Conversation(turns=turns, expected_outcome=OUTCOME)
    result = asyncio.run(metric.measure_conversation(conversation, OfflineJudge()))
    assert result.score is not None, result.reason
    return result.score


def _providers(replicas: list[Serve]) -> list[TracerProvider]:
    providers = []
    for replica in replicas:
        provider = TracerProvider(resource=Resource.create({"service.name": "replica-bot"}))
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{replica.http_url}/v1/traces"))
        )
        providers.append(provider)
    return providers


def _send(provider: TracerProvider, question: str, **reference: Any) -> None:
    ragtrace.configure(tracer_provider=provider)
    _app.answer(question, reference or None)
    assert provider.force_flush(30_000)


def test_three_replicas_one_redis(
    sink: OtlpSink, redis_server: RedisServer, tmp_path: Path
) -> None:
    for question, ids in [*SCRIPT, *SINGLE_TURN]:
        _app.route(question, ids)
    sampler = Sampler(SamplingConfig(rate=RATE))
    # Conversations carry an expected outcome, which is ground truth: the default rule
    # evaluates them all, whatever the rate.
    sessions = [f"replica-conv-{n}" for n in range(4)]
    store = {"backend": "redis", "url": redis_server.url, "key_prefix": "e2e:replicas:"}
    config = serve_config(sink, sampling={"rate": RATE}, metrics=METRICS, session_store=store)
    for i in range(REPLICAS):
        (tmp_path / f"replica-{i}").mkdir()
    replicas = [Serve(config, tmp_path / f"replica-{i}") for i in range(REPLICAS)]
    providers = _providers(replicas)
    traces = 0
    try:
        conversations = [
            ragtrace.session(sid, user_id="u-1", expected_outcome=OUTCOME) for sid in sessions
        ]
        for k, (question, _) in enumerate(SCRIPT):
            for c, conversation in enumerate(conversations):
                with conversation:  # the same conversation, its next turn
                    _send(providers[(c + k) % REPLICAS], question)
                traces += 1
            # A user waits for each answer: the turn is evaluated (and stored in Redis)
            # before the next one arrives, whichever replica that is.
            sink.wait_for_spans(SPANS_PER_TRACE * traces, timeout=60)
        for n in range(30):
            question, ids = SINGLE_TURN[n % len(SINGLE_TURN)]
            reference = {"reference_context_ids": ids[:1]} if n % 3 == 0 else {}
            _send(providers[n % REPLICAS], question, **reference)
            traces += 1
        spans = sink.wait_for_spans(SPANS_PER_TRACE * traces, timeout=60)
        received = [_received(replica) for replica in replicas]
    finally:
        for provider in providers:
            provider.shutdown()
        for replica in replicas:
            replica.kill()

    # -- every span exactly once (a late duplicate would show up here too)
    ids = [s.span.span_id for s in sink.spans]
    assert len(ids) == SPANS_PER_TRACE * traces
    assert len(set(ids)) == len(ids), "a span was delivered twice"

    # -- each replica really took part, and together they received every span once
    assert all(n > 0 for n in received), received
    assert sum(received) == SPANS_PER_TRACE * traces

    # -- sampling: every decision is a single replica's
    rags = rag_spans(spans)
    assert len(rags) == traces
    for span in rags:
        attrs = span.attributes
        expected = sampler.decide(span.span.trace_id, attrs.get(semconv.SESSION_ID), attrs)
        assert attrs.get(semconv.EVAL_SAMPLED) is expected.sampled, attrs

    # -- conversations: the final score is the offline metric's
    finals = {name: _offline_final(name) for name in CONVERSATION_METRICS}
    for sid in sessions:
        turns = sorted(
            (s for s in rags if s.attributes.get(semconv.SESSION_ID) == sid),
            key=lambda s: s.attributes[semconv.TURN_INDEX],
        )
        assert [t.attributes[semconv.TURN_INDEX] for t in turns] == list(range(len(SCRIPT)))
        assert all(t.attributes[semconv.EVAL_SAMPLED] is True for t in turns)
        for name, final in finals.items():
            got = flat(turns[-1], name, semconv.EVAL_FIELD_CONVERSATION_SCORE)
            assert got == pytest.approx(final), (sid, name)
    # The scores are not all trivially 1: the script exercises the windows.
    assert any(score < 1.0 for score in finals.values()), finals

    # -- single-turn traffic without ground truth: the rate decides, per trace id
    plain = [s for s in rags if semconv.SESSION_ID not in s.attributes]
    plain = [s for s in plain if semconv.REFERENCE_CONTEXT_IDS not in s.attributes]
    outcomes = {s.attributes[semconv.EVAL_SAMPLED] for s in plain}
    assert outcomes == {True, False}, "at rate 0.5, 20 traces are not all decided alike"

    # -- single-turn traffic with ground truth is always scored (the default rule)
    with_truth = [s for s in rags if semconv.REFERENCE_CONTEXT_IDS in s.attributes]
    assert len(with_truth) == 10
    for span in with_truth:
        expected_ids = json.loads(span.attributes[semconv.REFERENCE_CONTEXT_IDS])
        retrieved = _app.ROUTES[span.attributes[semconv.INPUT_VALUE]]
        want = len(set(expected_ids) & set(retrieved)) / len(set(expected_ids))
        assert flat(span, "id_context_recall", semconv.EVAL_FIELD_SCORE) == pytest.approx(want)


def _received(replica: Serve) -> float:
    return sum(
        value
        for (name, _labels), value in replica.scrape().items()
        if name == "ragtrace_spans_received_total"
    )
