"""The ``storage`` component: the write-ahead log as the pipeline sees it.

* **Append before acknowledging.**  :meth:`Storage.append` queues a request for the
  writer thread and returns a future the receiver awaits.  The writer takes every
  request waiting, writes them, and syncs once (``fsync: batch``, group commit), or
  once per request (``always``), or leaves it to the OS (``never``); then, on the
  event loop, each entry is counted in the ledger and handed to the assembler, and
  the receivers' futures resolve.  No file I/O runs on the event loop.
* **Settle, then truncate.**  Each entry (:class:`_Entry`) has a count of references:
  one per span group (spans of one trace from one request) per exporter, one per pin
  (an output still to come, :meth:`Storage.pin`), and, for an output record, one per
  entry it was made from that is still held (:meth:`Storage.outputs_of`).  Every
  exporter reports the groups it is done with (delivered, or given up for good)
  through :meth:`Storage.settle`; an entry whose count reaches zero is settled.
* **The checkpoint** is ``min(lowest unsettled entry, replay floor, log end)``,
  computed in one place (:meth:`Storage._checkpoint`).  The unsettled entries are kept
  in a heap of sequence numbers (settled ones are dropped lazily when they reach the
  top), so its minimum is the lowest unsettled entry whatever order entries were
  held in: carriers logged while replay runs, outputs, marks.  While replay runs the
  floor is the next record replay has not handed over.  It is written about twice a
  second and at :meth:`Storage.close`, so a restart replays little that was already
  delivered and never skips an unsettled entry.
* **Marks.**  An exporter that has finished an entry others still hold leaves a
  delivery mark in the log (see :mod:`.outputs`).  An entry settled above the
  checkpoint (an older one is still held) would be replayed by a restart: it gets a
  "settled" mark, at once if the oldest entry has been held back for a while, else
  at :meth:`Storage.close` if it is still above the checkpoint then.  So a clean stop
  and start neither sends nor evaluates a settled entry again.
* **When a segment may go** (:meth:`Storage._maybe_delete`, the one place that
  decides): when none of its entries is unsettled (the active one only when the log
  is full and nothing is being written).  What it still says about entries elsewhere
  is then carried forward, written again in the active segment before the file is
  removed: delivery marks of entries still held, "settled" marks of entries a restart
  would replay (at or above the checkpoint, in a segment still on disk), and, for each
  of its output records, a "settled" mark of each such source (the output record that
  told a replay not to evaluate it again goes with the segment).  Output records of
  held entries keep their segment (they are held themselves).
* **Replay.**  :meth:`Storage.replay` yields what is on disk at start, past the
  checkpoint; the pipeline feeds it to the assembler and registers each entry with
  :meth:`Storage.hold_replayed`.  A replayed request is also held until the processor
  has forwarded each of its span groups (:meth:`Storage.forwarded`): pins are not
  logged, so an entry that every exporter had delivered before the restart (its
  delivery marks say so) may still owe a result, and the processor takes the hold for
  it before it forwards the trace.  Without this reference, the replayed marks would
  settle the entry first and the checkpoint would pass it.
* **Refusal.**  :meth:`Storage.refusal` is the one answer to "would the log take a
  request now?", read both by admission (the receivers' 429 / RESOURCE_EXHAUSTED with
  a retry delay) and by ``/readyz``:

  - ``storage_full``: the segments on disk plus the requests being written reach
    ``max_size``; status ``recoverable_error`` until exporters deliver and space is
    freed;
  - ``storage_error``: a write failed (``ENOSPC``, I/O error; status
    ``permanent_error``; the failed write was cut back, see :mod:`.wal`), the writer is
    stalled (a write has not completed within the append timeout; status
    ``recoverable_error``) or the writer thread is gone (``permanent_error``).  After a
    failed write the writer probes the disk every half second (a scratch file of the
    size that failed) and lifts the refusal once the probe, or a write, succeeds: no
    restart needed.

* **Append timeout.**  A request whose write has not completed within
  ``storage.append_timeout`` (10 s by default) is answered as refused (the client
  retries) instead of waiting on a stuck disk.  If the write completes later, the request is still
  delivered: at worst a duplicate, never a loss.
* **Supervision.**  An unexpected exception in the writer thread is logged with its
  traceback, counted in ``ragtrace_component_failures_total{component="storage"}``, the
  requests in hand are failed (their clients retry) and the writer goes on; status
  ``recoverable_error``.  If the thread ends anyway, status ``permanent_error``, and
  every write waiting fails at once (and every new one), instead of at its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import queue
import threading
import time
from bisect import bisect_right, insort
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from google.protobuf.message import Message

from ragtrace_collector.component import Component, Status
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.storage.outputs import (
    KIND_DELIVERED,
    SETTLED_MARK,
    decode_marks,
    encode_marks,
)
from ragtrace_collector.storage.wal import (
    HEADER_SIZE,
    KIND_REQUEST,
    SEGMENT_HEADER_SIZE,
    AppendTimeout,
    FileOps,
    Placed,
    Record,
    StorageError,
    WriteAheadLog,
)

if TYPE_CHECKING:
    from ragtrace_collector.component.telemetry import Telemetry

__all__ = ["Storage", "segment_size_for"]

#: Replay hands the pipeline records in chunks of about this many payload bytes.
_REPLAY_CHUNK_BYTES: Final = 4 * 1024 * 1024
#: A segment holding nothing but its header (magic and key).
_EMPTY_SEGMENT: Final = SEGMENT_HEADER_SIZE
#: The writer takes at most this many payload bytes into one group commit.
_GROUP_BYTES: Final = 16 * 1024 * 1024
_CHECKPOINT_EVERY: Final = 0.5
#: An entry settled while an older one has been held this long gets delivery marks
#: (out-of-order settling over a shorter time is passed by the checkpoint anyway).
_HELD_BACK: Final = 2 * _CHECKPOINT_EVERY
#: Settled sequence numbers the heap of held entries may carry before it is rebuilt.
_ORDER_SLACK: Final = 1024
#: The exporter number of a "settled" mark (every exporter, every output: done).
_SETTLED: Final = -1
#: After a failed write, the disk is probed this often, with at most this many bytes.
_PROBE_EVERY: Final = 0.5
_PROBE_MAX_BYTES: Final = 1024 * 1024
_WRITER_GONE: Final = "the write-ahead log writer has stopped"
#: The writer's pause after an unexpected exception, doubling up to the maximum.
_WRITER_BACKOFF: Final = (0.05, 5.0)

Payload: TypeAlias = bytes | Message


def segment_size_for(max_size: int) -> int:
    """Segments of 1/8 of ``max_size``, between 64 KiB and 64 MiB."""
    return max(64 * 1024, min(64 * 1024 * 1024, max_size // 8))


@dataclass(slots=True)
class _Seg:
    """Ledger of one segment: unsettled entries, bytes, whether more may come, and what
    it says about entries elsewhere (carried forward when it is deleted)."""

    unsettled: int
    size: int
    open: bool
    #: Marks written in this segment: (exporter number or ``_SETTLED``, entry).
    marks: list[tuple[int, int]] = field(default_factory=list)
    #: The sources of the output records written in this segment.
    sources: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Entry:
    """One unsettled entry: a request, or an output record."""

    seq: int
    #: The first sequence number of the segment it is in.
    segment: int
    #: References left: groups per exporter, pins, unsettled sources.
    refs: int
    #: Span groups each exporter (by number) still owes.
    groups: list[int]


@dataclass(slots=True)
class _Append:
    seq: int
    payload: Payload
    size: int
    tag: Callable[[int], int]
    admit: Callable[[], None]
    future: asyncio.Future[None]
    queued: float
    #: Whether the future fails at the append timeout (False: it waits for the outcome).
    expires: bool = True


class Storage(Component):
    """The write-ahead log of accepted requests (see the module docstring)."""

    component_name = "storage"

    def __init__(
        self,
        config: StorageConfig,
        *,
        telemetry: Telemetry | None = None,
        file_ops: FileOps | None = None,
    ) -> None:
        if config.directory is None:
            raise ValueError("storage.directory is not set")
        self._config = config
        self._max_size = config.max_size
        self._segment_size = segment_size_for(config.max_size)
        self._append_timeout = config.append_timeout
        skipped = telemetry.wal_records_skipped if telemetry is not None else None
        self._wal = WriteAheadLog(
            config.directory,
            segment_size=self._segment_size,
            fsync=config.fsync,
            file_ops=file_ops,
            on_skipped=(lambda reason: skipped.labels(reason).inc()) if skipped else None,
        )
        self._log = get_logger("storage")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ops: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._next_seq = 1
        self._waiting: dict[int, _Append] = {}
        self._pending_bytes = 0
        #: The unsettled entries, by sequence number.
        self._entries: dict[int, _Entry] = {}
        #: Heap of the sequence numbers of held entries; settled ones are dropped when
        #: they reach the top, so ``_order[0]`` (after :meth:`_lowest`) is the lowest
        #: unsettled entry whatever order entries were held in.  Rebuilt from
        #: ``_entries`` when settled ones make up most of it (an old entry held while
        #: newer ones settle), so it stays within twice the entries held, plus a few.
        self._order: list[int] = []
        #: Heap of entries settled above the lowest unsettled one without a mark: at
        #: :meth:`close`, those still above the checkpoint get a "settled" mark.
        self._unmarked: list[int] = []
        #: Mark records being written: seq -> the marks (exporter number, entry).
        self._mark_records: dict[int, list[tuple[int, int]]] = {}
        #: First sequence numbers of the segments on disk, sorted.
        self._firsts: list[int] = []
        #: Exporter names, in the pipeline's order (delivery marks name them).
        self._exporters: list[str] = [""]
        #: Source entry -> output entries that stay while it does.
        self._dependents: dict[int, list[int]] = {}
        #: An output being written -> its sources (picked up when it is held).
        self._sources: dict[int, list[int]] = {}
        #: Delivery marks not yet written: exporter number -> sequence numbers.
        self._marks: dict[int, list[int]] = {}
        #: Replay: exporter numbers that had delivered an entry before the restart.
        #: Filled by replay only; a request's item goes once the processor has
        #: forwarded its groups, the others once replay is over (:meth:`_forget_marks`).
        self.delivered: dict[int, set[int]] = {}
        #: Replay: entries settled before the restart (outputs included); kept as long.
        self.settled: set[int] = set()
        #: Replayed requests -> their span groups the processor has not forwarded yet
        #: (each one a reference while the entry is held; see :meth:`forwarded`).
        self._unforwarded: dict[int, int] = {}
        #: The lowest unsettled entry (0: none), and since when (loop time).
        self._oldest = 0
        self._oldest_since = 0.0
        self._segments: dict[int, _Seg] = {}
        self._active: int | None = None
        self._disk_bytes = 0
        self._horizon = 1
        #: Lowest unsettled sequence number; read by the writer thread for checkpoints.
        self._watermark = 0
        self._replay_segment: int | None = None
        #: While replay runs: no record at or above this has been handed over yet.
        self._replay_floor: int | None = None
        #: Why writes fail (set on the loop after a failed write, cleared by a success).
        self._write_error: str | None = None
        #: Writer side: bytes to probe the disk with after a failed write (0: no probe).
        self._probe_bytes = 0
        self._stall_timer: asyncio.TimerHandle | None = None
        #: Set on the loop when the writer thread has ended (not by close).
        self._writer_gone = False
        self._closed = False
        #: Entries replayed at start, and how many spans' requests they held.
        self.replayed_entries = 0

    # ------------------------------------------------------------------ state
    @property
    def directory(self) -> str:
        return str(self._config.directory)

    @property
    def disk_bytes(self) -> int:
        """Bytes of the segments on disk (settled ones included until deleted)."""
        return self._disk_bytes

    @property
    def unsettled_entries(self) -> int:
        return len(self._entries) + len(self._waiting)

    @property
    def skipped_records(self) -> int:
        """Torn or corrupt records skipped at start."""
        return self._wal.skipped_records

    def refusal(self) -> tuple[str, str] | None:
        """Why the log would refuse a request now, as (reason, message); None if it
        would take it.  Admission and ``/readyz`` both read this."""
        if self._write_error is not None:
            return "storage_error", f"the write-ahead log cannot be written: {self._write_error}"
        if self._loop is not None and not self._closed:
            if self._writer_gone or (self._thread is not None and not self._thread.is_alive()):
                return "storage_error", _WRITER_GONE
            if self._waiting:
                oldest = next(iter(self._waiting.values()))
                waited = self._loop.time() - oldest.queued
                if waited >= self._append_timeout:
                    return (
                        "storage_error",
                        f"the write-ahead log has not completed a write for {waited:.0f}s",
                    )
        if self.full():
            return "storage_full", "the write-ahead log is full until exporters deliver"
        return None

    def room_for_output(self, size: int, *, needed: bool = True) -> bool:
        """Whether an output record of ``size`` payload bytes may be written now.
        Requests stop at ``max_size``; outputs may take one segment more: ``needed``
        ones (carriers, whose results exist nowhere else) up to ``max_size`` plus a
        segment, optional ones (copies of results written on a span, which only spare
        a judge call after a crash) up to ``max_size`` plus half a segment, so that they
        never take the room carriers need."""
        extra = self._segment_size if needed else self._segment_size // 2
        used = self._disk_bytes + self._pending_bytes + size + HEADER_SIZE
        return used <= self._max_size + extra

    def full(self) -> bool:
        full = self._disk_bytes + self._pending_bytes >= self._max_size
        if full:
            if self.status is not Status.PERMANENT_ERROR:
                self.report(
                    Status.RECOVERABLE_ERROR,
                    f"storage full: {self._disk_bytes} of {self._max_size} bytes in use "
                    "until exporters deliver",
                )
        elif self.status is Status.RECOVERABLE_ERROR:
            self.report_ok()
        return full

    # -------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Lock the directory, recover the torn tail, start the writer thread."""
        self._loop = asyncio.get_running_loop()
        self.report(Status.STARTING)
        try:
            await asyncio.to_thread(self._wal.open)
        except StorageError as exc:
            self.report(Status.PERMANENT_ERROR, exc)
            raise
        self._next_seq = self._wal.next_seq
        self._horizon = self._next_seq
        self._watermark = self._wal.checkpoint
        for segment in self._wal.segments:
            self._add_segment(segment.first_seq, _Seg(0, segment.size, True))
            self._disk_bytes += segment.size
        if any(s.size > _EMPTY_SEGMENT for s in self._wal.segments):
            # Records to replay: the checkpoint stays until replay has handed them over.
            self._replay_floor = self._wal.checkpoint
        self._thread = threading.Thread(
            target=self._supervised_writer, name="storage-writer", daemon=True
        )
        self._thread.start()
        self._log.info(
            "storage_opened",
            directory=self.directory,
            segments=len(self._wal.segments),
            bytes=self._disk_bytes,
            checkpoint=self._wal.checkpoint,
            fsync=self._config.fsync,
        )
        self.report_ok()

    async def close(self) -> None:
        """Stop the writer (requests it holds are written first), checkpoint, unlock."""
        if self._closed or self._loop is None:
            return
        self._update_watermark()
        self._mark_unmarked()
        if self._marks:
            self._write_marks()  # marks of this last loop round, and of _mark_unmarked
        self._closed = True
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self.report(Status.STOPPING)
        self._update_watermark()
        self._ops.put(("stop", self._watermark))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30.0)
        await asyncio.to_thread(self._wal.close)
        self._log.info(
            "storage_closed", unsettled_entries=len(self._entries), bytes=self._disk_bytes
        )
        self.report(Status.STOPPED)

    # ----------------------------------------------------------------- append
    def append(
        self,
        payload: Payload,
        *,
        tag: Callable[[int], int],
        admit: Callable[[], None],
        kind: int = KIND_REQUEST,
        timeout: bool = True,
    ) -> asyncio.Future[None]:
        """Write one record (a request, by default); the future resolves once it is
        durable, or fails with :class:`StorageError` (write error, the writer thread
        gone, or, with ``timeout``, not written within the append timeout:
        :class:`AppendTimeout`, though the record may still land).  ``timeout=False``
        (outputs: no client waits) makes the future wait for the write's outcome, so a
        write that fails after the timeout is still seen as failed.

        On the event loop, right after the write: ``tag(seq)`` marks the request's span
        groups with the entry's sequence number and returns its reference count, then
        ``admit()`` hands the request on.  Both run even if the waiter is cancelled or
        timed out.
        """
        loop = self._loop
        if loop is None or self._closed:
            raise StorageError("storage is not open")
        if self._writer_gone:
            raise StorageError(_WRITER_GONE)
        seq = self._next_seq
        self._next_seq += 1
        size = len(payload) if isinstance(payload, bytes) else payload.ByteSize()
        future: asyncio.Future[None] = loop.create_future()
        self._waiting[seq] = _Append(seq, payload, size, tag, admit, future, loop.time(), timeout)
        self._pending_bytes += size
        self._ops.put(("append", (seq, payload, size, kind)))
        if self._stall_timer is None:
            self._stall_timer = loop.call_later(self._append_timeout, self._check_stall)
        return future

    def _check_stall(self) -> None:
        """Fail the waiters of writes older than the append timeout; check again when
        the oldest write left would reach it."""
        self._stall_timer = None
        loop = self._loop
        if loop is None or not self._waiting:
            return
        now = loop.time()
        expired = 0
        for item in self._waiting.values():
            if now - item.queued < self._append_timeout:
                break
            if item.expires and not item.future.done():
                expired += 1
                item.future.set_exception(
                    AppendTimeout(
                        f"the write did not complete within {self._append_timeout:g}s; retry later"
                    )
                )
        if expired:
            self._log.error("wal_append_timeout", requests=expired, timeout_s=self._append_timeout)
            if self.status is not Status.PERMANENT_ERROR:
                self.report(
                    Status.RECOVERABLE_ERROR,
                    f"the storage writer has not completed a write for {self._append_timeout:g}s",
                )
        oldest = next(iter(self._waiting.values()), None)
        if oldest is not None:
            delay = max(oldest.queued + self._append_timeout - now, self._append_timeout / 10)
            self._stall_timer = loop.call_later(delay, self._check_stall)

    def _committed(self, placed: list[Placed]) -> None:
        """Loop side of a group commit: ledger, admission, acknowledgement."""
        for seq, segment_first, size in placed:
            item = self._waiting.pop(seq)
            self._pending_bytes -= item.size
            self._disk_bytes += size
            if segment_first != self._active:
                self._new_active(segment_first)
            self._segments[segment_first].size += size
            try:
                refs = item.tag(seq)
                self._hold(seq, segment_first, refs)
                item.admit()
            except Exception as exc:  # a bug: the entry stays and is replayed next start
                self._log.exception("storage_admit_failed", seq=seq)
                if not item.future.done():
                    item.future.set_exception(StorageError(f"cannot admit the request: {exc}"))
                continue
            if not item.future.done():
                item.future.set_result(None)
        self._recovered()

    def _recovered(self) -> None:
        """A write or a probe succeeded: the disk takes data again."""
        if self._write_error is not None:
            self._write_error = None
            self._log.info("wal_writable_again")
        if self.status is Status.PERMANENT_ERROR:
            self.report_ok()
        self.full()  # back to ok from a stall, or to recoverable_error while full

    def _failed(self, seqs: list[int], error: str, *, bug: bool = False) -> None:
        self._fail_waiting(seqs, error)
        if bug:  # the writer failed unexpectedly and goes on: counted, recoverable
            if self._host is not None:
                self._host.failed(self)
            self.report(Status.RECOVERABLE_ERROR, error)
            return
        self._write_error = error
        self.report(Status.PERMANENT_ERROR, error)

    def _fail_waiting(self, seqs: list[int], error: str) -> None:
        """These writes will not land: their waiters get :class:`StorageError`."""
        for seq in seqs:
            item = self._waiting.pop(seq, None)
            if item is None:
                continue
            self._mark_records.pop(seq, None)
            self._pending_bytes -= item.size
            if not item.future.done():
                item.future.set_exception(StorageError(error))

    def _writer_stopped(self) -> None:
        """The writer thread has ended (not by :meth:`close`): nothing will be written,
        so every write waiting fails now instead of at its timeout."""
        if self._closed:
            return
        self._writer_gone = True
        self._fail_waiting(list(self._waiting), _WRITER_GONE)
        self.report(Status.PERMANENT_ERROR, "the storage writer thread has stopped")

    def _new_active(self, first: int) -> None:
        previous = self._active
        self._active = first
        if first not in self._segments:
            self._add_segment(first, _Seg(0, _EMPTY_SEGMENT, True))
            self._disk_bytes += _EMPTY_SEGMENT  # its header
        if previous is not None and previous in self._segments:
            self._segments[previous].open = False
            self._maybe_delete(previous)

    # ----------------------------------------------------------------- ledger
    def set_exporters(self, names: list[str]) -> None:
        """The exporters, in the order :meth:`settle` numbers them (before start)."""
        self._exporters = list(names) or [""]

    def _hold(self, seq: int, segment_first: int, groups: int, *, to_forward: bool = False) -> None:
        """Register a written (or replayed) entry: ``groups`` span groups to deliver to
        every exporter (``to_forward``: and for the processor to forward), plus, for an
        output record, its unsettled sources."""
        if seq >= self._horizon:
            self._horizon = seq + 1
        seg = self._segments[segment_first]
        if self._mark_records:
            marks = self._mark_records.pop(seq, None)
            if marks:
                seg.marks += marks
        n = len(self._exporters)
        refs = groups * n
        if to_forward and groups > 0:
            refs += groups
            self._unforwarded[seq] = groups
        sources = self._sources.pop(seq, None) if self._sources else None
        live: list[int] = []
        if sources:
            seg.sources += sources
            live = [s for s in sources if s in self._entries]
            refs += len(live)
        if refs > 0:
            self._entries[seq] = _Entry(seq, segment_first, refs, [groups] * n)
            heapq.heappush(self._order, seq)
            seg.unsettled += 1
            for source in live:
                self._dependents.setdefault(source, []).append(seq)
        self._update_watermark()

    def settle(self, groups: Iterable[SpanGroup], exporter: int = 0) -> None:
        """Exporter number ``exporter`` is done with these groups (delivered or given up
        for good).  An entry it has finished while others still hold it gets a delivery
        mark, so that a replay does not send it there again."""
        touched = False
        entries = self._entries
        for group in groups:
            seq = group.wal_seq
            if seq < 0:
                continue
            entry = entries.get(seq)
            if entry is None or entry.groups[exporter] <= 0:
                continue  # settled, or delivered there before a restart
            entry.groups[exporter] -= 1
            if self._unref(entry, 1):
                touched = True
            elif entry.groups[exporter] == 0:
                self._mark(exporter, seq)
        if touched:
            self._update_watermark()

    def pin(self, seqs: Iterable[int]) -> list[int]:
        """One more reference on each unsettled entry of ``seqs`` (an output still to
        come); returns the entries pinned, to give to :meth:`unpin`."""
        pinned: list[int] = []
        for seq in seqs:
            entry = self._entries.get(seq)
            if entry is not None:
                entry.refs += 1
                pinned.append(seq)
        return pinned

    def unpin(self, seqs: Iterable[int]) -> None:
        """Drop the references :meth:`pin` added."""
        touched = False
        for seq in seqs:
            entry = self._entries.get(seq)
            if entry is not None:
                touched |= self._unref(entry, 1)
        if touched:
            self._update_watermark()

    def outputs_of(self, seq: int, sources: list[int]) -> None:
        """The record being written as ``seq`` is an output made from ``sources``: it
        stays while any of them does (call from ``tag``, before it is held)."""
        if sources:
            self._sources[seq] = sources

    def _unref(self, entry: _Entry, count: int) -> bool:
        """Drop ``count`` references of ``entry``; whether that settled it."""
        entry.refs -= count
        if entry.refs > 0:
            return False
        self._release(entry)
        return True

    def _release(self, entry: _Entry, *, marked: bool = False) -> None:
        """``entry`` is settled (``marked``: a replayed "settled" mark says so)."""
        seq = entry.seq
        del self._entries[seq]
        if len(self._order) > 2 * len(self._entries) + _ORDER_SLACK:
            self._order = list(self._entries)
            heapq.heapify(self._order)
        if not marked:
            lowest = self._lowest()
            if lowest is not None and seq > lowest:
                # Settled above the checkpoint, which an older entry holds back: a
                # restart would replay this one.  Marked now if the oldest has been held
                # back for a while (a backend down, an output awaited), else at close
                # if still above the checkpoint then.
                if self._now() - self._oldest_since > _HELD_BACK:
                    self._mark(_SETTLED, seq)
                else:
                    heapq.heappush(self._unmarked, seq)
        seg = self._segments.get(entry.segment)
        if seg is not None:
            seg.unsettled -= 1
            if seg.unsettled <= 0:
                self._maybe_delete(entry.segment)
        if self._dependents:
            outputs = self._dependents.pop(seq, None)
            if outputs:
                self.unpin(outputs)

    def _lowest(self) -> int | None:
        """The lowest unsettled entry (None: none is held)."""
        order, entries = self._order, self._entries
        while order and order[0] not in entries:
            heapq.heappop(order)
        return order[0] if order else None

    def _checkpoint(self) -> int:
        """Every record below this is settled and handed over: ``min(lowest unsettled,
        replay floor, log end)``."""
        mark = self._horizon
        lowest = self._lowest()
        if lowest is not None and lowest < mark:
            mark = lowest
        floor = self._replay_floor
        if floor is not None and floor < mark:
            mark = floor
        return mark

    def _update_watermark(self) -> None:
        self._watermark = mark = self._checkpoint()
        lowest = self._order[0] if self._order else 0  # (settled ones popped just now)
        if lowest != self._oldest:
            self._oldest, self._oldest_since = lowest, self._now()
        unmarked = self._unmarked
        while unmarked and unmarked[0] < mark:
            heapq.heappop(unmarked)  # below the checkpoint: never replayed, no mark needed

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    def _mark(self, exporter: int, seq: int) -> None:
        if not self._marks and self._loop is not None and not self._closed:
            self._loop.call_soon(self._write_marks)
        self._marks.setdefault(exporter, []).append(seq)

    def _mark_unmarked(self) -> None:
        """At close: a "settled" mark for each entry settled above the checkpoint
        without one, that a restart would replay."""
        floor = self._watermark
        for seq in sorted(set(self._unmarked)):
            if seq >= floor and self._segment_of(seq) is not None:
                self._mark(_SETTLED, seq)
        self._unmarked = []

    def _write_marks(self) -> None:
        """Log the marks gathered in this loop round as one record.  Not waited for: a
        lost mark costs a duplicate at the next start, nothing more."""
        marks, self._marks = self._marks, {}
        still: dict[str, list[int]] = {}
        facts: list[tuple[int, int]] = []
        for exporter, seqs in marks.items():
            if exporter == _SETTLED:
                still[SETTLED_MARK] = seqs
            elif seqs and exporter < len(self._exporters):
                still[self._exporters[exporter]] = seqs
            else:
                continue
            facts += [(exporter, seq) for seq in seqs]
        if not still or self._closed:
            return
        seq = self._next_seq
        try:
            done = self.append(
                encode_marks(still), tag=_no_groups, admit=_nothing, kind=KIND_DELIVERED
            )
        except StorageError:
            return
        self._mark_records[seq] = facts
        done.add_done_callback(_ignore_failure)

    # --------------------------------------------------------------- segments
    def _add_segment(self, first: int, seg: _Seg) -> None:
        self._segments[first] = seg
        insort(self._firsts, first)

    def _segment_of(self, seq: int) -> int | None:
        """The first sequence number of the segment on disk that holds ``seq``."""
        at = bisect_right(self._firsts, seq)
        return self._firsts[at - 1] if at else None

    def _maybe_delete(self, first: int) -> None:
        """The one place that decides whether a segment may go: none of its entries is
        unsettled, and it is closed (the active one is closed early only when space is
        needed, and only when nothing is being written into it).  What it still says
        about other entries is carried forward first (see the module docstring)."""
        seg = self._segments.get(first)
        if seg is None or seg.unsettled > 0:
            return
        if seg.open:
            if first != self._active or self._waiting or not self.full():
                return
            self._active = None
            self._ops.put(("seal", first))
        del self._segments[first]
        self._firsts.remove(first)
        self._disk_bytes -= seg.size
        self._carry_forward(seg)
        self._ops.put(("delete", first))  # after the carried marks: the writer keeps order
        self.full()

    def _carry_forward(self, seg: _Seg) -> None:
        """Mark again what a segment about to go says that is still needed."""
        if not seg.marks and not seg.sources:
            return
        floor = min(self._watermark, self._wal.checkpoint)
        entries = self._entries

        def replayable(seq: int) -> bool:
            return seq >= floor and seq not in entries and self._segment_of(seq) is not None

        for exporter, seq in seg.marks:
            if exporter == _SETTLED:
                if replayable(seq):
                    self._mark(_SETTLED, seq)
            else:
                entry = entries.get(seq)
                if entry is not None and entry.groups[exporter] == 0:
                    self._mark(exporter, seq)
        for seq in set(seg.sources):
            if replayable(seq):
                self._mark(_SETTLED, seq)
        if self._marks and not self._closed:
            self._write_marks()  # now, so that the record is queued before the delete

    # ----------------------------------------------------------------- replay
    async def replay(self) -> AsyncIterator[list[Record]]:
        """What the log held at start, past the checkpoint, in chunks, in order (every
        kind of record).

        Register every yielded entry with :meth:`hold_replayed` before asking for the
        next chunk.  Until the last chunk was asked for, the checkpoint stays at or
        below the first record not registered.  The replayed marks (:attr:`delivered`,
        :attr:`settled`) of records other than requests waiting for the processor are
        dropped in the loop round after the last chunk: fan out replayed carriers in
        the round the iteration ends.
        """
        recovered = [s for s in self._wal.segments if s.first_seq != self._wal.active_first_seq]
        checkpoint = self._wal.checkpoint
        for segment in recovered:
            self._replay_segment = segment.first_seq
            reader = iter(self._wal.records(segment))
            while True:
                chunk = await asyncio.to_thread(_read_chunk, reader, checkpoint)
                if chunk is None:
                    break
                if chunk:
                    self.replayed_entries += len(chunk)
                    yield chunk
            self._replay_segment = None
            seg = self._segments.get(segment.first_seq)
            if seg is not None:
                seg.open = False
                self._maybe_delete(segment.first_seq)
        self._replay_floor = None
        self._update_watermark()
        if (self.delivered or self.settled) and self._loop is not None:
            self._loop.call_soon(self._forget_marks)

    def hold_replayed(
        self,
        seq: int,
        refs: int,
        sources: list[int] | None = None,
        *,
        to_forward: bool = False,
    ) -> None:
        """Register a replayed entry with its span groups (``refs``; 0: nothing to
        deliver) and, for an output record, the entries it was made from.
        ``to_forward``: a request whose groups go through the processor; the entry is
        also held until :meth:`forwarded` has been told of each group."""
        if self._replay_segment is None:
            raise RuntimeError("hold_replayed outside replay")
        if sources:
            self._sources[seq] = sources
        if self._replay_floor is not None and seq >= self._replay_floor:
            self._replay_floor = seq + 1
        self._hold(seq, self._replay_segment, refs, to_forward=to_forward)

    def forwarded(self, groups: Iterable[SpanGroup]) -> None:
        """The processor has forwarded these groups (or the pipeline dropped them as
        settled before the restart): a replayed request no longer waits for them.  Any
        hold the processor takes for a result still owed is taken before this."""
        unforwarded = self._unforwarded
        if not unforwarded:
            return
        touched = False
        for group in groups:
            seq = group.wal_seq
            left = unforwarded.get(seq)
            if left is None:
                continue
            if left > 1:
                unforwarded[seq] = left - 1
            else:
                # Every group of it has passed the processor: its marks are read no more.
                del unforwarded[seq]
                self.delivered.pop(seq, None)
                self.settled.discard(seq)
            entry = self._entries.get(seq)
            if entry is not None:  # (not settled by a replayed "settled" mark)
                touched |= self._unref(entry, 1)
        if touched:
            self._update_watermark()

    def _forget_marks(self) -> None:
        """After replay (once the pipeline has fanned out the replayed carriers, in the
        same loop round): the marks of records that are not requests still waiting for
        the processor are read no more."""
        keep = self._unforwarded
        self.delivered = {s: e for s, e in self.delivered.items() if s in keep}
        self.settled = {s for s in self.settled if s in keep}

    def replayed_marks(self, payload: bytes) -> None:
        """A replayed ``KIND_DELIVERED`` record: those exporters no longer hold those
        entries, and :attr:`delivered` tells the pipeline not to send them again."""
        numbers = {name: i for i, name in enumerate(self._exporters)}
        everyone = set(range(len(self._exporters)))
        touched = False
        seg = self._segments.get(self._replay_segment) if self._replay_segment else None
        for name, seqs in decode_marks(payload).items():
            if name == SETTLED_MARK:
                for seq in seqs:
                    self.settled.add(seq)
                    self.delivered[seq] = everyone
                    if seg is not None:
                        seg.marks.append((_SETTLED, seq))
                    entry = self._entries.get(seq)
                    if entry is not None:
                        self._release(entry, marked=True)
                        touched = True
                continue
            exporter = numbers.get(name)
            if exporter is None:
                continue  # an exporter no longer configured
            for seq in seqs:
                self.delivered.setdefault(seq, set()).add(exporter)
                if seg is not None:
                    seg.marks.append((exporter, seq))
                entry = self._entries.get(seq)
                if entry is None or entry.groups[exporter] <= 0:
                    continue
                owed, entry.groups[exporter] = entry.groups[exporter], 0
                # Settled now (no "settled" mark says so yet): marked as any other.
                touched |= self._unref(entry, owed)
        if touched:
            self._update_watermark()

    # ----------------------------------------------------------------- writer
    def _supervised_writer(self) -> None:
        """The writer thread: runs :meth:`_writer_round` until stopped.  An unexpected
        exception fails the requests in hand (their clients retry), is logged and
        counted, and the writer goes on after a growing pause."""
        loop = self._loop
        assert loop is not None
        state = _WriterState(self._wal.checkpoint, time.monotonic())
        pause = _WRITER_BACKOFF[0]
        try:
            while not state.stop:
                held: list[int] = []
                try:
                    self._writer_round(loop, state, held)
                    pause = _WRITER_BACKOFF[0]
                except Exception as exc:
                    self._log.exception("storage_writer_failed", requests=len(held))
                    error = f"storage writer: {type(exc).__name__}: {exc}"
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(
                            functools.partial(self._failed, held, error, bug=True)
                        )
                    time.sleep(pause)
                    pause = min(pause * 2, _WRITER_BACKOFF[1])
        except BaseException:  # SystemExit, MemoryError...: the thread ends, logged
            self._log.exception("storage_writer_stopped")
        finally:
            if not state.stop:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._writer_stopped)

    def _writer_round(
        self, loop: asyncio.AbstractEventLoop, state: _WriterState, held: list[int]
    ) -> None:
        """Take what is queued, write it (group commit), delete, checkpoint, probe.
        ``held``: the sequence numbers taken, for the supervisor to fail on a bug."""
        wait = _PROBE_EVERY if self._probe_bytes else _CHECKPOINT_EVERY
        try:
            ops = [self._ops.get(timeout=wait)]
        except queue.Empty:
            ops = []
        taken = 0
        while ops and taken < _GROUP_BYTES:
            try:
                op = self._ops.get_nowait()
            except queue.Empty:
                break
            ops.append(op)
            if op[0] == "append":
                taken += op[1][2]
        held.extend(arg[0] for kind, arg in ops if kind == "append")
        batch: list[tuple[int, Payload, int]] = []
        for kind, arg in ops:
            if kind == "append":
                batch.append((arg[0], arg[1], arg[3]))
                continue
            self._write_batch(loop, batch)
            batch = []
            if kind == "delete":
                self._delete(arg)
            elif kind == "seal":
                if arg == self._wal.active_first_seq:
                    self._wal.seal()
            elif kind == "stop":
                state.stop = True
        self._write_batch(loop, batch)
        del held[:]
        if self._probe_bytes and not ops:
            self._probe(loop)
        watermark = self._watermark
        now = time.monotonic()
        if watermark != state.checkpoint and (
            state.stop or now - state.checkpoint_at >= _CHECKPOINT_EVERY
        ):
            try:
                self._wal.write_checkpoint(watermark)
                state.checkpoint = watermark
            except OSError as exc:
                self._log.warning("wal_checkpoint_failed", error=str(exc))
            state.checkpoint_at = now

    def _write_batch(
        self, loop: asyncio.AbstractEventLoop, batch: list[tuple[int, Payload, int]]
    ) -> None:
        if not batch:
            return
        try:
            records = [
                (seq, p if isinstance(p, bytes) else p.SerializeToString(), kind)
                for seq, p, kind in batch
            ]
            placed = self._wal.append(records)
        except StorageError as exc:
            error = str(exc)
            self._log.error("wal_write_failed", error=error, requests=len(batch) - len(exc.placed))
            self._probe_bytes = min(max(sum(len(r[1]) for r in records), 4096), _PROBE_MAX_BYTES)
            done = {p.seq for p in exc.placed}
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                if exc.placed:
                    loop.call_soon_threadsafe(self._committed, exc.placed)
                loop.call_soon_threadsafe(
                    self._failed, [seq for seq, _, _ in batch if seq not in done], error
                )
            return
        self._probe_bytes = 0
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._committed, placed)

    def _probe(self, loop: asyncio.AbstractEventLoop) -> None:
        """After a failed write, with nothing to write: is there room again?"""
        try:
            self._wal.probe(self._probe_bytes)
        except StorageError:
            return
        self._probe_bytes = 0
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._recovered)

    def _delete(self, first: int) -> None:
        try:
            if first == self._wal.active_first_seq:
                self._wal.seal()
            self._wal.delete(first)
        except OSError as exc:
            self._log.warning("wal_delete_failed", segment=first, error=str(exc))


@dataclass(slots=True)
class _WriterState:
    """What the writer thread carries from one round to the next."""

    checkpoint: int
    checkpoint_at: float
    stop: bool = False


def _read_chunk(reader: Iterator[Record], checkpoint: int) -> list[Record] | None:
    """The next records of a segment, up to about a chunk; None at its end."""
    chunk: list[Record] = []
    size = 0
    for record in reader:
        if record.seq < checkpoint:
            continue
        chunk.append(record)
        size += len(record.payload)
        if size >= _REPLAY_CHUNK_BYTES:
            return chunk
    return chunk or None


def _no_groups(_seq: int) -> int:
    return 0


def _nothing() -> None:
    return None


def _ignore_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a failed mark is only a duplicate later
