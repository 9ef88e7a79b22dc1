"""Trace assembly on a real event loop: grouping, readiness, bounds, late spans."""

from __future__ import annotations

import asyncio

import pytest

from ragtrace_collector.assembly.assembler import AssembledTrace, Assembler, ReleaseReason
from ragtrace_collector.assembly.config import AssemblyConfig
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.otlp.codec import split_request
from tests.fakes.otlp_data import make_request, make_span, new_trace_id, rag_trace


class _Released:
    def __init__(self) -> None:
        self.traces: list[AssembledTrace] = []
        self.event = asyncio.Event()

    def __call__(self, trace: AssembledTrace) -> None:
        self.traces.append(trace)
        self.event.set()

    async def wait(self, count: int, within: float = 5.0) -> None:
        async def _until() -> None:
            while len(self.traces) < count:
                self.event.clear()
                await self.event.wait()

        await asyncio.wait_for(_until(), within)


def _assembler(released: _Released, telemetry: Telemetry | None = None, **cfg: object) -> Assembler:
    config = AssemblyConfig.model_validate({"decision_wait": 0.05, "max_trace_wait": 2.0, **cfg})
    return Assembler(config, released, telemetry or Telemetry())


async def test_spans_of_one_trace_across_requests_are_released_together() -> None:
    released = _Released()
    asm = _assembler(released)
    tid = new_trace_id()
    spans = rag_trace(tid, children=4)
    # The children come in three requests, the root last; another trace is interleaved.
    other = rag_trace(children=1)
    asm.add(split_request(make_request(spans[:2])))
    asm.add(split_request(make_request(other)))
    asm.add(split_request(make_request(spans[2:4])))
    assert asm.buffered_spans == 6
    asm.add(split_request(make_request(spans[4:])))
    await released.wait(2)
    by_id = {t.trace_id: t for t in released.traces}
    trace = by_id[tid]
    assert trace.reason is ReleaseReason.READY
    assert trace.span_count == 5
    assert sorted(s.name for s, _ in trace.spans()) == sorted(s.name for s in spans)
    assert [s.name for s in trace.root_spans()] == ["rag"]
    assert asm.buffered_spans == 0
    asm.close()


async def test_decision_wait_restarts_with_every_new_span() -> None:
    released = _Released()
    asm = _assembler(released, decision_wait=0.3, max_trace_wait=10)
    tid = new_trace_id()
    root = make_span(tid, name="root")
    asm.add(split_request(make_request([root])))
    loop = asyncio.get_running_loop()
    start = loop.time()
    for _ in range(3):
        await asyncio.sleep(0.15)
        asm.add(split_request(make_request([make_span(tid, parent=root.span_id)])))
    await released.wait(1)
    waited = loop.time() - start
    # Released 0.3s after the last span (at ~0.45s), not 0.3s after the root.
    assert waited >= 0.45 + 0.3 - 0.05
    assert released.traces[0].span_count == 4
    asm.close()


async def test_trace_without_root_is_released_at_max_trace_wait() -> None:
    released = _Released()
    telemetry = Telemetry()
    asm = _assembler(released, telemetry, max_trace_wait=0.3)
    tid = new_trace_id()
    asm.add(split_request(make_request([make_span(tid, parent=b"\x01" * 8)])))
    await asyncio.sleep(0.1)
    assert released.traces == []
    await released.wait(1)
    assert released.traces[0].reason is ReleaseReason.MAX_WAIT
    assert not released.traces[0].has_root
    assert (
        telemetry.registry.get_sample_value(
            "ragtrace_traces_released_total", {"reason": "max_wait"}
        )
        == 1
    )
    asm.close()


async def test_over_the_bound_oldest_traces_are_released_early_never_dropped() -> None:
    released = _Released()
    telemetry = Telemetry()
    asm = _assembler(
        released, telemetry, decision_wait=60, max_trace_wait=60, max_buffered_spans=10
    )
    order = []
    for _ in range(7):  # 7 traces x 3 spans = 21 spans; all wait a minute for decision_wait
        spans = rag_trace(children=2)
        order.append(spans[0].trace_id)
        asm.add(split_request(make_request(spans)))
        assert asm.buffered_spans <= 10
    # 21 spans, bound 10: the 4 oldest traces went out early, in arrival order.
    assert [t.trace_id for t in released.traces] == order[:4]
    assert all(t.reason is ReleaseReason.PRESSURE for t in released.traces)
    assert asm.buffered_spans == 9
    assert asm.release_all() == 3
    assert [t.trace_id for t in released.traces[4:]] == order[4:]
    assert sum(t.span_count for t in released.traces) == 21
    assert (
        telemetry.registry.get_sample_value(
            "ragtrace_traces_released_total", {"reason": "pressure"}
        )
        == 4
    )
    asm.close()


async def test_late_span_is_forwarded_on_its_own_and_counted() -> None:
    released = _Released()
    telemetry = Telemetry()
    asm = _assembler(released, telemetry)
    spans = rag_trace(children=1)
    tid = spans[0].trace_id
    asm.add(split_request(make_request(spans)))
    await released.wait(1)
    late = make_span(tid, parent=spans[-1].span_id, name="late-child")
    asm.add(split_request(make_request([late])))
    # Released at once (no decision_wait), flagged late.
    assert len(released.traces) == 2
    trace = released.traces[1]
    assert trace.late
    assert trace.reason is ReleaseReason.LATE
    assert [s.name for s, _ in trace.spans()] == ["late-child"]
    assert asm.late_spans == 1
    assert telemetry.registry.get_sample_value("ragtrace_spans_late_total") == 1
    assert asm.buffered_spans == 0
    asm.close()


async def test_released_trace_memory_is_bounded() -> None:
    released = _Released()
    asm = _assembler(released, late_trace_ids=3, decision_wait=0)
    traces = [rag_trace(children=0) for _ in range(5)]
    for spans in traces:
        asm.add(split_request(make_request(spans)))
    await released.wait(5)
    # Only the 3 most recent ids are remembered: a span of the first trace is "new".
    asm.add(split_request(make_request([make_span(traces[0][0].trace_id, parent=b"\x02" * 8)])))
    assert asm.buffered_traces == 1
    asm.add(split_request(make_request([make_span(traces[4][0].trace_id, parent=b"\x02" * 8)])))
    assert released.traces[-1].late
    asm.release_all()
    asm.close()


async def test_invalid_ids_are_rejected_and_the_rest_kept() -> None:
    good = rag_trace(children=1)
    bad_trace = make_span(b"\x00" * 16, name="zero-trace")
    short_span = make_span(new_trace_id(), span_id=b"\x01\x02", name="short-span")
    split = split_request(make_request([*good, bad_trace, short_span]))
    assert split.span_count == 2
    assert split.rejected_spans == 2
    assert "trace_id must be 16 bytes" in split.error_message
    assert list(split.traces) == [good[0].trace_id]


@pytest.mark.parametrize("wait", [0.0, 0.02])
async def test_small_decision_waits_release_promptly(wait: float) -> None:
    released = _Released()
    asm = _assembler(released, decision_wait=wait)
    for _ in range(50):
        asm.add(split_request(make_request(rag_trace(children=1))))
    await released.wait(50, within=5)
    assert asm.buffered_spans == 0
    asm.close()
