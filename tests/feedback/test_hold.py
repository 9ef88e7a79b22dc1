"""The pipeline keeps a feedback span's log entry until the join holds the feedback.

In process, with a write-ahead log: the join's ``record`` is made to wait; the
feedback span is delivered by the exporter meanwhile, yet its log entry stays
unsettled (so a crash now replays it) until ``record`` returns.  A failing ``record``
is retried, the entry still kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragtrace_collector.feedback.record import Feedback
from ragtrace_collector.service.pipeline import AssembledTrace, Forward
from tests.fakes.harness import CollectorThread, collector_config, wait_for
from tests.fakes.otlp_sink import OtlpSink

TRACE = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


class _SlowJoin:
    """Stands in for the stage's ``record``: waits for ``release``; fails ``failures``
    times first."""

    def __init__(self, failures: int = 0) -> None:
        self.release = threading.Event()
        self.failures = failures
        self.calls = 0
        self.recorded: list[Feedback] = []

    async def record(self, feedback: Feedback) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise OSError("join backend down")
        await asyncio.to_thread(self.release.wait, 30)
        self.recorded.append(feedback)


def _post(collector: CollectorThread, trace_id: str = TRACE) -> int:
    addr = collector.svc.http_address
    assert addr is not None
    request = urllib.request.Request(
        f"http://{addr[0]}:{addr[1]}/v1/feedback",
        data=json.dumps({"trace_id": trace_id, "value": False, "user_id": "u"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


@pytest.mark.parametrize("failures", [0, 2])
def test_the_log_entry_stays_until_the_join_has_the_feedback(
    sink: OtlpSink, tmp_path: Path, failures: int
) -> None:
    config = collector_config(
        sink=sink,
        storage={"directory": str(tmp_path)},
        assembly={"max_trace_wait": "200ms", "decision_wait": "20ms"},
    )
    collector = CollectorThread(config).start()
    try:
        svc = collector.svc
        assert svc.feedback is not None
        join = _SlowJoin(failures)
        svc.feedback.record = join.record  # type: ignore[method-assign]
        storage = svc.storage
        assert storage is not None
        assert _post(collector) == 202
        sink.wait_until(lambda: len(sink.spans) == 1, timeout=10)  # delivered
        wait_for(lambda: join.calls > failures, 10, "record called")
        time.sleep(1.0)  # several checkpoint intervals
        assert collector.call(lambda: storage.unsettled_entries) == 1
        join.release.set()
        wait_for(lambda: len(join.recorded) == 1, 10, "recorded")
        wait_for(
            lambda: collector.call(lambda: storage.unsettled_entries) == 0, 10, "entry settled"
        )
        (feedback,) = join.recorded
        assert (feedback.trace_id, feedback.user_id, feedback.negative) == (TRACE, "u", True)
    finally:
        collector.stop()


class _Recording:
    """A trace processor that records what it is handed, then forwards it."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def submit(self, trace: AssembledTrace, forward: Forward) -> None:
        self.seen.append(trace.span_count)
        forward(trace)

    async def drain(self) -> None:
        return None


def test_a_trace_of_feedback_spans_only_never_reaches_the_processor(sink: OtlpSink) -> None:
    """Feedback is never a case: its trace goes straight to the exporters, while the
    feedback still reaches the join."""
    config = collector_config(sink=sink, assembly={"max_trace_wait": "200ms"})
    processor = _Recording()
    collector = CollectorThread(config, processor=processor).start()
    try:
        assert _post(collector) == 202
        sink.wait_until(lambda: len(sink.spans) == 1, timeout=10)
        assert processor.seen == []
        assert collector.svc.feedback is not None
        report = collector.call(collector.svc.feedback.report)
        assert report["counts"]["recorded"] == 1
    finally:
        collector.stop()


def test_a_join_that_hangs_costs_back_pressure_not_memory(sink: OtlpSink) -> None:
    """At feedback.max_pending feedback waiting for the join, new requests get 429
    (processor_busy); once the join catches up they are taken again."""
    config = collector_config(
        sink=sink, assembly={"max_trace_wait": "100ms"}, feedback={"max_pending": 2}
    )
    collector = CollectorThread(config).start()
    try:
        svc = collector.svc
        assert svc.feedback is not None
        join = _SlowJoin()
        svc.feedback.record = join.record  # type: ignore[method-assign]
        traces = [os.urandom(16).hex() for _ in range(4)]
        assert [_post(collector, traces[0]), _post(collector, traces[1])] == [202, 202]
        wait_for(lambda: join.calls == 2, 10, "two feedback waiting for the join")
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(collector, traces[2])
        assert refused.value.code == 429
        assert "wait for the join" in json.loads(refused.value.read())["error"]["message"]
        join.release.set()
        wait_for(lambda: len(join.recorded) == 2, 10, "the join caught up")
        assert _post(collector, traces[3]) == 202
    finally:
        join.release.set()
        collector.stop()
