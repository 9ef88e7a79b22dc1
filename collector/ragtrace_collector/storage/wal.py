"""The write-ahead log on disk: segment files of checksummed records, a lock, a checkpoint.

Layout of ``storage.directory``:

* ``lock``: held with ``flock`` by the one process that uses the directory; a second
  process fails to start with :class:`StorageLocked` (the file names the holder's pid);
* ``<first seq, 20 digits>.wal``: segment files.  Each starts with a 48-byte segment
  header: the 8-byte magic ``RTWAL03\n``, then twice the segment's key (16 random bytes,
  new for every segment, never sent anywhere) followed by its CRC32.  Then records.  A
  record is a 32-byte header and its payload:

  ====== ===== ============================================================
  bytes  type  field
  ====== ===== ============================================================
  0-3    4s    marker ``a7 5e d1 0c``: where a reader resynchronises
  4      u8    kind (:data:`KIND_REQUEST`: one OTLP ``ExportTraceServiceRequest``
               in binary protobuf; other kinds are stored and returned as they are)
  5      u8    flags (0)
  6-7    u16   reserved (0)
  8-11   u32   payload length
  12-19  u64   sequence number
  20-23  u32   CRC32 of the payload
  24-31  8s    tag of bytes 0-23: BLAKE2b (8-byte digest) keyed with the segment's key
  ====== ===== ============================================================

  little-endian.  A new segment starts when the current one would pass
  ``segment_size``, and at every open: a segment written by an earlier process is
  never appended to;
* ``checkpoint``: every record below this sequence number is settled (a hint that
  avoids replaying what was delivered; losing it only costs duplicates).

Reading tells damage from a torn tail.  A record whose header checks but whose payload
does not is skipped alone (its length is known).  A record whose header does not check
is skipped up to the next marker that starts a valid record.  Either is logged as
``wal_corrupt_record`` with the segment and offset and counted; the records after it
are read.  Only a bad region that runs to the end of the newest segment, starting
with an incomplete record (a header cut short, or a payload longer than the file), is
a torn tail: a write a crash cut short, never acknowledged.  It is logged as
``wal_torn_tail``, counted, and cut off the file.  Nothing valid is ever truncated.

Payloads are client bytes, so a payload can hold the image of a complete record (a
"settled" mark, any sequence number).  Resynchronising searches payload bytes, so a
header found there must prove that this process wrote it: its tag needs the segment's
key, which clients cannot know.  A forged image fails the tag (odds 2^-64 per image)
and is skipped with the damaged region.  A damaged key is recovered from its second
copy; a segment whose two copies are both damaged cannot be checked and is skipped
whole (logged and counted).

Segments of the previous formats are still read, so an upgrade loses nothing.
``RTWAL02\n`` (28-byte headers checked by a plain CRC32) is read record after record;
since a client could forge such a record, a header that does not check there is not
resynchronised from: the rest of its segment is skipped (logged and counted).
``RTWAL01\n`` (16-byte headers without marker) cannot resynchronise either.  New
records are always written in the current format.

A failed write (``ENOSPC``, a short write, an I/O error) is cut back to where the call
started, in the same segment, which stays the active one: no partial record is left
behind and no new segment is opened.  All writes go through :class:`FileOps`, the
injection point of the tests (:mod:`.fileops`, shared with the file exporter).

Everything here is synchronous file I/O, used from one thread at a time (the storage
writer thread, or a worker thread at startup); :mod:`.service` keeps it off the event
loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, NamedTuple

from ragtrace_collector.component.lazylog import LazyLogger
from ragtrace_collector.storage.fileops import (
    FileOps,
    FsyncPolicy,
    sync_directory,
    write_all,
    writev_all,
)

__all__ = [
    "KIND_REQUEST",
    "SEGMENT_HEADER_SIZE",
    "FileOps",
    "Placed",
    "Record",
    "Segment",
    "StorageError",
    "StorageLocked",
    "WriteAheadLog",
    "directory_problem",
]

#: A record holding one OTLP ``ExportTraceServiceRequest`` (binary protobuf).
KIND_REQUEST: Final = 1

_MAGIC: Final = b"RTWAL03\n"
_MAGIC_V2: Final = b"RTWAL02\n"
_MAGIC_V1: Final = b"RTWAL01\n"
_MARK: Final = b"\xa7\x5e\xd1\x0c"
_HEAD: Final = struct.Struct("<4sBBHIQI")  # marker, kind, flags, reserved, length, seq, pcrc
_HCRC: Final = struct.Struct("<I")
_KEY_SIZE: Final = 16
_KEY_COPY: Final = _KEY_SIZE + _HCRC.size  # a key and its CRC32
_TAG_SIZE: Final = 8
#: A segment holding nothing but its header (magic, two copies of the key).
SEGMENT_HEADER_SIZE: Final = len(_MAGIC) + 2 * _KEY_COPY
HEADER_SIZE: Final = _HEAD.size + _TAG_SIZE
_V1_HEADER: Final = struct.Struct("<IIQ")  # length, crc (seq + payload), seq
_SEQ: Final = struct.Struct("<Q")
_CHECKPOINT: Final = struct.Struct("<QI")
_SUFFIX: Final = ".wal"
_LOCK_NAME: Final = "lock"
_PROBE_NAME: Final = "probe.tmp"
_MAX_PAYLOAD: Final = 0xFFFF_FFFF
_TORN: Final = frozenset({"incomplete header", "incomplete payload"})
_TORN_DETAIL: Final = "a write cut short by a crash (never acknowledged); cut off"


class StorageError(Exception):
    """The write-ahead log cannot be used (directory, permissions, disk).

    From :meth:`WriteAheadLog.append`: ``placed`` lists the records of the call that
    were written and synced before the failure (the rest were cut back)."""

    def __init__(self, message: str, placed: list[Placed] | None = None) -> None:
        super().__init__(message)
        self.placed: list[Placed] = placed or []


class StorageLocked(StorageError):
    """Another process holds the directory."""


class AppendTimeout(StorageError):
    """A write did not complete within the append timeout.  It may still complete: the
    request is answered as refused (the client retries), but the record can land."""


class Record(NamedTuple):
    """One record read back: its sequence number, kind and payload."""

    seq: int
    kind: int
    payload: bytes


class Placed(NamedTuple):
    """Where :meth:`WriteAheadLog.append` put a record: seq, segment, bytes on disk."""

    seq: int
    segment: int
    size: int


@dataclass(slots=True)
class Segment:
    """One segment file: the sequence number of its first record and its size."""

    first_seq: int
    path: Path
    size: int
    #: Set once a reader has logged and counted this segment's bad records.
    reported: bool = field(default=False, compare=False)


def _crc(seq: int, payload: bytes) -> int:
    """The previous format's checksum (sequence number, then payload)."""
    return zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq)))


