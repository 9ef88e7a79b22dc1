"""The online evaluation stage, driven through its processor contract."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.cases import ContextItem, Conversation, Turn
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.evaluation.enrichment import EnrichmentConfig
from ragtrace_collector.evaluation.evaluator import EvaluationConfig, OnlineEvaluator
from ragtrace_collector.evaluation.sampling import Sampler, SamplingConfig
from ragtrace_collector.judges.base import JudgeAnswer, JudgeTask
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import MetricOptions, build_metric, build_metrics
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.otlp.spanattrs import attributes_to_dict, set_attribute
from ragtrace_collector.results import MetricResult
from ragtrace_collector.stores.session import SessionStoreConfig, create_session_store
from tests.fakes.spans import make_span


def _resource(service: str) -> resource_pb2.Resource:
    res = resource_pb2.Resource()
    kv = res.attributes.add(key="service.name")
    kv.value.string_value = service
    return res


def _trace(
    *,
    retrieved: list[str],
    reference: list[str] | None,
    question: str = "How do I reset my password?",
    session: str | None = None,
    turn: int | None = None,
    contents: dict[str, str] | None = None,
    service: str = "support-bot",
) -> AssembledTrace:
    tid = os.urandom(16)
    attrs: dict[str, Any] = {semconv.INPUT_VALUE: question, semconv.OUTPUT_VALUE: "answer"}
    if reference is not None:
        attrs[semconv.REFERENCE_CONTEXT_IDS] = json.dumps(reference)
    if session is not None:
        attrs[semconv.SESSION_ID] = session
        attrs[semconv.TURN_INDEX] = turn
    rag = make_span(tid, "rag", attrs=attrs)
    docs = [(d, (contents or {}).get(d, f"text of {d}")) for d in retrieved]
    ret = make_span(tid, "retriever", parent=rag, docs=docs)
    group = SpanGroup(_resource(service), "", common_pb2.InstrumentationScope(), "", [rag, ret])
    now = time.monotonic()
    return AssembledTrace(tid, [group], ReleaseReason.READY, now, now, True)


class _Forwarded:
    def __init__(self) -> None:
        self.traces: list[AssembledTrace] = []
        self.event = asyncio.Event()

    def __call__(self, trace: AssembledTrace) -> None:
        assert not trace.forwarded, "forwarded twice"
        trace.forwarded = True
        self.traces.append(trace)
        self.event.set()

    async def wait_for(self, n: int, limit: float = 10.0) -> None:
        deadline = time.monotonic() + limit
        while len(self.traces) < n:
            self.event.clear()
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(self.traces)} of {n} traces forwarded"
            try:
                await asyncio.wait_for(self.event.wait(), remaining)
            except TimeoutError:
                pass


def _rag_attrs(trace: AssembledTrace) -> dict[str, Any]:
    for span, _ in trace.spans():
        attrs = attributes_to_dict(span.attributes)
        if attrs.get(semconv.RAGTRACE_SPAN_KIND) == "rag":
            return attrs
    raise AssertionError("no rag span")


def _evaluator(
    *,
    metrics: dict[str, MetricOptions] | None = None,
    judge: Any = None,
    rate: float = 1.0,
    telemetry: Telemetry | None = None,
    enrichment: EnrichmentConfig | None = None,
    store: Any = None,
    **config: Any,
) -> OnlineEvaluator:
    chosen = (
        metrics
        if metrics is not None
        else {"id_context_recall": MetricOptions(), "id_context_precision": MetricOptions()}
    )
    return OnlineEvaluator(
        EvaluationConfig(**config),
        metrics=build_metrics(list(chosen), chosen),
        judge=judge or OfflineJudge(),
        sampler=Sampler(SamplingConfig(rate=rate)),
        session_store=store or create_session_store(SessionStoreConfig()),
        enrichment=enrichment or EnrichmentConfig(),
        telemetry=telemetry or Telemetry(),
    )


async def test_sampled_trace_gets_exact_id_scores_in_all_forms() -> None:
    telemetry = Telemetry()
    seen: list[tuple[str, str, float | None]] = []
    ev = _evaluator(telemetry=telemetry)
    ev._listeners.append(lambda svc, m, r, tid, segs: seen.append((svc, m, r.score)))
    ev.start()
    fwd = _Forwarded()
    trace = _trace(
        retrieved=["doc_1", "doc_2", "doc_3"], reference=["doc_1", "doc_4", "doc_5", "doc_6"]
    )
    ev.submit(trace, fwd)
    await fwd.wait_for(1)
    attrs = _rag_attrs(fwd.traces[0])
    assert attrs["ragtrace.eval.id_context_recall.score"] == pytest.approx(0.25)
    assert attrs["ragtrace.eval.id_context_precision.score"] == pytest.approx(1 / 3)
    assert attrs["ragtrace.eval.id_context_recall.passed"] is False
    assert attrs[semconv.EVAL_SAMPLE_RATE] == 1.0
    assert attrs[semconv.EVAL_MODEL] == "offline"
    names = {v for k, v in attrs.items() if k.endswith(".evaluation.name")}
    assert names == {"id_context_recall", "id_context_precision"}
    rag = next(s for s, _ in fwd.traces[0].spans() if s.events)
    assert {e.name for e in rag.events} == {semconv.GEN_AI_EVALUATION_RESULT_EVENT}
    assert sorted(seen) == [
        ("support-bot", "id_context_precision", pytest.approx(1 / 3)),
        ("support-bot", "id_context_recall", 0.25),
    ]
    text = telemetry.render().decode()
    assert (
        'ragtrace_eval_results_total{metric="id_context_recall",outcome="failed",'
        'service="support-bot"} 1.0' in text
    )
    assert 'ragtrace_eval_score_count{metric="id_context_recall",service="support-bot"} 1.0' in text
    await ev.drain()


async def test_unsampled_trace_forwarded_at_once_with_rate_recorded() -> None:
    ev = _evaluator(rate=0.0)  # no workers started: nothing may wait on them
    fwd = _Forwarded()
    ev.submit(_trace(retrieved=["a"], reference=None), fwd)
    assert len(fwd.traces) == 1
    attrs = _rag_attrs(fwd.traces[0])
    assert attrs[semconv.EVAL_SAMPLE_RATE] == 0.0
    assert attrs[semconv.EVAL_SAMPLED] is False
    assert not any(k.startswith("ragtrace.eval.id_") for k in attrs)


async def test_ground_truth_traces_sampled_even_at_rate_zero() -> None:
    ev = _evaluator(rate=0.0)
    ev.start()
    fwd = _Forwarded()
    ev.submit(_trace(retrieved=["a"], reference=["a"]), fwd)
    await fwd.wait_for(1)
    assert _rag_attrs(fwd.traces[0])["ragtrace.eval.id_context_recall.score"] == 1.0
    await ev.drain()


async def test_trace_without_rag_span_passes_through() -> None:
    ev = _evaluator()
    fwd = _Forwarded()
    tid = os.urandom(16)
    span = make_span(tid, "retriever", docs=[("a", "A")])
    group = SpanGroup(None, "", None, "", [span])
    ev.submit(AssembledTrace(tid, [group], ReleaseReason.READY, 0.0, 0.0, True), fwd)
    assert len(fwd.traces) == 1


async def test_overload_forwards_unevaluated_and_counts() -> None:
    telemetry = Telemetry()
    ev = _evaluator(telemetry=telemetry, queue_size=1)  # workers not started: queue fills
    fwd = _Forwarded()
    first = _trace(retrieved=["a"], reference=["a"])
    second = _trace(retrieved=["a"], reference=["a"])
    ev.submit(first, fwd)
    ev.submit(second, fwd)
    assert fwd.traces == [second]
    assert "ragtrace.eval.id_context_recall.score" not in _rag_attrs(second)
    text = telemetry.render().decode()
    assert 'ragtrace_eval_skipped_total{reason="overload"} 1.0' in text
    # shutdown forwards what is still queued, unevaluated
    await ev.drain()
    assert fwd.traces == [second, first]
    assert 'ragtrace_eval_skipped_total{reason="shutdown"} 1.0' in telemetry.render().decode()


class _HangingJudge:
    model = "openai/hanging"
    heuristic = False

    def __init__(self) -> None:
        self.started = 0

    async def ask(self, task: JudgeTask[Any]) -> JudgeAnswer[Any]:
        self.started += 1
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


async def test_hanging_judge_times_out_and_span_still_forwarded_in_bounded_time() -> None:
    judge = _HangingJudge()
    ev = _evaluator(
        metrics={"contextual_recall": MetricOptions(), "id_context_recall": MetricOptions()},
        judge=judge,
        metric_timeout=0.3,
        trace_timeout=5.0,
    )
    ev.start()
    fwd = _Forwarded()
    t0 = time.monotonic()
    ev.submit(_trace(retrieved=["a"], reference=["a"], contents={"a": "Reset it."}), fwd)
    await fwd.wait_for(1)
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0
    attrs = _rag_attrs(fwd.traces[0])
    assert attrs["ragtrace.eval.id_context_recall.score"] == 1.0
    # contextual_recall lacks expected_output: skipped, not an error, and no judge call
    assert attrs["ragtrace.eval.contextual_recall.skipped"] is True
    assert judge.started == 0
    await ev.drain()


async def test_metric_timeout_records_error_timeout() -> None:
    judge = _HangingJudge()
    ev = _evaluator(
        metrics={"contextual_relevancy": MetricOptions(), "id_context_recall": MetricOptions()},
        judge=judge,
        metric_timeout=0.3,
        trace_timeout=5.0,
    )
    ev.start()
    fwd = _Forwarded()
    t0 = time.monotonic()
    ev.submit(_trace(retrieved=["a"], reference=["a"], contents={"a": "Reset it."}), fwd)
    await fwd.wait_for(1)
    assert time.monotonic() - t0 < 3.0
    attrs = _rag_attrs(fwd.traces[0])
    assert attrs["ragtrace.eval.contextual_relevancy.error"] == "timeout"
    assert "ragtrace.eval.contextual_relevancy.score" not in attrs
    assert attrs["ragtrace.eval.id_context_recall.score"] == 1.0
    assert judge.started == 1
    await ev.drain()


class _SlowJudge(_HangingJudge):
    """Answers (as the offline judge), but only after ``delay`` seconds."""

    def __init__(self, delay: float = 0.6) -> None:
        super().__init__()
        self.delay = delay

    async def ask(self, task: JudgeTask[Any]) -> JudgeAnswer[Any]:
        self.started += 1
        await asyncio.sleep(self.delay)
        return await OfflineJudge().ask(task)


#: A fast metric and an LLM-judge one.
_FAST_AND_JUDGED = {"contextual_relevancy": MetricOptions(), "id_context_recall": MetricOptions()}


def _late_evaluator(judge: Any, **config: Any) -> OnlineEvaluator:
    """``late_results: carrier`` with ``trace_timeout`` shorter than ``judge``'s delay."""
    return _evaluator(
        metrics=_FAST_AND_JUDGED,
        judge=judge,
        metric_timeout=10.0,
        trace_timeout=0.2,
        late_results="carrier",
        **config,
    )


