"""OTLP protobuf encoding of finished spans, written straight to the wire format.

The OTel exporter builds a protobuf message object per span, attribute and value, then
serialises the tree; for a retriever span with a few documents that costs several times
what creating the span cost, so an app that makes calls as fast as it can outruns its own
export thread and spans pile up.  This module writes the same bytes directly: one
``bytes`` chunk per field, joined once per message.  Keys are encoded once and cached.

The output parses to exactly the message ``opentelemetry.exporter.otlp.proto.common``'s
``encode_spans`` builds (``tests/sdk/test_wire.py`` checks it field by field on spans of
every shape): same resource/scope grouping, same span flags, same handling of values.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

__all__ = ["encode_request"]

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack

# Span.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, plus IS_REMOTE for a remote parent.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

_KIND = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}

#: Encoded ``KeyValue.key`` fields, by key (attribute keys repeat on every span).
_KEY_CACHE: dict[str, bytes] = {}
_KEY_CACHE_LIMIT = 4096


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else _varint(n)) + payload


def _str_field(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8", "surrogatepass")) if text else b""


def _key(key: str) -> bytes:
    encoded = _KEY_CACHE.get(key)
    if encoded is None:
        encoded = _field(b"\x0a", key.encode("utf-8", "surrogatepass"))
        if len(_KEY_CACHE) < _KEY_CACHE_LIMIT:
            _KEY_CACHE[key] = encoded
    return encoded


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message body (what OTel's ``_encode_value`` builds)."""
    kind = type(value)
    if kind is str:
        return _field(b"\x0a", value.encode("utf-8", "surrogatepass"))
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if kind is float:
        return b"\x21" + _pack_double(value)
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", _kv(k, v)) for k, v in value.items()))
    raise TypeError(f"invalid type {type(value).__name__} of value {value!r}")


def _kv(key: str, value: Any) -> bytes:
    return _key(key) + _field(b"\x12", _any_value(value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    if not attributes:
        return []
    return [_field(tag, _kv(key, value)) for key, value in attributes.items()]


def _count(tag: bytes, n: int) -> bytes:
    return tag + _varint(n) if n else b""


def _span(span: ReadableSpan) -> bytes:
    ctx = span.context
    assert ctx is not None
    parts = [
        b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + ctx.span_id.to_bytes(8, "big"),
    ]
    state = ctx.trace_state
    if state:
        parts.append(_str_field(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items())))
    parent = span.parent
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts.append(_str_field(b"\x2a", span.name))
    parts.append(b"\x30" + bytes((_KIND[span.kind],)))
    if span.start_time:
        parts.append(b"\x39" + _pack_fixed64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _pack_fixed64(span.end_time))
    parts.extend(_attributes(b"\x4a", span.attributes))
    parts.append(_count(b"\x50", span.dropped_attributes))
    for event in span.events:
        body = [b"\x09" + _pack_fixed64(event.timestamp), _str_field(b"\x12", event.name)]
        body.extend(_attributes(b"\x1a", event.attributes))
        body.append(_count(b"\x20", event.dropped_attributes))
        parts.append(_field(b"\x5a", b"".join(body)))
    parts.append(_count(b"\x60", span.dropped_events))
    for link in span.links:
        lctx = link.context
        body = [
            b"\x0a\x10" + lctx.trace_id.to_bytes(16, "big"),
            b"\x12\x08" + lctx.span_id.to_bytes(8, "big"),
        ]
        body.extend(_attributes(b"\x22", link.attributes))
        body.append(_count(b"\x28", link.dropped_attributes))
        flags = _HAS_IS_REMOTE | (_IS_REMOTE if lctx.is_remote else 0)
        body.append(b"\x35" + _pack_fixed32(flags))
        parts.append(_field(b"\x6a", b"".join(body)))
    parts.append(_count(b"\x70", span.dropped_links))
    status = span.status
    if status is not None:
        message = _str_field(b"\x12", status.description or "")
        code = status.status_code.value
        parts.append(_field(b"\x7a", message + (b"\x18" + bytes((code,)) if code else b"")))
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
    parts.append(b"\x85\x01" + _pack_fixed32(flags))
    return b"".join(parts)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    parts = [_str_field(b"\x0a", scope.name or ""), _str_field(b"\x12", scope.version or "")]
    parts.extend(_attributes(b"\x1a", getattr(scope, "attributes", None)))
    return b"".join(parts)


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """An ``ExportTraceServiceRequest`` for ``spans``, serialised.

    Spans are grouped by resource, then by instrumentation scope, in first-seen order (as
    OTel's encoder does); resource and scope are encoded once per group.
    """
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope or None
        by_scope = groups.setdefault(id(resource), (resource, {}))[1]
        by_scope.setdefault(id(scope), (scope, []))[1].append(_field(b"\x12", _span(span)))
    out: list[bytes] = []
    for resource, by_scope in groups.values():
        body = [_field(b"\x0a", b"".join(_attributes(b"\x0a", resource.attributes)))]
        for scope, encoded in by_scope.values():
            scope_body = [_field(b"\x0a", _scope(scope)), *encoded]
            schema = scope.schema_url if scope is not None else ""
            scope_body.append(_str_field(b"\x1a", schema or ""))
            body.append(_field(b"\x12", b"".join(scope_body)))
        body.append(_str_field(b"\x1a", resource.schema_url or ""))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)
