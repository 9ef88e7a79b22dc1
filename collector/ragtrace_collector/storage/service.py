"""The ``storage`` component: the write-ahead log as the pipeline sees it.

* **Append before acknowledging.**  :meth:`Storage.append` queues a request for the
  writer thread and returns a future the receiver awaits.  The writer takes every
  request waiting, writes them, and syncs once (``fsync: batch``, group commit), or
  once per request (``always``), or leaves it to the OS (``never``); then, on the
  event loop, each entry is counted in the ledger and handed to the assembler, and
  the receivers' futures resolve.  No file I/O runs on the event loop.
* **Settle, then truncate.**  Each entry has a count of references: one per span group
  (spans of one trace from one request) per exporter, one per pin (an output still to
  come, :meth:`Storage.pin`), and, for an output record, one per entry it was made
  from that is still held (:meth:`Storage.outputs_of`).  Every exporter reports the
  groups it is done with (delivered, or given up for good) through
  :meth:`Storage.settle`; an entry whose count reaches zero is settled.  An exporter
  that has finished an entry others still hold, or an entry settled while an older one
  holds the checkpoint back, leaves a delivery mark in the log (see
  :mod:`.outputs`).  A segment
  whose entries are all settled is deleted (the active one is closed first, when the
  log is full).  A checkpoint (the lowest unsettled sequence number) is written about
  twice a second, so a restart replays little that was already delivered.  It never
  passes a record not yet replayed: while replay runs, it stays at or below the next
  record replay has not handed over, whatever was settled.
* **Replay.**  :meth:`Storage.replay` yields what is on disk at start, past the
  checkpoint; the pipeline feeds it to the assembler and registers each entry with
  :meth:`Storage.hold_replayed`.
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
  ``recoverable_error``.  If the thread ends anyway, status ``permanent_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
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
    KIND_REQUEST,
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
#: A segment holding nothing but its magic.
_EMPTY_SEGMENT: Final = 8
#: The writer takes at most this many payload bytes into one group commit.
_GROUP_BYTES: Final = 16 * 1024 * 1024
_CHECKPOINT_EVERY: Final = 0.5
#: An entry settled while an older one has been held this long gets delivery marks
#: (out-of-order settling over a shorter time is passed by the checkpoint anyway).
_HELD_BACK: Final = 2 * _CHECKPOINT_EVERY
#: The exporter number of a "settled" mark (every exporter, every output: done).
_SETTLED: Final = -1
#: After a failed write, the disk is probed this often, with at most this many bytes.
_PROBE_EVERY: Final = 0.5
_PROBE_MAX_BYTES: Final = 1024 * 1024
#: The writer's pause after an unexpected exception, doubling up to the maximum.
_WRITER_BACKOFF: Final = (0.05, 5.0)

Payload: TypeAlias = bytes | Message


def segment_size_for(max_size: int) -> int:
    """Segments of 1/8 of ``max_size``, between 64 KiB and 64 MiB."""
    return max(64 * 1024, min(64 * 1024 * 1024, max_size // 8))


@dataclass(slots=True)
class _Seg:
    """Ledger of one segment: unsettled entries, bytes, and whether more may come."""

    unsettled: int
    size: int
    open: bool


@dataclass(slots=True)
class _Append:
    seq: int
    payload: Payload
    size: int
    tag: Callable[[int], int]
    admit: Callable[[], None]
    future: asyncio.Future[None]
    queued: float


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
        self._append_timeout = config.append_timeout
        skipped = telemetry.wal_records_skipped if telemetry is not None else None
        self._wal = WriteAheadLog(
            config.directory,
            segment_size=segment_size_for(config.max_size),
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
        #: seq -> [references left, segment first seq, groups left for exporter 0, for
        #: exporter 1, ...]; insertion (= seq) order.  References: one per group per
        #: exporter, one per pin (an output still to come), one per unsettled source of
        #: an output record.
        self._entries: dict[int, list[int]] = {}
        #: Exporter names, in the pipeline's order (delivery marks name them).
        self._exporters: list[str] = [""]
        #: Source entry -> output entries that stay while it does.
        self._dependents: dict[int, list[int]] = {}
        #: An output being written -> its sources (picked up when it is held).
        self._sources: dict[int, list[int]] = {}
        #: Delivery marks not yet written: exporter number -> sequence numbers.
        self._marks: dict[int, list[int]] = {}
        #: Replay: exporter numbers that had delivered an entry before the restart.
        self.delivered: dict[int, set[int]] = {}
        #: Replay: entries settled before the restart (outputs included).
        self.settled: set[int] = set()
        #: The oldest unsettled entry, and since when it is the oldest (loop time).
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
            if self._thread is not None and not self._thread.is_alive():
                return "storage_error", "the write-ahead log writer has stopped"
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
            self._segments[segment.first_seq] = _Seg(0, segment.size, True)
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
        if self._marks:
            self._write_marks()  # delivery marks of this last loop round
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
    ) -> asyncio.Future[None]:
        """Write one record (a request, by default); the future resolves once it is
        durable, or fails with :class:`StorageError` (write error, or not written
        within the append timeout).

        On the event loop, right after the write: ``tag(seq)`` marks the request's span
        groups with the entry's sequence number and returns its reference count, then
        ``admit()`` hands the request on.  Both run even if the waiter is cancelled or
        timed out.
        """
        loop = self._loop
        if loop is None or self._closed:
            raise StorageError("storage is not open")
        seq = self._next_seq
        self._next_seq += 1
        size = len(payload) if isinstance(payload, bytes) else payload.ByteSize()
        future: asyncio.Future[None] = loop.create_future()
        self._waiting[seq] = _Append(seq, payload, size, tag, admit, future, loop.time())
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
            if not item.future.done():
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
        for seq in seqs:
            item = self._waiting.pop(seq, None)
            if item is None:
                continue
            self._pending_bytes -= item.size
            if not item.future.done():
                item.future.set_exception(StorageError(error))
        if bug:  # the writer failed unexpectedly and goes on: counted, recoverable
            if self._host is not None:
                self._host.failed(self)
            self.report(Status.RECOVERABLE_ERROR, error)
            return
        self._write_error = error
        self.report(Status.PERMANENT_ERROR, error)

    def _writer_stopped(self) -> None:
        if not self._closed:
            self.report(Status.PERMANENT_ERROR, "the storage writer thread has stopped")

    def _new_active(self, first: int) -> None:
        previous = self._active
        self._active = first
        self._segments.setdefault(first, _Seg(0, 0, True))
        if previous is not None and previous in self._segments:
            self._segments[previous].open = False
            self._maybe_delete(previous)

    # ----------------------------------------------------------------- ledger
    def set_exporters(self, names: list[str]) -> None:
        """The exporters, in the order :meth:`settle` numbers them (before start)."""
        self._exporters = list(names) or [""]

    def _hold(self, seq: int, segment_first: int, groups: int) -> None:
        """Register a written (or replayed) entry: ``groups`` span groups to deliver to
        every exporter, plus, for an output record, its unsettled sources."""
        if seq >= self._horizon:
            self._horizon = seq + 1
        n = len(self._exporters)
        refs = groups * n
        sources = self._sources.pop(seq, None) if self._sources else None
        live: list[int] = []
        if sources:
            live = [s for s in sources if s in self._entries]
            refs += len(live)
        if refs > 0:
            entry = [refs, segment_first]
            entry += [groups] * n
            self._entries[seq] = entry
            self._segments[segment_first].unsettled += 1
            if len(self._entries) == 1:
                self._oldest, self._oldest_since = seq, self._now()
            for source in live:
                self._dependents.setdefault(source, []).append(seq)
        self._update_watermark()

    def settle(self, groups: Iterable[SpanGroup], exporter: int = 0) -> None:
        """Exporter number ``exporter`` is done with these groups (delivered or given up
        for good).  An entry it has finished while others still hold it gets a delivery
        mark, so that a replay does not send it there again."""
        touched = False
        slot = 2 + exporter
        for group in groups:
            seq = group.wal_seq
            if seq < 0:
                continue
            entry = self._entries.get(seq)
            if entry is None or entry[slot] <= 0:
                continue  # settled, or delivered there before a restart
            entry[slot] -= 1
            entry[0] -= 1
            if entry[0] <= 0:
                self._release(seq, entry)
                touched = True
            elif entry[slot] == 0:
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
                entry[0] += 1
                pinned.append(seq)
        return pinned

    def unpin(self, seqs: Iterable[int]) -> None:
        """Drop the references :meth:`pin` added."""
        touched = False
        for seq in seqs:
            entry = self._entries.get(seq)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] <= 0:
                self._release(seq, entry)
                touched = True
        if touched:
            self._update_watermark()

    def outputs_of(self, seq: int, sources: list[int]) -> None:
        """The record being written as ``seq`` is an output made from ``sources``: it
        stays while any of them does (call from ``tag``, before it is held)."""
        if sources:
            self._sources[seq] = sources

    def _release(self, seq: int, entry: list[int]) -> None:
        del self._entries[seq]
        if self._entries:
            if seq == self._oldest:
                self._oldest = next(iter(self._entries))
                self._oldest_since = self._now()
            elif seq > self._oldest and self._now() - self._oldest_since > _HELD_BACK:
                # Settled above the checkpoint, which an older entry has held back for
                # a while (a backend down, an output awaited): a restart would replay
                # this one, so it gets a mark: done, outputs included.
                self._mark(_SETTLED, seq)
        seg = self._segments.get(entry[1])
        if seg is not None:
            seg.unsettled -= 1
            if seg.unsettled <= 0:
                self._maybe_delete(entry[1])
        if self._dependents:
            outputs = self._dependents.pop(seq, None)
            if outputs:
                self.unpin(outputs)

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    def _mark(self, exporter: int, seq: int) -> None:
        if not self._marks and self._loop is not None:
            self._loop.call_soon(self._write_marks)
        self._marks.setdefault(exporter, []).append(seq)

    def _write_marks(self) -> None:
        """Log the delivery marks gathered in this loop round as one record.  Not waited
        for: a lost mark costs a duplicate at the next start, nothing more."""
        marks, self._marks = self._marks, {}
        still: dict[str, list[int]] = {}
        for exporter, seqs in marks.items():
            if exporter == _SETTLED:
                still[SETTLED_MARK] = seqs
            elif seqs and exporter < len(self._exporters):
                still[self._exporters[exporter]] = seqs
        if not still or self._closed:
            return
        try:
            done = self.append(
                encode_marks(still), tag=_no_groups, admit=_nothing, kind=KIND_DELIVERED
            )
        except StorageError:
            return
        done.add_done_callback(_ignore_failure)

    def _update_watermark(self) -> None:
        mark = next(iter(self._entries), self._horizon)
        floor = self._replay_floor
        self._watermark = mark if floor is None else min(mark, floor)

    def _maybe_delete(self, first: int) -> None:
        seg = self._segments.get(first)
        if seg is None or seg.unsettled > 0:
            return
        if seg.open:
            # The active segment: closed early only when space is needed, and only when
            # nothing is being written into it.
            if first != self._active or self._waiting or not self.full():
                return
            self._active = None
        del self._segments[first]
        self._disk_bytes -= seg.size
        self._ops.put(("delete", first))
        self.full()

    # ----------------------------------------------------------------- replay
    async def replay(self) -> AsyncIterator[list[Record]]:
        """What the log held at start, past the checkpoint, in chunks, in order (every
        kind of record).

        Register every yielded entry with :meth:`hold_replayed` before asking for the
        next chunk.  Until the last chunk was asked for, the checkpoint stays at or
        below the first record not registered.
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

    def hold_replayed(self, seq: int, refs: int, sources: list[int] | None = None) -> None:
        """Register a replayed entry with its span groups (``refs``; 0: nothing to
        deliver) and, for an output record, the entries it was made from."""
        if self._replay_segment is None:
            raise RuntimeError("hold_replayed outside replay")
        if sources:
            self._sources[seq] = sources
        if self._replay_floor is not None and seq >= self._replay_floor:
            self._replay_floor = seq + 1
        self._hold(seq, self._replay_segment, refs)

    def replayed_marks(self, payload: bytes) -> None:
        """A replayed ``KIND_DELIVERED`` record: those exporters no longer hold those
        entries, and :attr:`delivered` tells the pipeline not to send them again."""
        numbers = {name: i for i, name in enumerate(self._exporters)}
        everyone = set(range(len(self._exporters)))
        touched = False
        for name, seqs in decode_marks(payload).items():
            if name == SETTLED_MARK:
                for seq in seqs:
                    self.settled.add(seq)
                    self.delivered[seq] = everyone
                    entry = self._entries.get(seq)
                    if entry is not None:
                        self._release(seq, entry)
                        touched = True
                continue
            exporter = numbers.get(name)
            if exporter is None:
                continue  # an exporter no longer configured
            slot = 2 + exporter
            for seq in seqs:
                self.delivered.setdefault(seq, set()).add(exporter)
                entry = self._entries.get(seq)
                if entry is None or entry[slot] <= 0:
                    continue
                entry[0] -= entry[slot]
                entry[slot] = 0
                if entry[0] <= 0:
                    self._release(seq, entry)
                    touched = True
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
