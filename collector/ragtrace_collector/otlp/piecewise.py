"""Parse a large OTLP trace request in pieces, so that no single parse call is long.

upb parses a message in one C call that holds the interpreter lock throughout: about
60 ms for a 7.6 MB request of 100,000 spans, during which the event loop cannot run,
even though the parse happens in a worker thread.  Protobuf's wire format lets a
message be parsed as the merge of any split of its field entries taken in order
(parsing ``a + b`` equals parsing ``a`` and then merging ``b``), and a repeated
message field's entry is one element.  So a large request is walked at the level of
its field entries:

* ``ExportTraceServiceRequest.resource_spans`` and ``ResourceSpans.scope_spans``
  entries that are large are descended into (a new element, filled the same way);
* every other run of consecutive entries, notably a ``ScopeSpans``' spans, is merged
  ``piece_bytes`` at a time.

The result is the same message as one ``ParseFromString`` (unknown fields included).
The walk only reads tags and lengths, and between two merges the lock can pass to
the loop.  Anything the walk does not expect (a group wire type, a length past the
end) is left to one whole parse, which then decides whether the body is valid.
"""

from __future__ import annotations

from typing import Final

from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = [
    "PIECE_BYTES",
    "WHOLE_BYTES",
    "WireError",
    "parse_in_pieces",
    "read_entry",
    "read_varint",
]

#: Bodies up to this size are parsed whole (about 15 ms of upb on a slow core): the
#: walk costs about 1 us of Python per entry, three to four times the parse itself for
#: small spans, so it is kept for the rare request that would stall the loop.
WHOLE_BYTES: Final = 4 * 1024 * 1024
#: At most this many bytes are given to one parse call (about 1 ms of upb).
PIECE_BYTES: Final = 256 * 1024

#: Repeated message fields descended into, by message type: field number -> name.
_DESCEND: Final[dict[str, tuple[int, str]]] = {
    "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest": (1, "resource_spans"),
    "opentelemetry.proto.trace.v1.ResourceSpans": (2, "scope_spans"),
}


class WireError(Exception):
    """A tag, length or value the walk does not handle, or that runs past its message
    (:func:`parse_in_pieces` then parses the body whole instead)."""


def parse_in_pieces(
    body: bytes, *, whole_bytes: int = WHOLE_BYTES, piece_bytes: int = PIECE_BYTES
) -> ExportTraceServiceRequest:
    """``body`` parsed as an ``ExportTraceServiceRequest``: whole up to ``whole_bytes``,
    else no parse call is given more than about ``piece_bytes`` (a single span larger
    than that is parsed alone).  Raises what ``ParseFromString`` raises for a malformed
    body."""
    request = ExportTraceServiceRequest()
    if len(body) <= max(whole_bytes, piece_bytes):
        request.ParseFromString(body)
        return request
    view = memoryview(body)
    try:
        _merge(request, view, 0, len(body), piece_bytes)
    except WireError:
        request.Clear()
        request.ParseFromString(body)
    return request


def _merge(message: Message, view: memoryview, start: int, end: int, piece: int) -> None:
    """Merge the field entries in ``view[start:end]`` into ``message``."""
    descend = _DESCEND.get(message.DESCRIPTOR.full_name)
    run_start = start  # the first entry not merged yet
    pos = start
    while pos < end:
        entry_start = pos
        key, value_start, pos = read_entry(view, pos, end)
        if (
            descend is not None
            and key >> 3 == descend[0]
            and key & 7 == 2
            and pos - value_start > piece
        ):
            if entry_start > run_start:
                message.MergeFromString(view[run_start:entry_start])
            child = getattr(message, descend[1]).add()
            _merge(child, view, value_start, pos, piece)
            run_start = pos
            continue
        if pos - run_start >= piece:
            message.MergeFromString(view[run_start:pos])
            run_start = pos
    if end > run_start:
        message.MergeFromString(view[run_start:end])


def read_entry(view: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """The field entry at ``view[pos]``: its key (field number << 3 | wire type), where
    its value starts and where the next entry starts.  :class:`WireError` for a group
    or an invalid wire type, or an entry that runs past ``end``."""
    key, pos = read_varint(view, pos, end)
    wire_type = key & 7
    value_start = pos
    if wire_type == 2:
        length, value_start = read_varint(view, pos, end)
        pos = value_start + length
    elif wire_type == 0:
        _, pos = read_varint(view, pos, end)
    elif wire_type == 1:
        pos += 8
    elif wire_type == 5:
        pos += 4
    else:  # groups (3, 4) and invalid wire types
        raise WireError
    if pos > end:
        raise WireError
    return key, value_start, pos


def read_varint(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``view[pos]`` and the position after it; :class:`WireError` when
    it runs past ``end`` or over 64 bits."""
    result = 0
    shift = 0
    while pos < end:
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise WireError
