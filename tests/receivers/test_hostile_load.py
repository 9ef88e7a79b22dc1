"""Hostile clients against a real ``ragtrace-collector serve`` process, on loopback.

* While each hostile request is in flight (a body of empty gzip members, a 15 MB RAG
  trace with ground truth, a 100k-span trace, a 10 MB judge answer), ``/healthz``
  answers every probe and a normal export is accepted.  Latency is the benchmark's
  business (``benchmarks/hostile_load.py``); these tests assert completion and
  statuses.
* Slow clients: a connection that sends no complete request head within
  ``read_header_timeout`` is closed; an idle keep-alive connection is closed after
  ``keepalive_timeout``; connections past ``max_connections`` get a 503 and are
  closed, and the collector serves again once one closes.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.service.server import SWITCH_INTERVAL_S
from tests.e2e._support import (
    JUDGE_KEY_ENV,
    JudgeServer,
    Serve,
    assert_errored,
    assert_scored,
    judge_task,
    llm_judge,
    serve_config,
)
from tests.fakes.hostile import (
    PROTOBUF,
    LoadOutcome,
    big_rag_trace,
    gzip_members_body,
    huge_judge_reply,
    normal_export,
    post,
    small_rag_trace,
    under_load,
    wide_trace,
)
from tests.fakes.openai_server import RecordedRequest, Reply
from tests.fakes.otlp_data import make_request, rag_trace
from tests.fakes.otlp_sink import OtlpSink


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


def _serve(sink: OtlpSink, tmp_path: Path, **sections: Any) -> Serve:
    """The collector, exporting over OTLP/HTTP (the sink takes large requests there)."""
    exporter = {
        "type": "otlp_http",
        "endpoint": sink.http_url,
        "retry": {"initial_interval": "50ms", "max_interval": "300ms"},
    }
    config = serve_config(sink, exporters={"backend": exporter}, **sections)
    return Serve(config, tmp_path, env={JUDGE_KEY_ENV: "sk-test"})


def _http_receiver(**options: Any) -> dict[str, Any]:
    """A ``receivers`` section: both on free ports, the HTTP one with ``options``."""
    return {
        "grpc": {"endpoint": "127.0.0.1:0"},
        "http": {"endpoint": "127.0.0.1:0", **options},
    }


def _traces(collector: Serve) -> str:
    return f"{collector.http_url}/v1/traces"


def _healthz(collector: Serve) -> str:
    return f"http://{collector.endpoints['admin']}/healthz"


def _assert_served(outcome: LoadOutcome) -> None:
    assert outcome.normal.status == 200, outcome.normal
    assert outcome.probes, "no probe was made"
    assert {p.status for p in outcome.probes} == {200}, outcome.probes


def test_gzip_of_many_empty_members_is_refused_and_nothing_stalls(
    sink: OtlpSink, tmp_path: Path
) -> None:
    collector = _serve(sink, tmp_path)
    try:
        body = gzip_members_body(8 * 1024 * 1024)
        outcome = under_load(
            http_url=_traces(collector),
            healthz_url=_healthz(collector),
            body=body,
            headers={**PROTOBUF, "Content-Encoding": "gzip"},
        )
        assert outcome.hostile.status in (400, 413)
        _assert_served(outcome)
        sink.wait_for_spans(2)
        # A gzip body of a few members is still fine.
        few = b"".join(
            gzip.compress(part) for part in (make_request(rag_trace()).SerializeToString(), b"")
        )
        ok = post(_traces(collector), few, {**PROTOBUF, "Content-Encoding": "gzip"})
        assert ok.status == 200
    finally:
        collector.kill()


def test_a_100k_span_trace_does_not_stall_the_collector(sink: OtlpSink, tmp_path: Path) -> None:
    collector = _serve(sink, tmp_path)
    try:
        body = wide_trace(100_000).SerializeToString()
        outcome = under_load(
            http_url=_traces(collector),
            healthz_url=_healthz(collector),
            body=body,
            headers=PROTOBUF,
            settle=lambda: sink.wait_until(lambda: sink.span_count >= 100_000, timeout=120),
        )
        assert outcome.hostile.status == 200
        _assert_served(outcome)
    finally:
        collector.kill()


def test_a_15mb_rag_trace_with_ground_truth_does_not_stall_the_collector(
    sink: OtlpSink, tmp_path: Path
) -> None:
    collector = _serve(sink, tmp_path)
    try:
        body = big_rag_trace(15 * 1000 * 1000).SerializeToString()
        outcome = under_load(
            http_url=_traces(collector),
            healthz_url=_healthz(collector),
            body=body,
            headers=PROTOBUF,
            settle=lambda: sink.wait_until(
                lambda: any(s.span.name == "rag" for s in sink.spans), timeout=120
            ),
        )
        assert outcome.hostile.status == 200
        _assert_served(outcome)
    finally:
        collector.kill()


@pytest.mark.slow
def test_a_10mb_judge_answer_does_not_stall_the_collector(sink: OtlpSink, tmp_path: Path) -> None:
    huge = huge_judge_reply(10 * 1000 * 1000)

    def answer(request: RecordedRequest) -> Reply:
        """10 MB for contextual_recall's task; a valid answer for contextual_precision's."""
        if judge_task(request.body) == "attribution":
            return huge(request)
        verdicts = [{"node": n, "verdict": "yes", "reason": "useful"} for n in (1, 2)]
        return Reply.json({"verdicts": verdicts, "reason": "both useful"})

    judge = JudgeServer(answer).start()
    collector = _serve(
        sink,
        tmp_path,
        judge=llm_judge(judge, max_retries=2),
        metrics={"contextual_recall": {}, "contextual_precision": {}},
    )
    try:
        outcome = under_load(
            http_url=_traces(collector),
            healthz_url=_healthz(collector),
            body=small_rag_trace().SerializeToString(),
            headers=PROTOBUF,
            settle=lambda: sink.wait_until(
                lambda: any(s.span.name == "rag" for s in sink.spans), timeout=120
            ),
        )
        assert outcome.hostile.status == 200
        _assert_served(outcome)
        # The 10 MB answer was refused unread, once (not retried): a clear error on
        # its metric, while the other metric's answer is taken and scored.
        assert judge.request_count == 2
        (rag,) = [s for s in sink.spans if s.span.name == "rag"]
        error = assert_errored(rag, "contextual_recall")
        assert error.startswith("invalid_response:"), error
        assert "refused unread" in error
        assert_scored(rag, "contextual_precision", 1.0)
    finally:
        collector.kill()
        judge.stop()


# ---------------------------------------------------------------- slow clients
def _connect(collector: Serve) -> socket.socket:
    host, _, port = collector.endpoints["otlp_http"].rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing, or None if it kept the socket open."""
    sock.settimeout(0.2)
    received = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received
        if not data:
            return received
        received += data
    return None


