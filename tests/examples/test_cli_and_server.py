"""The command line (as a subprocess, exporting to a real OTLP/HTTP endpoint on loopback)
and the HTTP front end (a real server on a free port)."""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from examples.support_bot import FaultMode, SupportBot
from examples.support_bot.server import SupportBotServer
from ragtrace import semconv as sc

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGTRACE_", "OTEL_"))}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONPATH=str(ROOT), **extra)
    return env


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "examples.support_bot", *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


# ------------------------------------------------------------------ CLI
def test_cli_golden_reports_id_recall_and_the_fault_lowers_it() -> None:
    healthy = _cli("--no-tracing", "golden", "--json")
    assert healthy.returncode == 0, healthy.stderr
    records = _json_lines(healthy.stdout)
    summary = records[-1]
    assert summary["summary"] is True
    assert summary["questions"] == 30 == len(records) - 1
    assert summary["id_recall"] == 1.0

    broken = _cli("golden", "--json", "--no-tracing", "--fault", "wrong_index")
    assert broken.returncode == 0, broken.stderr
    assert _json_lines(broken.stdout)[-1]["id_recall"] < 0.5

    from_env = _cli(
        "--no-tracing", "--json", "golden", "--count", "4", RAGTRACE_EXAMPLE_FAULT="drop_top"
    )
    assert from_env.returncode == 0, from_env.stderr
    lines = _json_lines(from_env.stdout)
    assert len(lines) == 5
    assert all(line["fault"] == "drop_top" for line in lines)


def test_cli_rejects_an_unknown_fault() -> None:
    result = _cli("--fault", "melted", "ask", "hello")
    assert result.returncode == 2
    assert "unknown fault mode 'melted'" in result.stderr
    assert "wrong_index" in result.stderr


def test_cli_conversations_and_traffic() -> None:
    conv = _cli("--no-tracing", "conversations", "--count", "2", "--json")
    assert conv.returncode == 0, conv.stderr
    turns = _json_lines(conv.stdout)
    assert len({t["session_id"] for t in turns}) == 2
    assert [t["turn"] for t in turns if t["session_id"] == turns[0]["session_id"]] == [0, 1, 2, 3]

    traffic = _cli(
        "--no-tracing", "--json", "traffic", "--rounds", "10", "--interval", "0",
        "--conversation-every", "5", "--fault-after", "0",
    )  # fmt: skip
    assert traffic.returncode == 0, traffic.stderr
    stats = _json_lines(traffic.stdout)[-1]
    assert stats["errors"] == 0
    assert stats["conversations"] == 2
    assert stats["canary"] == 5
    assert stats["requests"] == 10 + 4 + 4  # the first two scripts have 4 turns each
    assert "switching retrieval fault on: wrong_index" in traffic.stderr


