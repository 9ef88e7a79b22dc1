"""The write-ahead log: acknowledged spans survive kill -9, a torn tail, a full log, a lock.

And, without a log, a shutdown with a dead backend: bounded, exit 3, the loss counted,
the spill file written and replayed with ``ragtrace-collector replay``.

Every collector here is a real ``ragtrace-collector serve`` process (or the service in
a thread where noted) on loopback, and the backend is the real OTLP sink of the tests.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import struct
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ragtrace_collector.storage import Storage, StorageConfig
from ragtrace_collector.storage.wal import WriteAheadLog
from tests.collector.harness import (
    COLLECTOR,
    ServeProcess,
    collector_config,
    http_get,
    passthrough_sections,
    running_collector,
    sink_exporter,
    wait_for,
)
from tests.fakes.otlp_sink import OtlpSink

_HEADER = struct.Struct("<IIQ")  # the record header of the log format (wal.py)
_MAGIC_LEN = 8


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


# ------------------------------------------------------------------ load
def make_requests(count: int, spans: int, *, tag: int) -> list[tuple[bytes, list[str]]]:
    """``count`` OTLP requests of ``spans`` spans (10 per trace, roots included), each
    with its span ids (hex).  Every id is unique across ``tag`` values."""
    out: list[tuple[bytes, list[str]]] = []
    for r in range(count):
        request = ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        kv = rs.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", "wal-test"
        ss = rs.scope_spans.add()
        ss.scope.name = "wal-test"
        ids: list[str] = []
        for i in range(spans):
            span = ss.spans.add()
            trace_no = i // 10
            span.trace_id = struct.pack(">IIII", 0xAB, tag, r + 1, trace_no + 1)
            span.span_id = struct.pack(">HHI", tag + 1, r + 1, i + 1)
            if i % 10:
                span.parent_span_id = struct.pack(">HHI", tag + 1, r + 1, trace_no * 10 + 1)
            span.name = f"span {i}"
            span.start_time_unix_nano = 1_700_000_000_000_000_000
            span.end_time_unix_nano = 1_700_000_000_100_000_000
            attr = span.attributes.add()
            attr.key, attr.value.string_value = "retrieval.query", f"question {r}-{i} " * 4
            ids.append(span.span_id.hex())
        out.append((request.SerializeToString(), ids))
    return out


class Sender(threading.Thread):
    """Posts requests over OTLP/HTTP at a steady rate; records what was acknowledged.

    Refusals (429, 503) are retried after a short pause; a connection error ends the
    run (the collector is gone), the request in hand unacknowledged.
    """

    def __init__(
        self, endpoint: str, requests: list[tuple[bytes, list[str]]], spans_per_s: float
    ) -> None:
        super().__init__(daemon=True)
        host, port = endpoint.rsplit(":", 1)
        self._host, self._port = host, int(port)
        self._requests = requests
        self._interval = len(requests[0][1]) / spans_per_s if spans_per_s else 0.0
        self.acked: list[str] = []
        self.refused = 0
        self.broken: str | None = None

    def run(self) -> None:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
        started = time.monotonic()
        try:
            for n, (body, ids) in enumerate(self._requests):
                pause = started + n * self._interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                while True:
                    conn.request(
                        "POST",
                        "/v1/traces",
                        body=body,
                        headers={"Content-Type": "application/x-protobuf"},
                    )
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status == 200:
                        self.acked.extend(ids)
                        break
                    if resp.status not in (429, 503):
                        raise AssertionError(f"unexpected answer {resp.status}")
                    self.refused += 1
                    time.sleep(0.05)
        except (OSError, http.client.HTTPException) as exc:
            self.broken = repr(exc)
        finally:
            conn.close()


def _all_acknowledged(
    sender: Sender, requests: list[tuple[bytes, list[str]]], timeout: float
) -> set[str]:
    """Wait for ``sender`` to finish; every span id it sent was acknowledged."""
    sender.join(timeout)
    assert not sender.is_alive()
    assert sender.broken is None
    wanted = {i for _, ids in requests for i in ids}
    assert set(sender.acked) == wanted
    return wanted


def storage_config(sink: OtlpSink, wal: Path, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "receivers": {
            "grpc": {"endpoint": "127.0.0.1:0"},
            "http": {"endpoint": "127.0.0.1:0"},
            "retry_after": "100ms",
        },
        "admin": {"endpoint": "127.0.0.1:0"},
        "assembly": {"decision_wait": "50ms", "max_trace_wait": "5s"},
        "exporters": {"backend": sink_exporter(sink, "otlp_grpc")},
        "storage": {"directory": str(wal)},
        "shutdown": {"flush_timeout": "2s", "receiver_grace": "1s"},
    }
    for key, value in extra.items():
        config.setdefault(key, {}).update(value)
    return config


def received_ids(sink: OtlpSink) -> Counter[str]:
    return Counter(s.span.span_id.hex() for s in sink.spans)


def wait_delivered(sink: OtlpSink, wanted: set[str], timeout: float) -> Counter[str]:
    deadline = time.monotonic() + timeout
    while True:
        got = received_ids(sink)
        missing = wanted - got.keys()
        if not missing:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(missing)} of {len(wanted)} spans never delivered")
        time.sleep(0.2)


def segments(wal: Path) -> list[Path]:
    return sorted(wal.glob("*.wal"))


def stop(serve: ServeProcess, timeout: float = 60) -> int:
    serve.proc.send_signal(signal.SIGTERM)
    return serve.wait(timeout)


# ----------------------------------------------------------------- crash
@pytest.mark.slow
def test_kill_9_mid_stream_loses_no_acknowledged_span(sink: OtlpSink, tmp_path: Path) -> None:
    """20k spans at a steady rate, backend down, kill -9 mid-stream, restart with the
    backend up: every acknowledged span is delivered; duplicates are counted."""
    wal = tmp_path / "wal"
    config = storage_config(sink, wal)
    sink.go_down()
    serve = ServeProcess(config, tmp_path)
    requests = make_requests(200, 100, tag=1)  # 20,000 spans
    sender = Sender(serve.endpoints["otlp_http"], requests, spans_per_s=4000)
    try:
        sender.start()
        wait_for(lambda: len(sender.acked) >= 8000, timeout=60, what="8,000 spans acknowledged")
        serve.proc.send_signal(signal.SIGKILL)
        serve.kill()
        sender.join(30)
    finally:
        serve.kill()
    acked = set(sender.acked)
    assert sender.broken is not None, "the sender should have seen the collector die"
    assert 8000 <= len(acked) < 20_000, len(acked)
    assert sink.span_count == 0
    assert segments(wal)

    sink.come_up()
    restarted = ServeProcess(config, tmp_path)
    try:
        got = wait_delivered(sink, acked, timeout=90)
        # Once every exporter delivered, the replayed segments are deleted.
        wait_for(lambda: not segments(wal), timeout=30, what="settled segments deleted")
        assert stop(restarted) == 0
    finally:
        restarted.kill()
    duplicates = sum(n - 1 for n in got.values())
    unacked_delivered = len(got.keys() - acked)
    figure = {
        "acknowledged": len(acked),
        "delivered_of_acknowledged": len(acked & got.keys()),
        "duplicates": duplicates,
        "delivered_unacknowledged": unacked_delivered,
    }
    print("\nkill -9 figure:", json.dumps(figure))
    assert figure["delivered_of_acknowledged"] == len(acked)
    # Unacknowledged but delivered: only what was written when the process died.
    assert unacked_delivered <= 1000
    replayed = restarted.event("replay_done")
    assert replayed is not None
    assert replayed["spans"] >= len(acked) - 100


# ------------------------------------------------------------- torn tail
def test_torn_tail_is_skipped_and_the_rest_replayed(sink: OtlpSink, tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    config = storage_config(sink, wal)
    sink.go_down()
    serve = ServeProcess(config, tmp_path)
    requests = make_requests(20, 100, tag=2)
    sender = Sender(serve.endpoints["otlp_http"], requests, spans_per_s=0)
    sender.run()
    serve.proc.send_signal(signal.SIGKILL)
    serve.kill()
    assert len(sender.acked) == 2000
    # A crash in the middle of the last write: cut the last record short.
    last = segments(wal)[-1]
    data = last.read_bytes()
    offset, records = _MAGIC_LEN, []
    while offset < len(data):
        length = _HEADER.unpack_from(data, offset)[0]
        records.append((offset, data[offset + _HEADER.size : offset + _HEADER.size + length]))
        offset += _HEADER.size + length
    torn_at, torn_payload = records[-1]
    torn = ExportTraceServiceRequest()
    torn.ParseFromString(torn_payload)
    torn_ids = {
        s.span_id.hex() for rs in torn.resource_spans for ss in rs.scope_spans for s in ss.spans
    }
    assert len(torn_ids) == 100
    with open(last, "r+b") as fh:
        fh.truncate(torn_at + _HEADER.size + len(torn_payload) // 2)

    sink.come_up()
    restarted = ServeProcess(config, tmp_path)
    try:
        rest = set(sender.acked) - torn_ids
        got = wait_delivered(sink, rest, timeout=60)
        assert stop(restarted) == 0
    finally:
        restarted.kill()
    assert not (got.keys() & torn_ids)
    event = restarted.event("wal_torn_tail")
    assert event is not None
    assert event["segment"] == last.name
    assert event["offset"] == torn_at
    assert max(got.values()) == 1


def test_a_corrupt_record_ends_only_its_own_segment(tmp_path: Path) -> None:
    """A bad checksum in an older segment: the rest of that segment is skipped, the
    later segments are still read (file level, no process)."""
    log = WriteAheadLog(tmp_path, segment_size=64 * 1024, fsync="never")
    log.open()
    payloads = [(seq, bytes([seq % 251]) * 20_000) for seq in range(1, 13)]
    log.append(payloads)
    log.close()
    files = segments(tmp_path)
    assert len(files) >= 3
    first = bytearray(files[0].read_bytes())
    first[_MAGIC_LEN + _HEADER.size + 5] ^= 0xFF  # the first record's payload
    files[0].write_bytes(bytes(first))
    reopened = WriteAheadLog(tmp_path, segment_size=64 * 1024, fsync="never")
    reopened.open()
    seen = [seq for seg in reopened.segments for seq, _ in reopened.records(seg)]
    reopened.close()
    first_of_second = int(files[1].stem)
    assert seen == list(range(first_of_second, 13))
    assert reopened.skipped_records == 1
    assert reopened.next_seq == 13


# ------------------------------------------------------------------- full
def test_full_log_answers_back_pressure_and_drops_nothing(sink: OtlpSink, tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    config = storage_config(sink, wal, storage={"max_size": "1MiB"})
    sink.go_down()
    serve = ServeProcess(config, tmp_path)
    requests = make_requests(150, 100, tag=3)  # ~3 MiB: three times the log
    sender = Sender(serve.endpoints["otlp_http"], requests, spans_per_s=0)
    try:
        sender.start()
        wait_for(lambda: sender.refused >= 5, timeout=60, what="back-pressure")
        refused = serve.metric("ragtrace_spans_refused_total", {"reason": "storage_full"})
        assert refused > 0
        status = {"component": "storage", "status": "recoverable_error"}
        assert serve.metric("ragtrace_component_status", status) == 1
        on_disk = sum(p.stat().st_size for p in segments(wal))
        assert on_disk <= 1024 * 1024 + 200_000  # the bound, plus what was being written
        sink.come_up()
        wanted = _all_acknowledged(sender, requests, timeout=120)
        got = wait_delivered(sink, wanted, timeout=60)
        assert max(got.values()) == 1
        assert len(got) == 15_000
        ok = {"component": "storage", "status": "ok"}
        wait_for(lambda: serve.metric("ragtrace_component_status", ok) == 1, what="storage ok")
        assert serve.metric("ragtrace_spans_dropped_total") == 0
        assert stop(serve) == 0
    finally:
        serve.kill()


# ------------------------------------------------------------------- lock
def test_second_process_on_the_same_directory_refuses_to_start(
    sink: OtlpSink, tmp_path: Path
) -> None:
    wal = tmp_path / "wal"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = ServeProcess(storage_config(sink, wal), tmp_path / "a")
    try:
        second = ServeProcess(storage_config(sink, wal), tmp_path / "b", wait_ready=False)
        assert second.wait(60) == 1
        failed = second.event("startup_failed")
        assert failed is not None
        assert "in use by another collector" in failed["error"]
        assert f"pid {first.proc.pid}" in failed["error"]
        assert stop(first) == 0
    finally:
        first.kill()


# ------------------------------------------------- shutdown without a log
def test_sigterm_without_log_spills_and_exits_3_and_the_spill_replays(
    sink: OtlpSink, tmp_path: Path
) -> None:
    spill = tmp_path / "spill.jsonl"
    config = storage_config(sink, tmp_path / "unused", shutdown={"spill_path": str(spill)})
    del config["storage"]
    sink.go_down()
    serve = ServeProcess(config, tmp_path)
    requests = make_requests(30, 10, tag=4)
    sender = Sender(serve.endpoints["otlp_http"], requests, spans_per_s=0)
    try:
        sender.run()
        assert len(sender.acked) == 300
        started = time.monotonic()
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 3
        assert time.monotonic() - started < 20
    finally:
        serve.kill()
    done = serve.event("shutdown_complete")
    assert done is not None
    assert done["spans_dropped"] == 300
    spilled = serve.event("spans_spilled")
    assert spilled is not None
    assert spilled["spans"] == 300
    assert spilled["path"] == str(spill)

    sink.come_up()
    cfg = collector_config(sink=sink, **passthrough_sections())
    with running_collector(cfg) as collector:
        addr = collector.svc.http_address
        assert addr is not None
        result = subprocess.run(
            [str(COLLECTOR), "replay", str(spill), "--endpoint", f"http://{addr[0]}:{addr[1]}"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )
        assert result.returncode == 0, result.stderr
        assert "300 spans" in result.stdout
        got = wait_delivered(sink, set(sender.acked), timeout=30)
    assert len(got) == 300
    assert max(got.values()) == 1


# ------------------------------------------------------------ settlement
def test_an_entry_stays_until_every_exporter_delivered(tmp_path: Path) -> None:
    """Two exporters, one backend down: the log keeps the entries (and a restart
    replays them) until the second exporter delivered too; then segments go."""
    wal = tmp_path / "wal"
    requests = make_requests(10, 50, tag=5)
    wanted = {i for _, ids in requests for i in ids}
    with OtlpSink() as up, OtlpSink() as down:
        down.go_down()
        cfg = collector_config(
            exporters={"up": sink_exporter(up), "down": sink_exporter(down)},
            storage={"directory": str(wal)},
            shutdown={"flush_timeout": "500ms"},
            **passthrough_sections(),
        )
        with running_collector(cfg) as collector:
            addr = collector.svc.http_address
            assert addr is not None
            sender = Sender(f"{addr[0]}:{addr[1]}", requests, 0)
            sender.run()
            assert set(sender.acked) == wanted
            wait_delivered(up, wanted, timeout=30)
            storage = collector.svc.storage
            assert storage is not None
            time.sleep(0.5)
            assert collector.call(lambda: storage.unsettled_entries) == 10
        assert segments(wal)  # stopped with "down" still owed every span

        down.come_up()
        with running_collector(cfg) as collector:
            got = wait_delivered(down, wanted, timeout=30)
            storage = collector.svc.storage
            assert storage is not None
            wait_for(lambda: collector.call(lambda: storage.unsettled_entries) == 0)
            wait_for(lambda: not segments(wal), what="settled segments deleted")
        assert max(got.values()) == 1
        # "up" got the replayed spans again: at-least-once, duplicates counted.
        assert set(received_ids(up).values()) == {2}


@pytest.mark.parametrize("fsync", ["never", "batch", "always"])
def test_every_fsync_policy_writes_before_acknowledging(tmp_path: Path, fsync: str) -> None:
    """Whatever the policy, a resolved append is on disk (in the OS at least) with its
    sequence number, in order; the ledger settles it; a reopened log finds it."""
    config = StorageConfig.model_validate({"directory": str(tmp_path), "fsync": fsync})
    admitted: list[int] = []

    async def run() -> list[int]:
        storage = Storage(config)
        await storage.start()
        seqs: list[int] = []

        def tag(seq: int) -> int:
            seqs.append(seq)
            return 0  # nothing to deliver: settled at once

        await asyncio.gather(
            *(
                storage.append(bytes([n]) * 1000, tag=tag, admit=lambda: admitted.append(1))
                for n in range(50)
            )
        )
        wal = storage._wal  # what is on disk now, before close
        on_disk = [seq for seg in wal.segments for seq, _ in wal.records(seg)]
        assert storage.unsettled_entries == 0
        await storage.close()
        assert on_disk == seqs
        return seqs

    seqs = asyncio.run(run())
    assert seqs == list(range(1, 51))
    assert len(admitted) == 50
    reopened = WriteAheadLog(tmp_path, segment_size=1 << 20, fsync="never")
    reopened.open()
    assert reopened.checkpoint == 51  # every entry settled: nothing to replay
    assert reopened.next_seq == 51
    reopened.close()


def test_a_write_error_refuses_retryably_reports_permanent_error_and_recovers(
    sink: OtlpSink, tmp_path: Path
) -> None:
    """The disk fails (ENOSPC) under a running collector: the request is refused with a
    retryable answer and nothing is acknowledged, storage is permanent_error and
    /healthz says so; once writes work again, the client's retry is accepted and
    delivered, and storage is ok.  (Fault injection: this runs as root, where a
    read-only directory does not stop writes.)"""
    requests = make_requests(2, 20, tag=7)
    cfg = collector_config(
        sink=sink, storage={"directory": str(tmp_path / "wal")}, **passthrough_sections()
    )
    with running_collector(cfg) as collector:
        storage = collector.svc.storage
        assert storage is not None
        real_append = storage._wal.append
        failing = threading.Event()
        failing.set()

        def append(records: list[tuple[int, bytes]]) -> list[tuple[int, int, int]]:
            if failing.is_set():
                raise OSError(28, "No space left on device")
            return real_append(records)

        storage._wal.append = append  # type: ignore[method-assign]
        addr = collector.svc.http_address
        assert addr is not None
        sender = Sender(f"{addr[0]}:{addr[1]}", requests, 0)
        sender.start()
        wait_for(lambda: sender.refused >= 2, what="refusals while the disk fails")
        assert sender.acked == []
        assert collector.call(lambda: storage.status.value) == "permanent_error"
        code, body = http_get(f"{collector.admin_url}/healthz")
        assert code == 503
        assert b"No space left on device" in body
        failing.clear()
        wanted = _all_acknowledged(sender, requests, timeout=30)
        wait_delivered(sink, wanted, timeout=30)
        wait_for(lambda: collector.call(lambda: storage.status.value) == "ok", what="storage ok")
        assert http_get(f"{collector.admin_url}/healthz")[0] == 200
