"""Evaluation off the event loop: the worker-process pool, input bounds, big traces.

Real worker processes (``evaluation:workers``), real signals; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from typing import Any

import pytest
from opentelemetry.proto.common.v1 import common_pb2

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.component import Status
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.config import CollectorConfig
from ragtrace_collector.evaluation.enrichment import EnrichmentConfig
from ragtrace_collector.evaluation.evaluator import EvaluationConfig, OnlineEvaluator
from ragtrace_collector.evaluation.pool import EvaluationPool
from ragtrace_collector.evaluation.sampling import Sampler, SamplingConfig
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import OFFLINE_METRICS, build_metrics
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.service.server import CollectorService
from ragtrace_collector.stores.session import create_session_store
from tests.fakes.spans import make_span

from .test_evaluator import _Forwarded, _rag_attrs, _resource

_WORDS = [
    "paris",
    "france",
    "capital",
    "tower",
    "eiffel",
    "river",
    "seine",
    "museum",
    "louvre",
    "art",
    "history",
    "king",
    "revolution",
    "bridge",
    "island",
    "cathedral",
    "notre",
    "dame",
    "city",
    "population",
    "million",
    "metro",
]


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(12)).capitalize() + "."
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def _rag_trace(
    rng: random.Random,
    *,
    context_chars: int = 600,
    docs: int = 4,
    session: str | None = None,
    turn: int | None = None,
    extra_spans: int = 0,
    repeat: int = 1,
) -> AssembledTrace:
    """A RAG trace with ground truth; ``repeat`` > 1 makes each document its first
    ``1/repeat`` repeated (a large context without generating every word)."""
    tid = rng.randbytes(16)
    texts = [(_text(rng, context_chars // docs // repeat) + " ") * repeat for _ in range(docs)]
    attrs: dict[str, Any] = {
        semconv.INPUT_VALUE: "What is the capital of France and its famous tower?",
        semconv.OUTPUT_VALUE: _text(rng, 200),
        semconv.EXPECTED_OUTPUT: texts[0][:150] + " " + _text(rng, 100),
        semconv.REFERENCE_CONTEXTS: json.dumps([texts[0][:300], _text(rng, 200)]),
        semconv.REFERENCE_CONTEXT_IDS: json.dumps(["d0", "d2", "dx"]),
    }
    if session is not None:
        attrs[semconv.SESSION_ID] = session
        attrs[semconv.TURN_INDEX] = turn
    rag = make_span(tid, "rag", attrs=attrs)
    ret = make_span(tid, "retriever", parent=rag, docs=[(f"d{i}", t) for i, t in enumerate(texts)])
    spans = [rag, ret]
    spans += [make_span(tid, "generator", parent=rag) for _ in range(extra_spans)]
    group = SpanGroup(_resource("pool-test"), "", common_pb2.InstrumentationScope(), "", spans)
    now = time.monotonic()
    return AssembledTrace(tid, [group], ReleaseReason.READY, now, now, True)


def _evaluator(
    processes: int, metrics: tuple[str, ...] = OFFLINE_METRICS, **config: Any
) -> OnlineEvaluator:
    cfg = EvaluationConfig(processes=processes, **config)
    built = build_metrics(list(metrics))
    pool = (
        EvaluationPool(built, processes=processes, metric_timeout=cfg.metric_timeout)
        if processes
        else None
    )
    return OnlineEvaluator(
        cfg,
        metrics=built,
        judge=OfflineJudge(),
        sampler=Sampler(SamplingConfig(rate=1.0)),
        session_store=create_session_store(),
        enrichment=EnrichmentConfig(),
        telemetry=Telemetry(),
        pool=pool,
    )


def _results(trace: AssembledTrace) -> dict[str, Any]:
    """Every evaluation attribute of the @rag span but the latency."""
    return {
        k: v
        for k, v in _rag_attrs(trace).items()
        if (k.startswith(semconv.EVAL_PREFIX + ".") or k.startswith("evaluations."))
        and k != semconv.EVAL_LATENCY_MS
    }


async def _wait_until(condition: Any, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def _run_all(processes: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    traces = [_rag_trace(rng) for _ in range(6)]
    traces += [_rag_trace(rng, session="s1", turn=t) for t in range(3)]
    ev = _evaluator(processes)
    ev.start()
    fwd = _Forwarded()
    try:
        for trace in traces:
            ev.submit(trace, fwd)
            if trace is traces[-1] or trace is traces[-2]:
                await fwd.wait_for(len(fwd.traces) + 1, limit=60)  # turns in order
        await fwd.wait_for(len(traces), limit=60)
    finally:
        await ev.drain()
    by_id = {t.trace_id: _results(t) for t in fwd.traces}
    return [by_id[t.trace_id] for t in traces]


async def test_pool_results_equal_in_process_results() -> None:
    in_process = await _run_all(0, seed=7)
    one = await _run_all(1, seed=7)
    two = await _run_all(2, seed=7)
    scored = [k for k in in_process[0] if k.endswith(".score")]
    assert len(scored) >= 7, in_process[0]  # the case metrics did score
    assert any(k.endswith(".conversation_score") for k in in_process[-1])
    # Document verdicts name their retriever span, whose id is random per run.
    assert _without_span_ids(one) == _without_span_ids(in_process)
    assert _without_span_ids(two) == _without_span_ids(in_process)


def _without_span_ids(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import re

    return [
        {
            k: re.sub(r'"span_id":"[0-9a-f]+"', "", v) if k.endswith(".documents") else v
            for k, v in attrs.items()
        }
        for attrs in runs
    ]


async def test_huge_trace_times_out_in_a_worker_without_blocking_the_loop() -> None:
    """Tens of MB of context with ground truth (bounds raised): the offline judge
    runs in a worker, the loop stays free, metric_timeout kills and replaces it.

    The offline judge reads the context at about 15 MB/s on an idle machine, so 32 MB
    keeps it busy about 2 s: several times the 0.3 s timeout, however fast the machine.
    (At 4 MB the metric finished in 0.3 s and the test depended on the machine.)"""
    ev = _evaluator(1, ("contextual_recall",), metric_timeout=0.3, max_context_chars=100_000_000)
    assert ev.pool is not None
    ev.start()
    fwd = _Forwarded()
    try:
        # Warm: the worker is up and answers.
        ev.submit(_rag_trace(random.Random(1)), fwd)
        await fwd.wait_for(1, limit=60)
        first_pid = ev.pool.pids
        huge = _rag_trace(random.Random(2), context_chars=32_000_000, docs=8, repeat=8)
        ev.submit(huge, fwd)
        # The loop is free while the worker computes: timers run, the trace waits.
        for _ in range(5):
            await asyncio.sleep(0.02)
        assert len(fwd.traces) == 1, "the huge trace finished before a 100 ms timer"
        await fwd.wait_for(2, limit=30)
        attrs = _rag_attrs(fwd.traces[1])
        assert attrs["ragtrace.eval.contextual_recall.error"] == "timeout"
        assert "worker process was killed" in attrs["ragtrace.eval.contextual_recall.reason"]
        assert ev.pool.stats.timeouts == 1
        assert ev.pool.stats.replaced == 1
        # The replacement scores the next trace.
        ev.submit(_rag_trace(random.Random(3)), fwd)
        await fwd.wait_for(3, limit=60)
        assert "ragtrace.eval.contextual_recall.score" in _rag_attrs(fwd.traces[2])
        assert ev.pool.pids != first_pid
        assert ev.pool.status is Status.OK
    finally:
        await ev.drain()


async def test_killed_worker_is_replaced_and_its_trace_forwarded_with_the_error() -> None:
    ev = _evaluator(
        1,
        ("contextual_recall", "id_context_recall"),
        metric_timeout=60.0,
        max_context_chars=10_000_000,
        inline_max_chars=0,
    )
    assert ev.pool is not None
    ev.start()
    fwd = _Forwarded()
    try:
        ev.submit(_rag_trace(random.Random(1)), fwd)
        await fwd.wait_for(1, limit=60)
        ev.submit(_rag_trace(random.Random(4), context_chars=3_000_000, docs=8), fwd)
        pool = ev.pool
        await _wait_until(
            lambda: any(m == "contextual_recall" for _, m, _ in pool.running()),
            30,
            "the worker to start contextual_recall",
        )
        (pid,) = pool.pids
        os.kill(pid, signal.SIGKILL)
        await fwd.wait_for(2, limit=60)
        attrs = _rag_attrs(fwd.traces[1])
        assert attrs["ragtrace.eval.contextual_recall.error"].startswith("worker_lost:")
        assert "SIGKILL" in attrs["ragtrace.eval.contextual_recall.error"]
        # The other metric of the case was sent again to the replacement and scored.
        assert attrs["ragtrace.eval.id_context_recall.score"] == pytest.approx(2 / 3)
        assert pool.stats.lost == 1
        assert pool.last_error is not None
        assert "SIGKILL" in pool.last_error
        assert pool.pids
        assert pool.pids != [pid]
    finally:
        await ev.drain()


async def test_worker_dead_before_its_batch_is_replaced_with_no_unretrieved_exception() -> None:
    """A worker that died while idle (OOM-killed between batches): writing the next
    batch fails and the read of its answer fails too.  The batch goes to a
    replacement, and neither failure surfaces as "Task exception was never
    retrieved"."""
    import gc

    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    ev = _evaluator(1, ("id_context_recall",), inline_max_chars=0)
    assert ev.pool is not None
    pool = ev.pool
    ev.start()
    fwd = _Forwarded()
    try:
        for round_ in range(3):
            ev.submit(_rag_trace(random.Random(10 + round_)), fwd)
            await fwd.wait_for(2 * round_ + 1, limit=60)
            (pid,) = pool.pids
            os.kill(pid, signal.SIGKILL)
            await _wait_until(lambda pid=pid: _gone(pid), 10, f"worker {pid} to die")
            ev.submit(_rag_trace(random.Random(20 + round_)), fwd)
            await fwd.wait_for(2 * round_ + 2, limit=60)
            attrs = _rag_attrs(fwd.traces[-1])
            assert attrs["ragtrace.eval.id_context_recall.score"] == pytest.approx(2 / 3)
            assert pool.pids
            assert pool.pids != [pid]
        assert pool.stats.replaced == 3
        gc.collect()
        await asyncio.sleep(0)
    finally:
        await ev.drain()
    assert unhandled == []


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts: its socket is closed).  The
    process may be reaped between opening its stat file and reading it: the read then
    fails with ESRCH (ProcessLookupError), which means gone too."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