async def test_trace_timeout_with_late_results_on_carrier_span() -> None:
    ev = _late_evaluator(_SlowJudge())
    ev.start()
    fwd = _Forwarded()
    trace = _trace(retrieved=["a"], reference=["a"], contents={"a": "Reset your password."})
    ev.submit(trace, fwd)
    await fwd.wait_for(2)
    first, carrier_trace = fwd.traces
    assert first is trace
    attrs = _rag_attrs(first)
    assert attrs["ragtrace.eval.id_context_recall.score"] == 1.0
    assert "ragtrace.eval.contextual_relevancy.score" not in attrs
    [(carrier, _)] = list(carrier_trace.spans())
    cattrs = attributes_to_dict(carrier.attributes)
    assert cattrs[semconv.OPENINFERENCE_SPAN_KIND] == "EVALUATOR"
    assert "ragtrace.eval.contextual_relevancy.score" in cattrs
    assert carrier.trace_id == trace.trace_id
    rag = next(s for s, _ in first.spans() if s.name == "rag")
    assert carrier.links[0].span_id == rag.span_id
    await ev.drain()


async def test_attach_carrier_with_late_results_sends_a_late_carrier() -> None:
    """``attach: carrier`` and ``late_results: carrier``: what is done by
    ``trace_timeout`` goes on one carrier, the judge's late result on another (not
    cut off as a timeout)."""

    class _SlowJudge(_HangingJudge):
        async def ask(self, task: JudgeTask[Any]) -> JudgeAnswer[Any]:
            await asyncio.sleep(0.6)
            return await OfflineJudge().ask(task)

    ev = _late_evaluator(_SlowJudge(), enrichment=EnrichmentConfig(attach="carrier"))
    ev.start()
    fwd = _Forwarded()
    trace = _trace(retrieved=["a"], reference=["a"], contents={"a": "Reset your password."})
    ev.submit(trace, fwd)
    await fwd.wait_for(3)
    first, on_time, late = fwd.traces
    assert first is trace
    [(carrier, _)] = list(on_time.spans())
    attrs = attributes_to_dict(carrier.attributes)
    assert attrs["ragtrace.eval.id_context_recall.score"] == 1.0
    assert not any(k.startswith("ragtrace.eval.contextual_relevancy.") for k in attrs)
    [(carrier, _)] = list(late.spans())
    attrs = attributes_to_dict(carrier.attributes)
    assert "ragtrace.eval.contextual_relevancy.score" in attrs
    assert "ragtrace.eval.contextual_relevancy.error" not in attrs
    await ev.drain()