class _Layout(NamedTuple):
    """How the records of one segment are checked: the record header's size, the check
    of its first 24 bytes, and whether a reader may resynchronise after a bad header
    (only where client bytes cannot pass the check)."""

    header_size: int
    check: Callable[[bytes], bytes]
    resync: bool


def _crc_check(head: bytes) -> bytes:
    return _HCRC.pack(zlib.crc32(head))


#: The previous format: a plain CRC32, which a client can compute.
_V2: Final = _Layout(_HEAD.size + _HCRC.size, _crc_check, resync=False)


def _keyed(key: bytes) -> _Layout:
    """The current format, for a segment whose key is ``key``."""

    def check(head: bytes) -> bytes:
        return hashlib.blake2b(head, digest_size=_TAG_SIZE, key=key).digest()

    return _Layout(HEADER_SIZE, check, resync=True)


def _segment_header(key: bytes) -> bytes:
    copy = key + _HCRC.pack(zlib.crc32(key))
    return _MAGIC + copy + copy


def _segment_key(data: bytes) -> bytes | None:
    """The key of a current-format segment from either copy that checks, or None."""
    for at in (len(_MAGIC), len(_MAGIC) + _KEY_COPY):
        key = data[at : at + _KEY_SIZE]
        crc = data[at + _KEY_SIZE : at + _KEY_COPY]
        if len(crc) == _HCRC.size and _HCRC.pack(zlib.crc32(key)) == crc:
            return key
    return None