async def test_hung_worker_is_replaced_and_the_case_scored_by_the_next() -> None:
    ev = _evaluator(1, ("contextual_recall",), metric_timeout=1.0)
    assert ev.pool is not None
    ev.start()
    fwd = _Forwarded()
    try:
        ev.submit(_rag_trace(random.Random(1)), fwd)
        await fwd.wait_for(1, limit=60)
        (pid,) = ev.pool.pids
        os.kill(pid, signal.SIGSTOP)  # hangs before it reads the next batch
        ev.submit(_rag_trace(random.Random(5)), fwd)
        await fwd.wait_for(2, limit=30)
        assert "ragtrace.eval.contextual_recall.score" in _rag_attrs(fwd.traces[1])
        assert ev.pool.stats.replaced == 1
        assert ev.pool.pids != [pid]
    finally:
        await ev.drain()


async def test_case_over_a_bound_is_skipped_with_the_reason_on_the_span() -> None:
    ev = _evaluator(0, max_context_chars=1000)
    ev.start()
    fwd = _Forwarded()
    try:
        ev.submit(_rag_trace(random.Random(6), context_chars=5000), fwd)
        await fwd.wait_for(1)
    finally:
        await ev.drain()
    attrs = _rag_attrs(fwd.traces[0])
    for metric in OFFLINE_METRICS:
        assert attrs[f"ragtrace.eval.{metric}.skipped"] is True, metric
        reason = attrs[f"ragtrace.eval.{metric}.reason"]
        assert "retrieval context" in reason
        assert "evaluation.max_context_chars 1,000" in reason
        assert f"ragtrace.eval.{metric}.score" not in attrs


