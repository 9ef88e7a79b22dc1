"""Receivers over real sockets: encodings, OTLP-correct errors, auth, TLS."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.fakes.harness import (
    App,
    CollectorThread,
    assert_delivered_exactly,
    collector_config,
    emit_rag_request,
    make_app,
    running_collector,
    sink_exporter,
    span_key,
    wait_for,
)
from tests.fakes.otlp_data import make_request, make_span, rag_trace
from tests.fakes.otlp_sink import OtlpSink

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TOKEN = "s3cret-token-for-tests"


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), dict(err.headers), err.read()


def _traces(app: App) -> set[bytes]:
    """The trace ids of what ``app`` emitted (this module's sink is shared by its tests)."""
    return {bytes.fromhex(span_key(span)[0]) for span in app.emitted()}


def status_of(body: bytes, content_type: str) -> status_pb2.Status:
    status = status_pb2.Status()
    if content_type.startswith("application/json"):
        data = json.loads(body)
        status.code = data.get("code", 0)
        status.message = data.get("message", "")
    else:
        status.ParseFromString(body)
    return status


@pytest.fixture(scope="module")
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


@pytest.fixture(scope="module")
def collector(sink: OtlpSink) -> Iterator[CollectorThread]:
    config = collector_config(
        sink=sink,
        receivers={
            "http": {"max_request_bytes": 64 * 1024},
            "grpc": {"max_request_bytes": 64 * 1024},
        },
    )
    with running_collector(config) as c:
        yield c


PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


# ------------------------------------------------------------------ HTTP
def test_http_protobuf_accepts_and_answers_protobuf(
    collector: CollectorThread, sink: OtlpSink
) -> None:
    spans = rag_trace(children=2)
    status, headers, body = post(collector.http_url, make_request(spans).SerializeToString(), PB)
    assert status == 200
    assert headers["Content-Type"] == "application/x-protobuf"
    response = ExportTraceServiceResponse()
    response.ParseFromString(body)
    assert not response.HasField("partial_success")
    sink.wait_for_traces({spans[0].trace_id}, 3)


def test_http_json_with_hex_ids_round_trips_exactly(
    collector: CollectorThread, sink: OtlpSink
) -> None:
    trace_id = bytes.fromhex("5b8efff798038103d269b633813fc60c")
    root_id = bytes.fromhex("eee19b7ec3c1b174")
    child_id = bytes.fromhex("eee19b7ec3c1b173")
    payload = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "json-scope", "version": "0.1"},
                        "spans": [
                            {
                                "traceId": trace_id.hex(),
                                "spanId": child_id.hex(),
                                "parentSpanId": root_id.hex(),
                                "name": "child",
                                "kind": 3,
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [
                                    {"key": "n", "value": {"intValue": "42"}},
                                    {"key": "f", "value": {"doubleValue": 0.5}},
                                    {"key": "b", "value": {"boolValue": True}},
                                    {
                                        "key": "a",
                                        "value": {"arrayValue": {"values": [{"stringValue": "x"}]}},
                                    },
                                ],
                                "links": [
                                    {
                                        "traceId": "0af7651916cd43dd8448eb211c80319c",
                                        "spanId": "b7ad6b7169203331",
                                    }
                                ],
                                "status": {"code": 2, "message": "boom"},
                            },
                            {
                                "traceId": trace_id.hex(),
                                "spanId": root_id.hex(),
                                "name": "root",
                                "kind": "SPAN_KIND_SERVER",
                                "startTimeUnixNano": 1544712660000000000,
                                "endTimeUnixNano": 1544712662000000000,
                            },
                        ],
                    }
                ],
            }
        ]
    }
    status, headers, body = post(collector.http_url, json.dumps(payload).encode(), JS)
    assert status == 200, body
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {}
    got = {r.span.name: r for r in sink.wait_for_traces({trace_id}, 2)}
    child = got["child"].span
    assert child.trace_id == trace_id
    assert child.span_id == child_id
    assert child.parent_span_id == root_id
    assert child.kind == 3
    assert got["root"].span.kind == 2
    assert child.start_time_unix_nano == 1544712660000000000
    assert got["child"].attributes == {"n": 42, "f": 0.5, "b": True, "a": ["x"]}
    assert child.links[0].trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    assert child.status.code == 2
    assert child.status.message == "boom"
    assert got["child"].service_name == "json-svc"
    assert got["child"].scope.version == "0.1"