def _header(layout: _Layout, seq: int, kind: int, payload: bytes) -> bytes:
    head = _HEAD.pack(_MARK, kind, 0, 0, len(payload), seq, zlib.crc32(payload))
    return head + layout.check(head)


def _parse(data: bytes, offset: int, layout: _Layout) -> tuple[Record | None, int, str]:
    """The record at ``offset``: (record, next offset, "") or (None, next, problem);
    ``next`` is known only when the header checked (else it is ``offset + 1``)."""
    end = len(data)
    size = layout.header_size
    if end - offset < size:
        return None, offset + 1, "incomplete header"
    mark, kind, _flags, _reserved, length, seq, pcrc = _HEAD.unpack_from(data, offset)
    if mark != _MARK:
        return None, offset + 1, "no record marker"
    check = data[offset + _HEAD.size : offset + size]
    if layout.check(data[offset : offset + _HEAD.size]) != check:
        return None, offset + 1, "header checksum mismatch"
    body = offset + size
    if body + length > end:
        return None, offset + 1, "incomplete payload"
    payload = data[body : body + length]
    if zlib.crc32(payload) != pcrc:
        return None, body + length, "payload checksum mismatch"
    return Record(seq, kind, payload), body + length, ""


def _resync(data: bytes, start: int, layout: _Layout) -> int | None:
    """The offset of the next valid record at or after ``start``, or None."""
    at = data.find(_MARK, start)
    while at != -1:
        if _parse(data, at, layout)[0] is not None:
            return at
        at = data.find(_MARK, at + 1)
    return None


