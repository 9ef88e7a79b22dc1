"""OTLP trace payloads: decode, split by trace, re-encode, error bodies.

Spans stay protobuf messages (upb-backed) from the receiver to the exporter: a request
is parsed once, walked once to group its spans by trace id, and each exporter batch is
built by copying those span messages into a fresh ``ExportTraceServiceRequest``.
Nothing is converted to dicts on the hot path, and unknown protobuf fields survive the
trip (upb keeps them through parse, copy and serialise).

Two encodings are supported, as the OTLP specification defines them:

* binary protobuf (``application/x-protobuf``, and gRPC);
* OTLP/JSON (``application/json``): the proto3 JSON mapping with three differences —
  trace and span ids are lowercase hex strings rather than base64, enums are integers,
  and field names are lowerCamelCase (receivers also accept the original names).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from ragtrace_collector.otlp.piecewise import parse_in_pieces
from ragtrace_collector.otlp.problems import json_problem, json_type, protobuf_problem

__all__ = [
    "CONTENT_TYPE_JSON",
    "CONTENT_TYPE_PROTOBUF",
    "GRPC_EXPORT_METHOD",
    "ExportTraceServiceRequest",
    "ExportTraceServiceResponse",
    "InstrumentationScope",
    "OtlpDecodeError",
    "Resource",
    "Span",
    "SpanGroup",
    "SplitRequest",
    "TraceChunk",
    "build_request",
    "count_spans",
    "decode_failure",
    "decode_json_request",
    "decode_protobuf_request",
    "encode_json",
    "export_response",
    "hex_id",
    "iter_spans",
    "retry_delay_from_status",
    "retry_info",
    "rpc_status",
    "split_request",
]

CONTENT_TYPE_PROTOBUF: Final = "application/x-protobuf"
CONTENT_TYPE_JSON: Final = "application/json"
#: The full gRPC method name of the OTLP trace export call.
GRPC_EXPORT_METHOD: Final = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

_TRACE_ID_LEN: Final = 16
_SPAN_ID_LEN: Final = 8
_ZERO_TRACE_ID: Final = bytes(_TRACE_ID_LEN)
_ZERO_SPAN_ID: Final = bytes(_SPAN_ID_LEN)

#: JSON keys that hold ids, in both spellings a proto3 JSON parser accepts.
_SPAN_ID_KEYS: Final = (
    "traceId",
    "trace_id",
    "spanId",
    "span_id",
    "parentSpanId",
    "parent_span_id",
)
_LINK_ID_KEYS: Final = ("traceId", "trace_id", "spanId", "span_id")


class OtlpDecodeError(ValueError):
    """The body is not a valid OTLP trace export request; the message says why."""


def decode_failure(exc: BaseException) -> str:
    """What to answer when decoding raised something other than
    :class:`OtlpDecodeError`: only the kind of error, as its message may quote the body
    (the receivers' last resort, and the OTLP/JSON decoder's)."""
    return f"cannot decode the request ({type(exc).__name__})"


# --------------------------------------------------------------------------- model
@dataclass(slots=True, eq=False)
class SpanGroup:
    """Spans of one trace that share a Resource and an InstrumentationScope.

    ``resource`` and ``scope`` may be shared with groups of other traces that came in
    the same request: treat them as read-only.  ``resource`` is ``None`` when the
    sender did not set one (it stays unset on the way out).
    """

    resource: Resource | None
    resource_schema_url: str
    scope: InstrumentationScope | None
    scope_schema_url: str
    spans: list[Span] = field(default_factory=list)
    #: Sequence number of the write-ahead log entry these spans came from (-1: none).
    wal_seq: int = -1


@dataclass(slots=True, eq=False)
class TraceChunk:
    """The spans of one trace found in one export request."""

    groups: list[SpanGroup]
    span_count: int = 0
    has_root: bool = False


@dataclass(slots=True, eq=False)
class SplitRequest:
    """One export request, grouped by trace id, plus what had to be rejected."""

    traces: dict[bytes, TraceChunk]
    span_count: int
    rejected_spans: int = 0
    error_message: str = ""
    #: What the write-ahead log stores for this request: the plain (inflated) protobuf
    #: body, or the decoded message (OTLP/JSON); set by the receivers' decoder.
    payload: bytes | Message | None = None


def split_request(request: ExportTraceServiceRequest) -> SplitRequest:
    """Group the spans of ``request`` by trace id, in one walk.

    Spans whose trace id is not 16 non-zero bytes, or whose span id is not 8 non-zero
    bytes, cannot be assembled into a trace; they are counted as rejected (the
    receiver reports them through OTLP partial success) and the rest are kept.
    """
    traces: dict[bytes, TraceChunk] = {}
    accepted = 0
    rejected = 0
    for rs in request.resource_spans:
        resource = rs.resource if rs.HasField("resource") else None
        rs_url = rs.schema_url
        for ss in rs.scope_spans:
            scope = ss.scope if ss.HasField("scope") else None
            ss_url = ss.schema_url
            local: dict[bytes, SpanGroup] = {}
            for span in ss.spans:
                trace_id = span.trace_id
                group = local.get(trace_id)
                if group is None:
                    if len(trace_id) != _TRACE_ID_LEN or trace_id == _ZERO_TRACE_ID:
                        rejected += 1
                        continue
                    group = local[trace_id] = SpanGroup(resource, rs_url, scope, ss_url)
                    chunk = traces.get(trace_id)
                    if chunk is None:
                        chunk = traces[trace_id] = TraceChunk([])
                    chunk.groups.append(group)
                else:
                    chunk = traces[trace_id]
                span_id = span.span_id
                if len(span_id) != _SPAN_ID_LEN or span_id == _ZERO_SPAN_ID:
                    rejected += 1
                    continue
                group.spans.append(span)
                chunk.span_count += 1
                if not span.parent_span_id:
                    chunk.has_root = True
                accepted += 1
    if rejected:
        # Drop groups that ended up empty (every span in them was rejected).
        for trace_id in [t for t, c in traces.items() if c.span_count == 0]:
            del traces[trace_id]
        for chunk in traces.values():
            chunk.groups = [g for g in chunk.groups if g.spans]
    message = (
        f"{rejected} span(s) rejected: trace_id must be 16 bytes and span_id 8 bytes, not all zero"
        if rejected
        else ""
    )
    return SplitRequest(traces, accepted, rejected, message)


def build_request(groups: Iterable[SpanGroup]) -> ExportTraceServiceRequest:
    """An export request holding every span of ``groups``.

    Groups that share the same Resource (or Resource and scope) object are merged into
    one ResourceSpans (ScopeSpans), so a batch built from one incoming request keeps
    its shape.  Span messages are copied; the groups are not modified.
    """
    request = ExportTraceServiceRequest()
    by_resource: dict[tuple[int, str], Any] = {}
    by_scope: dict[tuple[int, str, int, str], Any] = {}
    for group in groups:
        if not group.spans:
            continue
        rkey = (id(group.resource), group.resource_schema_url)
        rs = by_resource.get(rkey)
        if rs is None:
            rs = by_resource[rkey] = request.resource_spans.add()
            if group.resource is not None:
                rs.resource.CopyFrom(group.resource)
            if group.resource_schema_url:
                rs.schema_url = group.resource_schema_url
        skey = (*rkey, id(group.scope), group.scope_schema_url)
        ss = by_scope.get(skey)
        if ss is None:
            ss = by_scope[skey] = rs.scope_spans.add()
            if group.scope is not None:
                ss.scope.CopyFrom(group.scope)
            if group.scope_schema_url:
                ss.schema_url = group.scope_schema_url
        ss.spans.extend(group.spans)
    return request


def iter_spans(request: ExportTraceServiceRequest) -> Iterator[Span]:
    """Every span of a request, in order."""
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            yield from ss.spans


def count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


# ------------------------------------------------------------------------ decoding
def decode_protobuf_request(body: bytes) -> ExportTraceServiceRequest:
    """Parse a binary ExportTraceServiceRequest; a large one in pieces (see
    :mod:`ragtrace_collector.otlp.piecewise`), so that no parse call holds the interpreter
    lock for long."""
    try:
        return parse_in_pieces(body)
    except (DecodeError, ValueError):  # upb raises DecodeError; be generous
        # Never the parser's message: described by position, never by content.
        problem = protobuf_problem(body)
        raise OtlpDecodeError(f"malformed protobuf ExportTraceServiceRequest: {problem}") from None


def decode_json_request(body: bytes) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON ExportTraceServiceRequest (hex ids, integer or named enums).

    Every problem, whatever finds it, raises :class:`OtlpDecodeError` with the message
    ``invalid OTLP/JSON: <what, where>``; the prefix is added here and nowhere else."""
    try:
        return _parse_json_request(body)
    except _JsonProblem as exc:
        problem = str(exc)
    except Exception as exc:  # whatever a hostile body provokes: its kind, never its text
        problem = decode_failure(exc)
    raise OtlpDecodeError(f"invalid OTLP/JSON: {problem}")


