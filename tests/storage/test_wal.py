"""The write-ahead log's guarantees, checked at the file and component level.

* recovery tells a torn tail from damage: a flipped byte costs its record only, in any
  segment, and is counted; only the incomplete last record of the newest segment is a
  torn tail; nothing valid is truncated; segments of the previous format are read;
* a failed write (short write then ``ENOSPC``, a failed sync) leaves no partial record
  and opens no new segment, however often it fails; the storage refuses while the disk
  fails and recovers by itself once writes work;
* every fsync policy syncs (or deliberately does not) before a request is acknowledged,
  seen through the log's system-call injection point (:class:`FileOps`);
* the checkpoint never passes a record replay has not handed over;
* an append that does not complete within its bound is a refusal; the writer thread's
  failures reach the component status.

Process-level crash tests (kill -9, a running collector) are in ``test_storage.py``.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

from ragtrace_collector.component import ComponentHost, Status
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.storage import Storage, StorageConfig
from ragtrace_collector.storage.wal import (
    KIND_REQUEST,
    AppendTimeout,
    FileOps,
    StorageError,
    WriteAheadLog,
)

_HEAD = struct.Struct("<4sBBHIQI")  # the documented record header (wal.py docstring)
_HEADER_SIZE = _HEAD.size + 8  # and its keyed tag
_MAGIC_LEN = 8 + 2 * (16 + 4)  # the segment header: magic, key and CRC twice
_SEGMENT = 64 * 1024


def wal_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wal"))


def offsets(path: Path) -> dict[int, int]:
    """seq -> offset of each record of a segment file, read by the documented format."""
    data = path.read_bytes()
    at, out = _MAGIC_LEN, {}
    while at + _HEADER_SIZE <= len(data):
        length, seq = _HEAD.unpack_from(data, at)[4:6]
        out[seq] = at
        at += _HEADER_SIZE + length
    return out


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def written_log(directory: Path, count: int, size: int = 20_000) -> list[Path]:
    """A closed log of ``count`` records (seq 1..count), several segments."""
    log = WriteAheadLog(directory, segment_size=_SEGMENT, fsync="never")
    log.open()
    log.append([(seq, bytes([seq % 251]) * size, KIND_REQUEST) for seq in range(1, count + 1)])
    log.close()
    return wal_files(directory)


def reread(directory: Path) -> tuple[list[int], list[str], WriteAheadLog]:
    """Open the log again: the sequence numbers read, the skip reasons reported."""
    reasons: list[str] = []
    log = WriteAheadLog(directory, segment_size=_SEGMENT, fsync="never", on_skipped=reasons.append)
    log.open()
    seqs = [r.seq for seg in list(log.segments) for r in log.records(seg)]
    log.close()
    return seqs, reasons, log


# ---------------------------------------------------------------- recovery
@pytest.mark.parametrize("where", ["payload", "length", "marker"])
def test_a_flipped_byte_mid_segment_costs_that_record_only(tmp_path: Path, where: str) -> None:
    """A byte flipped in the middle of an older segment and of the newest one: each
    costs its own record, counted as corrupt; every other record is read; no file is
    shortened; the reopened log writes after the last valid sequence number."""
    files = written_log(tmp_path, 12)
    assert len(files) == 4
    older, newest = files[1], files[-1]
    older_seq, newest_seq = sorted(offsets(older))[1], sorted(offsets(newest))[1]
    shift = {"payload": _HEADER_SIZE + 7_000, "length": 8, "marker": 1}[where]
    sizes = {p: p.stat().st_size for p in files}
    flip(older, offsets(older)[older_seq] + shift)
    flip(newest, offsets(newest)[newest_seq] + shift)

    seqs, reasons, log = reread(tmp_path)

    assert seqs == [s for s in range(1, 13) if s not in (older_seq, newest_seq)]
    assert reasons == ["corrupt", "corrupt"]
    assert log.skipped_records == 2
    assert log.next_seq == 13
    assert {p: p.stat().st_size for p in files} == sizes  # nothing truncated


def test_only_the_incomplete_last_record_of_the_newest_segment_is_a_torn_tail(
    tmp_path: Path,
) -> None:
    files = written_log(tmp_path, 12)
    newest, older = files[-1], files[1]
    last_seq = max(offsets(newest))
    torn_at = offsets(newest)[last_seq]
    with open(newest, "r+b") as fh:
        fh.truncate(torn_at + _HEADER_SIZE + 100)  # a write cut short
    older_last = offsets(older)[max(offsets(older))]
    with open(older, "r+b") as fh:  # the same cut in an older segment is damage
        fh.truncate(older_last + _HEADER_SIZE + 100)

    seqs, reasons, _ = reread(tmp_path)

    assert last_seq not in seqs
    assert max(offsets(older)) not in seqs
    assert len(seqs) == 10
    assert sorted(reasons) == ["corrupt", "torn_tail"]
    assert newest.stat().st_size == torn_at  # the torn tail is cut off
    assert older.stat().st_size == older_last + _HEADER_SIZE + 100  # damage is left


@pytest.mark.parametrize("shift", [_HEADER_SIZE + 50, 1])
def test_a_complete_damaged_last_record_is_corrupt_not_torn(tmp_path: Path, shift: int) -> None:
    """The last record of the newest segment is whole but damaged (payload, marker):
    counted as corrupt, and the file is left as it is."""
    files = written_log(tmp_path, 6)
    newest = files[-1]
    last = offsets(newest)[max(offsets(newest))]
    flip(newest, last + shift)
    size = newest.stat().st_size
    seqs, reasons, _ = reread(tmp_path)
    assert seqs == [1, 2, 3, 4, 5]
    assert reasons == ["corrupt"]
    assert newest.stat().st_size == size


def test_segments_of_the_previous_formats_are_still_read(tmp_path: Path) -> None:
    """RTWAL01 segments (16-byte headers, no marker) and RTWAL02 segments (28-byte
    headers checked by a plain CRC32): read, never appended to.  A bad record there is
    counted and ends the reading of its segment: an RTWAL02 reader does not
    resynchronise, since a client can build a record that passes a plain CRC (the
    forged mark inside record 10 is not read).  New records go to a new segment in the
    current format."""
    v1 = struct.Struct("<IIQ")

    def record(seq: int, payload: bytes) -> bytes:
        crc = zlib.crc32(payload, zlib.crc32(struct.pack("<Q", seq)))
        return v1.pack(len(payload), crc, seq) + payload

    body = b"".join(record(seq, b"old %d" % seq * 50) for seq in range(1, 6))
    (tmp_path / f"{1:020d}.wal").write_bytes(b"RTWAL01\n" + body)
    bad = bytearray(b"RTWAL01\n" + record(6, b"x" * 300) + record(7, b"y" * 300))
    bad[8 + v1.size + 10] ^= 0xFF
    (tmp_path / f"{6:020d}.wal").write_bytes(bytes(bad))
    from ragtrace_collector.storage.outputs import KIND_DELIVERED, SETTLED_MARK, encode_marks

    forged = _record_image(20, KIND_DELIVERED, encode_marks({SETTLED_MARK: [1, 2, 3]}))
    v2 = [_record_image(8, KIND_REQUEST, b"v2 8"), _record_image(9, KIND_REQUEST, b"v2 9")]
    v2.append(_record_image(10, KIND_REQUEST, b"pad" + forged + b"pad"))
    v2.append(_record_image(11, KIND_REQUEST, b"v2 11"))
    v2_bytes = bytearray(b"RTWAL02\n" + b"".join(v2))
    v2_bytes[8 + len(v2[0]) + len(v2[1]) + 8] ^= 0xFF  # record 10's length field
    (tmp_path / f"{8:020d}.wal").write_bytes(bytes(v2_bytes))

    log = WriteAheadLog(tmp_path, segment_size=_SEGMENT, fsync="never")
    log.open()
    assert log.next_seq == 10  # after the last record read in the newest segment
    old = [(r.seq, r.payload) for seg in list(log.segments) for r in log.records(seg)]
    log.append([(12, b"new", KIND_REQUEST)])
    log.close()
    assert old == [(seq, b"old %d" % seq * 50) for seq in range(1, 6)] + [
        (8, b"v2 8"),
        (9, b"v2 9"),
    ]
    assert log.skipped_records == 2
    newest = wal_files(tmp_path)[-1]
    assert newest.read_bytes().startswith(b"RTWAL03\n")
    assert offsets(newest) == {12: _MAGIC_LEN}


# ------------------------------------------------------------- failed write
class FailingOps(FileOps):
    """Writes half of what it is given, then fails with ``ENOSPC`` (a disk filling up
    mid-write), while ``failing`` is set; ``sync_fails`` makes fdatasync fail with EIO."""

    def __init__(self, fail_from_call: int = 0) -> None:
        self.failing = threading.Event()
        self.sync_fails = threading.Event()
        self.half_writes = 0
        self.calls = 0
        #: Set ``failing`` on this write call (0: only by hand).
        self.fail_from_call = fail_from_call

    def write(self, fd: int, data: memoryview) -> int:
        return self.writev(fd, [data])

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        self.calls += 1
        if self.calls == self.fail_from_call:
            self.failing.set()
        if not self.failing.is_set():
            return super().writev(fd, buffers)
        data = b"".join(buffers)
        if len(data) > 1:
            self.half_writes += 1
            return super().write(fd, memoryview(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def fdatasync(self, fd: int) -> None:
        if self.sync_fails.is_set():
            raise OSError(errno.EIO, "Input/output error")
        super().fdatasync(fd)


def test_a_failed_write_is_cut_back_and_opens_no_segment(tmp_path: Path) -> None:
    """300 appends fail half-way (short write, then ENOSPC) and 20 fail at the sync:
    each raises, leaves the active segment exactly as it was, and opens no file; once
    writes work, records go on in the same segment and a reopened log reads every
    acknowledged record and skips none."""
    ops = FailingOps()
    log = WriteAheadLog(tmp_path, segment_size=_SEGMENT, fsync="batch", file_ops=ops)
    log.open()
    log.append([(1, b"a" * 1000, KIND_REQUEST)])
    size = wal_files(tmp_path)[0].stat().st_size
    ops.failing.set()
    for seq in range(2, 302):
        with pytest.raises(StorageError, match="No space left"):
            log.append([(seq, b"b" * 3000, KIND_REQUEST), (seq, b"c" * 10, KIND_REQUEST)])
        assert wal_files(tmp_path)[0].stat().st_size == size
    ops.failing.clear()
    ops.sync_fails.set()
    for seq in range(302, 322):
        with pytest.raises(StorageError, match="Input/output error"):
            log.append([(seq, b"d" * 500, KIND_REQUEST)])
    ops.sync_fails.clear()
    log.append([(400, b"e" * 1000, KIND_REQUEST)])
    log.close()
    assert ops.half_writes >= 300
    assert len(wal_files(tmp_path)) == 1
    seqs, reasons, _ = reread(tmp_path)
    assert seqs == [1, 400]
    assert reasons == []


def test_a_failure_after_a_rotation_keeps_what_was_synced(tmp_path: Path) -> None:
    """A batch that spans two segments and fails in the second: the records synced in
    the first are reported as placed; the rest is cut back; at most one new file."""
    ops = FailingOps(fail_from_call=4)  # magic 1, run 1, magic 2, run 2: run 2 fails
    log = WriteAheadLog(tmp_path, segment_size=_SEGMENT, fsync="batch", file_ops=ops)
    log.open()
    with pytest.raises(StorageError) as failed:
        log.append([(seq, bytes(20_000), KIND_REQUEST) for seq in range(1, 7)])
    assert [p.seq for p in failed.value.placed] == [1, 2, 3]
    log.close()
    files = wal_files(tmp_path)
    assert len(files) == 2
    assert files[1].stat().st_size == _MAGIC_LEN
    assert reread(tmp_path)[0] == [1, 2, 3]


class ShortOps(FileOps):
    """Takes at most 7,001 bytes per write: every write is short, none fails."""

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        return super().write(fd, memoryview(b"".join(buffers))[:7001])


def test_short_writes_are_continued_until_the_record_is_whole(tmp_path: Path) -> None:
    log = WriteAheadLog(tmp_path, segment_size=_SEGMENT, fsync="batch", file_ops=ShortOps())
    log.open()
    records = [(seq, bytes([seq]) * (seq * 3000), KIND_REQUEST) for seq in range(1, 9)]
    log.append(records[:3])
    log.append(records[3:])
    log.close()
    reopened = WriteAheadLog(tmp_path, segment_size=_SEGMENT, fsync="never")
    reopened.open()
    got = [
        (r.seq, r.payload, r.kind) for seg in list(reopened.segments) for r in reopened.records(seg)
    ]
    reopened.close()
    assert got == records
    assert reopened.skipped_records == 0


# ------------------------------------------------------------------- fsync
class RecordingOps(FileOps):
    """Records every write and sync (the real calls are made too)."""

    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.events = events

    def write(self, fd: int, data: memoryview) -> int:
        written = super().write(fd, data)
        self.events.append(("write", written))
        return written

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        written = super().writev(fd, buffers)
        self.events.append(("write", written))
        return written

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self.events.append(("sync", fd))


@pytest.mark.parametrize("fsync", ["never", "batch", "always"])
def test_each_request_is_synced_per_policy_before_it_is_acknowledged(
    tmp_path: Path, fsync: str
) -> None:
    """Through the injection point: with ``batch`` and ``always`` every acknowledgement
    comes after a sync that followed the request's write (``always``: one sync per
    request); with ``never`` no data sync is made.  Removing the sync fails this."""
    config = StorageConfig.model_validate({"directory": str(tmp_path), "fsync": fsync})
    events: list[tuple[str, int]] = []

    async def run() -> None:
        storage = Storage(config, file_ops=RecordingOps(events))
        await storage.start()

        def tag(seq: int) -> int:
            events.append(("ack", seq))
            return 0

        await asyncio.gather(
            *(storage.append(bytes([n]) * 1000, tag=tag, admit=lambda: None) for n in range(50))
        )
        await storage.close()

    asyncio.run(run())
    acks = [i for i, (kind, _) in enumerate(events) if kind == "ack"]
    assert len(acks) == 50
    syncs = [i for i, (kind, _) in enumerate(events) if kind == "sync"]
    if fsync == "never":
        assert syncs == []
        return
    for ack in acks:
        last_write = max(i for i in range(ack) if events[i][0] == "write")
        assert any(last_write < s < ack for s in syncs), f"ack at {ack} without a sync"
    record_writes = [i for i, (kind, n) in enumerate(events) if kind == "write" and n > _MAGIC_LEN]
    if fsync == "always":
        assert len(record_writes) == 50
        for w in record_writes:  # each request's write has its own sync after it
            assert events[w + 1][0] == "sync"


def test_every_policy_finds_its_records_after_reopening(tmp_path: Path) -> None:
    config = StorageConfig.model_validate({"directory": str(tmp_path), "fsync": "batch"})

    async def run() -> list[int]:
        storage = Storage(config)
        await storage.start()
        seqs: list[int] = []

        def tag(seq: int) -> int:
            seqs.append(seq)
            return 0  # nothing to deliver: settled at once

        await asyncio.gather(
            *(storage.append(bytes([n]) * 1000, tag=tag, admit=lambda: None) for n in range(50))
        )
        await storage.close()
        return seqs

    assert asyncio.run(run()) == list(range(1, 51))
    seqs, _, log = reread(tmp_path)
    assert seqs == list(range(1, 51))
    assert log.checkpoint == 51  # every entry settled: nothing to replay


# -------------------------------------------------------------- checkpoint
def _fill(directory: Path, count: int) -> None:
    """A log of ``count`` unsettled requests (as a crash would leave it)."""
    config = StorageConfig.model_validate({"directory": str(directory)})

    async def run() -> None:
        storage = Storage(config)
        await storage.start()
        await asyncio.gather(
            *(
                storage.append(b"r" * 500, tag=lambda seq: 1, admit=lambda: None)
                for _ in range(count)
            )
        )
        await storage.close()

    asyncio.run(run())


def test_the_checkpoint_never_passes_a_record_replay_has_not_handed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 unsettled records replayed in chunks of 10; the first chunk settled at once;
    the checkpoint written meanwhile stays at the first record not handed over, and a
    restart then replays the other 30.  After a complete replay with everything
    settled, the checkpoint passes the whole log."""
    from ragtrace_collector.storage import service

    _fill(tmp_path, 40)
    monkeypatch.setattr(service, "_REPLAY_CHUNK_BYTES", 10 * 500)
    config = StorageConfig.model_validate({"directory": str(tmp_path)})

    async def first_chunk_only() -> int:
        storage = Storage(config)
        await storage.start()
        replay = storage.replay()
        chunk = await replay.__anext__()
        for record in chunk:
            storage.hold_replayed(record.seq, 1)
        storage.settle(_groups(r.seq for r in chunk))
        await asyncio.sleep(1.2)  # the writer checkpoints every 0.5 s
        mark = storage._wal.checkpoint
        await replay.aclose()
        await storage.close()
        return mark

    mark = asyncio.run(first_chunk_only())
    assert mark == 11  # records 11..40 were never handed over

    async def full_replay() -> tuple[list[int], int]:
        storage = Storage(config)
        await storage.start()
        seen: list[int] = []
        async for chunk in storage.replay():
            for record in chunk:
                seen.append(record.seq)
                storage.hold_replayed(record.seq, 1)
            storage.settle(_groups(r.seq for r in chunk))
        await storage.close()
        return seen, storage._wal.checkpoint

    seen, mark = asyncio.run(full_replay())
    assert seen == list(range(11, 41))
    assert mark == 41


