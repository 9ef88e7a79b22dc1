"""One piece of user feedback, read from (or written as) a ``ragtrace.feedback`` span.

The SDK's ``ragtrace.feedback()`` and the collector's ``POST /v1/feedback`` both put
feedback into the span stream as one span in the request's own trace (attributes in
:mod:`ragtrace.semconv`).  That makes feedback exactly as durable as an acknowledged
span (it goes through the write-ahead log), routes it by trace id like the request,
and lets every exporter show it.  This module is the one place that reads such a span
into a :class:`Feedback` and builds one from a :class:`Feedback`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv

from ..otlp.codec import hex_id
from ..otlp.spanattrs import attributes_to_dict, set_attributes

if TYPE_CHECKING:
    from opentelemetry.proto.resource.v1 import resource_pb2

__all__ = ["Feedback", "UpsertKey", "from_span", "is_feedback_span", "to_span"]

#: (trace id, name, user id or ""): a repeat of the same key replaces the earlier one.
UpsertKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Feedback:
    """What a user said about one request."""

    #: The request's trace id, 32 lowercase hex digits.
    trace_id: str
    #: The request span's id (16 lowercase hex digits) when the sender knew it.
    span_id: str | None
    name: str
    #: In [0, 1]; a thumbs-up is 1.0.
    value: float
    #: ``boolean`` or ``numeric``.
    value_type: str
    comment: str | None = None
    user_id: str | None = None
    correction: str | None = None
    #: ``service.name`` of the span's resource ("" when unset).
    service: str = ""
    #: When the feedback was given (the span's end time), in ns since the epoch.
    time_unix_nano: int = 0

    @property
    def outcome(self) -> str:
        """``positive`` or ``negative`` (a number is negative below 0.5)."""
        return semconv.feedback_outcome(self.value)

    @property
    def negative(self) -> bool:
        return self.outcome == semconv.FEEDBACK_NEGATIVE

    @property
    def key(self) -> UpsertKey:
        """The upsert key: a later feedback with the same key replaces this one."""
        return (self.trace_id, self.name, self.user_id or "")


def is_feedback_span(span: trace_pb2.Span) -> bool:
    """Whether ``span`` is a ``ragtrace.feedback`` span: its name, then its
    ``ragtrace.span.kind`` (the name first: cheap enough for every span of a trace)."""
    if span.name != semconv.FEEDBACK_SPAN_NAME:
        return False
    for kv in span.attributes:
        if kv.key == semconv.RAGTRACE_SPAN_KIND:
            return bool(kv.value.string_value == semconv.KIND_FEEDBACK)
    return False


def from_span(
    span: trace_pb2.Span, resource: resource_pb2.Resource | None = None
) -> Feedback | str:
    """The feedback a ``ragtrace.feedback`` span carries, or why it carries none.

    The span comes from a client, so nothing is trusted: a missing or out-of-range
    value, an over-long name or user id, or a bad trace id gives a reason (a short
    phrase naming the attribute, never its value) instead of a :class:`Feedback`.
    Over-long comments and corrections are cut, as the SDK cuts them.
    """
    if len(span.trace_id) != 16 or not any(span.trace_id):
        return "bad trace id"
    attrs = attributes_to_dict(span.attributes)
    if attrs.get(semconv.RAGTRACE_SPAN_KIND) != semconv.KIND_FEEDBACK:
        return "not a feedback span"
    value = attrs.get(semconv.FEEDBACK_VALUE)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{semconv.FEEDBACK_VALUE} missing or not a number"
    read = semconv.feedback_number(value)
    if read is None:
        return f"{semconv.FEEDBACK_VALUE} outside [0, 1]"
    number = read[0]
    name = attrs.get(semconv.FEEDBACK_NAME, semconv.FEEDBACK_DEFAULT_NAME)
    if not _identifier(name, semconv.FEEDBACK_MAX_NAME_CHARS):
        return f"{semconv.FEEDBACK_NAME} empty, too long or not a string"
    user_id = attrs.get(semconv.FEEDBACK_USER_ID)
    if user_id is not None and not _identifier(user_id, semconv.FEEDBACK_MAX_USER_ID_CHARS):
        return f"{semconv.FEEDBACK_USER_ID} empty, too long or not a string"
    value_type = attrs.get(semconv.FEEDBACK_VALUE_TYPE)
    if value_type not in (semconv.FEEDBACK_TYPE_BOOLEAN, semconv.FEEDBACK_TYPE_NUMERIC):
        value_type = semconv.FEEDBACK_TYPE_NUMERIC
    span_id = _request_span_id(span)
    return Feedback(
        trace_id=hex_id(span.trace_id),
        span_id=span_id,
        name=name,
        value=number,
        value_type=value_type,
        comment=_text(attrs.get(semconv.FEEDBACK_COMMENT)),
        user_id=user_id,
        correction=_text(attrs.get(semconv.FEEDBACK_CORRECTION)),
        service=_service(resource),
        time_unix_nano=span.end_time_unix_nano or span.start_time_unix_nano,
    )


def to_span(feedback: Feedback) -> trace_pb2.Span:
    """A ``ragtrace.feedback`` span for ``feedback``, shaped as the SDK shapes it.

    It sits in the request's trace.  With a span id it is a child of the request span
    and links to it; without one its parent is a random placeholder, as in the SDK.
    """
    span = trace_pb2.Span(
        trace_id=bytes.fromhex(feedback.trace_id),
        span_id=_random_id(),
        name=semconv.FEEDBACK_SPAN_NAME,
        kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=feedback.time_unix_nano,
        end_time_unix_nano=feedback.time_unix_nano,
    )
    if feedback.span_id is not None:
        request = bytes.fromhex(feedback.span_id)
        span.parent_span_id = request
        span.links.add(trace_id=span.trace_id, span_id=request)
    else:
        span.parent_span_id = _random_id()
    attrs: dict[str, Any] = {
        semconv.OPENINFERENCE_SPAN_KIND: semconv.OI_KIND_EVALUATOR,
        semconv.RAGTRACE_SPAN_KIND: semconv.KIND_FEEDBACK,
        semconv.FEEDBACK_NAME: feedback.name,
        semconv.FEEDBACK_VALUE: feedback.value,
        semconv.FEEDBACK_VALUE_TYPE: feedback.value_type,
        semconv.FEEDBACK_OUTCOME: feedback.outcome,
    }
    for key, text in (
        (semconv.FEEDBACK_USER_ID, feedback.user_id),
        (semconv.FEEDBACK_COMMENT, feedback.comment),
        (semconv.FEEDBACK_CORRECTION, feedback.correction),
    ):
        if text is not None:
            attrs[key] = text
    set_attributes(span.attributes, attrs.items())
    return span


def _identifier(value: Any, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value[: semconv.FEEDBACK_MAX_TEXT_CHARS]


def _request_span_id(span: trace_pb2.Span) -> str | None:
    """The request span's id: the link into the same trace, as the SDK writes it."""
    for link in span.links:
        if link.trace_id == span.trace_id and len(link.span_id) == 8 and any(link.span_id):
            return hex_id(link.span_id)
    return None


def _service(resource: resource_pb2.Resource | None) -> str:
    if resource is None:
        return ""
    for kv in resource.attributes:
        if kv.key == "service.name":
            return str(kv.value.string_value)
    return ""


def _random_id() -> bytes:
    while True:
        raw = os.urandom(8)
        if any(raw):
            return raw
