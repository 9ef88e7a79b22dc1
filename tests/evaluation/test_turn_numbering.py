"""Conversations whose turns carry no ``ragtrace.turn.index`` (OpenInference
``using_session``, GenAI ``gen_ai.conversation.id``): the session store numbers the
turns 1, 2, 3, ... by start, so every reason and detail names a real turn, whatever
order the turns arrive in."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from ragtrace import semconv
from ragtrace_collector.cases import Conversation
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.evaluation.enrichment import EnrichmentConfig
from ragtrace_collector.evaluation.evaluator import EvaluationConfig, OnlineEvaluator
from ragtrace_collector.evaluation.sampling import Sampler, SamplingConfig
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import MetricOptions, build_metric, build_metrics
from ragtrace_collector.otlp.spanattrs import set_attribute
from ragtrace_collector.results import MetricResult
from ragtrace_collector.stores.session import SessionStoreConfig, create_session_store
from tests.evaluation.test_evaluator import (
    _OUTCOME,
    _TURNS,
    _conversation,
    _Forwarded,
    _rag_attrs,
    _trace,
)

_NAMES = ["turn_contextual_precision", "turn_contextual_recall", "turn_contextual_relevancy"]
#: Start of turn k (1-based): a realistic clock, whose microseconds the old code used.
_T0 = 1_795_628_315_281_335_000


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.services)])
def store_config(request: pytest.FixtureRequest) -> SessionStoreConfig:
    if request.param == "memory":
        return SessionStoreConfig()
    server = request.getfixturevalue("redis_server")
    prefix = f"ragtrace:turns:{os.urandom(4).hex()}:"
    return SessionStoreConfig(backend="redis", url=server.url, key_prefix=prefix)


def _evaluator(
    config: SessionStoreConfig, seen: list[MetricResult], window_size: int = 2
) -> OnlineEvaluator:
    opts = MetricOptions(window_size=window_size)
    chosen = dict.fromkeys(_NAMES, opts)

    def listen(
        service: str, metric: str, result: MetricResult, trace_id: str, segments: tuple[str, ...]
    ) -> None:
        seen.append(result)

    return OnlineEvaluator(
        EvaluationConfig(),
        metrics=build_metrics(list(chosen), chosen),
        judge=OfflineJudge(),
        sampler=Sampler(SamplingConfig(rate=1.0)),
        session_store=create_session_store(config, window_size=window_size),
        enrichment=EnrichmentConfig(),
        telemetry=Telemetry(),
        listeners=[listen],
    )


def _turn_trace(session: str, k: int) -> Any:
    """Turn k (1-based) of _TURNS as an unindexed trace starting at _T0 + k seconds."""
    question, contexts = _TURNS[k - 1]
    ids = [f"d{k}-{i}" for i in range(len(contexts))]
    trace = _trace(
        retrieved=ids,
        reference=None,
        question=question,
        session=session,
        turn=None,
        contents=dict(zip(ids, contexts, strict=True)),
    )
    for span, _ in trace.spans():
        span.start_time_unix_nano = _T0 + k * 1_000_000_000
        if span.name == "rag":
            kept = [kv for kv in span.attributes if kv.key != semconv.TURN_INDEX]
            del span.attributes[:]
            span.attributes.extend(kept)
            set_attribute(span.attributes, semconv.EXPECTED_OUTCOME, _OUTCOME)
    assert semconv.TURN_INDEX not in _rag_attrs(trace)
    return trace


def _named_turns(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"turns? (\d+)", text)}


async def test_unindexed_turns_in_order_score_like_the_offline_metric(
    store_config: SessionStoreConfig,
) -> None:
    seen: list[MetricResult] = []
    ev = _evaluator(store_config, seen)
    ev.start()
    fwd = _Forwarded()
    session = f"s-{os.urandom(4).hex()}"
    for k in range(1, len(_TURNS) + 1):
        ev.submit(_turn_trace(session, k), fwd)
        await fwd.wait_for(k)
    await ev.drain()

    assert len(seen) == len(_NAMES) * len(_TURNS)
    for result in seen:
        assert result.error is None, result
        assert "missing" not in result.reason, result.reason
        assert "missing_turns" not in result.details
    assert sorted(r.details["turn"] for r in seen) == sorted(
        k for k in range(1, len(_TURNS) + 1) for _ in _NAMES
    )
    last = _rag_attrs(fwd.traces[-1])
    for name in _NAMES:
        offline = await build_metric(name, MetricOptions(window_size=2)).measure_conversation(  # type: ignore[attr-defined]
            _conversation(), OfflineJudge()
        )
        online = last[f"ragtrace.eval.{name}.conversation_score"]
        assert online == pytest.approx(offline.score, abs=1e-9), name


async def test_unindexed_turns_out_of_order_name_only_real_turns(
    store_config: SessionStoreConfig,
) -> None:
    """Turns 3, 1, 4, 2 arrive in that order: every number is one of 1..4, no reason
    names a turn (nothing is 'missing'), and a turn that arrives late is numbered by its
    start, not by its arrival."""
    seen: list[MetricResult] = []
    ev = _evaluator(store_config, seen)
    ev.start()
    fwd = _Forwarded()
    session = f"s-{os.urandom(4).hex()}"
    for n, k in enumerate([3, 1, 4, 2], 1):
        ev.submit(_turn_trace(session, k), fwd)
        await fwd.wait_for(n)
    # The running sums count each turn once (keyed by span, not by a number that moved).
    for name in _NAMES:
        _, count = await ev.sessions.get_window_scores(session, name)
        assert count == len(_TURNS), name
    await ev.drain()

    assert len(seen) == len(_NAMES) * len(_TURNS)
    numbers = [r.details["turn"] for r in seen]
    # Arrival 3 -> 1st known turn; 1 -> 1 (3 moves to 2); 4 -> 3; 2 -> 2 (finally 1..4).
    assert numbers == [n for n in (1, 1, 3, 2) for _ in _NAMES]
    for result in seen:
        assert result.error is None, result
        assert not _named_turns(result.reason), result.reason
        assert "missing_turns" not in result.details


async def test_a_window_with_no_unit_names_no_unit() -> None:
    """A turn whose conversation holds no complete unit (dropped by the store, older
    than every kept turn) is skipped without naming a unit or turn that does not exist."""
    metric = build_metric("turn_contextual_relevancy", MetricOptions(window_size=2))
    empty = Conversation(turns=[], expected_outcome=_OUTCOME)
    result = await metric.measure_window(empty, -1, OfflineJudge())  # type: ignore[attr-defined]
    assert result.skipped
    assert "-1" not in result.reason
    assert "no complete units" in result.reason
