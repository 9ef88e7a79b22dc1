"""A large request parsed in pieces is exactly the request parsed whole."""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ragtrace_collector.otlp.codec import OtlpDecodeError, decode_protobuf_request
from ragtrace_collector.otlp.piecewise import WHOLE_BYTES, parse_in_pieces
from tests.fakes.hostile import wide_trace
from tests.fakes.otlp_data import make_request, make_span, new_trace_id


def _whole(body: bytes) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(body)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field entry."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _unknown() -> bytes:
    """Unknown fields of every wire type upb keeps: varint, 64-bit, bytes, 32-bit."""
    return (
        _varint(90 << 3 | 0)
        + _varint(300)
        + _varint(91 << 3 | 1)
        + b"\x01" * 8
        + _field(92, b"kept")
        + _varint(93 << 3 | 5)
        + b"\x02" * 4
    )


def _scrambled_request(rng: random.Random) -> bytes:
    """Several resources and scopes, fields out of the usual order, repeated singular
    messages (merged), schema urls and unknown fields at every level."""
    out = b""
    for r in range(rng.randint(1, 3)):
        entries: list[bytes] = []
        for s in range(rng.randint(1, 3)):
            trace_id = new_trace_id()
            spans = [
                make_span(
                    trace_id,
                    name=f"s{r}.{s}.{i}",
                    attrs={"i": i, "text": "x" * rng.randint(0, 300)},
                )
                for i in range(rng.randint(0, 40))
            ]
            scope_entries = [_field(2, span.SerializeToString()) for span in spans]
            scope_entries.append(_field(1, _field(1, f"scope{s}".encode())))
            scope_entries.append(_field(3, b"https://schema/scope"))
            scope_entries.append(_unknown())
            rng.shuffle(scope_entries)
            entries.append(_field(2, b"".join(scope_entries)))
        entries.append(
            _field(
                1,
                make_request([], service=f"svc{r}").resource_spans[0].resource.SerializeToString(),
            )
        )
        entries.append(_field(1, _unknown()))  # a second resource entry merges into the first
        entries.append(_field(3, b"https://schema/resource"))
        entries.append(_unknown())
        rng.shuffle(entries)
        out += _field(1, b"".join(entries))
    return out + _unknown()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), piece=st.integers(1, 4096))
def test_any_piece_size_gives_the_whole_parse(seed: int, piece: int) -> None:
    body = _scrambled_request(random.Random(seed))
    pieces = parse_in_pieces(body, whole_bytes=0, piece_bytes=piece)
    whole = _whole(body)
    assert pieces == whole
    assert pieces.SerializeToString() == whole.SerializeToString()


def test_a_100k_span_request_is_parsed_in_pieces_equal_to_the_whole() -> None:
    body = wide_trace(100_000).SerializeToString()
    assert len(body) > WHOLE_BYTES
    pieces = decode_protobuf_request(body)
    assert pieces.SerializeToString() == body
    assert len(pieces.resource_spans[0].scope_spans[0].spans) == 100_000


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cut=st.floats(0.0, 1.0), flip=st.integers(0, 255))
def test_a_damaged_body_is_refused_or_read_as_the_whole_parse_reads_it(
    seed: int, cut: float, flip: int
) -> None:
    body = bytearray(_scrambled_request(random.Random(seed)))
    at = int(cut * (len(body) - 1))
    body[at] ^= flip
    damaged = bytes(body[: max(1, len(body) - at // 3)])
    try:
        whole: ExportTraceServiceRequest | None = _whole(damaged)
    except DecodeError:
        whole = None
    try:
        pieces: ExportTraceServiceRequest | None = parse_in_pieces(
            damaged, whole_bytes=0, piece_bytes=64
        )
    except DecodeError:
        pieces = None
    if whole is None:
        # The whole parse refuses it: so must the pieces (never a half-read request).
        assert pieces is None
    else:
        assert pieces is not None
        assert pieces == whole


def test_a_malformed_large_body_is_an_otlp_decode_error() -> None:
    body = wide_trace(60_000).SerializeToString()
    assert len(body) > WHOLE_BYTES
    with pytest.raises(OtlpDecodeError, match="malformed protobuf"):
        decode_protobuf_request(body[: len(body) // 2 + 3])
