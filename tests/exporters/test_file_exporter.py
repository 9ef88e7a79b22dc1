"""The file exporter on a failing disk: whole lines or nothing, synced before settling.

The system calls go through :class:`FileOps`, so a test can make a write stop half-way
with ``ENOSPC`` (what a full disk does to a large write), take fewer bytes than asked,
or record every sync.  Also: a batch that cannot be encoded is never settled.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.config import parse_config
from ragtrace_collector.exporters.config import FileExporterConfig
from ragtrace_collector.exporters.file import FileExporter, FsyncPolicy
from ragtrace_collector.otlp.codec import SpanGroup, decode_json_request, iter_spans, split_request
from ragtrace_collector.service.server import CollectorService
from ragtrace_collector.storage.fileops import FileOps
from ragtrace_collector.storage.spill import Outstanding, write_spill
from tests.fakes.harness import collector_config, running_collector, wait_for
from tests.fakes.otlp_data import make_request, rag_trace

_FAST_RETRY = {"initial_interval": "10ms", "max_interval": "20ms"}


def _config(path: Path, **extra: Any) -> FileExporterConfig:
    return FileExporterConfig.model_validate(
        {"type": "file", "path": str(path), "retry": _FAST_RETRY, **extra}
    )


def _trace(children: int = 3, name: str = "span") -> list[SpanGroup]:
    spans = rag_trace(children=children)
    for span in spans:
        span.name = name
    (chunk,) = split_request(make_request(spans)).traces.values()
    return chunk.groups


def _span_ids(groups: list[SpanGroup]) -> list[bytes]:
    return [s.span_id for g in groups for s in g.spans]


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    # Empty (created, not yet written: a reader can look in between) has no partial line.
    assert not data or data.endswith(b"\n"), "the file ends in a partial line"
    return data.splitlines()


def _ids_in(lines: list[bytes]) -> list[bytes]:
    return [s.span_id for line in lines for s in iter_spans(decode_json_request(line))]


async def _export(
    exporter: FileExporter,
    batches: list[list[SpanGroup]],
    *,
    settled: Callable[[list[SpanGroup]], None] | None = None,
) -> int:
    """Enqueue ``batches``, wait until they are delivered; return close()'s count."""
    if settled is not None:
        exporter.on_settled = settled
    await exporter.start()
    for groups in batches:
        exporter.enqueue(groups, sum(len(g.spans) for g in groups))
    return await exporter.close(asyncio.get_running_loop().time() + 10)


