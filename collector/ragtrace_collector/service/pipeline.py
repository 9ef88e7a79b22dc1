"""The pipeline: receivers -> assembler -> trace processor -> exporters.

This module is where a ready trace is handed to a processor, the one hook of the
collector.  In this release the processor is :class:`PassThroughProcessor`; the
evaluation stage is another :class:`TraceProcessor`.

The processor contract
======================

``submit(trace, forward)`` is called from the event loop, once for every trace the
assembler releases, including late spans (``trace.late`` is true, ``trace.reason`` is
``ReleaseReason.LATE``: spans whose trace was already released and forwarded; a
processor can use them to attach late results).  It must not block.  The processor
then owns the trace until it calls ``forward(trace)``:

* It may hold the trace asynchronously (start a task, await judges) for a bounded
  time, then forward it.  ``forward`` is synchronous, never blocks and never fails:
  the spans go to every exporter's queue.
* Before forwarding, it may change spans in place (attributes, events, status) and add
  spans with :meth:`AssembledTrace.add_span` (e.g. an evaluation carrier span).
  Resource and InstrumentationScope objects may be shared with other traces: do not
  change them; pass new ones to ``add_span`` instead.
* It may forward a trace object it made itself (e.g. only a carrier span for a late
  result), with the trace id of the spans it holds.
* After ``forward(trace)`` the trace belongs to the exporters: do not touch it again.
  Forwarding the same trace twice is ignored (and logged).
* Every submitted trace must be forwarded exactly once, whatever happens (errors
  included).  If ``submit`` raises, the pipeline forwards the trace unchanged.
* If the processor has a ``start()`` method (plain or async), the pipeline calls it
  once at startup, in the event loop, before any receiver listens.
* ``drain()`` is awaited at shutdown, after the assembler has released every buffered
  trace (``reason="shutdown"``): finish or abandon held work and forward every held
  trace.  The pipeline waits at most ``shutdown.processor_timeout``; then it cancels
  ``drain`` and forwards whatever is still held, unchanged.

Spans held by the processor count against ``assembly.max_buffered_spans`` for
admission: while the processor holds that many spans, receivers refuse new ones
(clients retry), so memory stays bounded however slow the processor is.  A processor
that wants to shed load instead should forward traces unprocessed and count them.

Back-pressure
=============

A request is accepted only if the pipeline can take it: not shutting down, every
exporter with ``on_full: backpressure`` below its queue bound, and the processor
holding fewer than ``max_buffered_spans`` spans.  Otherwise :meth:`Pipeline.offer`
raises :class:`Refused` and the receiver answers with a retryable status and a delay
(HTTP 429/503 + Retry-After, gRPC RESOURCE_EXHAUSTED/UNAVAILABLE + RetryInfo).  Once a
request is accepted, its spans are never dropped by the pipeline.

Durability
==========

Receivers hand requests in with :meth:`Pipeline.accept`.  With a write-ahead log
(``storage.directory``, :mod:`ragtrace_collector.storage`) the request is written and
synced before ``accept`` returns, so an acknowledged request survives a crash; the log
is also full at ``storage.max_size``, another reason for refusal (``storage_full``).
Every span group carries the sequence number of its log entry (``SpanGroup.wal_seq``);
each exporter reports the groups it is done with (``Exporter.on_settled``), and an
entry is removed once every exporter has settled every group of it.  At start,
:meth:`Pipeline.replay` feeds what the log still holds through assembly and the
processor, before the receivers listen: replayed traces are evaluated again when
sampling picks them (the decision is a hash, so the same ones are picked).

Without a log, ``track_undelivered`` keeps the groups not yet settled, so that a
shutdown can spill what the deadline cut off (:meth:`Pipeline.undelivered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from google.protobuf.message import Message

from ragtrace_collector.assembly.assembler import AssembledTrace, Assembler, ReleaseReason
from ragtrace_collector.assembly.config import AssemblyConfig
from ragtrace_collector.exporters.base import Exporter
from ragtrace_collector.otlp.codec import (
    OtlpDecodeError,
    SpanGroup,
    SplitRequest,
    decode_protobuf_request,
    split_request,
)
from ragtrace_collector.service.logs import get_logger
from ragtrace_collector.service.telemetry import Telemetry
from ragtrace_collector.storage.service import Storage
from ragtrace_collector.storage.spill import Outstanding
from ragtrace_collector.storage.wal import StorageError

__all__ = [
    "AssembledTrace",
    "Forward",
    "PassThroughProcessor",
    "Pipeline",
    "Refused",
    "ReleaseReason",
    "ShutdownReport",
    "TraceProcessor",
]

#: Hands a trace to the exporters.  Synchronous; never blocks; never raises.
Forward = Callable[[AssembledTrace], None]


@runtime_checkable
class TraceProcessor(Protocol):
    """What the pipeline hands every released trace to (see the module docstring)."""

    def submit(self, trace: AssembledTrace, forward: Forward) -> None:
        """Take ownership of ``trace``; call ``forward(trace)`` exactly once, later or now."""
        ...

    async def drain(self) -> None:
        """Shutdown: finish or abandon held work, forwarding every held trace."""
        ...


class PassThroughProcessor:
    """Forwards every trace at once, unchanged."""

    def submit(self, trace: AssembledTrace, forward: Forward) -> None:
        forward(trace)

    async def drain(self) -> None:
        return None


class Refused(Exception):
    """The pipeline cannot take a request now; the client should retry later."""

    def __init__(self, reason: str, message: str, retry_after: float) -> None:
        super().__init__(message)
        #: ``queue_full``, ``processor_busy``, ``storage_full``, ``storage_error`` or
        #: ``shutting_down``.
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


@dataclass(slots=True)
class ShutdownReport:
    traces_flushed: int
    processor_timed_out: bool
    forwarded_unprocessed: int
    spans_dropped: int


class Pipeline:
    """Assembler, processor hook and exporter fan-out, with admission control."""

    def __init__(
        self,
        *,
        assembly: AssemblyConfig,
        exporters: Sequence[Exporter[Any]],
        processor: TraceProcessor,
        telemetry: Telemetry,
        retry_after: float = 1.0,
        storage: Storage | None = None,
        track_undelivered: bool = False,
    ) -> None:
        self._assembly_config = assembly
        self.exporters = list(exporters)
        self.processor = processor
        self._telemetry = telemetry
        self._retry_after = retry_after
        self._log = get_logger("pipeline")
        self._assembler: Assembler | None = None
        self._held: dict[int, tuple[AssembledTrace, int]] = {}
        self._held_spans = 0
        self._accepting = False
        self._refusing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backpressure = [e for e in self.exporters if e.backpressure]
        self._processor_gauge = telemetry.queue_depth.labels("processor")
        self._storage = storage
        self._outstanding = (
            Outstanding(len(self.exporters)) if track_undelivered and storage is None else None
        )

    # ---------------------------------------------------------------- state
    @property
    def assembler(self) -> Assembler:
        if self._assembler is None:
            raise RuntimeError("pipeline not started")
        return self._assembler

    @property
    def held_spans(self) -> int:
        """Spans the processor holds (submitted, not yet forwarded)."""
        return self._held_spans

    @property
    def accepting(self) -> bool:
        return self._accepting

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for exporter in self.exporters:
            if self._storage is not None or self._outstanding is not None:
                exporter.on_settled = self._settled
            await exporter.start()
        start_processor = getattr(self.processor, "start", None)
        if callable(start_processor):
            started = start_processor()
            if inspect.isawaitable(started):
                await started
        self._assembler = Assembler(
            self._assembly_config, self._dispatch, self._telemetry, loop=self._loop
        )
        self._accepting = True

    def stop_accepting(self) -> None:
        self._accepting = False

    async def shutdown(self, *, processor_timeout: float, flush_timeout: float) -> ShutdownReport:
        """Release every buffered trace, let the processor drain, flush every exporter."""
        self._accepting = False
        loop = asyncio.get_running_loop()
        flushed = 0
        if self._assembler is not None:
            flushed = self._assembler.release_all(ReleaseReason.SHUTDOWN)
            self._assembler.close()
        timed_out = False
        drain = asyncio.ensure_future(self.processor.drain())
        try:
            await asyncio.wait_for(drain, processor_timeout)
        except TimeoutError:
            timed_out = True
            self._log.warning(
                "processor_drain_timeout",
                timeout_s=processor_timeout,
                traces_held=len(self._held),
            )
        except Exception as exc:
            self._log.error("processor_drain_failed", error=repr(exc))
        unprocessed = 0
        for trace, _ in list(self._held.values()):
            unprocessed += 1
            self._forward(trace)
        if unprocessed:
            self._log.warning("forwarded_unprocessed_at_shutdown", traces=unprocessed)
        deadline = loop.time() + flush_timeout
        results = await asyncio.gather(
            *(e.close(deadline) for e in self.exporters), return_exceptions=True
        )
        dropped = 0
        for exporter, result in zip(self.exporters, results, strict=True):
            if isinstance(result, BaseException):
                self._log.error("exporter_close_failed", exporter=exporter.name, error=repr(result))
            else:
                dropped += result
        return ShutdownReport(flushed, timed_out, unprocessed, dropped)

    # ------------------------------------------------------------- intake
    def refusal(self) -> Refused | None:
        """Why a request would be refused now, or ``None`` if it would be accepted."""
        if not self._accepting:
            return Refused("shutting_down", "the collector is shutting down", self._retry_after)
        for exporter in self._backpressure:
            if exporter.full():
                return Refused(
                    "queue_full",
                    f"exporter {exporter.name!r} queue is full "
                    f"({exporter.depth} spans); retry later",
                    self._retry_after,
                )
        if self._held_spans >= self._assembly_config.max_buffered_spans:
            return Refused(
                "processor_busy",
                f"the trace processor holds {self._held_spans} spans; retry later",
                self._retry_after,
            )
        if self._storage is not None and self._storage.full():
            return Refused(
                "storage_full",
                "the write-ahead log is full until exporters deliver; retry later",
                self._retry_after,
            )
        return None

    def offer(self, split: SplitRequest, receiver: str) -> None:
        """Accept the spans of one request, or raise :class:`Refused` (nothing taken).

        Spans of an accepted request that ``split`` already set aside (invalid trace or
        span ids, answered as a partial success) are counted as refused ``invalid_id``.
        This does not write the write-ahead log: receivers call :meth:`accept`.
        """
        self._admission(split, receiver)
        self._take(split, receiver)

    async def accept(self, split: SplitRequest, receiver: str, payload: bytes | Message) -> None:
        """:meth:`offer`, durably: with a write-ahead log, ``payload`` (the request as
        binary protobuf, or the message) is written and synced before this returns.
        Raises :class:`Refused` (nothing taken)."""
        storage = self._storage
        if storage is None or not split.span_count:
            self.offer(split, receiver)
            return
        self._admission(split, receiver)
        try:
            await storage.append(
                payload,
                tag=lambda seq: self._tag(split, seq),
                admit=lambda: self._take(split, receiver),
            )
        except StorageError as exc:
            self._telemetry.spans_refused.labels(receiver, "storage_error").inc(split.span_count)
            raise Refused(
                "storage_error", f"cannot write the request durably: {exc}", self._retry_after
            ) from None

    def _admission(self, split: SplitRequest, receiver: str) -> None:
        refused = self.refusal()
        if refused is not None:
            self._telemetry.spans_refused.labels(receiver, refused.reason).inc(split.span_count)
            if not self._refusing:
                self._refusing = True
                self._log.warning("backpressure_on", reason=refused.reason, detail=refused.message)
            raise refused
        if self._refusing:
            self._refusing = False
            self._log.info("backpressure_off")

    def _take(self, split: SplitRequest, receiver: str | None) -> None:
        if split.span_count:
            self.assembler.add(split)
            if receiver is not None:
                self._telemetry.spans_received.labels(receiver).inc(split.span_count)
        if split.rejected_spans and receiver is not None:
            self._telemetry.spans_refused.labels(receiver, "invalid_id").inc(split.rejected_spans)

    # ------------------------------------------------------------ durability
    def _tag(self, split: SplitRequest, seq: int) -> int:
        """Mark the request's groups with its log entry; return the entry's references."""
        groups = 0
        for chunk in split.traces.values():
            for group in chunk.groups:
                group.wal_seq = seq
                groups += 1
        return groups * len(self.exporters)

    def _settled(self, groups: list[SpanGroup]) -> None:
        if self._storage is not None:
            self._storage.settle(groups)
        if self._outstanding is not None:
            self._outstanding.settle(groups)

    def undelivered(self) -> list[SpanGroup]:
        """After :meth:`shutdown`: groups some exporter did not deliver (needs
        ``track_undelivered`` and no write-ahead log)."""
        return self._outstanding.groups() if self._outstanding is not None else []

    async def replay(self) -> int:
        """Feed what the write-ahead log held at start through assembly and export.

        Called after :meth:`start`, before receivers listen.  Waits while exporters or
        the processor are full (a backend still down), so memory stays bounded; stops
        early when the pipeline stops accepting.  Returns the spans replayed.
        """
        storage = self._storage
        if storage is None:
            return 0
        spans = entries = bad = 0
        waiting_logged = False
        async for chunk in storage.replay():
            decoded = await asyncio.to_thread(_decode_entries, chunk)
            for seq, split in decoded:
                while (refused := self.refusal()) is not None and refused.reason != "storage_full":
                    if refused.reason == "shutting_down":
                        return spans
                    if not waiting_logged:
                        waiting_logged = True
                        self._log.warning("replay_waiting", reason=refused.reason)
                    await asyncio.sleep(0.05)
                if split is None:
                    bad += 1
                    storage.hold_replayed(seq, 0)
                    continue
                storage.hold_replayed(seq, self._tag(split, seq))
                self._take(split, None)
                spans += split.span_count
                entries += 1
        if entries or bad:
            self._log.info("replay_done", entries=entries, spans=spans, undecodable=bad)
        return spans

    # ------------------------------------------------------- processor hook
    def _dispatch(self, trace: AssembledTrace) -> None:
        count = trace.span_count
        self._held[id(trace)] = (trace, count)
        self._held_spans += count
        try:
            self.processor.submit(trace, self._forward)
        except Exception as exc:
            self._log.error("processor_submit_failed", trace_id=trace.trace_id_hex, error=repr(exc))
            self._forward(trace)
        self._processor_gauge.set(self._held_spans)

    def _forward(self, trace: AssembledTrace) -> None:
        if trace.forwarded:
            self._log.warning("trace_forwarded_twice", trace_id=trace.trace_id_hex)
            return
        trace.forwarded = True
        held = self._held.pop(id(trace), None)
        if held is not None:
            self._held_spans -= held[1]
            self._processor_gauge.set(self._held_spans)
        count = trace.span_count
        if self._outstanding is not None:
            self._outstanding.forwarded(trace.groups)
        for exporter in self.exporters:
            exporter.enqueue(trace.groups, count)
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._telemetry.pipeline_latency.observe(self._loop.time() - trace.released_at)


def _decode_entries(chunk: list[tuple[int, bytes]]) -> list[tuple[int, SplitRequest | None]]:
    """Decode replayed log entries (in a worker thread); None for one that does not parse."""
    out: list[tuple[int, SplitRequest | None]] = []
    for seq, payload in chunk:
        try:
            out.append((seq, split_request(decode_protobuf_request(payload))))
        except OtlpDecodeError:
            out.append((seq, None))
    return out