def _request_head(length: int) -> bytes:
    return (
        b"POST /v1/traces HTTP/1.1\r\nHost: collector\r\n"
        b"Content-Type: application/x-protobuf\r\n"
        b"Content-Length: " + str(length).encode() + b"\r\n\r\n"
    )


def test_connections_without_a_complete_request_head_are_closed(
    sink: OtlpSink, tmp_path: Path
) -> None:
    collector = _serve(sink, tmp_path, receivers=_http_receiver(read_header_timeout=1))
    try:
        idle = [_connect(collector) for _ in range(20)]
        partial = [_connect(collector) for _ in range(20)]
        for sock in partial:
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: collector\r\n")
        # Meanwhile a well-behaved client is served, and keeps its connection across
        # requests spaced wider than the header timeout.
        body = normal_export()
        polite = _connect(collector)
        for _ in range(2):
            polite.sendall(_request_head(len(body)) + body)
            polite.settimeout(10)
            assert polite.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(1.5)
        for sock in idle + partial:
            assert _closed_within(sock, 10) is not None, "a slow connection was kept open"
            sock.close()
        polite.sendall(_request_head(len(body)) + body)
        assert polite.recv(65536).startswith(b"HTTP/1.1 200")
        polite.close()
        rejected = collector.scrape()
        assert (
            rejected[
                (
                    "ragtrace_requests_rejected_total",
                    (("reason", "header_timeout"), ("receiver", "otlp_http")),
                )
            ]
            >= 40
        )
    finally:
        collector.kill()


def test_idle_keepalive_connections_are_closed(sink: OtlpSink, tmp_path: Path) -> None:
    collector = _serve(sink, tmp_path, receivers=_http_receiver(keepalive_timeout=1))
    try:
        body = normal_export()
        sock = _connect(collector)
        sock.sendall(_request_head(len(body)) + body)
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert _closed_within(sock, 10) == b""
        sock.close()
    finally:
        collector.kill()


def test_connections_over_the_cap_get_503_and_are_closed(sink: OtlpSink, tmp_path: Path) -> None:
    collector = _serve(sink, tmp_path, receivers=_http_receiver(max_connections=5))
    try:
        held = [_connect(collector) for _ in range(5)]
        time.sleep(0.3)  # the collector has accepted them all
        extra = _connect(collector)
        answer = _closed_within(extra, 10)
        assert answer is not None
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"Retry-After: 1" in answer
        extra.close()
        # A held connection is served normally.
        body = normal_export()
        held[0].sendall(_request_head(len(body)) + body)
        held[0].settimeout(10)
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200")
        # Once one closes, a new client gets in.
        held.pop().close()
        time.sleep(0.3)
        assert post(_traces(collector), body, PROTOBUF).status == 200
        for sock in held:
            sock.close()
    finally:
        collector.kill()


_FREEZE_PROBE = """
import asyncio, gc, json, sys
from ragtrace_collector.service.pipeline import PassThroughProcessor
from ragtrace_collector.service.server import CollectorService
from tests.fakes.harness import collector_config

async def main():
    config = collector_config(exporters={"b": {"type": "file", "path": "/dev/null"}})
    service = CollectorService(config, processor=PassThroughProcessor())
    await service.start()
    try:
        counts = {
            "frozen": gc.get_freeze_count(),
            "tracked": len(gc.get_objects()),
            "switch": sys.getswitchinterval(),
        }
        print("GC " + json.dumps(counts))
    finally:
        await service.stop()

asyncio.run(main())
"""


def test_serve_freezes_the_start_up_heap_and_shortens_the_switch_interval() -> None:
    # A full collection walks every object the GC tracks, holding the interpreter lock:
    # with the imported modules' ~400k objects that stalled the event loop for ~0.3 s
    # whenever one large request's spans triggered it.  A fresh process, so that no
    # earlier test has frozen this one's heap.
    done = subprocess.run(
        [sys.executable, "-c", _FREEZE_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("GC "))
    counts = json.loads(line[3:])
    assert counts["frozen"] > 50_000, counts
    # What a collection still walks is what serving made since, a small fraction.
    assert counts["tracked"] < counts["frozen"] / 10, counts
    # Threads hand the interpreter lock back to the event loop every millisecond.
    assert counts["switch"] == pytest.approx(SWITCH_INTERVAL_S), counts