class _OtlpSink:
    """A minimal OTLP/HTTP traces endpoint: decodes and keeps every exported span."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with sink.lock:
                    for rs in request.resource_spans:
                        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            for span in ss.spans:
                                span_attrs = {a.key: _value(a.value) for a in span.attributes}
                                sink.spans.append((resource, span_attrs))
                payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def otlp_sink() -> Iterator[_OtlpSink]:
    sink = _OtlpSink()
    sink.thread.start()
    try:
        yield sink
    finally:
        sink.httpd.shutdown()
        sink.httpd.server_close()


def test_cli_exports_spans_over_otlp(otlp_sink: _OtlpSink) -> None:
    result = _cli("golden", "--count", "2", OTEL_EXPORTER_OTLP_ENDPOINT=otlp_sink.url)
    assert result.returncode == 0, result.stderr
    # ragtrace.shutdown() at exit flushed every span before the process ended.
    rag = [(r, a) for r, a in otlp_sink.spans if a.get(sc.RAGTRACE_SPAN_KIND) == sc.KIND_RAG]
    assert len(rag) == 2
    assert len(otlp_sink.spans) == 8
    for resource, span_attrs in rag:
        assert resource["service.name"] == "support-bot"
        assert json.loads(span_attrs[sc.REFERENCE_CONTEXT_IDS])
        assert span_attrs[sc.EXPECTED_OUTPUT]


# ---------------------------------------------------------------- server
@pytest.fixture
def server() -> Iterator[SupportBotServer]:
    srv = SupportBotServer(SupportBot(fault="none"), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        thread.join(timeout=10)


def _call(srv: SupportBotServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    request = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    text = raw.decode()
    return status, json.loads(text) if text.startswith("{") else text


def test_server_answers_and_switches_faults(server: SupportBotServer) -> None:
    assert _call(server, "GET", "/healthz") == (200, "ok")
    status, body = _call(server, "POST", "/ask", {"question": "Do you ship to Australia?"})
    assert status == 200
    assert body["contexts"][0]["id"] == "kb-shipping-003"
    assert "Australia" in body["answer"]
    assert body["fault"] == "none"

    assert _call(server, "POST", "/fault", {"mode": "wrong_index"}) == (
        200,
        {"fault": "wrong_index"},
    )
    assert server.bot.fault is FaultMode.WRONG_INDEX
    status, body = _call(server, "POST", "/ask", {"question": "Do you ship to Australia?"})
    assert status == 200
    assert "kb-shipping-003" not in [c["id"] for c in body["contexts"]]
    assert _call(server, "GET", "/fault") == (200, {"fault": "wrong_index"})
    assert _call(server, "POST", "/fault", {"mode": "none"})[1] == {"fault": "none"}


def test_server_rejects_bad_requests_clearly(server: SupportBotServer) -> None:
    status, body = _call(server, "POST", "/ask", b"{not json")
    assert (status, body["error"]) == (400, "body is not valid JSON")
    status, body = _call(server, "POST", "/ask", {"question": ""})
    assert status == 400
    assert "question" in body["error"]
    status, body = _call(server, "POST", "/fault", {"mode": "melted"})
    assert status == 400
    assert "choose one of" in body["error"]
    assert server.bot.fault is FaultMode.NONE
    assert _call(server, "GET", "/nowhere")[0] == 404
    assert _call(server, "POST", "/nowhere", {})[0] == 404


def test_server_sessions_number_their_turns(server: SupportBotServer) -> None:
    from tests.examples.conftest import SpanRecorder, attrs

    recorder = SpanRecorder()
    for question in (
        "My Orla Cam 2 keeps going offline.",
        "I replaced my router. Does that matter?",
    ):
        status, _ = _call(
            server, "POST", "/ask", {"question": question, "session_id": "web-1", "user_id": "u-9"}
        )
        assert status == 200
    turns = [attrs(s) for s in recorder.of_kind(sc.KIND_RAG)]
    assert [t[sc.TURN_INDEX] for t in turns] == [0, 1]
    assert {t[sc.SESSION_ID] for t in turns} == {"web-1"}
    assert {t[sc.USER_ID] for t in turns} == {"u-9"}
    # The follow-up was retrieved with the previous turn as context.
    [*_, follow_up] = recorder.of_kind(sc.KIND_RETRIEVER)
    assert "Cam 2" in str(attrs(follow_up)[sc.GEN_AI_RETRIEVAL_QUERY_TEXT])


def test_cli_serve_answers_then_exits_cleanly_on_sigterm(otlp_sink: _OtlpSink) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.support_bot", "serve", "--port", "0",
         "--traffic", "--interval", "0.05"],
        cwd=ROOT,
        env=_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_sink.url),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    stderr = proc.stderr

    def pump() -> None:
        for line in stderr:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        port = None
        while port is None:
            line = lines.get(timeout=60)
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(found.group(1)) if found else None
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=30) as response:
            assert response.read() == b"ok"
        request = urllib.request.Request(
            f"{base}/ask", data=json.dumps({"question": "Do you ship to Australia?"}).encode()
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["contexts"][0]["id"] == "kb-shipping-003"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    # Spans were flushed on the way out, including the request we made.
    inputs = [
        a.get(sc.INPUT_VALUE)
        for _, a in otlp_sink.spans
        if a.get(sc.RAGTRACE_SPAN_KIND) == sc.KIND_RAG
    ]
    assert "Do you ship to Australia?" in inputs
