"""``POST /v1/feedback``: what a front end or back end sends, read and checked.

The body is one JSON object::

    {"trace_id": "<32 hex>", "value": true | false | <number in [0, 1]>,
     "span_id": "<16 hex>", "name": "user_feedback", "comment": "...",
     "user_id": "...", "correction": "...", "service": "..."}

``trace_id`` and ``value`` are required.  Nothing in it is trusted: a field of the
wrong type or out of its bounds is refused with the field's name and what it must be,
never with the value sent (a body may hold a user's words or a token pasted by
mistake); a field the endpoint does not know is refused too, by name, so a typo
(``comments``) is not silently dropped.  ``comment`` and ``correction`` are cut at
:data:`ragtrace.semconv.FEEDBACK_MAX_TEXT_CHARS` characters, as the SDK cuts them;
``name`` and ``user_id`` longer than their bounds are refused (cutting them could merge
two names or two users).

Accepted feedback becomes one ``ragtrace.feedback`` span, shaped exactly as the SDK
shapes it (:func:`~ragtrace_collector.feedback.record.to_span`), timed now, in an OTLP
request of its own (:func:`feedback_request`).  The receiver hands that request to the
pipeline like any OTLP request, so it goes through the write-ahead log before the
client is answered.  ``service`` (optional) becomes the resource's ``service.name``;
without it the resource has none and the join takes the service of the request's
scores.

:class:`TokenBucket` is the endpoint's rate bound (``feedback.rate`` per second, a
burst of one second's worth).
"""

from __future__ import annotations

import json
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from ragtrace import semconv

from ..otlp.codec import SplitRequest, split_request
from .record import Feedback, to_span

__all__ = [
    "FIELDS",
    "SCOPE_NAME",
    "BadFeedback",
    "FeedbackIntake",
    "TokenBucket",
    "feedback_request",
    "parse_feedback",
]

#: The instrumentation scope of feedback spans made by the endpoint.
SCOPE_NAME: Final = "ragtrace.collector.feedback"
#: Every field the body may hold.
FIELDS: Final = (
    "trace_id",
    "value",
    "span_id",
    "name",
    "comment",
    "user_id",
    "correction",
    "service",
)
#: A ``service`` longer than this is refused (it becomes a metric label).
_MAX_SERVICE_CHARS: Final = semconv.FEEDBACK_MAX_NAME_CHARS
#: Unknown field names quoted in an error, and their longest quoted length.
_MAX_UNKNOWN_NAMED: Final = 5
_MAX_UNKNOWN_CHARS: Final = 40
_HEX: Final = frozenset(string.hexdigits)
_QUOTABLE: Final = frozenset(string.ascii_letters + string.digits + "_.-")


class BadFeedback(ValueError):
    """The body cannot be taken; ``field`` names the culprit (``body`` for the whole)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def answer(self) -> dict[str, Any]:
        """The JSON error the client gets: the field and what it must be."""
        return {"error": {"field": self.field, "message": self.message}}


def parse_feedback(body: bytes, *, now_ns: int | None = None) -> Feedback:
    """The feedback ``body`` holds, timed ``now_ns`` (default: now), or
    :class:`BadFeedback`."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # bad UTF-8 or JSON; nesting too deep
        raise BadFeedback("body", "must be a JSON object (UTF-8)") from None
    if not isinstance(data, dict):
        raise BadFeedback("body", "must be a JSON object")
    unknown = [key for key in data if key not in FIELDS]
    if unknown:
        raise BadFeedback("body", f"unknown fields: {_quote_names(unknown)}")
    if "trace_id" not in data:
        raise BadFeedback("trace_id", "is required")
    if "value" not in data:
        raise BadFeedback("value", "is required")
    trace_id = _hex_id(data["trace_id"], 32, "trace_id")
    raw_span = data.get("span_id")
    span_id = None if raw_span is None else _hex_id(raw_span, 16, "span_id")
    value, value_type = _value(data["value"])
    name = _identifier(data, "name", semconv.FEEDBACK_MAX_NAME_CHARS)
    return Feedback(
        trace_id=trace_id,
        span_id=span_id,
        name=name if name is not None else semconv.FEEDBACK_DEFAULT_NAME,
        value=value,
        value_type=value_type,
        comment=_text(data, "comment"),
        user_id=_identifier(data, "user_id", semconv.FEEDBACK_MAX_USER_ID_CHARS),
        correction=_text(data, "correction"),
        service=_identifier(data, "service", _MAX_SERVICE_CHARS) or "",
        time_unix_nano=now_ns if now_ns is not None else time.time_ns(),
    )