async def test_attach_carrier_forwards_original_immediately() -> None:
    ev = _evaluator(enrichment=EnrichmentConfig(attach="carrier"))
    ev.start()
    fwd = _Forwarded()
    trace = _trace(retrieved=["a", "b"], reference=["a"])
    ev.submit(trace, fwd)
    await fwd.wait_for(2)
    assert fwd.traces[0] is trace
    assert "ragtrace.eval.id_context_recall.score" not in _rag_attrs(trace)
    [(carrier, _)] = list(fwd.traces[1].spans())
    assert attributes_to_dict(carrier.attributes)["ragtrace.eval.id_context_precision.score"] == 0.5
    await ev.drain()


# ---------------------------------------------------------------- conversations
_TURNS = [
    ("How do I reset my password?", ["Open Settings, then Security, then Reset password."]),
    ("Is there a fee for it?", []),
    ("What if I lost access to my email?", ["Contact support with your account ID to verify."]),
    ("Thanks, and how long does verification take?", ["Verification takes two business days."]),
]
_OUTCOME = "The user resets the password, or verifies identity with support in two days."


def _conversation() -> Conversation:
    turns: list[Turn] = []
    for question, contexts in _TURNS:
        turns.append(Turn(role="user", content=question))
        turns.append(
            Turn(
                role="assistant",
                content="answer",
                retrieval_context=[ContextItem(content=c) for c in contexts],
            )
        )
    return Conversation(turns=turns, expected_outcome=_OUTCOME)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.services)])