class _Disk(FileOps):
    """System calls with faults: ``fail_writes`` writes stop half-way with ENOSPC,
    ``chunk`` caps what one write takes, ``fail_syncs`` syncs raise EIO; every write
    and sync of the file is recorded (with the file's inode) in ``events``."""

    def __init__(self, *, fail_writes: int = 0, chunk: int = 0, fail_syncs: int = 0) -> None:
        self.fail_writes = fail_writes
        self.chunk = chunk
        self.fail_syncs = fail_syncs
        self.events: list[tuple[str, int]] = []

    def write(self, fd: int, data: memoryview) -> int:
        self.events.append(("write", os.fstat(fd).st_ino))
        if self.fail_writes:
            self.fail_writes -= 1
            os.write(fd, data[: len(data) // 2])  # half the line reaches the disk
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.chunk:
            data = data[: self.chunk]
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.events.append(("fsync", os.fstat(fd).st_ino))
        if self.fail_syncs:
            self.fail_syncs -= 1
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)


def test_a_write_cut_short_by_a_full_disk_leaves_no_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    first, second = _trace(), _trace()
    disk = _Disk(fail_writes=2)
    exporter = FileExporter("f", _config(path), Telemetry(), ops=disk)
    settled: list[list[SpanGroup]] = []
    assert asyncio.run(_export(exporter, [first], settled=settled.append)) == 0
    disk.fail_writes = 3  # the next batch lands on a file that already holds a line
    exporter = FileExporter("f", _config(path), Telemetry(), ops=disk)
    assert asyncio.run(_export(exporter, [second], settled=settled.append)) == 0

    lines = _lines(path)
    assert len(lines) == 2  # one line per batch: the failed halves were cut back
    assert _ids_in(lines) == _span_ids(first) + _span_ids(second)  # each span once
    assert [len(call) for call in settled] == [len(first), len(second)]
    assert disk.fail_writes == 0


def test_a_batch_is_settled_only_once_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    groups = _trace()
    disk = _Disk(fail_writes=1_000_000)  # the disk stays full
    exporter = FileExporter("f", _config(path), Telemetry(), ops=disk)
    settled: list[list[SpanGroup]] = []

    async def scenario() -> None:
        exporter.on_settled = settled.append
        await exporter.start()
        exporter.enqueue(groups, len(_span_ids(groups)))
        for _ in range(3000):  # until it has failed five times
            if sum(1 for kind, _ in disk.events if kind == "write") >= 5:
                break
            await asyncio.sleep(0.01)
        assert settled == []  # failing for a while: nothing settled
        assert path.stat().st_size == 0  # and nothing half-written
        disk.fail_writes = 0  # space returns
        await exporter.close(asyncio.get_running_loop().time() + 10)

    asyncio.run(scenario())
    assert _ids_in(_lines(path)) == _span_ids(groups)
    assert settled == [groups]


def test_short_writes_are_completed(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    groups = _trace(children=20)
    disk = _Disk(chunk=97)  # the system takes at most 97 bytes per write
    exporter = FileExporter("f", _config(path), Telemetry(), ops=disk)
    asyncio.run(_export(exporter, [groups]))
    assert _ids_in(_lines(path)) == _span_ids(groups)
    assert sum(1 for kind, _ in disk.events if kind == "write") > 10


def test_a_partial_line_left_by_a_crash_does_not_swallow_the_next_batch(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b'{"resourceSpans":[{"scopeSpa')  # a write the crash cut short
    groups = _trace()
    asyncio.run(_export(FileExporter("f", _config(path), Telemetry()), [groups]))
    partial, line = _lines(path)
    assert partial == b'{"resourceSpans":[{"scopeSpa'  # kept, on its own line
    assert _ids_in([line]) == _span_ids(groups)


@pytest.mark.parametrize("policy", ["batch", "always"])
def test_each_batch_is_synced_before_it_is_settled(tmp_path: Path, policy: FsyncPolicy) -> None:
    path = tmp_path / "spans.jsonl"
    disk = _Disk()
    exporter = FileExporter(
        "f", _config(path, max_batch_spans=4), Telemetry(), fsync=policy, ops=disk
    )

    def settled(groups: list[SpanGroup]) -> None:
        disk.events.append(("settled", len(groups)))

    batches = [_trace(), _trace(), _trace()]
    asyncio.run(_export(exporter, batches, settled=settled))
    inode = path.stat().st_ino
    settles = [i for i, (kind, _) in enumerate(disk.events) if kind == "settled"]
    assert len(settles) == 3
    previous = -1
    for at in settles:
        since = disk.events[previous + 1 : at]
        writes = [i for i, e in enumerate(since) if e == ("write", inode)]
        syncs = [i for i, e in enumerate(since) if e == ("fsync", inode)]
        assert writes, "a batch settled without a write"
        assert syncs, "a batch settled without a sync"
        assert syncs[-1] > writes[-1], "a batch settled before its line was synced"
        previous = at
    # The new file's directory entry was synced too.
    assert ("fsync", tmp_path.stat().st_ino) in disk.events


def test_without_a_log_nothing_is_synced(tmp_path: Path) -> None:
    disk = _Disk()
    exporter = FileExporter("f", _config(tmp_path / "s.jsonl"), Telemetry(), ops=disk)
    asyncio.run(_export(exporter, [_trace()]))
    assert [kind for kind, _ in disk.events] == ["write"]


def test_a_failed_sync_cuts_the_line_back_and_retries(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    groups = _trace()
    disk = _Disk(fail_syncs=2)
    exporter = FileExporter("f", _config(path), Telemetry(), fsync="batch", ops=disk)
    asyncio.run(_export(exporter, [groups]))
    assert _ids_in(_lines(path)) == _span_ids(groups)  # once, not three times


def test_rotation_still_keeps_lines_whole(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    disk = _Disk(fail_writes=3)
    config = _config(path, max_bytes=3000, keep=50, max_batch_spans=3)
    batches = [_trace(children=2) for _ in range(12)]
    asyncio.run(_export(FileExporter("f", config, Telemetry(), ops=disk), batches))
    files = sorted(tmp_path.iterdir())
    assert len(files) > 2
    ids = [i for f in files for i in _ids_in(_lines(f))]
    assert sorted(ids) == sorted(i for b in batches for i in _span_ids(b))


@pytest.mark.parametrize(
    ("storage", "expected"),
    [({"directory": "WAL", "fsync": "always"}, "always"), ({"fsync": "always"}, "never")],
)
def test_the_service_gives_the_file_exporter_the_storage_policy(
    tmp_path: Path, storage: dict[str, str], expected: str
) -> None:
    if "directory" in storage:
        storage = {**storage, "directory": str(tmp_path / "wal")}
    config = parse_config(
        {
            "exporters": {"f": {"type": "file", "path": str(tmp_path / "s.jsonl")}},
            "storage": storage,
        },
        env={},
    )
    (exporter,) = CollectorService(config).exporters
    assert isinstance(exporter, FileExporter)
    assert exporter.fsync == expected


# ------------------------------------------------------------- encode errors
class _PoisonedFileExporter(FileExporter):
    """Cannot encode a batch holding a span named ``poison`` (a stand-in for a bug)."""

    def _encode(self, groups: Any) -> bytes:
        if any(s.name == "poison" for g in groups for s in g.spans):
            raise ValueError("cannot encode")
        return super()._encode(groups)


def test_a_batch_that_cannot_be_encoded_is_never_settled_but_spilled(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    good, bad, later = _trace(), _trace(name="poison"), _trace()
    telemetry = Telemetry()
    exporter = _PoisonedFileExporter("f", _config(path, max_batch_spans=4), telemetry)
    outstanding = Outstanding(exporters=1)  # what the pipeline tracks without a log
    for groups in (good, bad, later):
        outstanding.forwarded(groups)
    settled: list[SpanGroup] = []

    def on_settled(groups: list[SpanGroup]) -> None:
        settled.extend(groups)
        outstanding.settle(groups)

    not_delivered = asyncio.run(_export(exporter, [good, bad, later], settled=on_settled))
    assert not_delivered == len(_span_ids(bad))  # close() reports it
    assert [id(g) for g in settled] == [id(g) for g in (*good, *later)]
    dropped = telemetry.registry.get_sample_value(
        "ragtrace_spans_dropped_total", {"exporter": "f", "reason": "encode_error"}
    )
    assert dropped == len(_span_ids(bad))
    assert _ids_in(_lines(path)) == _span_ids(good) + _span_ids(later)
    # Still outstanding, so a shutdown spills it.
    left = outstanding.groups()
    assert [id(g) for g in left] == [id(g) for g in bad]
    spill = tmp_path / "spill.jsonl"
    assert write_spill(spill, left) == len(_span_ids(bad))
    assert _ids_in(_lines(spill)) == _span_ids(bad)


def test_the_line_is_json(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    asyncio.run(_export(FileExporter("f", _config(path), Telemetry()), [_trace()]))
    (line,) = _lines(path)
    span = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32


def _post(url: str, spans: list[Any]) -> None:
    body = make_request(spans).SerializeToString()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/x-protobuf"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def _poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file exporter of the service fails to encode a span named ``poison``."""
    encode = FileExporter._encode

    def poisoned(self: FileExporter, groups: Any) -> bytes:
        if any(s.name == "poison" for g in groups for s in g.spans):
            raise ValueError("cannot encode")
        return encode(self, groups)

    monkeypatch.setattr(FileExporter, "_encode", poisoned)


def _poison_and_good(url: str) -> tuple[list[bytes], list[bytes]]:
    poison = rag_trace(children=2)
    for span in poison:
        span.name = "poison"
    good = rag_trace(children=2)
    _post(url, poison)
    _post(url, good)
    return [s.span_id for s in poison], [s.span_id for s in good]


def test_an_unencodable_trace_is_spilled_at_shutdown_not_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, spill = tmp_path / "spans.jsonl", tmp_path / "spill.jsonl"
    config = collector_config(
        exporters={"f": {"type": "file", "path": str(out)}},
        assembly={"decision_wait": 0},
        shutdown={"spill_path": str(spill)},
    )
    _poisoned(monkeypatch)
    with running_collector(config) as collector:
        poison, good = _poison_and_good(collector.http_url)
        wait_for(lambda: out.exists() and len(_ids_in(_lines(out))) == len(good))
        collector.stop()
        assert collector.svc.spans_undelivered == len(poison)  # exit code 3
    assert _ids_in(_lines(out)) == good
    assert sorted(_ids_in(_lines(spill))) == sorted(poison)


def test_an_unencodable_trace_stays_in_the_log_and_goes_out_after_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "spans.jsonl"
    config = collector_config(
        exporters={"f": {"type": "file", "path": str(out)}},
        assembly={"decision_wait": 0},
        storage={"directory": str(tmp_path / "wal")},
    )
    with monkeypatch.context() as patch:
        _poisoned(patch)
        with running_collector(config) as collector:
            poison, good = _poison_and_good(collector.http_url)
            wait_for(lambda: out.exists() and len(_ids_in(_lines(out))) == len(good))
    assert _ids_in(_lines(out)) == good
    with running_collector(config):  # the bug fixed: the log still holds the trace
        # At least once: a replay may send the good trace again, the poisoned one must come.
        wait_for(lambda: set(poison) <= set(_ids_in(_lines(out))))
    assert set(_ids_in(_lines(out))) == set(good + poison)