def test_http_gzip_body_is_accepted(collector: CollectorThread, sink: OtlpSink) -> None:
    spans = rag_trace(children=1)
    body = gzip.compress(make_request(spans).SerializeToString())
    status, _, _ = post(collector.http_url, body, {**PB, "Content-Encoding": "gzip"})
    assert status == 200
    sink.wait_for_traces({spans[0].trace_id}, 2)


@pytest.mark.parametrize(
    ("headers", "body", "want_status", "want_text"),
    [
        (PB, b"\xff\xff\xff\xff garbage", 400, "malformed protobuf"),
        (JS, b'{"resourceSpans": [', 400, "malformed JSON"),
        (
            JS,
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
            400,
            "traceId: expected a hex string, got a string of 2 characters that is not hex",
        ),
        (JS, b'{"resourceSpans": 5}', 400, "resourceSpans: expected array, got number"),
        (JS, b"[1, 2]", 400, "top level must be an object"),
        ({**PB, "Content-Encoding": "gzip"}, b"not gzip at all", 400, "invalid gzip body"),
        # mtime=0: the same bytes, hence the same test id, in every xdist worker
        (
            {**PB, "Content-Encoding": "gzip"},
            gzip.compress(b"x" * 100, mtime=0)[:-9],
            400,
            "truncated gzip",
        ),
        ({**PB, "Content-Encoding": "br"}, b"", 415, "unsupported Content-Encoding"),
        ({"Content-Type": "text/plain"}, b"hello", 415, "unsupported Content-Type"),
        ({}, b"hello", 415, "unsupported Content-Type"),
        (PB, b"\x0a" + b"\x00" * (70 * 1024), 413, "exceeds the limit"),
        (
            {**PB, "Content-Encoding": "gzip"},
            gzip.compress(b"\x00" * (1024 * 1024), mtime=0),
            413,
            "decompressed body exceeds",
        ),
    ],
)
def test_http_bad_input_gets_the_otlp_status_and_a_clear_message(
    collector: CollectorThread,
    headers: dict[str, str],
    body: bytes,
    want_status: int,
    want_text: str,
) -> None:
    status, resp_headers, resp_body = post(collector.http_url, body, headers)
    assert status == want_status
    content_type = resp_headers["Content-Type"]
    # The Status is in the request's encoding (protobuf when the type is unknown).
    want_type = (
        "application/json"
        if headers.get("Content-Type") == "application/json"
        else "application/x-protobuf"
    )
    assert content_type.startswith(want_type)
    message = status_of(resp_body, content_type)
    assert want_text in message.message
    assert message.code == code_pb2.INVALID_ARGUMENT
    # The service keeps serving.
    ok, _, _ = post(collector.http_url, make_request(rag_trace()).SerializeToString(), PB)
    assert ok == 200


#: A value that must never come back in an answer or reach a log line.
SECRET = "sk-live-DO-NOT-ECHO-4242"
_IDS = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174"}


def _json_with(span: dict[str, object], resource: dict[str, object] | None = None) -> bytes:
    rs: dict[str, object] = {"scopeSpans": [{"spans": [{"name": "ok", **_IDS}, span]}]}
    if resource is not None:
        rs["resource"] = resource
    return json.dumps({"resourceSpans": [rs]}).encode()


def _protobuf_with_a_bad_span() -> bytes:
    """A request whose second span's name holds the secret behind an invalid UTF-8 byte."""
    spans = rag_trace(children=1)
    spans[1].name = "#" + SECRET
    body = make_request(spans).SerializeToString()
    return body.replace(b"#" + SECRET.encode(), b"\xff" + SECRET.encode())


