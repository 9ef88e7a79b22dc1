"""The evaluation stage at a replay (issue 27, defect 2), with the real ledger of
outputs (:class:`~ragtrace_collector.storage.outputs.OutputLedger`) and its holds.

``late_results: carrier`` and a judge slower than ``trace_timeout``: the first run
logs the span with its fast result and forwards the trace; the crash comes before the
judge answers.  At the replay the fast result is restored from the log, and the trace
reached an exporter already (a delivery mark), so what is computed now must follow on
a carrier span, and a judge still slower than ``trace_timeout`` must be let finish:
``late_results: carrier`` holds in carrier mode too.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.evaluation.enrichment import is_carrier
from ragtrace_collector.otlp.codec import Span, SpanGroup
from ragtrace_collector.otlp.spanattrs import attributes_to_dict
from ragtrace_collector.storage.outputs import Hold, OutputLedger
from tests.evaluation.test_evaluator import (
    _Forwarded,
    _HangingJudge,
    _late_evaluator,
    _rag_attrs,
    _SlowJudge,
    _trace,
)

_JUDGED = "contextual_relevancy"  # an LLM-judge metric
_FAST = "id_context_recall"  # scored at once


class _Log:
    """The pipeline's side of the ledger: logged results, carriers through holds."""

    def __init__(self, *, reached: bool) -> None:
        self.results: list[Span] = []
        self.carriers: list[AssembledTrace] = []
        self.unpinned = 0
        self.ledger = OutputLedger(
            hold=self._hold, results=self._results, reached=lambda trace: reached
        )

    def _hold(self, trace: AssembledTrace) -> Hold:
        return Hold([1], self._forward, self._unpin)

    def _forward(self, trace: AssembledTrace, hold: Hold) -> None:
        trace.forwarded = True
        hold.logging()
        self.carriers.append(trace)
        hold.logged()

    def _unpin(self, sources: list[int]) -> None:
        self.unpinned += 1

    def _results(self, trace: AssembledTrace, spans: list[Span]) -> None:
        self.results += [_span_copy(s) for s in spans]


def _span_copy(span: Span) -> Span:
    copy = Span()
    copy.CopyFrom(span)
    return copy


def _copy(trace: AssembledTrace) -> AssembledTrace:
    """The trace as its log entry holds it (before evaluation wrote on it)."""
    groups = [replace(g, spans=[_span_copy(s) for s in g.spans]) for g in trace.groups]
    return AssembledTrace(trace.trace_id, groups, ReleaseReason.READY, 0.0, 0.0, True)


async def test_a_replayed_trace_whose_fast_result_was_logged_gets_its_late_score() -> None:
    original = _trace(retrieved=["a"], reference=["a"], contents={"a": "Reset your password."})
    entry = _copy(original)

    # First run: the fast result is logged with the span, the trace goes out, and the
    # process dies before the judge answers (the drain is cut off, as by a kill).
    first_log = _Log(reached=False)
    first = _late_evaluator(_HangingJudge())
    first.use_ledger(first_log.ledger)
    first.start()
    forwarded = _Forwarded()
    first.submit(original, forwarded)
    await forwarded.wait_for(1)
    assert _rag_attrs(original)[f"ragtrace.eval.{_FAST}.score"] == 1.0
    assert [s.name for s in first_log.results] == ["rag"], "the fast result was logged"
    try:
        await asyncio.wait_for(first.drain(), 0.5)
    except TimeoutError:
        pass
    assert not first_log.carriers, "no late result before the crash"
    assert first_log.unpinned == 0, "the hold keeps the entry for the next start"

    # Replay: the log held the span with its fast result; an exporter has the trace.
    log = _Log(reached=True)
    log.ledger.found([SpanGroup(None, "", None, "", first_log.results)], is_carrier)
    judge = _SlowJudge(delay=0.6)  # still slower than trace_timeout
    again = _late_evaluator(judge)
    again.use_ledger(log.ledger)
    again.start()
    replayed = _Forwarded()
    again.submit(entry, replayed)
    await replayed.wait_for(1)
    # The trace is the exporters' once forwarded: nothing may write on it after.
    as_forwarded = [span.SerializeToString() for span, _ in entry.spans()]
    for _ in range(100):  # bounded: 5 s
        if log.unpinned:
            break
        await asyncio.sleep(0.05)
    await again.drain()
    assert replayed.traces == [entry]
    assert [span.SerializeToString() for span, _ in entry.spans()] == as_forwarded

    assert judge.started == 1
    assert log.unpinned == 1, "the hold was released once its outputs were logged"
    scores: dict[str, Any] = {}
    for carrier_trace in log.carriers:
        for span, _ in carrier_trace.spans():
            attrs = attributes_to_dict(span.attributes)
            assert attrs[semconv.OPENINFERENCE_SPAN_KIND] == "EVALUATOR"
            scores.update(attrs)
    assert f"ragtrace.eval.{_JUDGED}.error" not in scores, "cut off at trace_timeout"
    assert f"ragtrace.eval.{_JUDGED}.score" in scores, "the late score reached a carrier"
    assert f"ragtrace.eval.{_FAST}.score" not in scores, "the logged result is not recomputed"
