"""Writes that fail late, a writer that dies, a log at its bound (issue 27, defects 4,
7 and 6), in process on a real log directory: an output write that first outlives the
append timeout and then fails is retried like any failed output write, so its hold
ends; a dead writer thread fails the writes waiting on it at once; outputs count
against ``storage.max_size``, which the segments never pass by more than a segment."""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.assembly.config import AssemblyConfig
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.service.pipeline import PassThroughProcessor, Pipeline
from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.storage.outputs import KIND_OUTPUT
from ragtrace_collector.storage.service import Storage
from ragtrace_collector.storage.wal import FileOps, StorageError
from tests.storage.test_bookkeeping import _fill
from tests.storage.test_output_ledger import _group, _replay, _write

_TRACE_ID = b"\x01" * 16


class _HangThenFail(FileOps):
    """Once armed, the next write hangs until released and then fails (ENOSPC); the
    writes after it succeed."""

    def __init__(self) -> None:
        self.armed = False
        self.release = threading.Event()

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        if self.armed:
            self.armed = False
            self.release.wait(30)
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().writev(fd, buffers)


async def _until(predicate: Callable[[], bool], limit: float = 10.0) -> None:
    for _ in range(int(limit / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


def _trace(groups: list[SpanGroup]) -> AssembledTrace:
    return AssembledTrace(
        trace_id=_TRACE_ID,
        groups=groups,
        reason=ReleaseReason.LATE,
        first_seen=0.0,
        released_at=0.0,
        has_root=False,
    )


async def test_an_output_write_that_times_out_then_fails_is_retried(tmp_path: Path) -> None:
    """Defect 4: the carrier's first write outlives ``append_timeout`` and then fails.
    It must be written again, so the hold on its source ends and the carrier is in
    the log at the next start."""
    ops = _HangThenFail()
    config = StorageConfig.model_validate({"directory": str(tmp_path), "append_timeout": "200ms"})
    storage = Storage(config, file_ops=ops)
    pipeline = Pipeline(
        assembly=AssemblyConfig(),
        exporters=[],
        processor=PassThroughProcessor(),
        telemetry=Telemetry(),
        storage=storage,
    )
    await storage.start()
    await pipeline.start()
    (source,) = await _write(storage, 1)
    assert pipeline.ledger is not None
    hold = pipeline.ledger.hold(_trace([_group(source)]))
    assert hold.sources == [source]
    span = trace_pb2.Span(trace_id=_TRACE_ID, span_id=b"\x02" * 8, name="carrier")
    ops.armed = True
    hold.forward(_trace([SpanGroup(None, "", None, "", [span])]))
    hold.release()
    await asyncio.sleep(0.6)  # past the append timeout: the write still hangs
    ops.release.set()  # ... and now fails
    storage.settle([_group(source)], 0)
    await _until(lambda: not hold.sources)  # the carrier was logged: the hold ended
    await _until(lambda: storage.unsettled_entries == 1)  # the carrier, not delivered
    await pipeline.shutdown(processor_timeout=1.0, flush_timeout=1.0)
    await storage.close()

    again = Storage(StorageConfig(directory=tmp_path))
    await again.start()
    kinds = await _replay(again)
    assert KIND_OUTPUT in kinds.values()
    assert source not in kinds  # settled: the checkpoint passed it
    await again.close()


async def test_a_dead_writer_fails_waiting_writes_at_once(tmp_path: Path) -> None:
    """Defect 7: the writer thread ends (here: SystemExit from the log) with a write in
    hand and one queued.  Both fail now, not after ``append_timeout``, and so does the
    next append."""
    config = StorageConfig.model_validate({"directory": str(tmp_path), "append_timeout": "60s"})
    storage = Storage(config)
    await storage.start()
    entered = threading.Event()
    go = threading.Event()

    def die(records: object) -> None:
        entered.set()
        go.wait(10)
        raise SystemExit

    storage._wal.append = die  # type: ignore[assignment, method-assign]
    first = storage.append(b"x" * 100, tag=lambda seq: 0, admit=lambda: None)
    await asyncio.to_thread(entered.wait, 10)
    second = storage.append(b"y" * 100, tag=lambda seq: 0, admit=lambda: None)
    go.set()
    for future in (first, second):
        with pytest.raises(StorageError, match="writer has stopped"):
            await asyncio.wait_for(future, 10)
    with pytest.raises(StorageError, match="writer has stopped"):
        storage.append(b"z", tag=lambda seq: 0, admit=lambda: None)
    refused = storage.refusal()
    assert refused is not None
    assert refused[0] == "storage_error"
    await storage.close()


def _segment_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.wal"))


async def test_outputs_count_against_max_size(tmp_path: Path) -> None:
    """Defect 6: requests fill the log to ``max_size`` (1 MiB, segments of 128 KiB);
    then copies of results (a quarter of a request each) are logged for every trace, and a
    carrier.  The segments on disk never pass ``max_size`` by more than a segment; the
    carrier (needed) is written, the copies that do not fit are left out."""
    max_size, segment = 1024 * 1024, 128 * 1024
    storage = Storage(StorageConfig(directory=tmp_path, max_size=max_size))
    pipeline = Pipeline(
        assembly=AssemblyConfig(),
        exporters=[],
        processor=PassThroughProcessor(),
        telemetry=Telemetry(),
        storage=storage,
    )
    await storage.start()
    await pipeline.start()
    seqs: list[int] = []
    while storage.refusal() is None:
        seqs += await _fill(storage, 1)
    big = common_pb2.KeyValue(key="x", value=common_pb2.AnyValue(string_value="r" * 10_000))
    assert pipeline.ledger is not None
    for seq in seqs:
        span = trace_pb2.Span(trace_id=_TRACE_ID, span_id=seq.to_bytes(8), attributes=[big])
        pipeline.ledger.results(_trace([_group(seq)]), [span])
        await asyncio.sleep(0)
    hold = pipeline.ledger.hold(_trace([_group(seqs[0])]))
    carrier = trace_pb2.Span(trace_id=_TRACE_ID, span_id=b"\x03" * 8, name="carrier")
    hold.forward(_trace([SpanGroup(None, "", None, "", [carrier])]))
    hold.release()
    await _until(lambda: not hold.sources)  # the carrier was logged, after the copies
    assert _segment_bytes(tmp_path) <= max_size + segment
    logged = len(seqs) - pipeline.results_not_logged  # copies written (held by sources)
    await _until(lambda: storage.unsettled_entries == len(seqs) + logged + 1)  # none in flight
    assert storage.disk_bytes == _segment_bytes(tmp_path)
    assert 0 < pipeline.results_not_logged < len(seqs)
    await pipeline.shutdown(processor_timeout=1.0, flush_timeout=1.0)
    await storage.close()