_SPAN_PATH = "resourceSpans[0].scopeSpans[0].spans[1]"

#: (body, what the answer must say) for JSON requests that carry the secret.
SECRET_JSON = [
    (
        _json_with({**_IDS, "attributes": [{"key": "k", "value": {"intValue": SECRET}}]}),
        f"{_SPAN_PATH}.attributes[0].value.intValue: expected integer, got a string",
    ),
    (
        _json_with({**_IDS, "attributes": [{"key": SECRET, "value": {"stringValue": 7}}]}),
        f"{_SPAN_PATH}.attributes[0].value.stringValue: expected string, got number",
    ),
    (
        _json_with({**_IDS, "name": {"v": SECRET}}),
        f"{_SPAN_PATH}.name: expected string, got object",
    ),
    (  # the parser alone would take this for an empty value: the attribute lost
        _json_with(
            {
                **_IDS,
                "attributes": [
                    {"key": "a", "value": {"intValue": 1}},
                    {"key": "k", "value": SECRET},
                ],
            }
        ),
        f"{_SPAN_PATH}.attributes[1].value: expected object, got string",
    ),
    (
        _json_with({**_IDS}, {"attributes": [{"key": "k", "value": [SECRET]}]}),
        "resourceSpans[0].resource.attributes[0].value: expected object, got array",
    ),
    (_json_with({**_IDS, "traceId": SECRET}), f"{_SPAN_PATH}.traceId: expected a hex string"),
    (
        _json_with({**_IDS, "attributes": SECRET}),
        f"{_SPAN_PATH}.attributes: expected array, got string",
    ),
    (
        _json_with({**_IDS}, {"attributes": [{"key": "k", "value": {"doubleValue": SECRET}}]}),
        "resourceSpans[0].resource.attributes[0].value.doubleValue: expected number",
    ),
    (
        _json_with({**_IDS, "startTimeUnixNano": SECRET}),
        f"{_SPAN_PATH}.startTimeUnixNano: expected integer",
    ),
    (json.dumps({"resourceSpans": SECRET}).encode(), "resourceSpans: expected array, got string"),
    (b'{"resourceSpans": ["' + SECRET.encode() + b'" oops', "malformed JSON at line 1"),
]


def _assert_not_echoed(answer: str | bytes, capfd: pytest.CaptureFixture[str]) -> None:
    text = answer if isinstance(answer, str) else answer.decode("utf-8", "replace")
    assert "DO-NOT-ECHO" not in text, text
    out, err = capfd.readouterr()
    assert "DO-NOT-ECHO" not in out + err, "the secret reached the logs"
    assert "request_rejected" in out + err  # the logs were captured


@pytest.mark.parametrize(("body", "want"), SECRET_JSON)
def test_a_malformed_json_request_is_described_by_position_never_by_value(
    collector: CollectorThread, capfd: pytest.CaptureFixture[str], body: bytes, want: str
) -> None:
    capfd.readouterr()
    status, headers, answer = post(collector.http_url, body, JS)
    assert status == 400
    message = status_of(answer, headers["Content-Type"]).message
    assert want in message
    _assert_not_echoed(answer, capfd)


def test_a_malformed_protobuf_request_is_described_by_position_never_by_value(
    collector: CollectorThread, capfd: pytest.CaptureFixture[str]
) -> None:
    body = _protobuf_with_a_bad_span()
    capfd.readouterr()
    status, headers, answer = post(collector.http_url, body, PB)
    assert status == 400
    message = status_of(answer, headers["Content-Type"]).message
    assert f"{_SPAN_PATH}: malformed Span (byte " in message
    _assert_not_echoed(answer, capfd)
    with pytest.raises(grpc.RpcError) as err:
        _grpc_call(collector, body)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"{_SPAN_PATH}: malformed Span" in err.value.details()
    _assert_not_echoed(err.value.details(), capfd)
    cut = make_request(rag_trace(children=1)).SerializeToString()[:-3]
    with pytest.raises(grpc.RpcError) as err:
        _grpc_call(collector, cut)
    assert "cut short" in err.value.details()