def _groups(seqs: Iterable[int]) -> list[SpanGroup]:
    return [SpanGroup(None, "", None, "", wal_seq=seq) for seq in seqs]


# -------------------------------------------------------- refusal, recovery
async def _until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` (state of another thread's making: no event to wait on)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached within 20 s")


def test_a_full_disk_refuses_then_recovers_by_itself(tmp_path: Path) -> None:
    """ENOSPC half-way through a write: the append fails, refusal() says storage_error
    (what admission and /readyz read), status permanent_error; once space returns the
    writer's probe lifts the refusal with no request and no restart; one segment."""
    ops = FailingOps()
    config = StorageConfig.model_validate({"directory": str(tmp_path)})

    async def run() -> None:
        storage = Storage(config, file_ops=ops)
        await storage.start()
        await storage.append(b"x" * 1000, tag=lambda seq: 0, admit=lambda: None)
        ops.failing.set()
        with pytest.raises(StorageError, match="No space left"):
            await storage.append(b"y" * 5000, tag=lambda seq: 0, admit=lambda: None)
        refused = storage.refusal()
        assert refused is not None
        assert refused[0] == "storage_error"
        assert storage.status is Status.PERMANENT_ERROR
        await asyncio.sleep(1.2)  # probes keep failing
        assert storage.refusal() is not None
        ops.failing.clear()
        await _until(lambda: storage.refusal() is None)
        assert storage.status is Status.OK
        await storage.append(b"z" * 1000, tag=lambda seq: 0, admit=lambda: None)
        await storage.close()

    asyncio.run(run())
    assert len(wal_files(tmp_path)) == 1
    assert not (tmp_path / "probe.tmp").exists()


class BlockingOps(FileOps):
    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        self.release.wait(30)
        return super().writev(fd, buffers)


def test_an_append_that_hangs_becomes_a_refusal(tmp_path: Path) -> None:
    """A write stuck in the kernel: after the append timeout the waiter gets a
    StorageError (a 429 for the client), refusal() says storage_error, status
    recoverable_error.  When the write completes the request is still admitted (never
    lost) and the storage is ok again."""
    ops = BlockingOps()
    config = StorageConfig.model_validate({"directory": str(tmp_path), "append_timeout": "300ms"})
    admitted: list[int] = []

    async def run() -> None:
        storage = Storage(config, file_ops=ops)
        await storage.start()
        ops.release.clear()
        future = storage.append(b"x" * 1000, tag=lambda seq: 0, admit=lambda: admitted.append(1))
        with pytest.raises(AppendTimeout, match="did not complete within"):
            await future
        refused = storage.refusal()
        assert refused is not None
        assert refused[0] == "storage_error"
        assert storage.status is Status.RECOVERABLE_ERROR
        ops.release.set()
        await _until(lambda: admitted == [1])
        assert storage.refusal() is None
        assert storage.status is Status.OK
        await storage.close()

    asyncio.run(run())


def test_the_writer_thread_is_supervised(tmp_path: Path) -> None:
    """An unexpected exception in the writer: logged, counted in
    ragtrace_component_failures_total{component="storage"}, status recoverable_error,
    and the writer goes on (the next append is written).  A writer thread that ends
    anyway fails the write it held at once, puts the storage in permanent_error and
    refuses."""
    config = StorageConfig.model_validate({"directory": str(tmp_path)})
    telemetry = Telemetry()
    host = ComponentHost(telemetry)

    async def run() -> None:
        storage = Storage(config, telemetry=telemetry)
        host.register(storage)
        await storage.start()
        real = storage._wal.write_checkpoint
        failures = [RuntimeError("a bug")]

        def checkpoint(seq: int) -> None:
            if failures:
                raise failures.pop()
            real(seq)

        storage._wal.write_checkpoint = checkpoint  # type: ignore[method-assign]
        await storage.append(b"x" * 100, tag=lambda seq: 0, admit=lambda: None)
        await _until(lambda: storage.status is Status.RECOVERABLE_ERROR)
        assert "a bug" in (storage.last_error or "")
        failed = telemetry.registry.get_sample_value(
            "ragtrace_component_failures_total", {"component": "storage"}
        )
        assert failed == 1
        await storage.append(b"y" * 100, tag=lambda seq: 0, admit=lambda: None)
        assert storage.status is Status.OK

        # The thread ends in the write of the next append.  (Not in the checkpoint: the
        # writer may be checkpointing the previous round while the test patches it,
        # and then died before taking the append, which waited for the append timeout.)
        def die(records: object) -> None:
            raise SystemExit

        storage._wal.append = die  # type: ignore[assignment, method-assign]
        with pytest.raises(StorageError, match="writer has stopped"):
            await storage.append(b"z" * 100, tag=lambda seq: 0, admit=lambda: None)
        await _until(lambda: storage.status is Status.PERMANENT_ERROR)
        refused = storage.refusal()
        assert refused is not None
        assert "stopped" in refused[1]
        await storage.close()

    asyncio.run(run())


def test_skipped_records_are_counted_in_the_metric(tmp_path: Path) -> None:
    files = written_log(tmp_path, 12)
    flip(files[0], offsets(files[0])[2] + _HEADER_SIZE + 10)
    with open(files[-1], "r+b") as fh:
        fh.truncate(os.path.getsize(files[-1]) - 5)
    telemetry = Telemetry()
    config = StorageConfig.model_validate({"directory": str(tmp_path)})

    async def run() -> list[int]:
        storage = Storage(config, telemetry=telemetry)
        await storage.start()
        seen = []
        async for chunk in storage.replay():
            for record in chunk:
                seen.append(record.seq)
                storage.hold_replayed(record.seq, 0)
        await storage.close()
        return seen

    assert asyncio.run(run()) == [1, *range(3, 12)]

    def count(reason: str) -> float | None:
        return telemetry.registry.get_sample_value(
            "ragtrace_wal_records_skipped_total", {"reason": reason}
        )

    assert count("corrupt") == 1
    assert count("torn_tail") == 1


# ------------------------------------------------------------ forged records
def _record_image(seq: int, kind: int, payload: bytes, key: bytes | None = None) -> bytes:
    """A complete record image as a client can build it from the documented layouts:
    the previous format's (RTWAL02: a CRC32 of the header), or, given a guessed
    ``key``, the current one's (a BLAKE2b tag of the header keyed with it)."""
    head = _HEAD.pack(b"\xa7\x5e\xd1\x0c", kind, 0, 0, len(payload), seq, zlib.crc32(payload))
    if key is None:
        return head + struct.pack("<I", zlib.crc32(head)) + payload
    return head + hashlib.blake2b(head, digest_size=8, key=key).digest() + payload


@pytest.mark.parametrize("damage", ["header", "torn_tail"])
def test_client_bytes_never_become_a_record(tmp_path: Path, damage: str) -> None:
    """A request's payload holds complete record images, valid per the documented
    layout: a "settled" mark for entries 1-3 (and a request numbered 99).  When the
    header of that request is damaged, or the request is a torn tail cut short after
    the images, resynchronisation must not read them as records: entries 1-3 are read
    as requests, and no mark and no seq 99 appear.  On the format whose records are
    checked with a plain CRC (RTWAL02), the forged mark was read."""
    from ragtrace_collector.storage.outputs import KIND_DELIVERED, SETTLED_MARK, encode_marks

    mark = encode_marks({SETTLED_MARK: [1, 2, 3]})
    forged = b"".join(
        _record_image(50, KIND_DELIVERED, mark, key)
        for key in (None, bytes(16), b"ragtrace-wal-key")
    )
    forged += _record_image(99, KIND_REQUEST, b"x" * 40)
    hostile = b"\x00" * 64 + forged + b"\x00" * 64
    log = WriteAheadLog(tmp_path, segment_size=_SEGMENT, fsync="never")
    log.open()
    records = [(seq, b"ok %d" % seq * 30, KIND_REQUEST) for seq in (1, 2, 3)]
    records.append((4, hostile, KIND_REQUEST))
    if damage == "header":
        records.append((5, b"after", KIND_REQUEST))
    log.append(records)
    log.close()
    (path,) = wal_files(tmp_path)
    data = bytearray(path.read_bytes())

    at = data.rfind(b"\xa7\x5e\xd1\x0c", 0, data.find(hostile))
    if damage == "header":
        data[at + 8] ^= 0xFF  # its length field: the header no longer checks
    else:
        del data[data.find(hostile) + len(hostile) - 10 :]  # cut after the images
    path.write_bytes(bytes(data))

    reasons: list[str] = []
    reader = WriteAheadLog(
        tmp_path, segment_size=_SEGMENT, fsync="never", on_skipped=reasons.append
    )
    reader.open()
    read = [(r.seq, r.kind) for seg in list(reader.segments) for r in reader.records(seg)]
    reader.close()

    assert (50, KIND_DELIVERED) not in read
    assert all(seq != 99 for seq, _ in read)
    expected = [(1, KIND_REQUEST), (2, KIND_REQUEST), (3, KIND_REQUEST)]
    if damage == "header":
        expected.append((5, KIND_REQUEST))
    assert read == expected
    assert reasons == ["corrupt" if damage == "header" else "torn_tail"]
