"""What is wrong with a malformed OTLP request, said by position and type, never by value.

A request's content is the client's data: span names, attribute values, prompts and
answers that may hold personal data or secrets.  The error messages of the parsers
(``json_format.ParseError``, ``int()``...) quote the offending value, so the receivers
never pass them on.  Instead a request is walked here against the message's schema,
and the first problem is described by its path and the JSON type found, e.g.
``resourceSpans[0].scopeSpans[2].spans[5].attributes[1].value: expected object, got
string``.

:func:`json_problem` checks decoded OTLP/JSON before it is parsed: besides naming what
the parser would refuse, it refuses what the parser would silently take for an empty
message (a string or an array where an object belongs), which would lose that part of
the span.  It accepts everything else the parser accepts (numbers as strings, enum
names or integers, unknown fields).  Its cost is about a tenth of the parse.
:func:`protobuf_problem` finds the first element of a binary request that does not
parse (down to a span), with its byte offset; it runs only on the error path.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any, Final

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from ragtrace_collector.otlp.piecewise import WireError, read_entry

__all__ = ["json_problem", "json_type", "protobuf_problem"]

_INT_RANGES: Final[dict[int, tuple[int, int]]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS: Final = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
_STRING: Final = FieldDescriptor.TYPE_STRING
_FLOAT_WORDS: Final = ("NaN", "Infinity", "-Infinity")

_fields_cache: dict[str, dict[str, _Field]] = {}


def json_type(value: Any) -> str:
    """The JSON type of a decoded value: object, array, string, number, boolean, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def json_problem(data: Any, descriptor: Descriptor | None = None) -> str | None:
    """The first problem of ``data`` (decoded OTLP/JSON, ids already in base64) as an
    ``ExportTraceServiceRequest`` (or ``descriptor``): ``"<path>: <what>"``, or None
    when the walk finds nothing wrong."""
    try:
        found = _message(descriptor or ExportTraceServiceRequest.DESCRIPTOR, data)
    except RecursionError:
        return "the request is nested too deeply"
    if found is None:
        return None
    steps, what = found
    path = "".join(reversed(steps)).lstrip(".")
    return f"{path or 'the request'}: {what}"


class _Field:
    """What the walk needs of one field (read once from its descriptor)."""

    __slots__ = ("json_name", "kind", "message", "oneof", "repeated")

    def __init__(self, field: FieldDescriptor) -> None:
        self.json_name = "." + field.json_name
        self.kind = field.type
        self.message = field.message_type if self.kind == FieldDescriptor.TYPE_MESSAGE else None
        oneof = field.containing_oneof
        self.oneof = oneof.name if oneof is not None else None
        self.repeated = field.is_repeated


#: The walk's findings: the path's steps, innermost first, and what is wrong there.
_Found = tuple[list[str], str]


def _fields(descriptor: Descriptor) -> dict[str, _Field]:
    """A message's fields by JSON name and by proto name (both are accepted)."""
    found = _fields_cache.get(descriptor.full_name)
    if found is None:
        found = {}
        for field in descriptor.fields:
            info = _Field(field)
            found[field.name] = info
            found[field.json_name] = info
        _fields_cache[descriptor.full_name] = found
    return found


def _message(descriptor: Descriptor, obj: Any) -> _Found | None:
    if not isinstance(obj, dict):
        return [], f"expected object, got {json_type(obj)}"
    fields = _fields(descriptor)
    oneofs: set[str] | None = None
    for key, value in obj.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is None or value is None:  # unknown fields are ignored, as when parsing
            continue
        if field.oneof is not None:
            if oneofs is None:
                oneofs = set()
            elif field.oneof in oneofs:
                return [field.json_name], f"a second field of the one-of '{field.oneof}'"
            oneofs.add(field.oneof)
        if not field.repeated:
            if field.kind == _STRING and type(value) is str:
                continue  # the common cases without a second call
            message = field.message
            found = _message(message, value) if message is not None else _value(field, value)
            if found is not None:
                found[0].append(field.json_name)
                return found
            continue
        if not isinstance(value, list):
            return [field.json_name], f"expected array, got {json_type(value)}"
        message = field.message
        for i, item in enumerate(value):
            found = _message(message, item) if message is not None else _value(field, item)
            if found is not None:
                found[0].append(f"{field.json_name}[{i}]")
                return found
    return None