def test_the_json_worker_process_does_not_echo_either() -> None:
    from ragtrace_collector.otlp.codec import OtlpDecodeError
    from ragtrace_collector.receivers.decode import InflateBudget
    from ragtrace_collector.receivers.jsonworker import JsonWorker

    async def decode(body: bytes) -> str:
        worker = JsonWorker(time_limit=30)
        try:
            await worker.to_protobuf(body, encoding="identity", budget=InflateBudget(1 << 20))
        except OtlpDecodeError as exc:
            return str(exc)
        finally:
            await worker.aclose()
        raise AssertionError("decoded")

    body, want = SECRET_JSON[0]
    message = asyncio.run(decode(body))
    assert want in message
    assert "DO-NOT-ECHO" not in message


#: OTLP/JSON bodies, each wrong in another way, all carrying the secret where they can.
BAD_JSON_BODIES = [
    pytest.param(_json_with({**_IDS, "traceId": SECRET}), id="trace-id-not-hex"),
    pytest.param(_json_with({**_IDS, "traceId": "abc"}), id="trace-id-odd-length"),
    pytest.param(_json_with({**_IDS, "traceId": 12}), id="trace-id-a-number"),
    pytest.param(
        _json_with({**_IDS, "links": [{"traceId": _IDS["traceId"], "spanId": SECRET}]}),
        id="link-span-id",
    ),
    pytest.param(_json_with({**_IDS, "name": {"v": SECRET}}), id="schema"),
    pytest.param(b'{"resourceSpans": ["' + SECRET.encode() + b'" oops', id="syntax"),
    pytest.param(b'{"resourceSpans": "\xff' + SECRET.encode() + b'"}', id="not-utf8"),
    pytest.param(b"[1, 2]", id="not-an-object"),
    pytest.param(b"[" * 50_000, id="nested-too-deeply"),
]


@pytest.mark.parametrize("body", BAD_JSON_BODIES)
def test_every_otlp_json_body_error_has_the_same_prefix(
    collector: CollectorThread, capfd: pytest.CaptureFixture[str], body: bytes
) -> None:
    capfd.readouterr()
    status, headers, answer = post(collector.http_url, body, JS)
    assert status == 400
    message = status_of(answer, headers["Content-Type"]).message
    assert message.startswith("invalid OTLP/JSON: "), message
    assert message.count("invalid OTLP/JSON") == 1, message
    _assert_not_echoed(answer, capfd)


def test_http_partial_success_for_spans_with_bad_ids(
    collector: CollectorThread, sink: OtlpSink
) -> None:
    invalid_id = {"receiver": "otlp_http", "reason": "invalid_id"}
    refused_before = collector.metric("ragtrace_spans_refused_total", invalid_id)
    spans = [*rag_trace(children=1), make_span(b"\x00" * 16, name="bad")]
    status, _, body = post(collector.http_url, make_request(spans).SerializeToString(), PB)
    assert status == 200
    response = ExportTraceServiceResponse()
    response.ParseFromString(body)
    assert response.partial_success.rejected_spans == 1
    assert "trace_id" in response.partial_success.error_message
    assert collector.metric("ragtrace_spans_refused_total", invalid_id) == refused_before + 1
    sink.wait_for_traces({spans[0].trace_id}, 2)
    assert "bad" not in {r.span.name for r in sink.spans}


def test_http_wrong_path_and_method(collector: CollectorThread) -> None:
    status, _, _ = post(collector.http_url.replace("/v1/traces", "/v1/metrics"), b"", PB)
    assert status == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(collector.http_url, timeout=5)
    assert err.value.code == 405


# ------------------------------------------------------------------ gRPC
def _grpc_call(
    collector: CollectorThread, body: bytes, metadata: tuple[tuple[str, str], ...] = ()
) -> bytes:
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        call = channel.unary_unary(EXPORT)
        return call(body, metadata=metadata, timeout=10)  # type: ignore[no-any-return]


