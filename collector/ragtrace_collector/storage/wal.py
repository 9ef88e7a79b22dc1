"""The write-ahead log on disk: segment files of checksummed records, a lock, a checkpoint.

Layout of ``storage.directory``:

* ``lock``: held with ``flock`` by the one process that uses the directory; a second
  process fails to start with :class:`StorageLocked` (the file names the holder's pid);
* ``<first seq, 20 digits>.wal``: segment files.  Each starts with an 8-byte magic and
  holds records, each a 16-byte header (payload length u32, CRC32 u32, sequence
  number u64, little-endian) and the payload: one OTLP ``ExportTraceServiceRequest``
  in binary protobuf.  The CRC covers the sequence number and the payload.  A new
  segment starts when the current one would pass ``segment_size``, and at every open;
* ``checkpoint``: every record below this sequence number is settled (a hint that
  avoids replaying what was delivered; losing it only costs duplicates).

A record that a crash left half-written at the end of the last segment fails its
length or checksum test: it is skipped with a ``wal_torn_tail`` log line and the file
is truncated before it.  A bad record elsewhere (``wal_corrupt_record``) ends the
reading of its segment; the other segments are still read.

Everything here is synchronous file I/O, used from one thread at a time (the storage
writer thread, or a worker thread at startup); :mod:`.service` keeps it off the event
loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Literal

from ragtrace_collector.service.lazylog import LazyLogger

__all__ = ["Segment", "StorageError", "StorageLocked", "WriteAheadLog", "directory_problem"]

FsyncPolicy = Literal["never", "batch", "always"]

_MAGIC: Final = b"RTWAL01\n"
_HEADER: Final = struct.Struct("<IIQ")
_SEQ: Final = struct.Struct("<Q")
_CHECKPOINT: Final = struct.Struct("<QI")
_SUFFIX: Final = ".wal"
_LOCK_NAME: Final = "lock"
_MAX_PAYLOAD: Final = 0xFFFF_FFFF


class StorageError(Exception):
    """The write-ahead log cannot be used (directory, permissions, disk)."""


class StorageLocked(StorageError):
    """Another process holds the directory."""


@dataclass(slots=True)
class Segment:
    """One segment file: the sequence number of its first record and its size."""

    first_seq: int
    path: Path
    size: int


def _crc(seq: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq)))


class WriteAheadLog:
    """The files of one WAL directory (see the module docstring)."""

    def __init__(self, directory: Path, *, segment_size: int, fsync: FsyncPolicy) -> None:
        self.directory = directory
        self._segment_size = segment_size
        self._fsync = fsync
        self._log = LazyLogger("storage")
        self._lock_fh: IO[str] | None = None
        self._active: IO[bytes] | None = None
        self._active_segment: Segment | None = None
        #: Segments on disk in order, the active one last; set by :meth:`open`.
        self.segments: list[Segment] = []
        #: The next sequence number to write; set by :meth:`open`.
        self.next_seq = 1
        #: Every record below this was settled before the last stop or crash.
        self.checkpoint = 0
        #: Records skipped as torn or corrupt while reading.
        self.skipped_records = 0

    # ------------------------------------------------------------------- open
    def open(self) -> None:
        """Create and lock the directory, list segments, recover the torn tail."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock = open(self.directory / _LOCK_NAME, "a+")  # noqa: SIM115 (held until close)
        except OSError as exc:
            raise StorageError(f"cannot use storage.directory {self.directory}: {exc}") from None
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise StorageLocked(
                f"storage.directory {self.directory} is in use by another collector "
                f"(pid {holder}); give each collector its own directory"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        self._lock_fh = lock
        self.checkpoint = self._read_checkpoint()
        self.segments = self._list_segments()
        next_seq = max(self.checkpoint, 1)
        if self.segments:
            last = self.segments[-1]
            next_seq = max(next_seq, last.first_seq)
            for seq, _ in self.records(last, tail=True):
                next_seq = max(next_seq, seq + 1)
        self.next_seq = next_seq

    def close(self) -> None:
        self._close_active()
        if self._lock_fh is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def _list_segments(self) -> list[Segment]:
        found: list[Segment] = []
        for path in self.directory.iterdir():
            if path.suffix != _SUFFIX or not path.stem.isdigit():
                continue
            found.append(Segment(int(path.stem), path, path.stat().st_size))
        found.sort(key=lambda s: s.first_seq)
        return found

    # ------------------------------------------------------------------- read
    def records(self, segment: Segment, *, tail: bool = False) -> Iterator[tuple[int, bytes]]:
        """The valid records of ``segment`` in order.  ``tail``: it is the last segment,
        so a bad record at its end is a torn write, cut off the file."""
        try:
            data = segment.path.read_bytes()
        except FileNotFoundError:
            return
        if not data.startswith(_MAGIC):
            if len(data) < len(_MAGIC) and _MAGIC.startswith(data):
                return  # created, then the process died before writing the magic
            self._log.error(
                "wal_corrupt_record", segment=segment.path.name, offset=0, detail="bad magic"
            )
            self.skipped_records += 1
            return
        offset = len(_MAGIC)
        end = len(data)
        while offset < end:
            problem = ""
            if end - offset < _HEADER.size:
                problem = "incomplete header"
            else:
                length, crc, seq = _HEADER.unpack_from(data, offset)
                body_at = offset + _HEADER.size
                if body_at + length > end:
                    problem = "incomplete payload"
                else:
                    payload = data[body_at : body_at + length]
                    if _crc(seq, payload) != crc:
                        problem = "checksum mismatch"
            if problem:
                self.skipped_records += 1
                if tail:
                    self._log.warning(
                        "wal_torn_tail",
                        segment=segment.path.name,
                        offset=offset,
                        bytes_skipped=end - offset,
                        detail=f"{problem}: a write cut short by a crash; the rest is replayed",
                    )
                    with open(segment.path, "r+b") as fh:
                        fh.truncate(offset)
                    segment.size = offset
                else:
                    self._log.error(
                        "wal_corrupt_record",
                        segment=segment.path.name,
                        offset=offset,
                        bytes_skipped=end - offset,
                        detail=f"{problem}: the rest of this segment is skipped",
                    )
                return
            yield seq, payload
            offset = body_at + length

    # ------------------------------------------------------------------ write
    def append(self, records: list[tuple[int, bytes]]) -> list[tuple[int, int, int]]:
        """Write records (sequence number, payload) in order; durable per the fsync policy
        when this returns.  Returns (seq, segment first seq, bytes on disk) per record.

        On an error, what this call wrote is cut off again and the segment is closed, so
        no half-written record sits in front of later ones.
        """
        placed: list[tuple[int, int, int]] = []
        fh: IO[bytes] | None = None
        start = 0
        try:
            for seq, payload in records:
                if len(payload) > _MAX_PAYLOAD:
                    raise StorageError(f"a request of {len(payload)} bytes is too large")
                size = _HEADER.size + len(payload)
                segment = self._active_segment
                if segment is None or (
                    segment.size + size > self._segment_size and segment.size > len(_MAGIC)
                ):
                    if fh is not None:
                        self._sync(fh)
                    fh = self._rotate(seq)
                    segment = self._active_segment
                    assert segment is not None
                    start = segment.size
                elif fh is None:
                    fh = self._active
                    assert fh is not None
                    start = segment.size
                fh.write(_HEADER.pack(len(payload), _crc(seq, payload), seq))
                fh.write(payload)
                segment.size += size
                if self._fsync == "always":
                    self._sync(fh)
                placed.append((seq, segment.first_seq, size))
            if fh is not None and self._fsync != "always":
                self._sync(fh)
        except (OSError, StorageError) as exc:
            self._abort(start)
            if isinstance(exc, StorageError):
                raise
            raise StorageError(f"cannot write to {self.directory}: {exc}") from None
        return placed

    def _sync(self, fh: IO[bytes]) -> None:
        fh.flush()
        if self._fsync != "never":
            os.fdatasync(fh.fileno())

    def _rotate(self, first_seq: int) -> IO[bytes]:
        self._close_active()
        path = self.directory / f"{first_seq:020d}{_SUFFIX}"
        fh = open(path, "wb")  # noqa: SIM115 (the active segment stays open)
        fh.write(_MAGIC)
        segment = Segment(first_seq, path, len(_MAGIC))
        self._active, self._active_segment = fh, segment
        # An empty segment left by a crash may carry the same name: it is replaced.
        self.segments = [s for s in self.segments if s.first_seq != first_seq]
        self.segments.append(segment)
        if self._fsync != "never":
            with contextlib.suppress(OSError):
                fd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        return fh

    def _abort(self, start: int) -> None:
        segment, fh = self._active_segment, self._active
        if segment is not None and fh is not None:
            with contextlib.suppress(OSError):
                fh.flush()
            with contextlib.suppress(OSError):
                fh.truncate(start)
                segment.size = start
        self._close_active()

    def _close_active(self) -> None:
        if self._active is not None:
            with contextlib.suppress(OSError):
                self._active.close()
        self._active = None
        self._active_segment = None

    # ----------------------------------------------------------------- delete
    @property
    def active_first_seq(self) -> int | None:
        segment = self._active_segment
        return segment.first_seq if segment is not None else None

    def delete(self, first_seq: int) -> int:
        """Remove a settled segment (never the active one); returns the bytes freed."""
        if first_seq == self.active_first_seq:
            return 0
        for i, segment in enumerate(self.segments):
            if segment.first_seq == first_seq:
                del self.segments[i]
                segment.path.unlink(missing_ok=True)
                return segment.size
        return 0

    def seal(self) -> None:
        """Close the active segment so that it can be deleted once settled."""
        self._close_active()

    # ------------------------------------------------------------- checkpoint
    def _read_checkpoint(self) -> int:
        path = self.directory / "checkpoint"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return 0
        if len(data) == _CHECKPOINT.size:
            seq, crc = _CHECKPOINT.unpack(data)
            if zlib.crc32(_SEQ.pack(seq)) == crc:
                return int(seq)
        self._log.warning("wal_checkpoint_ignored", detail="unreadable; everything is replayed")
        return 0

    def write_checkpoint(self, seq: int) -> None:
        path = self.directory / "checkpoint"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(_CHECKPOINT.pack(seq, zlib.crc32(_SEQ.pack(seq))))
        os.replace(tmp, path)
        self.checkpoint = seq


def directory_problem(directory: Path) -> str | None:
    """Why :meth:`WriteAheadLog.open` would refuse ``directory``, checked without
    creating or locking anything (for ``check-config``); None when it would open."""
    existing = directory
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        verb = "write to" if existing == directory else "create"
        return f"cannot {verb} {directory}: {existing} is not writable"
    lock_path = directory / _LOCK_NAME
    if existing != directory or not lock_path.exists():
        return None
    try:
        with open(lock_path) as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                holder = lock.read().strip() or "unknown"
                return f"{directory} is in use by another collector (pid {holder})"
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    except OSError as exc:
        return f"cannot read {lock_path}: {exc}"
    return None