def feedback_request(feedback: Feedback) -> tuple[SplitRequest, bytes]:
    """The OTLP request carrying ``feedback`` as one span (resource ``service.name``
    when the feedback names a service), split for the pipeline, and its bytes for the
    write-ahead log."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    if feedback.service:
        attribute = resource_spans.resource.attributes.add(key="service.name")
        attribute.value.string_value = feedback.service
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = SCOPE_NAME
    scope_spans.spans.append(to_span(feedback))
    payload = request.SerializeToString()
    split = split_request(request)
    split.payload = payload
    return split, payload


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved; :meth:`take` spends one."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self._tokens = self.burst
        self._at: float | None = None

    def take(self, now: float) -> float:
        """0.0 when a token was spent; else the seconds until one is there (none spent)."""
        if self._at is not None and now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now if self._at is None else max(self._at, now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate


# ------------------------------------------------------------------- fields
def _hex_id(raw: Any, digits: int, field: str) -> str:
    if (
        not isinstance(raw, str)
        or len(raw) != digits
        or not _HEX.issuperset(raw)
        or not int(raw, 16)
    ):
        raise BadFeedback(field, f"must be {digits} hex digits, not all zero")
    return raw.lower()


def _value(raw: Any) -> tuple[float, str]:
    # JSON numbers only: a numeric string is not a number here.
    read = semconv.feedback_number(raw) if isinstance(raw, bool | int | float) else None
    if read is None:
        raise BadFeedback("value", "must be true, false or a number in [0, 1]")
    return read


def _identifier(data: dict[str, Any], field: str, limit: int) -> str | None:
    raw = data.get(field)
    if raw is None:
        return None
    if not isinstance(raw, str) or not 0 < len(raw) <= limit:
        raise BadFeedback(field, f"must be a string of 1 to {limit} characters")
    return raw


def _text(data: dict[str, Any], field: str) -> str | None:
    raw = data.get(field)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise BadFeedback(field, "must be a string")
    return raw[: semconv.FEEDBACK_MAX_TEXT_CHARS]


def _quote_names(names: list[str]) -> str:
    """Unknown field names, quoted only when they look like field names (letters,
    digits, ``_.-``, short); the others are counted, not quoted."""
    quoted = [n for n in names if len(n) <= _MAX_UNKNOWN_CHARS and _QUOTABLE.issuperset(n)]
    shown = ", ".join(sorted(quoted)[:_MAX_UNKNOWN_NAMED])
    rest = len(names) - min(len(quoted), _MAX_UNKNOWN_NAMED)
    if rest:
        shown = f"{shown} and {rest} more" if shown else f"{rest} with names not shown"
    return f"{shown} (known: {', '.join(FIELDS)})"


def _ignore(_reason: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class FeedbackIntake:
    """What the OTLP/HTTP receiver needs to serve ``POST /v1/feedback``."""

    #: Largest body, in bytes (``feedback.max_body``).
    max_body: int
    #: Feedback accepted per second (``feedback.rate``), a burst of one second's worth.
    rate: float
    #: Counts a refused body by reason (``FeedbackStage.invalid``).
    invalid: Callable[[str], None] = _ignore
    #: Origins whose pages may call the endpoint (``feedback.allowed_origins``).
    allowed_origins: frozenset[str] = frozenset()

    def cors_origin(self, origin: str | None) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for a request from ``origin``, or
        None when that origin is not allowed (or the request came from no page)."""
        if origin is None or not self.allowed_origins:
            return None
        if "*" in self.allowed_origins:
            return "*"
        return origin if origin in self.allowed_origins else None