class _JsonProblem(Exception):
    """What is wrong with an OTLP/JSON body, said by position and type, never by value."""


def _parse_json_request(body: bytes) -> ExportTraceServiceRequest:
    try:
        data = json.loads(body)
    except UnicodeDecodeError as exc:
        raise _JsonProblem(f"malformed JSON: body is not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise _JsonProblem(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise _JsonProblem("malformed JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise _JsonProblem("malformed JSON: the top level must be an object")
    _hex_ids_to_base64(data)
    # Checked against the schema first: the parser would take a string where an object
    # belongs for an empty message (an attribute's value silently lost), and its error
    # messages quote the offending value.  See otlp.problems.
    problem = json_problem(data)
    if problem is not None:
        raise _JsonProblem(problem)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise _JsonProblem(f"not an ExportTraceServiceRequest ({type(exc).__name__})") from None
    return request


def _hex_ids_to_base64(data: dict[str, Any]) -> None:
    """Rewrite OTLP/JSON hex ids in place into the base64 that proto3 JSON expects."""
    for i, rs in enumerate(_as_list(data, "resourceSpans", "resource_spans")):
        for j, ss in enumerate(_as_list(rs, "scopeSpans", "scope_spans")):
            for k, span in enumerate(_as_list(ss, "spans")):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                _convert_ids(span, _SPAN_ID_KEYS, where)
                for n, link in enumerate(_as_list(span, "links")):
                    _convert_ids(link, _LINK_ID_KEYS, f"{where}.links[{n}]")


def _as_list(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        return []
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return value
    return []


def _convert_ids(obj: Any, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(obj, dict):
        return
    for key in keys:
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise _JsonProblem(f"{where}.{key}: expected a hex string, got {json_type(value)}")
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise _JsonProblem(
                f"{where}.{key}: expected a hex string, got a string of {len(value)} "
                "characters that is not hex (OTLP/JSON ids are hex)"
            ) from None
        obj[key] = base64.b64encode(raw).decode("ascii")


# ------------------------------------------------------------------------ encoding
def hex_id(raw: bytes) -> str:
    return raw.hex()


def encode_json(message: Message) -> bytes:
    """OTLP/JSON for any OTLP message (ids as hex, enums as integers, camelCase)."""
    data = json_format.MessageToDict(message, use_integers_for_enums=True)
    if isinstance(message, ExportTraceServiceRequest):
        _base64_ids_to_hex(data)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _base64_ids_to_hex(data: dict[str, Any]) -> None:
    for rs in data.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                _b64_to_hex(span, ("traceId", "spanId", "parentSpanId"))
                for link in span.get("links", ()):
                    _b64_to_hex(link, ("traceId", "spanId"))


def _b64_to_hex(obj: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str):
            try:
                obj[key] = base64.b64decode(value).hex()
            except binascii.Error:  # pragma: no cover - MessageToDict always emits base64
                pass


def export_response(rejected_spans: int = 0, error_message: str = "") -> ExportTraceServiceResponse:
    response = ExportTraceServiceResponse()
    if rejected_spans or error_message:
        response.partial_success.rejected_spans = rejected_spans
        response.partial_success.error_message = error_message
    return response


def retry_info(delay_seconds: float) -> error_details_pb2.RetryInfo:
    seconds = int(delay_seconds)
    nanos = round((delay_seconds - seconds) * 1e9)
    return error_details_pb2.RetryInfo(retry_delay=Duration(seconds=seconds, nanos=nanos))


def rpc_status(code: int, message: str, *, retry_delay: float | None = None) -> status_pb2.Status:
    """A ``google.rpc.Status``; with ``retry_delay`` it carries a RetryInfo detail."""
    status = status_pb2.Status(code=code, message=message)
    if retry_delay is not None:
        status.details.add().Pack(retry_info(retry_delay))
    return status


def retry_delay_from_status(status: status_pb2.Status) -> float | None:
    """The RetryInfo delay of a ``google.rpc.Status``, if it has one."""
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


#: google.rpc.Code values used by the receivers, re-exported for convenience.
CODE_INVALID_ARGUMENT: Final = code_pb2.INVALID_ARGUMENT
CODE_UNAUTHENTICATED: Final = code_pb2.UNAUTHENTICATED
CODE_RESOURCE_EXHAUSTED: Final = code_pb2.RESOURCE_EXHAUSTED
CODE_UNAVAILABLE: Final = code_pb2.UNAVAILABLE
CODE_INTERNAL: Final = code_pb2.INTERNAL
CODE_UNIMPLEMENTED: Final = code_pb2.UNIMPLEMENTED
