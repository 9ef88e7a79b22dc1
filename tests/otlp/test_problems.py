"""otlp.problems: a malformed request described by path and JSON type, never by value."""

from __future__ import annotations

import json

import pytest

from ragtrace_collector.otlp.codec import (
    OtlpDecodeError,
    decode_json_request,
    decode_protobuf_request,
    encode_json,
)
from ragtrace_collector.otlp.problems import json_problem, protobuf_problem
from tests.fakes.otlp_data import make_request, rag_trace

SECRET = "hunter2-DO-NOT-ECHO"


def _request(span_extra: dict[str, object]) -> dict[str, object]:
    span = {"traceId": "AAAAAAAAAAAAAAAAAAAAAQ==", "spanId": "AAAAAAAAAAE=", **span_extra}
    return {"resourceSpans": [{"scopeSpans": [{}, {"spans": [{}, span]}]}]}


def test_a_valid_request_has_no_problem() -> None:
    data = json.loads(encode_json(make_request(rag_trace(children=3))))
    # encode_json writes hex ids; the walk sees what the parser sees (base64 bytes).
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    span.pop(key, None)
    assert json_problem(data) is None


@pytest.mark.parametrize(
    ("span", "want"),
    [
        ({"name": [SECRET]}, "name: expected string, got array"),
        ({"kind": True}, "kind: expected enum name or integer, got boolean"),
        ({"droppedAttributesCount": -1}, "droppedAttributesCount: integer out of range"),
        (
            {"droppedAttributesCount": SECRET},
            "droppedAttributesCount: expected integer, got a string",
        ),
        (
            {"attributes": [{"key": "k", "value": SECRET}]},
            "attributes[0].value: expected object, got string",
        ),
        (
            {"attributes": [{"key": "k", "value": {"stringValue": "a", "intValue": 1}}]},
            "attributes[0].value.intValue: a second field of the one-of 'value'",
        ),
        ({"status": {"message": 5}}, "status.message: expected string, got number"),
        (
            {"events": [{"name": "e", "attributes": {"k": SECRET}}]},
            "events[0].attributes: expected array",
        ),
    ],
)
def test_the_first_problem_is_named_by_path_and_type(span: dict[str, object], want: str) -> None:
    problem = json_problem(_request(span))
    assert problem is not None
    assert problem.startswith(f"resourceSpans[0].scopeSpans[1].spans[1].{want}")
    assert SECRET not in problem


def test_a_deeply_nested_value_is_reported_not_raised() -> None:
    value: dict[str, object] = {"stringValue": 1}
    for _ in range(3000):
        value = {"arrayValue": {"values": [value]}}
    problem = json_problem(_request({"attributes": [{"key": "k", "value": value}]}))
    assert problem is not None


def test_a_string_where_an_object_belongs_is_refused_not_taken_for_empty() -> None:
    hex_ids = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1"}
    attributes = [{"key": "a", "value": {"stringValue": "x"}}, {"key": "k", "value": SECRET}]
    body = json.dumps(_request({**hex_ids, "attributes": attributes})).encode()
    with pytest.raises(OtlpDecodeError) as err:
        decode_json_request(body)
    assert str(err.value) == (
        "invalid OTLP/JSON: resourceSpans[0].scopeSpans[1].spans[1].attributes[1].value: "
        "expected object, got string"
    )


def test_what_the_parser_accepts_loosely_is_still_accepted() -> None:
    hex_ids = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1"}
    span = {
        **hex_ids,
        "kind": "SPAN_KIND_SERVER",
        "start_time_unix_nano": "1700000000000000000",
        "endTimeUnixNano": 1.7e18,
        "droppedAttributesCount": "2.0",
        "attributes": [
            {"key": "i", "value": {"intValue": "5"}},
            {"key": "d", "value": {"doubleValue": "NaN"}},
            {"key": "b", "value": {"bytesValue": "AAEC"}},
            {"key": "n", "value": None},
        ],
        "futureField": {"anything": [1, "two"]},
    }
    request = decode_json_request(json.dumps(_request(span)).encode())
    decoded = request.resource_spans[0].scope_spans[1].spans[1]
    assert decoded.start_time_unix_nano == 1_700_000_000_000_000_000
    assert decoded.dropped_attributes_count == 2
    assert decoded.attributes[0].value.int_value == 5


def test_decode_json_request_never_quotes_the_value() -> None:
    hex_ids = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1"}
    body = json.dumps(_request({**hex_ids, "startTimeUnixNano": SECRET})).encode()
    with pytest.raises(OtlpDecodeError) as err:
        decode_json_request(body)
    assert "spans[1].startTimeUnixNano: expected integer" in str(err.value)
    assert SECRET not in str(err.value)


def test_a_binary_request_is_described_down_to_the_span() -> None:
    spans = rag_trace(children=2)
    spans[2].name = "#" + SECRET
    body = make_request(spans).SerializeToString()
    bad = body.replace(b"#" + SECRET.encode(), b"\xff" + SECRET.encode())
    problem = protobuf_problem(bad)
    assert problem.startswith("resourceSpans[0].scopeSpans[0].spans[2]: malformed Span (byte ")
    with pytest.raises(OtlpDecodeError) as err:
        decode_protobuf_request(bad)
    assert "spans[2]: malformed Span" in str(err.value)
    assert "DO-NOT-ECHO" not in str(err.value)


def test_a_cut_short_binary_request_names_the_offset() -> None:
    body = make_request(rag_trace(children=2)).SerializeToString()
    assert "cut short" in protobuf_problem(body[:-5])
    assert "cut short" in protobuf_problem(b"\xff\xff\xff\xff")


def _nodes(obj: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every position in a decoded JSON document (paths of keys and indices)."""
    found = [path]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _nodes(value, (*path, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += _nodes(value, (*path, i))
    return found


def _replace(obj: object, path: tuple[object, ...], value: object) -> object:
    if not path:
        return value
    parent = obj
    for step in path[:-1]:
        parent = parent[step]  # type: ignore[index]
    parent[path[-1]] = value  # type: ignore[index]
    return obj


def test_any_value_of_the_wrong_type_is_described_without_its_content() -> None:
    """Seeded mutations of a real request: every position, given a value of each JSON
    type that holds the secret; whatever the parser refuses is described by a path."""
    import random

    rng = random.Random(7)
    wrong: list[object] = [
        SECRET,
        {"x": SECRET},
        [SECRET],
        [{"k": SECRET}],
        12.5,
        -3,
        True,
        "1" * 30,
    ]
    base = encode_json(make_request(rag_trace(children=2)))
    refused = 0
    for path in _nodes(json.loads(base)):
        for value in rng.sample(wrong, 3):
            data = _replace(json.loads(base), path, value)
            try:
                decode_json_request(json.dumps(data).encode())
            except OtlpDecodeError as exc:
                refused += 1
                message = str(exc)
                assert "DO-NOT-ECHO" not in message, message
                assert "1" * 30 not in message, message
                assert "not an ExportTraceServiceRequest" not in message, (path, message)
    assert refused > 50
