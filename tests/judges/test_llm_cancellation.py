"""Cancelling callers of the LLM judge: the call lives only while someone waits for it.

The collector cancels a metric at ``metric_timeout``; the judge call that metric
started must then stop at once (free its concurrency slot, stop retrying, cache
nothing), unless another caller still waits for the same call.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.evaluation.config import EvaluationConfig
from ragtrace_collector.evaluation.enrichment import EnrichmentConfig
from ragtrace_collector.evaluation.evaluator import OnlineEvaluator
from ragtrace_collector.evaluation.sampling import Sampler, SamplingConfig
from ragtrace_collector.judges.base import JudgeCallRecord, RelevanceRequest, UsefulnessRequest
from ragtrace_collector.judges.llm import LLMJudge
from ragtrace_collector.metrics import MetricOptions, build_metrics
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.otlp.spanattrs import attributes_to_dict
from ragtrace_collector.stores.session import SessionStoreConfig, create_session_store
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest, Reply, auto_reply
from tests.fakes.spans import make_span
from tests.judges.conftest import MakeJudge

CONTEXTS = ("Node one.", "Node two.", "Node three.")
HANG_S = 120.0  # far beyond anything a test waits for
WITHIN_S = 10.0  # generous bound for "promptly" on a busy machine


def usefulness_task(reference: str = "The reference answer.") -> UsefulnessRequest:
    return UsefulnessRequest(input="The question?", reference=reference, contexts=CONTEXTS)


def usefulness_answer(*verdicts: str) -> dict[str, object]:
    return {
        "verdicts": [{"node": i, "verdict": v} for i, v in enumerate(verdicts, 1)],
        "reason": "scripted",
    }


def _judge_calls_running() -> list[asyncio.Task[Any]]:
    """Tasks running an LLM judge call (``LLMJudge._answer``) on this loop."""
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and getattr(t.get_coro(), "__qualname__", "") == "LLMJudge._answer"
    ]


async def _until(predicate: Callable[[], bool], within_s: float = WITHIN_S) -> None:
    """Wait until ``predicate()`` holds, yielding to the loop (AssertionError otherwise)."""
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ------------------------------------------------------------- the judge alone
async def test_cancelled_caller_frees_the_slot_at_once(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    def handler(req: RecordedRequest) -> Reply:
        if "hangs" in req.prompt_text:
            return Reply.json(usefulness_answer("no", "no", "no"), delay_s=HANG_S)
        return Reply.json(usefulness_answer("yes", "no", "yes"))

    openai_server.handler = handler
    records: list[JudgeCallRecord] = []
    judge = make_judge(concurrency=1, timeout_s=HANG_S, on_call=records.append)

    caller = asyncio.create_task(judge.ask(usefulness_task("This one hangs.")))
    await openai_server.wait_for_requests(1)
    await _cancel(caller)

    # The only slot is free again: a different request goes out and is answered now,
    # not after the first call's timeout (120 s).
    started = time.monotonic()
    async with asyncio.timeout(WITHIN_S):
        answer = await judge.ask(usefulness_task("This one is answered."))
    assert time.monotonic() - started < WITHIN_S
    assert [v.verdict for v in answer.value.verdicts] == ["yes", "no", "yes"]
    assert answer.cost.calls == 1
    assert openai_server.request_count == 2
    assert openai_server.max_in_flight == 2  # the first is abandoned, still held server-side

    # The abandoned call is over (no task left running it) and was reported as
    # cancelled, not as a failure of the model.
    assert _judge_calls_running() == []
    assert [r.outcome for r in records] == ["cancelled", "ok"]
    assert records[0].prompt_tokens == 0
    assert records[0].cost_usd is None
    assert judge.stats.abandoned == 1
    assert judge.stats.http_calls == 2


async def test_cancelled_caller_stops_a_retry_waiting_in_backoff(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(
        Reply.error(429, retry_after=HANG_S), Reply.json(usefulness_answer("yes", "yes", "no"))
    )
    failed = asyncio.Event()
    records: list[JudgeCallRecord] = []

    def on_call(record: JudgeCallRecord) -> None:
        records.append(record)
        if record.outcome == "error":
            failed.set()

    judge = make_judge(backoff_max_s=HANG_S, max_retries=3, on_call=on_call)

    caller = asyncio.create_task(judge.ask(usefulness_task()))
    async with asyncio.timeout(WITHIN_S):
        await failed.wait()
    await _until(lambda: judge.stats.http_retries == 1)  # now sleeping Retry-After
    await _cancel(caller)

    await _until(lambda: _judge_calls_running() == [])
    assert openai_server.request_count == 1  # the retry never went out
    assert [r.outcome for r in records] == ["error"]  # no attempt was cut off on the wire

    # Nothing cached, nothing pending: the same request is a fresh call.
    answer = await judge.ask(usefulness_task())
    assert answer.cached is False
    assert [v.verdict for v in answer.value.verdicts] == ["yes", "yes", "no"]
    assert openai_server.request_count == 2


@pytest.mark.parametrize("cancelled", ["first", "second"])
async def test_cancelling_one_of_two_identical_callers_keeps_the_call(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge, cancelled: str
) -> None:
    release = asyncio.Event()

    async def held(_req: RecordedRequest) -> Reply:
        await release.wait()
        return Reply.json(usefulness_answer("yes", "no", "no"))

    openai_server.handler = held
    records: list[JudgeCallRecord] = []
    judge = make_judge(concurrency=1, on_call=records.append)

    first = asyncio.create_task(judge.ask(usefulness_task()))
    second = asyncio.create_task(judge.ask(usefulness_task()))
    try:
        await openai_server.wait_for_requests(1)
        assert judge.stats.requests == 2
        gone, survivor = (first, second) if cancelled == "first" else (second, first)
        await _cancel(gone)
        await asyncio.sleep(0.1)  # room for a (wrong) cancellation to reach the call
        assert not survivor.done()
        assert len(_judge_calls_running()) == 1
    finally:
        release.set()

    async with asyncio.timeout(WITHIN_S):
        answer = await survivor
    assert [v.verdict for v in answer.value.verdicts] == ["yes", "no", "no"]
    # The survivor is charged the one call, whichever caller started it.
    assert answer.cached is False
    assert answer.cost.calls == 1
    assert openai_server.request_count == 1
    assert judge.stats.abandoned == 0
    assert [r.outcome for r in records] == ["ok"]

    # The finished call was cached as usual.
    again = await judge.ask(usefulness_task())
    assert again.cached is True
    assert openai_server.request_count == 1


async def test_two_identical_callers_both_cancelled_cancel_the_call(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(Reply.json(usefulness_answer("no", "no", "no"), delay_s=HANG_S))
    records: list[JudgeCallRecord] = []
    judge = make_judge(concurrency=1, timeout_s=HANG_S, on_call=records.append)

    first = asyncio.create_task(judge.ask(usefulness_task()))
    second = asyncio.create_task(judge.ask(usefulness_task()))
    await openai_server.wait_for_requests(1)
    await _cancel(first)
    assert len(_judge_calls_running()) == 1  # the second still waits for it
    await _cancel(second)

    await _until(lambda: _judge_calls_running() == [])
    assert [r.outcome for r in records] == ["cancelled"]
    assert judge.stats.abandoned == 1


async def test_nothing_is_cached_for_a_cancelled_call(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(
        Reply.json(usefulness_answer("no", "no", "no"), delay_s=HANG_S),
        Reply.json(usefulness_answer("yes", "yes", "yes")),
    )
    judge = make_judge(timeout_s=HANG_S)

    caller = asyncio.create_task(judge.ask(usefulness_task()))
    await openai_server.wait_for_requests(1)
    await _cancel(caller)

    # Asked again at once (the cancelled call may not have unwound yet): a new call,
    # neither joined to the dying one nor served from the cache.
    async with asyncio.timeout(WITHIN_S):
        answer = await judge.ask(usefulness_task())
    assert answer.cached is False
    assert answer.cost.calls == 1
    assert [v.verdict for v in answer.value.verdicts] == ["yes", "yes", "yes"]
    assert openai_server.request_count == 2
    assert judge.stats.cache_hits == 0


# ------------------------------------------------------- through the collector
def _trace(question: str) -> AssembledTrace:
    tid = os.urandom(16)
    attrs: dict[str, Any] = {
        semconv.INPUT_VALUE: question,
        semconv.OUTPUT_VALUE: "Use the reset link.",
        semconv.REFERENCE_CONTEXT_IDS: json.dumps(["a"]),
    }
    rag = make_span(tid, "rag", attrs=attrs)
    ret = make_span(tid, "retriever", parent=rag, docs=[("a", "Reset your password here.")])
    resource = resource_pb2.Resource()
    resource.attributes.add(key="service.name").value.string_value = "support-bot"
    group = SpanGroup(resource, "", common_pb2.InstrumentationScope(), "", [rag, ret])
    now = time.monotonic()
    return AssembledTrace(tid, [group], ReleaseReason.READY, now, now, True)


def _rag_attrs(trace: AssembledTrace) -> dict[str, Any]:
    for span, _ in trace.spans():
        attrs = attributes_to_dict(span.attributes)
        if attrs.get(semconv.RAGTRACE_SPAN_KIND) == "rag":
            return attrs
    raise AssertionError("no rag span")


class _Forwarded:
    def __init__(self) -> None:
        self.traces: list[AssembledTrace] = []
        self.event = asyncio.Event()

    def __call__(self, trace: AssembledTrace) -> None:
        self.traces.append(trace)
        self.event.set()

    async def next(self, within_s: float) -> AssembledTrace:
        async with asyncio.timeout(within_s):
            await self.event.wait()
        self.event.clear()
        return self.traces[-1]


async def test_metric_timeouts_do_not_starve_a_hanging_judge_of_its_slot(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    def handler(req: RecordedRequest) -> Reply:
        if "hangs" in req.prompt_text:
            return Reply(delay_s=HANG_S)
        return auto_reply(req)

    openai_server.handler = handler
    # Warm litellm up (first-call setup) so that the prompt answer below is prompt.
    warm = make_judge()
    await warm.ask(RelevanceRequest(input="Warm up?", contexts=("Warm.",)))

    hooks: list[Callable[[JudgeCallRecord], None]] = []
    judge: LLMJudge = make_judge(
        concurrency=1,
        timeout_s=HANG_S,
        max_retries=0,
        on_call=lambda record: [hook(record) for hook in hooks],
    )
    telemetry = Telemetry()
    metric_timeout = 1.5
    chosen = {"contextual_relevancy": MetricOptions()}
    ev = OnlineEvaluator(
        EvaluationConfig(workers=1, metric_timeout=metric_timeout, trace_timeout=HANG_S),
        metrics=build_metrics(list(chosen), chosen),
        judge=judge,
        sampler=Sampler(SamplingConfig(rate=1.0)),
        session_store=create_session_store(SessionStoreConfig()),
        enrichment=EnrichmentConfig(),
        telemetry=telemetry,
    )
    hooks.append(ev.judge_listener())
    ev.start()
    fwd = _Forwarded()
    requests_before = openai_server.request_count
    try:
        # Each hanging trace is bounded by metric_timeout and then gives its slot back:
        # the next trace's judge call goes out at once instead of queueing behind a
        # call that would hold the only slot for judge.timeout_s (120 s).
        for i in range(3):
            started = time.monotonic()
            ev.submit(_trace(f"Question {i} hangs?"), fwd)
            trace = await fwd.next(metric_timeout + WITHIN_S)
            assert time.monotonic() - started < metric_timeout + WITHIN_S
            assert _rag_attrs(trace)["ragtrace.eval.contextual_relevancy.error"] == "timeout"
            assert openai_server.request_count == requests_before + i + 1

        # A judge that answers again is heard straight away: a score, not a timeout.
        ev.submit(_trace("How do I reset my password?"), fwd)
        trace = await fwd.next(metric_timeout + WITHIN_S)
        attrs = _rag_attrs(trace)
        assert "ragtrace.eval.contextual_relevancy.error" not in attrs
        assert isinstance(attrs["ragtrace.eval.contextual_relevancy.score"], float)
        assert openai_server.request_count == requests_before + 4
    finally:
        await ev.drain()

    await _until(lambda: _judge_calls_running() == [])
    assert judge.stats.abandoned == 3
    text = telemetry.render().decode()
    model = judge.model
    assert f'ragtrace_judge_calls_total{{model="{model}",outcome="cancelled"}} 3.0' in text
    assert f'ragtrace_judge_calls_total{{model="{model}",outcome="ok"}} 1.0' in text
    assert f'ragtrace_judge_calls_total{{model="{model}",outcome="error"}}' not in text