def _value(field: _Field, value: Any) -> _Found | None:
    """A scalar field's value (message fields are walked by :func:`_message`)."""
    kind = field.kind
    if kind == _STRING:
        return None if isinstance(value, str) else _expected("string", value)
    if kind == FieldDescriptor.TYPE_BYTES:
        if not isinstance(value, str):
            return _expected("base64 string", value)
        try:
            base64.b64decode(value + "=" * (-len(value) % 4), validate=False)
        except (binascii.Error, ValueError):
            return [], "expected base64 string, got a string that is not base64"
        return None
    if kind == FieldDescriptor.TYPE_BOOL:
        return None if isinstance(value, bool) else _expected("boolean", value)
    if kind == FieldDescriptor.TYPE_ENUM:
        ok = isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
        return None if ok else _expected("enum name or integer", value)
    if kind in _FLOATS:
        return _float(value)
    bounds = _INT_RANGES.get(kind)
    if bounds is not None:
        return _integer(value, bounds)
    return None


def _expected(wanted: str, value: Any) -> _Found:
    return [], f"expected {wanted}, got {json_type(value)}"


def _integer(value: Any, bounds: tuple[int, int]) -> _Found | None:
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        number = _integral(value)
        if number is None:
            return [], "expected integer, got a string that is not an integer"
    if number is None:
        return _expected("integer", value)
    low, high = bounds
    if not low <= number <= high:
        return [], f"integer out of range [{low}, {high}]"
    return None


def _integral(text: str) -> int | None:
    """``text`` as an integer the way the JSON parser reads it ("7", "7.0", "7e0")."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


def _float(value: Any) -> _Found | None:
    if isinstance(value, bool):
        return _expected("number", value)
    if isinstance(value, int | float):
        return None
    if isinstance(value, str):
        if value in _FLOAT_WORDS:
            return None
        try:
            float(value)
        except ValueError:
            return [], "expected number, got a string that is not a number"
        return None
    return _expected("number", value)


# ------------------------------------------------------------------ protobuf
#: The levels a binary request is checked at: the message walked, and the field number,
#: JSON name and type of its repeated elements.
_LEVELS: Final = (
    ("ExportTraceServiceRequest", 1, "resourceSpans", ResourceSpans),
    ("ResourceSpans", 2, "scopeSpans", ScopeSpans),
    ("ScopeSpans", 2, "spans", Span),
)


def protobuf_problem(body: bytes) -> str:
    """Where a binary ``ExportTraceServiceRequest`` that does not parse goes wrong:
    the first resourceSpans, scopeSpans or span element that does not parse on its
    own (down to the span), with its byte offset."""
    return _protobuf_level(memoryview(body), 0, len(body), 0, "")


def _protobuf_level(view: memoryview, start: int, end: int, level: int, path: str) -> str:
    owner, number, name, element = _LEVELS[level]
    here = path or "the request"
    index = 0
    pos = start
    entry = start
    try:
        while pos < end:
            entry = pos
            key, value_start, pos = read_entry(view, pos, end)
            if key >> 3 == number and key & 7 == 2:
                where = f"{path}.{name}[{index}]" if path else f"{name}[{index}]"
                index += 1
                try:
                    element.FromString(bytes(view[value_start:pos]))
                except DecodeError:
                    if level + 1 < len(_LEVELS):
                        return _protobuf_level(view, value_start, pos, level + 1, where)
                    return f"{where}: malformed {element.__name__} (byte {value_start})"
    except WireError:
        return f"{here}: a field is cut short or has an unknown wire type (byte {entry})"
    return f"{here}: malformed {owner} outside its {name} (byte {start})"