def test_grpc_malformed_message_is_invalid_argument(
    collector: CollectorThread, sink: OtlpSink
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _grpc_call(collector, b"\xff\xff\xff\xff")
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed protobuf" in err.value.details()
    spans = rag_trace()
    answer = _grpc_call(collector, make_request(spans).SerializeToString())
    assert ExportTraceServiceResponse.FromString(answer) == ExportTraceServiceResponse()
    sink.wait_for_traces({spans[0].trace_id}, 3)


def test_grpc_message_over_the_limit_is_refused(collector: CollectorThread) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _grpc_call(collector, b"\x0a" + b"\x00" * (70 * 1024))
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


# ------------------------------------------------------------------ auth
@pytest.fixture(scope="module")
def authed(sink: OtlpSink) -> Iterator[CollectorThread]:
    config = collector_config(sink=sink, receivers={"auth": {"bearer_tokens": [TOKEN]}})
    with running_collector(config) as c:
        yield c


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer", TOKEN])
def test_http_auth_refuses_missing_or_wrong_token(
    authed: CollectorThread, auth: str | None
) -> None:
    headers = dict(PB)
    if auth is not None:
        headers["Authorization"] = auth
    status, resp_headers, body = post(
        authed.http_url, make_request(rag_trace()).SerializeToString(), headers
    )
    assert status == 401
    assert resp_headers["WWW-Authenticate"] == "Bearer"
    assert status_of(body, resp_headers["Content-Type"]).code == code_pb2.UNAUTHENTICATED


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer nope"),)])
def test_grpc_auth_refuses_missing_or_wrong_token(
    authed: CollectorThread, metadata: tuple[tuple[str, str], ...]
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _grpc_call(authed, make_request(rag_trace()).SerializeToString(), metadata)
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_sdk_exporters_with_the_token_get_through(authed: CollectorThread, sink: OtlpSink) -> None:
    refused, _, _ = post(authed.http_url, make_request(rag_trace()).SerializeToString(), PB)
    assert refused == 401
    header = {"authorization": f"Bearer {TOKEN}"}
    for exporter in (
        HttpSpanExporter(endpoint=authed.http_url, headers=header),
        GrpcSpanExporter(endpoint=authed.grpc_endpoint, insecure=True, headers=header),
    ):
        sink.clear()
        app = make_app(exporter)
        for n in range(5):
            emit_rag_request(app.provider, n)
        app.shutdown()
        assert_delivered_exactly(app.emitted(), sink.wait_for_traces(_traces(app), 15))
    assert (
        authed.metric(
            "ragtrace_requests_rejected_total",
            {"receiver": "otlp_http", "reason": "unauthenticated"},
        )
        >= 1
    )


# ------------------------------------------------------------------ TLS
@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_on_both_receivers_and_both_exporters(
    sink: OtlpSink, tls_files: tuple[Path, Path]
) -> None:
    """app -> collector A (plain) -> https/TLS-gRPC with a token -> collector B -> sink."""
    cert, key = tls_files
    tls = {"cert_file": str(cert), "key_file": str(key)}
    b_config = collector_config(
        sink=sink,
        receivers={"grpc": {"tls": tls}, "http": {"tls": tls}, "auth": {"bearer_tokens": [TOKEN]}},
    )
    with running_collector(b_config) as b:
        bh, bp = b.svc.http_address or ("", 0)
        gh, gp = b.svc.grpc_address or ("", 0)
        client_tls = {"ca_file": str(cert)}
        auth = {"authorization": f"Bearer {TOKEN}"}
        a_config = collector_config(
            exporters={
                "to_b_http": {
                    "type": "otlp_http",
                    "endpoint": f"https://{bh}:{bp}",
                    "tls": client_tls,
                    "headers": auth,
                },
                "to_b_grpc": {
                    "type": "otlp_grpc",
                    "endpoint": f"https://{gh}:{gp}",
                    "tls": client_tls,
                    "headers": auth,
                },
            }
        )
        with running_collector(a_config) as a:
            sink.clear()
            app = make_app(HttpSpanExporter(endpoint=a.http_url))
            for n in range(10):
                emit_rag_request(app.provider, n)
            app.shutdown()
            emitted = app.emitted()
            got = sink.wait_for_traces(_traces(app), 2 * len(emitted))
            # Each exporter delivered a full copy.
            keys = [r.key for r in got]
            assert sorted(keys) == sorted([span_key(s) for s in emitted] * 2)
            assert b.metric("ragtrace_spans_received_total", {"receiver": "otlp_http"}) == len(
                emitted
            )
            assert b.metric("ragtrace_spans_received_total", {"receiver": "otlp_grpc"}) == len(
                emitted
            )
        # The SDK's own exporters speak TLS to B directly too.
        sink.clear()
        app = make_app(
            GrpcSpanExporter(
                endpoint=f"localhost:{gp}",
                credentials=grpc.ssl_channel_credentials(cert.read_bytes()),
                headers=auth,
            )
        )
        emit_rag_request(app.provider, 1)
        app.shutdown()
        assert_delivered_exactly(app.emitted(), sink.wait_for_traces(_traces(app), 3))


# ------------------------------------------------------------ back-pressure
def _retry_delay(status: status_pb2.Status) -> float | None:
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


def test_backpressure_answers_are_retryable_with_a_delay() -> None:
    with OtlpSink() as backend:
        exporter = sink_exporter(backend, "otlp_grpc", queue={"max_spans": 5})
        config = collector_config(
            exporters={"backend": exporter},
            assembly={"decision_wait": 0},
            receivers={"retry_after": "1500ms"},
        )
        backend.go_down()
        with running_collector(config) as collector:
            assert (
                post(
                    collector.http_url, make_request(rag_trace(children=5)).SerializeToString(), PB
                )[0]
                == 200
            )
            queue = collector.svc.exporters[0]
            wait_for(lambda: collector.call(queue.full), what="a full exporter queue")
            body = make_request(rag_trace()).SerializeToString()
            # HTTP: 429, Retry-After in whole seconds, a Status with a RetryInfo,
            # in the request's encoding.
            status, headers, resp = post(collector.http_url, body, PB)
            assert status == 429
            assert headers["Retry-After"] == "2"
            message = status_of(resp, headers["Content-Type"])
            assert message.code == code_pb2.RESOURCE_EXHAUSTED
            assert "queue is full" in message.message
            assert _retry_delay(message) == 1.5
            status, headers, resp = post(collector.http_url, b"{}", JS)
            assert status == 429
            assert headers["Content-Type"].startswith("application/json")
            assert json.loads(resp)["details"][0]["retryDelay"] == "1.500s"
            # gRPC: RESOURCE_EXHAUSTED with RetryInfo (standard details and the Python key).
            with pytest.raises(grpc.RpcError) as err:
                _grpc_call(collector, body)
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(err.value.trailing_metadata())
            details = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
            assert details.code == code_pb2.RESOURCE_EXHAUSTED
            assert _retry_delay(details) == 1.5
            info = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
            assert info.retry_delay.seconds == 1
            assert info.retry_delay.nanos == 500_000_000
            refused = collector.metric(
                "ragtrace_spans_refused_total", {"receiver": "otlp_http", "reason": "queue_full"}
            )
            assert refused == 3
            # Shutting down: 503 / UNAVAILABLE, also retryable.
            collector.call(collector.svc.pipeline.stop_accepting)
            status, headers, _ = post(collector.http_url, body, PB)
            assert status == 503
            assert "Retry-After" in headers
            with pytest.raises(grpc.RpcError) as err:
                _grpc_call(collector, body)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            backend.come_up()
        # Everything accepted was delivered (the rest was refused, not dropped).
        assert backend.span_count == 6
