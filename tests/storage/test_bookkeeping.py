"""The storage bookkeeping of issue 27 (storage/service.py), in process on a real log
directory: the checkpoint is the lowest unsettled entry whatever order entries are held
in, and a segment goes only when nothing in it is still needed, so a clean stop and
start neither sends nor evaluates a settled entry again."""

from __future__ import annotations

import asyncio
import struct
import zlib
from pathlib import Path

from ragtrace_collector.storage import service
from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.storage.outputs import KIND_OUTPUT, encode_output
from ragtrace_collector.storage.service import Storage
from ragtrace_collector.storage.wal import KIND_REQUEST, SEGMENT_HEADER_SIZE
from tests.storage.test_output_ledger import _group, _open, _replay, _unsettled, _write

_CHECKPOINT = struct.Struct("<QI")
#: Three of these fill a segment of a 1 MiB log (segments of 128 KiB).
_FILLER = 40_000


def _segments(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.wal"))


def _checkpoint(directory: Path) -> int:
    seq, crc = _CHECKPOINT.unpack((directory / "checkpoint").read_bytes())
    assert zlib.crc32(struct.pack("<Q", seq)) == crc
    return int(seq)


async def _open_small(path: Path, exporters: list[str]) -> Storage:
    storage = Storage(StorageConfig(directory=path, max_size=1024 * 1024))
    storage.set_exporters(exporters)
    await storage.start()
    return storage


async def _fill(storage: Storage, count: int) -> list[int]:
    """``count`` records of about a third of a segment, one span group each."""
    seqs: list[int] = []

    def tag(seq: int) -> int:
        seqs.append(seq)
        return 1

    for _ in range(count):
        await storage.append(b"f" * _FILLER, tag=tag, admit=lambda: None)
    return seqs


async def _output(storage: Storage, sources: list[int]) -> int:
    """A carrier's output record made from ``sources`` (one span group)."""
    out: list[int] = []

    def tag(seq: int) -> int:
        out.append(seq)
        storage.outputs_of(seq, sources)
        return 1

    await storage.append(encode_output(sources, b""), tag=tag, admit=lambda: None, kind=KIND_OUTPUT)
    return out[0]


async def test_a_carrier_logged_during_replay_never_lets_the_checkpoint_pass_an_entry(
    tmp_path: Path,
) -> None:
    """Defect 1: replay holds entry 1, the processor logs a carrier for it (a new, higher
    sequence number) and entry 1 settles; entries 2 and 3 are held after the carrier.
    The checkpoint must stay at 2, and the next start must replay 2 and 3."""
    storage = await _open(tmp_path, ["a"])
    first, second, third = await _write(storage, 3)
    await storage.close()

    again = await _open(tmp_path, ["a"])
    carrier = 0
    async for chunk in again.replay():
        for record in chunk:
            again.hold_replayed(record.seq, 1)
            if record.seq == first:
                carrier = await _output(again, [first])
                again.settle([_group(first)], 0)
    assert carrier > third
    assert again.unsettled_entries == 3  # second, third, the carrier
    await again.close()
    assert _checkpoint(tmp_path) <= second

    third_start = await _open(tmp_path, ["a"])
    kinds = await _replay(third_start)
    assert {second, third, carrier} <= set(kinds)
    assert await _unsettled(third_start, 2) == 2  # (the helper holds outputs without groups)
    await third_start.close()


async def test_an_entry_settled_before_a_clean_stop_is_not_replayed_as_unsettled(
    tmp_path: Path,
) -> None:
    """Defect 3: the first entry stays (exporter "b" has not delivered it); the second
    is delivered everywhere just before a clean stop.  The checkpoint cannot pass the
    first, so the second is replayed: it must come back as settled (neither sent nor
    evaluated again), whatever the time between its settling and the stop."""
    storage = await _open(tmp_path, ["a", "b"])
    first, second = await _write(storage, 2)
    storage.settle([_group(second)], 0)
    storage.settle([_group(second)], 1)
    await storage.close()

    again = await _open(tmp_path, ["a", "b"])
    await _replay(again)
    assert second in again.settled
    assert again.delivered.get(second) == {0, 1}
    assert first not in again.settled
    assert await _unsettled(again, 1) == 1  # the first only
    await again.close()


async def test_marks_outlive_their_segment_while_they_are_needed(tmp_path: Path) -> None:
    """Defect 3: exporter "a" delivers entry 1 while "b" still owes it; the delivery
    mark lands in the second segment, whose own entries all settle, so that segment is
    deleted.  After a clean stop and start, "a" must still not owe entry 1, and the
    fillers settled in entry 1's segment must come back settled."""
    storage = await _open_small(tmp_path, ["a", "b"])
    first, *fillers = await _fill(storage, 4)  # the 4th opens the second segment
    files = _segments(tmp_path)
    assert len(files) == 2, "the first segment is full"
    storage.settle([_group(first)], 0)  # "a" delivered it: a mark in the second segment
    await asyncio.sleep(0.05)
    fillers += await _fill(storage, 8)
    for exporter in (0, 1):
        storage.settle([_group(s) for s in fillers], exporter)
    await asyncio.sleep(0.05)
    assert files[1] not in _segments(tmp_path), "the second segment went"
    assert files[0] in _segments(tmp_path), "the first stays: entry 1 is held"
    await storage.close()

    again = await _open_small(tmp_path, ["a", "b"])
    await _replay(again)
    assert again.delivered.get(first) == {0}
    assert {fillers[0], fillers[1]} <= again.settled  # in the first segment, settled
    assert await _unsettled(again, 1) == 1
    again.settle([_group(first)], 1)
    assert again.unsettled_entries == 0
    await again.close()


async def test_an_output_record_gone_with_its_segment_leaves_its_source_settled(
    tmp_path: Path,
) -> None:
    """Defect 3, outputs: entry 2's results record is in a later segment, which goes
    once entry 2 settles.  Entry 2 itself is still on disk (entry 1 holds its segment):
    a restart must take it as settled, not evaluate it again."""
    storage = await _open_small(tmp_path, ["a"])
    _, second, third = await _fill(storage, 3)
    pinned = storage.pin([second])
    results = await _output(storage, [second])  # opens the second segment
    storage.settle([_group(second), _group(third)], 0)
    storage.settle([_group(results)], 0)
    storage.unpin(pinned)
    fillers = await _fill(storage, 6)
    storage.settle([_group(s) for s in fillers], 0)
    await asyncio.sleep(0.05)
    assert f"{results:020d}.wal" not in _segments(tmp_path), "the results record's segment went"
    await storage.close()

    again = await _open_small(tmp_path, ["a"])
    await _replay(again)
    assert {second, third} <= again.settled
    assert await _unsettled(again, 1) == 1
    await again.close()


async def test_an_entry_held_while_thousands_settle_keeps_the_bookkeeping_small(
    tmp_path: Path,
) -> None:
    """The heap of held entries drops settled ones only from its top: with the oldest
    entry held (a result awaited) while newer ones settle, it would grow with every
    entry written for the life of the process.  It is rebuilt when settled ones make up
    most of it; the checkpoint still stays at the held entry."""
    storage = await _open(tmp_path, ["a"])
    (held,) = await _write(storage, 1)
    pinned = storage.pin([held])
    storage.settle([_group(held)], 0)
    seqs: list[int] = []

    def tag(seq: int) -> int:
        seqs.append(seq)
        return 1

    count = 2 * service._ORDER_SLACK
    await asyncio.gather(*(storage.append(b"x", tag=tag, admit=lambda: None) for _ in range(count)))
    for seq in seqs:
        storage.settle([_group(seq)], 0)
    assert await _unsettled(storage, 1) == 1  # (once the delivery mark is written)
    assert len(storage._order) <= 2 * 1 + service._ORDER_SLACK
    assert storage._checkpoint() == held
    storage.unpin(pinned)
    assert await _unsettled(storage, 0) == 0
    assert storage._checkpoint() > max(seqs)
    await storage.close()


def _leave_an_empty_segment(directory: Path, first: int) -> Path:
    """A segment named ``first`` holding only a header, as a crash right after its
    creation leaves it; returns the newest segment before it."""
    last = max(directory.glob("*.wal"))
    (directory / f"{first:020d}.wal").write_bytes(last.read_bytes()[:SEGMENT_HEADER_SIZE])
    return last


async def test_an_empty_segment_left_by_a_crash_is_not_taken_for_an_older_one(
    tmp_path: Path,
) -> None:
    """A crash right after a new segment was created leaves it holding only its header,
    named by the next sequence number, which the next process assigns again: its first
    write creates a segment of the same name.  The replay must not take that one for
    the old one (close it and delete it while it is being written): a write placed in
    it was then never admitted (an output write, with no timeout, waited for ever) or
    deleted with the segment.  The model found it (``holds`` profile, a kill while a
    write was blocked on a stalled disk).  The empty segment is removed at open."""
    storage = await _open(tmp_path, ["a"])
    await _write(storage, 3)  # never settled: replayed
    await storage.close()
    last = _leave_an_empty_segment(tmp_path, 4)

    again = await _open(tmp_path, ["a"])
    assert _segments(tmp_path) == [last.name], "the empty one is removed at open"
    chunks = again.replay().__aiter__()
    first = await chunks.__anext__()  # replay has begun: it knows the segments on disk
    for record in first:
        again.hold_replayed(record.seq, 1)
    out: list[int] = []

    def tag(seq: int) -> int:
        out.append(seq)
        return 0

    def write() -> asyncio.Future[None]:
        payload = encode_output([], b"o")
        return again.append(payload, tag=tag, admit=lambda: None, kind=KIND_OUTPUT, timeout=False)

    await asyncio.wait_for(write(), 5.0)
    async for chunk in chunks:
        for record in chunk:  # (the output just written may be read too: no groups)
            again.hold_replayed(record.seq, 1 if record.kind == KIND_REQUEST else 0)
    await asyncio.wait_for(write(), 5.0)
    assert out == [4, 5]
    assert _segments(tmp_path) == [last.name, f"{4:020d}.wal"]
    await again.close()
