"""The storage side of the ledger of outputs (storage/service.py, storage/outputs.py):
per-exporter delivery marks, pins for outputs still to come, output records that stay
while their sources do.  In process, on a real log directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.storage import service
from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.storage.outputs import (
    KIND_DELIVERED,
    KIND_OUTPUT,
    decode_marks,
    decode_output,
    encode_output,
)
from ragtrace_collector.storage.service import Storage
from ragtrace_collector.storage.wal import KIND_REQUEST


async def _unsettled(storage: Storage, expected: int) -> int:
    """The unsettled entries once the delivery marks in flight are written."""
    for _ in range(200):
        if storage.unsettled_entries <= expected:
            break
        await asyncio.sleep(0.01)
    return storage.unsettled_entries


def _group(seq: int) -> SpanGroup:
    return SpanGroup(None, "", None, "", [], wal_seq=seq)


async def _open(path: Path, exporters: list[str]) -> Storage:
    storage = Storage(StorageConfig(directory=path))
    storage.set_exporters(exporters)
    await storage.start()
    return storage


async def _write(storage: Storage, count: int, *, kind: int = KIND_REQUEST) -> list[int]:
    """``count`` records of one span group each; their sequence numbers."""
    seqs: list[int] = []

    def tag(seq: int) -> int:
        seqs.append(seq)
        return 1

    for _ in range(count):
        await storage.append(b"x", tag=tag, admit=lambda: None, kind=kind)
    return seqs


async def _replay(storage: Storage, *, to_forward: bool = False) -> dict[int, int]:
    """Replay the way the pipeline does (requests hold one group, and with
    ``to_forward`` wait for the processor as the pipeline's do); seq -> kind."""
    kinds: dict[int, int] = {}
    async for chunk in storage.replay():
        for record in chunk:
            kinds[record.seq] = record.kind
            if record.kind == KIND_DELIVERED:
                storage.hold_replayed(record.seq, 0)
                storage.replayed_marks(record.payload)
            elif record.kind == KIND_OUTPUT:
                sources, _ = decode_output(record.payload)
                storage.hold_replayed(record.seq, 0, sources)
            else:
                storage.hold_replayed(record.seq, 1, to_forward=to_forward)
    return kinds


async def test_an_exporter_that_delivered_is_not_sent_the_entry_again(tmp_path: Path) -> None:
    storage = await _open(tmp_path, ["a", "b"])
    (seq,) = await _write(storage, 1)
    storage.settle([_group(seq)], 0)  # "a" delivered, "b" not yet
    assert storage.unsettled_entries == 1
    await storage.close()

    again = await _open(tmp_path, ["a", "b"])
    kinds = await _replay(again)
    marks = [s for s, k in kinds.items() if k == KIND_DELIVERED]
    assert marks, "a delivery mark was logged"
    assert again.delivered == {seq: {0}}
    # Only "b" still owes it: its settle releases the entry.
    assert again.unsettled_entries == 1
    again.settle([_group(seq)], 1)
    assert again.unsettled_entries == 0
    await again.close()


async def test_an_entry_settled_above_the_checkpoint_is_marked_for_every_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first entry stays (its backend is down); the second is delivered everywhere.
    The checkpoint cannot pass the first, so the second is replayed: its marks keep it
    from being sent again."""
    monkeypatch.setattr(service, "_HELD_BACK", -1.0)  # the first counts as held back
    storage = await _open(tmp_path, ["a", "b"])
    first, second = await _write(storage, 2)
    storage.settle([_group(second)], 0)
    storage.settle([_group(second)], 1)
    assert storage.unsettled_entries == 1
    await storage.close()

    again = await _open(tmp_path, ["a", "b"])
    kinds = await _replay(again)
    assert kinds[first] == kinds[second] == KIND_REQUEST
    assert again.delivered.get(second) == {0, 1}
    assert again.settled == {second}
    assert first not in again.delivered
    assert await _unsettled(again, 1) == 1  # the first only
    await again.close()


async def test_a_pin_holds_a_delivered_entry_until_its_output_is_logged(tmp_path: Path) -> None:
    storage = await _open(tmp_path, ["a"])
    (seq,) = await _write(storage, 1)
    pinned = storage.pin([seq])
    storage.settle([_group(seq)], 0)
    assert storage.unsettled_entries == 1, "pinned: an output is still to come"

    # The output record stays while its source does, and the source waits for the pin.
    out: list[int] = []

    def tag(o: int) -> int:
        out.append(o)
        storage.outputs_of(o, [seq])
        return 0

    await storage.append(encode_output([seq], b""), tag=tag, admit=lambda: None, kind=KIND_OUTPUT)
    assert await _unsettled(storage, 2) == 2
    storage.unpin(pinned)
    assert storage.unsettled_entries == 0, "source released, then its output"
    await storage.close()


async def test_an_output_record_is_replayed_with_its_sources(tmp_path: Path) -> None:
    storage = await _open(tmp_path, ["a"])
    (seq,) = await _write(storage, 1)
    storage.pin([seq])

    def tag(o: int) -> int:
        storage.outputs_of(o, [seq])
        return 0

    await storage.append(
        encode_output([seq], b"request"), tag=tag, admit=lambda: None, kind=KIND_OUTPUT
    )
    await storage.close()  # crash-like: the source never settled

    again = await _open(tmp_path, ["a"])
    records = []
    async for chunk in again.replay():
        records += chunk
        for record in chunk:
            again.hold_replayed(record.seq, 1 if record.kind == KIND_REQUEST else 0)
    outputs = [r for r in records if r.kind == KIND_OUTPUT]
    assert [decode_output(r.payload) for r in outputs] == [([seq], b"request")]
    await again.close()


async def test_a_replayed_entry_every_exporter_had_waits_for_the_processor(
    tmp_path: Path,
) -> None:
    """Pins are not logged.  An entry pinned for a result still to come, delivered by
    every exporter (each left a delivery mark), then a clean stop: at the next start
    the marks alone would settle it before the processor takes its hold again, and the
    checkpoint would pass it, losing the result for good.  It waits for the processor
    to forward it (the model's sequence ``found1`` in test_model.py)."""
    storage = await _open(tmp_path, ["a", "b"])
    (seq,) = await _write(storage, 1)
    storage.pin([seq])
    storage.settle([_group(seq)], 0)
    storage.settle([_group(seq)], 1)
    await storage.close()

    again = await _open(tmp_path, ["a", "b"])
    await _replay(again, to_forward=True)
    assert again.delivered == {seq: {0, 1}}
    assert again.unsettled_entries == 1, "held until the processor has forwarded it"
    assert again.pin([seq]) == [seq], "the evaluator's hold, taken before it forwards"
    again.forwarded([_group(seq)])
    assert again.unsettled_entries == 1, "held by the hold: the result is still to come"
    assert again.delivered == {}, "its marks are read no more"
    await again.close()  # before the result is logged

    third = await _open(tmp_path, ["a", "b"])
    kinds = await _replay(third, to_forward=True)
    assert kinds.get(seq) == KIND_REQUEST, "replayed again: its result is still owed"
    third.forwarded([_group(seq)])  # forwarded with no hold: nothing more is owed
    assert third.unsettled_entries == 0
    await third.close()


async def test_replayed_marks_are_dropped_once_read_for_the_last_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delivered`` and ``settled`` are filled by replay only: a request's marks go
    once the processor has forwarded (or the pipeline dropped) each of its groups, the
    marks of other records (a carrier here) once replay is over."""
    monkeypatch.setattr(service, "_HELD_BACK", -1.0)  # "settled" marks at once
    storage = await _open(tmp_path, ["a", "b"])
    first, second = await _write(storage, 2)
    out: list[int] = []

    def one_group(seq: int) -> int:
        out.append(seq)
        return 1

    await storage.append(
        encode_output([], b"carrier"), tag=one_group, admit=lambda: None, kind=KIND_OUTPUT
    )
    (carrier,) = out
    storage.settle([_group(second)], 0)
    storage.settle([_group(second)], 1)  # settled above the held first: a "settled" mark
    storage.settle([_group(first)], 0)
    storage.settle([_group(carrier)], 0)
    await storage.close()

    again = await _open(tmp_path, ["a", "b"])
    await _replay(again, to_forward=True)
    assert again.settled == {second}
    assert again.delivered == {first: {0}, second: {0, 1}, carrier: {0}}
    await asyncio.sleep(0)  # the next loop round: the carrier's marks were fanned out
    assert again.delivered == {first: {0}, second: {0, 1}}
    again.forwarded([_group(second)])  # dropped by the pipeline: settled before
    assert again.settled == set()
    assert again.delivered == {first: {0}}
    again.forwarded([_group(first)])
    assert again.delivered == {}
    assert again.unsettled_entries == 1, "exporter b still owes the first"
    await again.close()


def test_marks_and_outputs_decode_what_they_encode_and_refuse_garbage() -> None:
    assert decode_output(encode_output([3, 1, 3], b"body")) == ([1, 3], b"body")
    with pytest.raises(ValueError, match="too short"):
        decode_output(b"\x05\x00\x00\x00")
    assert decode_marks(b'{"a": [1, 2, true, "x"], "b": 3}') == {"a": [1, 2]}
    assert decode_marks(b"not json") == {}