class WriteAheadLog:
    """The files of one WAL directory (see the module docstring).

    ``on_skipped(reason)`` is called for every record skipped while reading
    (``corrupt`` or ``torn_tail``), from the reading thread."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_size: int,
        fsync: FsyncPolicy,
        file_ops: FileOps | None = None,
        on_skipped: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = directory
        self._segment_size = segment_size
        self._fsync = fsync
        self.file_ops = file_ops if file_ops is not None else FileOps()
        self._on_skipped = on_skipped
        self._log = LazyLogger("storage")
        self._lock_fh: IO[str] | None = None
        self._fd: int | None = None
        self._active_segment: Segment | None = None
        self._layout: _Layout | None = None  # the active segment's
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
        (self.directory / _PROBE_NAME).unlink(missing_ok=True)
        self.checkpoint = self._read_checkpoint()
        self.segments = self._list_segments()
        next_seq = max(self.checkpoint, 1)
        if self.segments:
            last = self.segments[-1]
            next_seq = max(next_seq, last.first_seq)
            for record in self.records(last):
                next_seq = max(next_seq, record.seq + 1)
            if last.first_seq >= next_seq and last.size <= SEGMENT_HEADER_SIZE:
                # Created just before a crash (its header only, once a torn record is
                # cut off): the first write creates it again under the same name, so it
                # is removed now, not taken for an older segment to replay and delete.
                self.segments.pop()
                last.path.unlink(missing_ok=True)
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
    def records(self, segment: Segment) -> Iterator[Record]:
        """The valid records of ``segment`` in order, skipping (and, the first time a
        segment is read, logging and counting) damaged ones; the torn tail of the
        newest segment is cut off the file."""
        try:
            data = segment.path.read_bytes()
        except FileNotFoundError:
            return
        report = not segment.reported
        segment.reported = True
        newest = bool(self.segments) and segment is self.segments[-1]
        if data.startswith(_MAGIC_V1):
            yield from self._records_v1(segment, data, report=report, newest=newest)
            return
        end = len(data)
        if data.startswith(_MAGIC_V2):
            layout, offset = _V2, len(_MAGIC_V2)
        else:
            if end < SEGMENT_HEADER_SIZE and (_MAGIC.startswith(data) or data.startswith(_MAGIC)):
                return  # created, then the process died before its header was written
            if report and not data.startswith(_MAGIC):
                self._log.error(
                    "wal_corrupt_record",
                    segment=segment.path.name,
                    offset=0,
                    detail="bad segment magic; read as the current format",
                )
            key = _segment_key(data)
            if key is None:
                if report:
                    self._skipped(
                        segment,
                        0,
                        end,
                        torn=False,
                        detail="both copies of the segment key are damaged: its records "
                        "cannot be checked, the whole segment is skipped",
                    )
                return
            layout, offset = _keyed(key), SEGMENT_HEADER_SIZE
        while offset < end:
            record, after, problem = _parse(data, offset, layout)
            if record is not None:
                yield record
                offset = after
                continue
            if problem == "payload checksum mismatch":
                resume: int | None = after
            elif layout.resync:
                resume = _resync(data, after, layout)
            else:
                resume = None
            if resume is None and newest and problem in _TORN:
                if report:
                    self._skipped(
                        segment, offset, end, torn=True, detail=f"{problem}: {_TORN_DETAIL}"
                    )
                    with open(segment.path, "r+b") as fh:
                        fh.truncate(offset)
                    segment.size = offset
                return
            if report:
                stop = end if resume is None else resume
                then = (
                    "this record is skipped, the records after it are read"
                    if layout.resync or resume is not None
                    else "in a segment of the previous format (RTWAL02), where a client's "
                    "bytes could pass for a record, reading does not resynchronise: the "
                    "rest of this segment is skipped"
                )
                self._skipped(segment, offset, stop, torn=False, detail=f"{problem}: {then}")
            if resume is None:
                return
            offset = resume

    def _records_v1(
        self, segment: Segment, data: bytes, *, report: bool, newest: bool
    ) -> Iterator[Record]:
        """A segment of the previous format: no marker, so a bad record ends it."""
        offset, end = len(_MAGIC_V1), len(data)
        while offset < end:
            problem = ""
            if end - offset < _V1_HEADER.size:
                problem = "incomplete header"
            else:
                length, crc, seq = _V1_HEADER.unpack_from(data, offset)
                body = offset + _V1_HEADER.size
                if body + length > end:
                    problem = "incomplete payload"
                else:
                    payload = data[body : body + length]
                    if _crc(seq, payload) != crc:
                        problem = "checksum mismatch"
            if problem:
                if report:
                    self._skipped(
                        segment,
                        offset,
                        end,
                        torn=newest and problem in _TORN,
                        detail=f"{problem} in a segment of the previous format (RTWAL01), "
                        "which cannot resynchronise: the rest of this segment is skipped",
                    )
                return
            yield Record(seq, KIND_REQUEST, payload)
            offset = body + length

    def _skipped(
        self, segment: Segment, offset: int, stop: int, *, torn: bool, detail: str
    ) -> None:
        """Count and log one skipped record (bytes ``offset`` to ``stop``)."""
        self.skipped_records += 1
        if self._on_skipped is not None:
            self._on_skipped("torn_tail" if torn else "corrupt")
        log = self._log.warning if torn else self._log.error
        log(
            "wal_torn_tail" if torn else "wal_corrupt_record",
            segment=segment.path.name,
            offset=offset,
            bytes_skipped=stop - offset,
            detail=detail,
        )

    # ------------------------------------------------------------------ write
    def append(self, records: Sequence[tuple[int, bytes, int]]) -> list[Placed]:
        """Write records (sequence number, payload, kind) in order; durable per the
        fsync policy when this returns.  Returns where each record went.

        On an error, what this call wrote to the active segment since its last sync is
        cut back (the segment stays active), and :class:`StorageError` carries the
        records written and synced before (:attr:`StorageError.placed`).
        """
        placed: list[Placed] = []
        run: list[bytes] = []
        run_placed: list[Placed] = []
        for _, payload, _ in records:
            if len(payload) > _MAX_PAYLOAD:
                raise StorageError(f"a request of {len(payload)} bytes is too large")
        pending = 0  # bytes gathered in `run`, not yet written
        try:
            for seq, payload, kind in records:
                size = HEADER_SIZE + len(payload)
                segment = self._active_segment
                if segment is None or (
                    segment.size + pending + size > self._segment_size
                    and segment.size + pending > SEGMENT_HEADER_SIZE
                ):
                    self._write_run(run, run_placed, placed)
                    self._rotate(seq)
                    segment = self._active_segment
                    assert segment is not None
                    pending = 0
                assert self._layout is not None
                run.append(_header(self._layout, seq, kind, payload))
                run.append(payload)
                run_placed.append(Placed(seq, segment.first_seq, size))
                pending += size
                if self._fsync == "always":
                    self._write_run(run, run_placed, placed)
                    pending = 0
            self._write_run(run, run_placed, placed)
        except OSError as exc:
            raise StorageError(f"cannot write to {self.directory}: {exc}", placed) from None
        return placed

    def _write_run(self, run: list[bytes], run_placed: list[Placed], placed: list[Placed]) -> None:
        """Write and sync the records gathered for the active segment, or cut them back."""
        if not run:
            return
        segment, fd = self._active_segment, self._fd
        assert segment is not None
        assert fd is not None
        start = segment.size
        try:
            segment.size += writev_all(self.file_ops, fd, run)
            self._sync(fd)
        except OSError:
            self._cut_back(start)
            raise
        placed.extend(run_placed)
        run.clear()
        run_placed.clear()

    def _sync(self, fd: int) -> None:
        if self._fsync != "never":
            self.file_ops.fdatasync(fd)

    def _cut_back(self, start: int) -> None:
        """Remove a partial write; if even that fails, retire the segment (the next
        write opens a new one, and a reader skips the partial record)."""
        segment, fd = self._active_segment, self._fd
        assert segment is not None
        assert fd is not None
        try:
            self.file_ops.truncate(fd, start)
            segment.size = start
        except OSError as exc:
            self._log.error(
                "wal_cut_back_failed", segment=segment.path.name, offset=start, error=str(exc)
            )
            self._close_active()

    def _rotate(self, first_seq: int) -> None:
        self._close_active()
        path = self.directory / f"{first_seq:020d}{_SUFFIX}"
        # O_APPEND: after a cut back, the next write lands at the new end of the file.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        key = os.urandom(_KEY_SIZE)
        try:
            write_all(self.file_ops, fd, _segment_header(key))
            if self._fsync != "never":
                self._sync(fd)
                sync_directory(self.file_ops, self.directory)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            self.segments = [s for s in self.segments if s.path != path]
            raise
        segment = Segment(first_seq, path, SEGMENT_HEADER_SIZE, reported=True)
        self._fd, self._active_segment, self._layout = fd, segment, _keyed(key)
        # An empty segment left by a crash may carry the same name: it is replaced.
        self.segments = [s for s in self.segments if s.first_seq != first_seq]
        self.segments.append(segment)

    def _close_active(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._active_segment = None
        self._layout = None

    def probe(self, size: int) -> None:
        """Check that ``size`` bytes can be written and synced now (after a failed
        write): a scratch file, removed again.  Raises :class:`StorageError`."""
        path = self.directory / _PROBE_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(self.file_ops, fd, bytes(size))
                self._sync(fd)
            finally:
                os.close(fd)
                path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot write to {self.directory}: {exc}") from None

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
