"""Hand-encoded protobuf for the few OTLP shapes the collector writes or searches in bulk.

Adding an attribute through the protobuf API costs a Python-to-C crossing per field
(``add``, ``key``, ``value``, the typed setter); the evaluation stage writes dozens per
case.  Encoding the wire bytes here and merging them with one ``MergeFromString`` (C
code, which appends to repeated fields) costs a fraction of that.  Only scalar values
(str, bool, int64, float) are encoded here; anything else goes through the protobuf
API (:func:`key_value`).

Field numbers (``opentelemetry/proto``): ``Span.attributes`` 9, ``Span.events`` 11,
``Span.Event.time_unix_nano`` 1 (fixed64), ``name`` 2, ``attributes`` 3;
``KeyValue.key`` 1, ``value`` 2; ``AnyValue.string_value`` 1, ``bool_value`` 2,
``int_value`` 3, ``double_value`` 4.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Container, Iterable
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2

from ragtrace_collector.otlp.spanattrs import set_attribute

__all__ = [
    "EVENT_ATTRIBUTE",
    "SPAN_ATTRIBUTE",
    "SPAN_EVENT",
    "attribute",
    "event",
    "event_parts",
    "fixed64",
    "key_value",
    "length_delimited",
    "span_attribute_entries",
    "string_field",
    "varint",
]

#: Tags (field number << 3 | wire type 2) of the repeated fields written here.
SPAN_ATTRIBUTE = 0x4A
SPAN_EVENT = 0x5A
EVENT_ATTRIBUTE = 0x1A

_SMALL = tuple(bytes([i]) for i in range(128))
_DOUBLE = struct.Struct("<d").pack
_FIXED64 = struct.Struct("<Q").pack
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_TRUE = b"\x02\x10\x01"  # length 2, AnyValue.bool_value = 1
_FALSE = b"\x02\x10\x00"


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf varint."""
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def length_delimited(tag: int, data: bytes) -> bytes:
    """A length-delimited field: tag (one byte: field numbers below 16), length, ``data``."""
    return _SMALL[tag] + varint(len(data)) + data


def string_field(tag: int, text: str) -> bytes:
    return length_delimited(tag, text.encode())


@functools.lru_cache(maxsize=4096)
def _key_lead(key: str) -> bytes:
    """``KeyValue.key`` and the tag of ``KeyValue.value``."""
    return string_field(0x0A, key) + b"\x12"


def key_value(key: str, value: Any) -> bytes:
    """One serialised ``KeyValue``; str, bool, int and float are encoded here, any other
    value (lists, mappings, bytes) through the protobuf API, as
    :func:`~ragtrace_collector.otlp.spanattrs.set_attribute` writes it."""
    kind = type(value)
    if kind is float:
        return _key_lead(key) + b"\x09\x21" + _DOUBLE(value)
    if kind is str:
        data: bytes = value.encode("utf-8", "replace")
        inner = b"\x0a" + varint(len(data)) + data
        return _key_lead(key) + varint(len(inner)) + inner
    if kind is bool:
        return _key_lead(key) + (_TRUE if value else _FALSE)
    if kind is int and _INT64_MIN <= value <= _INT64_MAX:
        inner = b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)
        return _key_lead(key) + varint(len(inner)) + inner
    holder = common_pb2.KeyValueList()
    set_attribute(holder.values, key, value)
    blob: bytes = holder.values[0].SerializeToString()
    return blob


@functools.lru_cache(maxsize=4096)
def _double_lead(tag: int, key: str) -> bytes:
    """Everything of a double attribute entry but its 8 value bytes."""
    lead = _key_lead(key)
    return _SMALL[tag] + varint(len(lead) + 10) + lead + b"\x09\x21"


#: Short string (and bool) attribute entries, by (tag, key, value): metric names,
#: labels, judges and short reasons repeat from case to case.
_ENTRIES: dict[tuple[int, str, Any], bytes] = {}
_MAX_ENTRIES = 16384
_CACHED_CHARS = 80


def attribute(tag: int, key: str, value: Any) -> bytes:
    """One entry of a repeated ``attributes`` field with tag ``tag``."""
    kind = type(value)
    if kind is float:
        return _double_lead(tag, key) + _DOUBLE(value)
    cacheable = kind is bool or (kind is str and len(value) <= _CACHED_CHARS)
    if cacheable:
        entry = _ENTRIES.get((tag, key, value))
        if entry is not None:
            return entry
    kv = key_value(key, value)
    entry = _SMALL[tag] + varint(len(kv)) + kv
    if cacheable:
        if len(_ENTRIES) >= _MAX_ENTRIES:
            _ENTRIES.clear()
        _ENTRIES[(tag, key, value)] = entry
    return entry


def span_attribute_entries(
    attributes: Any, items: Iterable[tuple[str, Any]], existing: Container[str]
) -> list[bytes]:
    """Span attribute entries for the ``items`` whose key is not in ``existing`` (the
    keys already in ``attributes``), to merge into the span in one call; an item whose
    key is there replaces that entry in place (OTLP keys are unique)."""
    out: list[bytes] = []
    for key, value in items:
        if key in existing:
            set_attribute(attributes, key, value)
        else:
            out.append(attribute(SPAN_ATTRIBUTE, key, value))
    return out


def event(time_unix_nano: int, name: str, attributes: list[tuple[str, Any]]) -> bytes:
    """One ``Span.events`` entry."""
    head, tail = event_parts(name, attributes)
    return head + _FIXED64(time_unix_nano) + tail


def event_parts(name: str, attributes: list[tuple[str, Any]]) -> tuple[bytes, bytes]:
    """A ``Span.events`` entry without its time: ``head + time (8 bytes LE) + tail``
    (the time is a fixed64, so the length is known without it)."""
    rest = [string_field(0x12, name)]
    for key, value in attributes:
        rest.append(attribute(EVENT_ATTRIBUTE, key, value))
    tail = b"".join(rest)
    return _SMALL[SPAN_EVENT] + varint(9 + len(tail)) + b"\x09", tail


def fixed64(n: int) -> bytes:
    return _FIXED64(n)