async def test_truncated_case_is_scored_and_every_reason_says_so() -> None:
    ev = _evaluator(0, max_context_chars=1000, oversize="truncate")
    ev.start()
    fwd = _Forwarded()
    try:
        ev.submit(_rag_trace(random.Random(6), context_chars=5000), fwd)
        await fwd.wait_for(1)
    finally:
        await ev.drain()
    attrs = _rag_attrs(fwd.traces[0])
    assert "ragtrace.eval.contextual_recall.score" in attrs
    for metric in ("contextual_recall", "non_llm_context_recall", "id_context_recall"):
        assert attrs[f"ragtrace.eval.{metric}.reason"].startswith("[truncated: retrieval context")


async def test_case_building_of_a_big_trace_runs_off_the_loop() -> None:
    ev = _evaluator(0, ("id_context_recall",))
    ev.start()
    fwd = _Forwarded()
    ticks = 0
    try:
        trace = _rag_trace(random.Random(8), extra_spans=30_000)
        ev.submit(trace, fwd)
        assert not fwd.traces  # submit returned before the cases were built
        while not fwd.traces:
            await asyncio.sleep(0)
            ticks += 1
            assert ticks < 10_000_000
        assert ticks > 1, "the loop never ran while the trace was being built"
        assert _rag_attrs(fwd.traces[0])["ragtrace.eval.id_context_recall.score"] == pytest.approx(
            2 / 3
        )
    finally:
        await ev.drain()


def test_service_registers_the_evaluation_components(tmp_path: Any) -> None:
    config = CollectorConfig.model_validate(
        {
            "evaluation": {"processes": 2},
            "exporters": {"f": {"type": "file", "path": str(tmp_path / "out.jsonl")}},
        }
    )
    service = CollectorService(config)
    components = service.host.components
    assert components["evaluation"] is service.stage.evaluator  # type: ignore[union-attr]
    pool = components["evaluation:workers"]
    assert isinstance(pool, EvaluationPool)
    assert pool.processes == 2
    off = CollectorService(
        CollectorConfig.model_validate(
            {
                "evaluation": {"processes": 0},
                "exporters": {"f": {"type": "file", "path": str(tmp_path / "o.jsonl")}},
            }
        )
    )
    assert "evaluation:workers" not in off.host.components
