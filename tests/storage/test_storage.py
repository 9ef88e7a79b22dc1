"""The write-ahead log: acknowledged spans survive kill -9, a torn tail, a full log, a lock.

And, without a log, a shutdown with a dead backend: bounded, exit 3, the loss counted,
the spill file written and replayed with ``ragtrace-collector replay``.

Every collector here is a real ``ragtrace-collector serve`` process (or the service in
a thread where noted) on loopback, and the backend is the real OTLP sink of the tests.
"""

from __future__ import annotations

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

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ragtrace_collector.storage.wal import WriteAheadLog
from tests.fakes.harness import (
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

_HEAD = struct.Struct("<4sBBHIQI")  # marker, kind, flags, reserved, length, seq, crc (wal.py)
_HEADER_SIZE = _HEAD.size + 8  # and the header's keyed tag
_MAGIC_LEN = 8 + 2 * (16 + 4)  # the segment header: magic, key and CRC twice


def record_spans(data: bytes) -> list[tuple[int, int, bytes]]:
    """(offset, seq, payload) of each record of a segment file's bytes, read by the
    documented format (a test-side reader, independent of wal.py)."""
    offset, out = _MAGIC_LEN, []
    while offset + _HEADER_SIZE <= len(data):
        _mark, _kind, _flags, _res, length, seq, _crc = _HEAD.unpack_from(data, offset)
        body = offset + _HEADER_SIZE
        out.append((offset, seq, data[body : body + length]))
        offset = body + length
    return out


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


# ------------------------------------------------------------------ load
def make_requests(
    count: int, spans: int, *, tag: int, pad: int = 4
) -> list[tuple[bytes, list[str]]]:
    """``count`` OTLP requests of ``spans`` spans (10 per trace, roots included), each
    with its span ids (hex).  Every id is unique across ``tag`` values.  ``pad``: how
    many times each span's 20-odd-byte query attribute is repeated."""
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
            attr.key, attr.value.string_value = "retrieval.query", f"question {r}-{i} " * pad
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
    torn_at, _, torn_payload = record_spans(last.read_bytes())[-1]
    torn_ids = span_ids(torn_payload)
    assert len(torn_ids) == 100
    with open(last, "r+b") as fh:
        fh.truncate(torn_at + _HEADER_SIZE + len(torn_payload) // 2)

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


def span_ids(payload: bytes) -> set[str]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(payload)
    return {
        s.span_id.hex() for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans
    }


@pytest.mark.slow
def test_kill_9_with_a_flipped_byte_in_two_segments_loses_only_those_records(
    sink: OtlpSink, tmp_path: Path
) -> None:
    """The issue's scenario: 120 spans acknowledged (60 requests of 2), backend down,
    kill -9; a byte flipped in the middle of an older segment (a payload byte) and of
    the newest one (a header byte).  After a restart with the backend up, the 4 spans
    of the two damaged records are lost, counted and logged with segment and offset;
    the other 116 are delivered once each, and no file is truncated."""
    wal = tmp_path / "wal"
    config = storage_config(sink, wal, storage={"max_size": "1MiB"})  # 128 KiB segments
    sink.go_down()
    serve = ServeProcess(config, tmp_path)
    requests = make_requests(60, 2, tag=8, pad=120)  # about 4.5 KB each: two segments
    sender = Sender(serve.endpoints["otlp_http"], requests, spans_per_s=0)
    sender.run()
    serve.proc.send_signal(signal.SIGKILL)
    serve.kill()
    acked = set(sender.acked)
    assert len(acked) == 120
    files = segments(wal)
    assert len(files) == 2
    damaged: set[str] = set()
    expected_events = []
    for path, shift in ((files[0], _HEADER_SIZE + 1500), (files[1], 9)):
        records = record_spans(path.read_bytes())
        offset, _, payload = records[len(records) // 2]
        damaged |= span_ids(payload)
        data = bytearray(path.read_bytes())
        data[offset + shift] ^= 0xFF
        path.write_bytes(bytes(data))
        expected_events.append((path.name, offset))
    sizes = {p.name: p.stat().st_size for p in files}
    assert len(damaged) == 4

    sink.come_up()
    restarted = ServeProcess(config, tmp_path)
    try:
        got = wait_delivered(sink, acked - damaged, timeout=60)
        skipped = restarted.metric("ragtrace_wal_records_skipped_total", {"reason": "corrupt"})
        assert {p.name: p.stat().st_size for p in files if p.exists()}.items() <= sizes.items()
        assert stop(restarted) == 0
    finally:
        restarted.kill()
    events = [
        (e["segment"], e["offset"])
        for e in restarted.events
        if e.get("event") == "wal_corrupt_record"
    ]
    figure = {
        "acknowledged": len(acked),
        "in_damaged_records": len(damaged),
        "delivered": len(got.keys() & acked),
        "lost_beyond_damaged": len(acked - damaged - got.keys()),
        "duplicates": sum(n - 1 for n in got.values()),
        "skipped_records_counted": skipped,
    }
    print("\nkill -9 + flipped bytes figure:", json.dumps(figure))
    assert figure["delivered"] == 116
    assert not (got.keys() & damaged)
    assert figure["duplicates"] == 0
    assert skipped == 2
    assert sorted(events) == sorted(expected_events)
    assert restarted.event("wal_torn_tail") is None


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
        # Readiness reads the same predicate as admission: not ready while refusing.
        code, body = http_get(f"http://{serve.endpoints['admin']}/readyz")
        assert code == 503
        assert b"storage_full" in body
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
        assert http_get(f"http://{serve.endpoints['admin']}/readyz")[0] == 200
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
        # Refused by the checks check-config runs, before anything starts: exit 2.
        assert second.wait(60) == 2
        failed = second.event("startup_failed")
        assert failed is not None
        (problem,) = failed["problems"]
        assert f"storage.directory: {wal} is in use by another collector" in problem
        assert f"pid {first.proc.pid}" in problem
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
        # "up" had delivered them: its delivery marks in the log keep the replay from
        # sending them there again.
        assert set(received_ids(up).values()) == {1}


def test_a_full_disk_refuses_with_readiness_and_recovers_without_restart(
    sink: OtlpSink, tmp_path: Path
) -> None:
    """The disk fills up under a running collector: every write fails half-way (a
    short write, then ENOSPC).  Requests are refused with 429 and Retry-After, nothing
    is acknowledged, storage is permanent_error, /healthz and /readyz both say 503;
    the log keeps one segment, its failed writes cut back.  Once space returns both
    probes say 200 again before any request (the writer probes the disk), the client's
    retry is accepted and delivered, and a reopened log has nothing to skip."""
    from tests.storage.test_wal import FailingOps

    wal = tmp_path / "wal"
    requests = make_requests(3, 20, tag=7)
    cfg = collector_config(
        sink=sink,
        storage={"directory": str(wal)},
        receivers={"retry_after": "2s"},
        **passthrough_sections(),
    )
    ops = FailingOps()
    with running_collector(cfg) as collector:
        storage = collector.svc.storage
        assert storage is not None
        storage._wal.file_ops = ops
        host, port = collector.svc.http_address or ("", 0)
        Sender(f"{host}:{port}", requests[:1], 0).run()  # a segment with one record
        (segment,) = segments(wal)
        size = segment.stat().st_size
        ops.failing.set()
        conn = http.client.HTTPConnection(host, port, timeout=30)
        body, _ = requests[1]
        answers = []
        for _ in range(50):
            conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
            answers.append((resp.status, resp.getheader("Retry-After")))
        conn.close()
        assert set(answers) == {(429, "2")}
        with grpc.insecure_channel(collector.grpc_endpoint) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
            )
            with pytest.raises(grpc.RpcError) as refused:
                export(body, timeout=10)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        trailers = dict(refused.value.trailing_metadata() or ())
        assert "google.rpc.retryinfo-bin" in trailers
        assert ops.half_writes >= 1
        assert collector.call(lambda: storage.status.value) == "permanent_error"
        for probe in ("healthz", "readyz"):
            code, text = http_get(f"{collector.admin_url}/{probe}")
            assert code == 503, probe
            assert b"No space left on device" in text
        assert segments(wal) == [segment]
        assert segment.stat().st_size == size  # the failed write was cut back
        assert collector.metric("ragtrace_spans_received_total", {"receiver": "otlp_http"}) == 20

        ops.failing.clear()
        wait_for(lambda: http_get(f"{collector.admin_url}/readyz")[0] == 200, what="ready again")
        assert http_get(f"{collector.admin_url}/healthz")[0] == 200
        sender = Sender(f"{host}:{port}", requests[1:], 0)
        sender.start()
        wanted = _all_acknowledged(sender, requests[1:], timeout=30)
        wait_delivered(sink, wanted, timeout=30)
        assert len(segments(wal)) <= 2
    reopened = WriteAheadLog(wal, segment_size=1 << 20, fsync="never")
    reopened.open()
    for segment in list(reopened.segments):
        list(reopened.records(segment))
    assert reopened.skipped_records == 0
    reopened.close()


@pytest.mark.parametrize("first", ["http", "grpc"])
def test_refusals_for_a_failing_disk_name_no_path_and_no_os_error(
    sink: OtlpSink, tmp_path: Path, capsys: pytest.CaptureFixture[str], first: str
) -> None:
    """The disk fails (short write, then ENOSPC).  The request whose write fails and
    the requests refused after it, over OTLP/HTTP and OTLP/gRPC, are answered with a
    plain message: no directory, no OS error text.  The log line and /readyz (the
    operator's side) keep the detail.  Before, the answer read ``cannot write the
    request durably: cannot write to /tmp/.../wal: [Errno 28] No space left on
    device``."""
    from tests.storage.test_wal import FailingOps

    wal = tmp_path / "wal"
    requests = make_requests(2, 5, tag=9)
    cfg = collector_config(sink=sink, storage={"directory": str(wal)}, **passthrough_sections())
    ops = FailingOps()
    answers: list[bytes] = []

    def over_http(host: str, port: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        for body, _ in requests:
            conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            answers.append(resp.read())
            assert resp.status == 429
        conn.close()

    def over_grpc(endpoint: str) -> None:
        with grpc.insecure_channel(endpoint) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
            )
            for body, _ in requests:
                with pytest.raises(grpc.RpcError) as refused:
                    export(body, timeout=10)
                error: Any = refused.value
                assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                answers.append(str(error.details()).encode())
                answers.extend(
                    v for _, v in error.trailing_metadata() or () if isinstance(v, bytes)
                )

    with running_collector(cfg) as collector:
        storage = collector.svc.storage
        assert storage is not None
        storage._wal.file_ops = ops
        host, port = collector.svc.http_address or ("", 0)
        ops.failing.set()
        if first == "http":
            over_http(host, port)
            over_grpc(collector.grpc_endpoint)
        else:
            over_grpc(collector.grpc_endpoint)
            over_http(host, port)
        assert ops.half_writes >= 1  # the first request's write did fail on the disk
        readyz = http_get(f"{collector.admin_url}/readyz")[1]
        ops.failing.clear()

    assert len(answers) >= 4
    for answer in answers:
        for secret in (str(tmp_path), "/wal", "Errno", "No space left"):
            assert secret.encode() not in answer, (secret, answer)
    assert all(b"write-ahead log" in a for a in answers if b"retry" in a)
    assert b"No space left on device" in readyz  # the operator still sees the detail
    assert "[Errno 28] No space left on device" in capsys.readouterr().out
