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
each exporter reports the groups it is done with (``Exporter.on_settled``, numbered
per exporter), and an entry is removed once every exporter has settled every group of
it and every output made from it is logged (the *ledger of outputs*,
:mod:`ragtrace_collector.storage.outputs`):

* a processor with a ``use_ledger(ledger)`` method gets an
  :class:`~ragtrace_collector.storage.outputs.OutputLedger` at start.  Before it
  forwards a trace whose results will follow, it takes ``ledger.hold(trace)``, forwards
  those results through ``hold.forward(carrier_trace)`` and then calls
  ``hold.release()``: the trace's entries stay until the outputs are logged.  A trace
  the processor made and forwards without a hold is logged too (with no sources).
  Results written on a span are logged with ``ledger.results(trace, spans)`` before the
  trace is forwarded;
* at start, :meth:`Pipeline.replay` feeds what the log still holds through assembly and
  the processor, before the receivers listen; carrier spans in output records are
  delivered from the log, delivery marks keep entries from exporters that had them,
  and ``ledger.logged(trace_id, span_id)`` hands the processor the results the log held
  for a span, so that it does not compute them again.

Without a log, ``track_undelivered`` keeps the groups not yet settled, so that a
shutdown can spill what the deadline cut off (:meth:`Pipeline.undelivered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from google.protobuf.message import Message

from ragtrace_collector.assembly.assembler import AssembledTrace, Assembler, ReleaseReason
from ragtrace_collector.assembly.config import AssemblyConfig
from ragtrace_collector.component.consumer import Refused
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.evaluation.enrichment import is_carrier
from ragtrace_collector.exporters.base import Exporter
from ragtrace_collector.feedback.tap import FeedbackTap
from ragtrace_collector.otlp.codec import (
    OtlpDecodeError,
    Span,
    SpanGroup,
    SplitRequest,
    build_request,
    decode_protobuf_request,
    split_request,
)
from ragtrace_collector.storage.outputs import (
    KIND_DELIVERED,
    KIND_OUTPUT,
    Hold,
    OutputLedger,
    decode_output,
    encode_output,
)
from ragtrace_collector.storage.service import Storage
from ragtrace_collector.storage.spill import Outstanding
from ragtrace_collector.storage.wal import KIND_REQUEST, AppendTimeout, Record, StorageError

__all__ = [
    "AssembledTrace",
    "Forward",
    "PassThroughProcessor",
    "Pipeline",
    "ReleaseReason",
    "ShutdownReport",
    "TraceProcessor",
]

#: What a client is told when the write-ahead log refuses a request.  The detail (the
#: directory, the OS error) stays on the operator's side: the log and ``/readyz``.
_STORAGE_ANSWERS: Final = {
    "storage_error": "the write-ahead log cannot be written; retry later",
    "storage_timeout": "the write-ahead log did not complete the write in time; retry later",
    "storage_full": "the write-ahead log is full until exporters deliver; retry later",
}

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
        #: The processor's view of the log (outputs, holds, results found at start).
        self.ledger: OutputLedger | None = None
        #: Reads feedback spans out of released traces for the join (set by the service).
        self.feedback: FeedbackTap | None = None
        #: Copies of results not logged because the log was at its bound.
        self.results_not_logged = 0
        self._skipping_results = False
        if storage is not None:
            storage.set_exporters([e.name for e in self.exporters])
            self.ledger = OutputLedger(
                hold=self._hold, results=self._log_results, reached=self._reached
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
        for number, exporter in enumerate(self.exporters):
            if self._storage is not None or self._outstanding is not None:
                exporter.on_settled = functools.partial(self._settled, number)
            await exporter.start()
        use_ledger = getattr(self.processor, "use_ledger", None)
        if self.ledger is not None and callable(use_ledger):
            use_ledger(self.ledger)
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
        if self.feedback is not None and self.feedback.busy:
            return Refused(
                "processor_busy",
                f"{self.feedback.in_flight} feedback wait for the join; retry later",
                self._retry_after,
            )
        storage = self._storage.refusal() if self._storage is not None else None
        if storage is not None:
            reason, detail = storage
            return Refused(
                reason,
                _STORAGE_ANSWERS.get(reason, _STORAGE_ANSWERS["storage_error"]),
                self._retry_after,
                detail=f"{detail}; retry later",
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
            answer = "storage_timeout" if isinstance(exc, AppendTimeout) else "storage_error"
            raise Refused(
                "storage_error",
                _STORAGE_ANSWERS[answer],
                self._retry_after,
                detail=f"cannot write the request durably: {exc}",
            ) from None

    def _admission(self, split: SplitRequest, receiver: str) -> None:
        refused = self.refusal()
        if refused is not None:
            self._telemetry.spans_refused.labels(receiver, refused.reason).inc(split.span_count)
            if not self._refusing:
                self._refusing = True
                self._log.warning("backpressure_on", reason=refused.reason, detail=refused.detail)
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
        """Mark the request's groups with its log entry; return how many there are."""
        groups = 0
        for chunk in split.traces.values():
            for group in chunk.groups:
                group.wal_seq = seq
                groups += 1
        return groups

    def _settled(self, exporter: int, groups: list[SpanGroup]) -> None:
        if self._storage is not None:
            self._storage.settle(groups, exporter)
        if self._outstanding is not None:
            self._outstanding.settle(groups)

    # ------------------------------------------------------- ledger of outputs
    def _hold(self, trace: AssembledTrace) -> Hold:
        storage = self._storage
        assert storage is not None
        sources = storage.pin({g.wal_seq for g in trace.groups if g.wal_seq >= 0})
        return Hold(sources, self._log_output, storage.unpin)

    def _log_output(self, trace: AssembledTrace, hold: Hold | None) -> None:
        """A span the processor made (a carrier): logged, then handed to the exporters.
        Its log record stays while the entries it was made from do."""
        storage = self._storage
        assert storage is not None
        trace.forwarded = True  # (when it comes through a hold)
        sources = hold.sources if hold is not None else []
        groups = [g for g in trace.groups if g.spans]
        payload = encode_output(sources, build_request(groups).SerializeToString())
        if hold is not None:
            hold.logging()

        def tag(seq: int) -> int:
            storage.outputs_of(seq, sources)
            for group in groups:
                group.wal_seq = seq
            return len(groups)

        def admit() -> None:
            self._fan_out(groups)
            if hold is not None:
                hold.logged()

        self._append_output(payload, tag, admit, hold)

    def _log_results(self, trace: AssembledTrace, spans: list[Span]) -> None:
        """Spans with the results just written on them, logged (not delivered from the
        log: the trace carries them) so that a replay of the trace does not evaluate
        them again.  The record stays while the trace's entries do."""
        storage = self._storage
        assert storage is not None
        sources = sorted({g.wal_seq for g in trace.groups if g.wal_seq >= 0})
        if not sources:
            return
        request = build_request([SpanGroup(None, "", None, "", spans)]).SerializeToString()
        payload = encode_output(sources, request)
        if not storage.room_for_output(len(payload), needed=False):
            # The log is at its bound (storage.max_size): the copy is left out; a
            # replay after a crash would evaluate this trace again, nothing is lost.
            if not self._skipping_results:  # logged once per stretch at the bound
                self._skipping_results = True
                self._log.warning(
                    "results_not_logged",
                    reason="storage_full",
                    detail="copies of results are left out while the log is at its bound; "
                    "a crash meanwhile costs repeated judge calls, never a loss",
                )
            self.results_not_logged += 1
            return
        if self._skipping_results:
            self._skipping_results = False
            self._log.info("results_logged_again", left_out=self.results_not_logged)

        def tag(seq: int) -> int:
            storage.outputs_of(seq, sources)
            return 0

        self._append_output(payload, tag, _nothing, None)

    def _append_output(
        self,
        payload: bytes,
        tag: Callable[[int], int],
        admit: Callable[[], None],
        hold: Hold | None,
        delay: float = 0.1,
    ) -> None:
        """Write an output record; a failed write (a full disk) is tried again until it
        succeeds or the log closes (the hold keeps the sources meanwhile).  The write is
        not bounded by the append timeout (no client waits for it): its future tells
        its outcome, however late."""
        storage = self._storage
        assert storage is not None

        def retry(error: str) -> None:
            self._log.warning("output_log_retrying", error=error, retry_in=delay)
            if self._loop is not None:
                self._loop.call_later(
                    delay, self._append_output, payload, tag, admit, hold, min(delay * 2, 5.0)
                )

        if not storage.room_for_output(len(payload)):
            retry("the write-ahead log is at its bound (storage.max_size)")
            return
        try:
            future = storage.append(payload, tag=tag, admit=admit, kind=KIND_OUTPUT, timeout=False)
        except StorageError as exc:
            self._log.error("output_not_logged", error=str(exc))
            return

        def done(fut: asyncio.Future[None]) -> None:
            if not fut.cancelled() and fut.exception() is not None:
                retry(str(fut.exception()))

        future.add_done_callback(done)

    def _reached(self, trace: AssembledTrace) -> bool:
        """Whether a replayed delivery mark says an exporter had some of ``trace``."""
        assert self._storage is not None
        delivered = self._storage.delivered
        return bool(delivered) and any(delivered.get(g.wal_seq) for g in trace.groups)

    def _settled_before(self, trace: AssembledTrace) -> bool:
        """Whether every group of ``trace`` came from an entry settled before a restart."""
        assert self._storage is not None
        settled = self._storage.settled
        return all(g.wal_seq in settled for g in trace.groups)

    def _fan_out(self, groups: list[SpanGroup]) -> None:
        """Hand groups to every exporter, except those a replayed delivery mark says
        already have them."""
        marks = self._storage.delivered if self._storage is not None else None
        count = sum(len(g.spans) for g in groups)
        for number, exporter in enumerate(self.exporters):
            if marks:
                mine = [g for g in groups if number not in marks.get(g.wal_seq, ())]
                if len(mine) != len(groups):
                    exporter.enqueue(mine, sum(len(g.spans) for g in mine))
                    continue
            exporter.enqueue(groups, count)

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
        spans = entries = bad = outputs = 0
        waiting_logged = False
        carriers: list[SpanGroup] = []
        async for chunk in storage.replay():
            decoded = await asyncio.to_thread(_decode_entries, chunk)
            for record, split, sources in decoded:
                seq = record.seq
                if record.kind == KIND_DELIVERED:
                    storage.hold_replayed(seq, 0)
                    storage.replayed_marks(record.payload)
                    continue
                if record.kind == KIND_OUTPUT:
                    if split is None:
                        bad += 1
                        storage.hold_replayed(seq, 0)
                        continue
                    assert self.ledger is not None
                    groups = [g for c in split.traces.values() for g in c.groups]
                    delivered = self.ledger.found(groups, is_carrier)
                    for group in delivered:
                        group.wal_seq = seq
                    carriers += delivered
                    storage.hold_replayed(seq, len(delivered), sources)
                    outputs += 1
                    continue
                while (refused := self.refusal()) is not None and not refused.reason.startswith(
                    "storage"
                ):  # replay does not write the log: its refusals do not hold replay
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
                storage.hold_replayed(seq, self._tag(split, seq), to_forward=True)
                self._take(split, None)
                spans += split.span_count
                entries += 1
        # Carrier spans from the log go out once every delivery mark is known.
        for group in carriers:
            self._fan_out([group])
        if self.ledger is not None and self.ledger.replayed_results and self._loop is not None:
            # Every replayed trace reaches the processor within max_trace_wait.
            wait = self._assembly_config.max_trace_wait
            self._loop.call_later(2 * wait + 1.0, self.ledger.forget)
        if entries or bad or outputs:
            self._log.info(
                "replay_done",
                entries=entries,
                spans=spans,
                undecodable=bad,
                outputs=outputs,
                carrier_spans=sum(len(g.spans) for g in carriers),
            )
        return spans

    # ------------------------------------------------------- processor hook
    def _dispatch(self, trace: AssembledTrace) -> None:
        if self._storage is not None and self._storage.settled and self._settled_before(trace):
            self._storage.forwarded(trace.groups)
            return  # replayed, but delivered (outputs included) before the restart
        count = trace.span_count
        self._held[id(trace)] = (trace, count)
        self._held_spans += count
        try:
            if self.feedback is not None and self.feedback.take(trace, self.ledger):
                self._forward(trace)  # feedback only: exported, never a case to evaluate
            else:
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
        elif self._storage is not None:
            # Made by the processor (a carrier span): logged before it goes out.
            self._log_output(trace, None)
            return
        if self._outstanding is not None:
            self._outstanding.forwarded(trace.groups)
        self._fan_out(trace.groups)
        if self._storage is not None:
            self._storage.forwarded(trace.groups)  # replayed entries wait for this
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._telemetry.pipeline_latency.observe(self._loop.time() - trace.released_at)


def _decode_entries(
    chunk: list[Record],
) -> list[tuple[Record, SplitRequest | None, list[int]]]:
    """Decode replayed log records (in a worker thread): the request (of a request or
    an output record; None when it does not parse) and an output's sources."""
    out: list[tuple[Record, SplitRequest | None, list[int]]] = []
    for record in chunk:
        sources: list[int] = []
        if record.kind not in (KIND_REQUEST, KIND_OUTPUT):
            out.append((record, None, sources))
            continue
        try:
            body = record.payload
            if record.kind == KIND_OUTPUT:
                sources, body = decode_output(body)
            out.append((record, split_request(decode_protobuf_request(body)), sources))
        except (OtlpDecodeError, ValueError):
            out.append((record, None, sources))
    return out


def _nothing() -> None:
    return None
