"""Fuzzing the receivers with hypothesis: no crash, a correct status, still healthy."""

from __future__ import annotations

import gzip
import http.client
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.fakes.harness import CollectorThread, collector_config, http_get, running_collector
from tests.fakes.otlp_data import make_request, rag_trace
from tests.fakes.otlp_sink import OtlpSink

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def collector() -> Iterator[CollectorThread]:
    with OtlpSink() as sink:
        config = collector_config(
            sink=sink,
            receivers={"http": {"max_request_bytes": 256 * 1024}},
            assembly={"decision_wait": 0, "max_trace_wait": 1},
        )
        with running_collector(config) as c:
            yield c


class _Client:
    """One keep-alive HTTP connection to the receiver."""

    def __init__(self, collector: CollectorThread) -> None:
        host, port = collector.svc.http_address or ("", 0)
        self._conn = http.client.HTTPConnection(host, port, timeout=10)

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        self._conn.request("POST", "/v1/traces", body=body, headers=headers)
        resp = self._conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()


@pytest.fixture(scope="module")
def client(collector: CollectorThread) -> _Client:
    return _Client(collector)


def _still_healthy(collector: CollectorThread) -> None:
    assert http_get(collector.admin_url + "/healthz")[0] == 200
    assert http_get(collector.admin_url + "/readyz")[0] == 200
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        answer = channel.unary_unary(EXPORT)(
            make_request(rag_trace()).SerializeToString(), timeout=10
        )
    assert ExportTraceServiceResponse.FromString(answer) is not None


def _parses(body: bytes) -> bool:
    """Whether ``body`` is a valid message (the oracle: protobuf itself)."""
    try:
        ExportTraceServiceRequest.FromString(body)
    except Exception:
        return False
    return True


def _valid_request_bytes() -> bytes:
    return bytes(make_request(rag_trace(children=3)).SerializeToString())


def _mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    buf = bytearray(data)
    for pos, value in edits:
        if buf:
            buf[pos % len(buf)] = value
    return bytes(buf)


_edits = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8)


@FUZZ
@given(
    body=st.one_of(
        st.binary(max_size=2048), _edits.map(lambda e: _mutate(_valid_request_bytes(), e))
    )
)
def test_http_protobuf_fuzz(client: _Client, body: bytes) -> None:
    status, content_type, resp = client.post(body, {"Content-Type": "application/x-protobuf"})
    assert status == (200 if _parses(body) else 400), (status, resp)
    assert content_type.startswith("application/x-protobuf")


@FUZZ
@given(
    body=st.binary(max_size=1024),
    truncate=st.integers(0, 64),
)
def test_http_gzip_fuzz(client: _Client, body: bytes, truncate: int) -> None:
    compressed = gzip.compress(body)
    compressed = compressed[: max(0, len(compressed) - truncate)]
    status, _, _ = client.post(
        compressed, {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    )
    assert status in (200, 400)


_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "resourceSpans",
                    "scopeSpans",
                    "spans",
                    "traceId",
                    "spanId",
                    "parentSpanId",
                    "name",
                    "kind",
                    "attributes",
                    "key",
                    "value",
                    "stringValue",
                    "intValue",
                    "links",
                    "events",
                    "status",
                    "code",
                    "resource",
                    "scope",
                    "startTimeUnixNano",
                ]
            )
            | st.text(max_size=8),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=30,
)


def _otlp_shaped(draw_value: Any) -> dict[str, Any]:
    return {"resourceSpans": [{"scopeSpans": [{"spans": [draw_value]}]}]}


@FUZZ
@given(
    doc=st.one_of(_json, _json.map(_otlp_shaped)),
    raw=st.one_of(st.none(), st.binary(max_size=256)),
)
def test_http_json_fuzz(client: _Client, doc: Any, raw: bytes | None) -> None:
    body = raw if raw is not None else json.dumps(doc).encode()
    status, content_type, resp = client.post(body, {"Content-Type": "application/json"})
    assert status in (200, 400), (status, resp)
    assert content_type.startswith("application/json")
    answer = json.loads(resp)
    if status == 400:
        assert answer["code"] == 3
        assert answer["message"]


@FUZZ
@given(
    body=st.one_of(
        st.binary(max_size=2048), _edits.map(lambda e: _mutate(_valid_request_bytes(), e))
    )
)
def test_grpc_raw_bytes_fuzz(collector: CollectorThread, body: bytes) -> None:
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        call = channel.unary_unary(EXPORT)
        outcome = call.with_call(body, timeout=10)[1] if _parses(body) else None
        if outcome is not None:
            assert outcome.code() is grpc.StatusCode.OK
            return
        with pytest.raises(grpc.RpcError) as err:
            call(body, timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value
        assert err.value.details()


def test_still_healthy_after_fuzzing(collector: CollectorThread) -> None:
    # Runs after the fuzz tests in this module (file order; tests/conftest.py keeps the
    # module on one xdist worker).
    _still_healthy(collector)
    rejected = collector.metric(
        "ragtrace_requests_rejected_total", {"receiver": "otlp_http", "reason": "malformed"}
    )
    assert rejected > 0
