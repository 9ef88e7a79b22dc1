"""Every exporter builds (copies every span into) its request off the event loop.

Copying and serialising a large batch holds the interpreter in C code for as long as
the batch is big; on the loop that stalls every connection and ``/healthz``.  The
request builder of each exporter module is wrapped to record the thread it ran on.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters import build_exporter
from ragtrace_collector.exporters.config import (
    FileExporterConfig,
    OtlpGrpcExporterConfig,
    OtlpHttpExporterConfig,
    PhoenixExporterConfig,
)
from ragtrace_collector.otlp.codec import SpanGroup, build_request
from tests.fakes.otlp_data import make_request, rag_trace

KINDS: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "otlp_http": (
        "otlp_http",
        OtlpHttpExporterConfig,
        {"type": "otlp_http", "endpoint": "http://127.0.0.1:9"},
    ),
    "otlp_grpc": (
        "otlp_grpc",
        OtlpGrpcExporterConfig,
        {"type": "otlp_grpc", "endpoint": "127.0.0.1:9"},
    ),
    "phoenix": (
        "phoenix",
        PhoenixExporterConfig,
        {"type": "phoenix", "endpoint": "http://127.0.0.1:9"},
    ),
    "file": ("file", FileExporterConfig, {"type": "file", "path": "PLACEHOLDER"}),
}


def _groups() -> list[SpanGroup]:
    request = make_request(rag_trace(children=3))
    rs = request.resource_spans[0]
    ss = rs.scope_spans[0]
    return [SpanGroup(rs.resource, "", ss.scope, "", list(ss.spans))]


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_the_request_is_built_off_the_event_loop(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_name, config_type, data = KINDS[kind]
    if kind == "file":
        data = {**data, "path": str(tmp_path / "spans.jsonl")}
    module = importlib.import_module(f"ragtrace_collector.exporters.{module_name}")
    threads: list[int] = []

    def recording(groups: Any) -> Any:
        threads.append(threading.get_ident())
        return build_request(groups)

    monkeypatch.setattr(module, "build_request", recording)
    exporter = build_exporter("x", config_type.model_validate(data), Telemetry())
    payload = await exporter._prepare(_groups())
    assert payload, "the exporter encoded nothing"
    assert threads, f"{kind}: build_request was not called through its module"
    assert threading.get_ident() not in threads, f"{kind} built its request on the loop"