def session_store(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return create_session_store(SessionStoreConfig(), window_size=2)
    server = request.getfixturevalue("redis_server")
    prefix = f"ragtrace:test:{os.urandom(4).hex()}:"
    return create_session_store(
        SessionStoreConfig(backend="redis", url=server.url, key_prefix=prefix), window_size=2
    )


@pytest.mark.parametrize("window_size", [2, 10])
async def test_online_conversation_score_equals_offline_metric(
    session_store: Any, window_size: int
) -> None:
    names = ["turn_contextual_precision", "turn_contextual_recall", "turn_contextual_relevancy"]
    opts = MetricOptions(window_size=window_size)
    ev = _evaluator(metrics=dict.fromkeys(names, opts), store=session_store)
    ev.start()
    fwd = _Forwarded()
    session = f"s-{os.urandom(4).hex()}"
    for index, (question, contexts) in enumerate(_TURNS):
        ids = [f"d{index}-{i}" for i in range(len(contexts))]
        trace = _trace(
            retrieved=ids,
            reference=None,
            question=question,
            session=session,
            turn=index,
            contents=dict(zip(ids, contexts, strict=True)),
        )
        rag = next(s for s, _ in trace.spans() if s.name == "rag")
        set_attribute(rag.attributes, semconv.EXPECTED_OUTCOME, _OUTCOME)
        ev.submit(trace, fwd)
        await fwd.wait_for(index + 1)  # turns complete one after another, as in a chat

    judge = OfflineJudge()
    last = _rag_attrs(fwd.traces[-1])
    scores: list[float] = []
    for name in names:
        offline: MetricResult = await build_metric(name, opts).measure_conversation(  # type: ignore[attr-defined]
            _conversation(), judge
        )
        assert offline.score is not None
        online = last[f"ragtrace.eval.{name}.conversation_score"]
        assert online == pytest.approx(offline.score, abs=1e-9), name
        scores.append(online)
        for trace in fwd.traces:
            assert f"ragtrace.eval.{name}.score" in _rag_attrs(trace)
    # the lexical judge finds the third turn's context off-topic: not a trivial 1.0
    assert min(scores) < 1.0
    await ev.drain()
