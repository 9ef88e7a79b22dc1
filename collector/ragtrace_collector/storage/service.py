"""The ``storage`` component: the write-ahead log as the pipeline sees it.

* **Append before acknowledging.**  :meth:`Storage.append` queues a request for the
  writer thread and returns a future the receiver awaits.  The writer takes every
  request waiting, writes them, and syncs once (``fsync: batch``, group commit), or
  once per request (``always``), or leaves it to the OS (``never``); then, on the
  event loop, each entry is counted in the ledger and handed to the assembler, and
  the receivers' futures resolve.  No file I/O runs on the event loop.
* **Settle, then truncate.**  Each entry has a count of references: one per span group
  (spans of one trace from one request) per exporter.  Every exporter reports the
  groups it is done with (delivered, or given up for good) through
  :meth:`Storage.settle`; an entry whose count reaches zero is settled.  A segment
  whose entries are all settled is deleted (the active one is closed first, when the
  log is full).  A checkpoint (the lowest unsettled sequence number) is written about
  twice a second, so a restart replays little that was already delivered.
* **Replay.**  :meth:`Storage.replay` yields what is on disk at start, past the
  checkpoint; the pipeline feeds it to the assembler and registers each entry with
  :meth:`Storage.hold_replayed`.
* **Limits.**  :meth:`Storage.full`: the segments on disk plus the requests being
  written reach ``max_size``; the pipeline then refuses requests (429 /
  RESOURCE_EXHAUSTED with a retry delay) and the status is ``recoverable_error`` until
  space is freed.  A write error fails the waiting requests (the clients retry) and
  sets ``permanent_error`` until a write succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from google.protobuf.message import Message

from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.service.component import Component, Status
from ragtrace_collector.service.logs import get_logger
from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.storage.wal import StorageError, WriteAheadLog

__all__ = ["Storage", "segment_size_for"]

#: Replay hands the pipeline records in chunks of about this many payload bytes.
_REPLAY_CHUNK_BYTES: Final = 4 * 1024 * 1024
#: The writer takes at most this many payload bytes into one group commit.
_GROUP_BYTES: Final = 16 * 1024 * 1024
_CHECKPOINT_EVERY: Final = 0.5

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


class Storage(Component):
    """The write-ahead log of accepted requests (see the module docstring)."""

    component_name = "storage"

    def __init__(self, config: StorageConfig) -> None:
        if config.directory is None:
            raise ValueError("storage.directory is not set")
        self._config = config
        self._max_size = config.max_size
        self._wal = WriteAheadLog(
            config.directory, segment_size=segment_size_for(config.max_size), fsync=config.fsync
        )
        self._log = get_logger("storage")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ops: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._next_seq = 1
        self._waiting: dict[int, _Append] = {}
        self._pending_bytes = 0
        #: seq -> [references left, segment first seq]; insertion (= seq) order.
        self._entries: dict[int, list[int]] = {}
        self._segments: dict[int, _Seg] = {}
        self._active: int | None = None
        self._disk_bytes = 0
        self._horizon = 1
        #: Lowest unsettled sequence number; read by the writer thread for checkpoints.
        self._watermark = 0
        self._replay_segment: int | None = None
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
        self._thread = threading.Thread(target=self._writer, name="storage-writer", daemon=True)
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
        self._closed = True
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
        self, payload: Payload, *, tag: Callable[[int], int], admit: Callable[[], None]
    ) -> asyncio.Future[None]:
        """Write one request; the future resolves once it is durable (or fails with
        :class:`StorageError`).

        On the event loop, right after the write: ``tag(seq)`` marks the request's span
        groups with the entry's sequence number and returns its reference count, then
        ``admit()`` hands the request on.  Both run even if the waiter is cancelled.
        """
        if self._loop is None or self._closed:
            raise StorageError("storage is not open")
        seq = self._next_seq
        self._next_seq += 1
        size = len(payload) if isinstance(payload, bytes) else payload.ByteSize()
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiting[seq] = _Append(seq, payload, size, tag, admit, future)
        self._pending_bytes += size
        self._ops.put(("append", (seq, payload, size)))
        return future

    def _committed(self, placed: list[tuple[int, int, int]]) -> None:
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
        if self.status is Status.PERMANENT_ERROR:
            self.report_ok()
        self.full()

    def _failed(self, seqs: list[int], error: str) -> None:
        for seq in seqs:
            item = self._waiting.pop(seq, None)
            if item is None:
                continue
            self._pending_bytes -= item.size
            if not item.future.done():
                item.future.set_exception(StorageError(error))
        self.report(Status.PERMANENT_ERROR, error)

    def _new_active(self, first: int) -> None:
        previous = self._active
        self._active = first
        self._segments.setdefault(first, _Seg(0, 0, True))
        if previous is not None and previous in self._segments:
            self._segments[previous].open = False
            self._maybe_delete(previous)

    # ----------------------------------------------------------------- ledger
    def _hold(self, seq: int, segment_first: int, refs: int) -> None:
        if seq >= self._horizon:
            self._horizon = seq + 1
        if refs > 0:
            self._entries[seq] = [refs, segment_first]
            self._segments[segment_first].unsettled += 1
        self._update_watermark()

    def settle(self, groups: Iterable[SpanGroup]) -> None:
        """One exporter is done with these groups (delivered or given up for good)."""
        touched = False
        for group in groups:
            seq = group.wal_seq
            if seq < 0:
                continue
            entry = self._entries.get(seq)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] <= 0:
                del self._entries[seq]
                touched = True
                seg = self._segments.get(entry[1])
                if seg is not None:
                    seg.unsettled -= 1
                    if seg.unsettled <= 0:
                        self._maybe_delete(entry[1])
        if touched:
            self._update_watermark()

    def _update_watermark(self) -> None:
        self._watermark = next(iter(self._entries), self._horizon)

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
    async def replay(self) -> AsyncIterator[list[tuple[int, bytes]]]:
        """What the log held at start, past the checkpoint, in chunks, in order.

        Register every yielded entry with :meth:`hold_replayed` before asking for the
        next chunk.
        """
        recovered = [s for s in self._wal.segments if s.first_seq != self._wal.active_first_seq]
        checkpoint = self._wal.checkpoint
        for segment in recovered:
            self._replay_segment = segment.first_seq
            reader = iter(self._wal.records(segment, tail=segment is recovered[-1]))
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

    def hold_replayed(self, seq: int, refs: int) -> None:
        """Register a replayed entry with its reference count (0: nothing to deliver)."""
        if self._replay_segment is None:
            raise RuntimeError("hold_replayed outside replay")
        self._hold(seq, self._replay_segment, refs)

    # ----------------------------------------------------------------- writer
    def _writer(self) -> None:
        loop = self._loop
        assert loop is not None
        last_checkpoint = self._wal.checkpoint
        checkpoint_at = time.monotonic()
        stop = False
        while not stop:
            try:
                ops = [self._ops.get(timeout=_CHECKPOINT_EVERY)]
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
            batch: list[tuple[int, Payload]] = []
            for kind, arg in ops:
                if kind == "append":
                    batch.append((arg[0], arg[1]))
                    continue
                self._write_batch(loop, batch)
                batch = []
                if kind == "delete":
                    self._delete(loop, arg)
                elif kind == "stop":
                    stop = True
            self._write_batch(loop, batch)
            watermark = self._watermark
            now = time.monotonic()
            if watermark != last_checkpoint and (stop or now - checkpoint_at >= _CHECKPOINT_EVERY):
                try:
                    self._wal.write_checkpoint(watermark)
                    last_checkpoint = watermark
                except OSError as exc:
                    self._log.warning("wal_checkpoint_failed", error=str(exc))
                checkpoint_at = now

    def _write_batch(
        self, loop: asyncio.AbstractEventLoop, batch: list[tuple[int, Payload]]
    ) -> None:
        if not batch:
            return
        try:
            records = [
                (seq, p if isinstance(p, bytes) else p.SerializeToString()) for seq, p in batch
            ]
            placed = self._wal.append(records)
        except Exception as exc:
            error = str(exc) if isinstance(exc, StorageError) else f"{type(exc).__name__}: {exc}"
            self._log.error("wal_write_failed", error=error, requests=len(batch))
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(self._failed, [seq for seq, _ in batch], error)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._committed, placed)

    def _delete(self, loop: asyncio.AbstractEventLoop, first: int) -> None:
        try:
            if first == self._wal.active_first_seq:
                self._wal.seal()
            self._wal.delete(first)
        except OSError as exc:
            self._log.warning("wal_delete_failed", segment=first, error=str(exc))


def _read_chunk(reader: Any, checkpoint: int) -> list[tuple[int, bytes]] | None:
    """The next records of a segment, up to about a chunk; None at its end."""
    chunk: list[tuple[int, bytes]] = []
    size = 0
    for seq, payload in reader:
        if seq < checkpoint:
            continue
        chunk.append((seq, payload))
        size += len(payload)
        if size >= _REPLAY_CHUNK_BYTES:
            return chunk
    return chunk or None
