"""``ragtrace.current_request()`` and ``ragtrace.feedback()``: what users say about a request.

Inside a ``@rag`` call, :func:`current_request` returns a :class:`RequestHandle`: the
trace id and span id of the request, as hex strings, small enough to hand to a front end
with the answer.  Later (seconds or hours, from any thread, with no live context),
:func:`feedback` records what the user said about that request.

The feedback is one span (``ragtrace.feedback``, see :mod:`ragtrace.semconv`) **in the
request's own trace**, so a load balancer that routes by trace id sends it to the
collector replica that scored the request.  The OpenTelemetry SDK keeps a trace id only
from a parent, so the span is started under a non-recording, remote parent built from a
``SpanContext``:

* with a handle (trace id and span id), the parent is the request span itself and the
  feedback span also carries a span link to it, as the collector's late-result carriers
  do;
* with a trace id alone, the parent span id is a random placeholder that is in no trace
  (backends may show the feedback span as an orphan of that trace) and there is no link.

The parent is marked sampled, so the SDK's ``sample_rate`` never drops feedback: a
feedback on a request that was sampled out still reaches the collector, which counts it
and joins it to nothing.

Feedback never raises into the application.  Bad input is logged once per kind of fault
(``logging.getLogger("ragtrace")``, values never echoed) and the feedback is dropped:

* a target that is neither a :class:`RequestHandle` nor a 32-hex-digit trace id, or an
  all-zero id;
* a value that is neither a bool nor a finite number in [0, 1] (a 1-5 star rating is
  refused rather than clamped: clamping would turn every rating into 1.0);
* a name that is not a non-empty string of at most :data:`MAX_NAME_CHARS` characters;
* a user id that is not a non-empty string of at most :data:`MAX_USER_ID_CHARS`
  characters (it is the upsert key: cutting it could merge two users).

``comment`` and ``correction`` are free text: ``redact`` applies to them, and each is
cut at :data:`MAX_TEXT_CHARS` characters (or ``max_content_chars`` if smaller), which
sets ``ragtrace.content_truncated`` on the span.  A comment or correction that is not a
string is left out (logged once); the feedback itself is kept.  They are recorded even
with ``capture_content=False``: the application chose to send them, as with
``set_reference``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from ragtrace import semconv
from ragtrace._capture import process_text
from ragtrace._config import RUNTIME, Settings
from ragtrace._reference import current_rag
from ragtrace._safety import report, warn_once

__all__ = [
    "MAX_NAME_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_USER_ID_CHARS",
    "RequestHandle",
    "current_request",
    "feedback",
]

#: ``comment`` and ``correction`` are cut at this many characters.
MAX_TEXT_CHARS: Final = semconv.FEEDBACK_MAX_TEXT_CHARS
#: Longer feedback names are refused (a name is a metric label in the collector).
MAX_NAME_CHARS: Final = semconv.FEEDBACK_MAX_NAME_CHARS
#: Longer user ids are refused.
MAX_USER_ID_CHARS: Final = semconv.FEEDBACK_MAX_USER_ID_CHARS

_TRACE_ID_DIGITS: Final = 32
_SPAN_ID_DIGITS: Final = 16
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_placeholder_ids = random.SystemRandom()


@dataclass(frozen=True, slots=True)
class RequestHandle:
    """One request, as :func:`current_request` returns it: hex ids that survive JSON."""

    #: 32 lowercase hex digits
    trace_id: str
    #: 16 lowercase hex digits: the ``@rag`` span
    span_id: str


def _hex_id(text: object, digits: int) -> int | None:
    """The id in ``text`` (exactly ``digits`` hex digits, not all zero), else None."""
    if not isinstance(text, str) or len(text) != digits or not _HEX.issuperset(text):
        return None
    value = int(text, 16)
    return value or None


def current_request() -> RequestHandle | None:
    """The innermost running ``@rag`` request, or None outside one.  Never raises.

    Also None when ragtrace is disabled or has no tracer yet (the request then has no
    trace id).
    """
    try:
        frame = current_rag()
        if frame is None:
            return None
        ctx = frame.span.get_span_context()
        if not ctx.is_valid:
            return None
        return RequestHandle(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    except Exception as exc:
        report("current_request", exc)
        return None


def _drop(key: str, message: str) -> bool:
    warn_once(f"feedback-{key}", f"feedback() {message}; this feedback is dropped")
    return False


def _target(target: object) -> tuple[int, int | None] | str:
    """(trace id, span id or None), or the reason the target is refused."""
    if isinstance(target, RequestHandle):
        trace_id = _hex_id(target.trace_id, _TRACE_ID_DIGITS)
        span_id = _hex_id(target.span_id, _SPAN_ID_DIGITS)
        if trace_id is None or span_id is None:
            return "got a RequestHandle whose ids are not 32 and 16 hex digits (nor all zero)"
        return trace_id, span_id
    if isinstance(target, str):
        trace_id = _hex_id(target, _TRACE_ID_DIGITS)
        if trace_id is None:
            return "got a trace id that is not 32 hex digits (or is all zero)"
        return trace_id, None
    return f"needs a RequestHandle or a trace id string as its target, got {type(target).__name__}"


def _identifier(value: object, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit


def _text(key: str, value: object, what: str, settings: Settings, attrs: dict[str, Any]) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        warn_once(
            f"feedback-{what}",
            f"feedback(): {what}= must be a str, got {type(value).__name__}; left out",
        )
        return
    limit = MAX_TEXT_CHARS
    if settings.max_content_chars:
        limit = min(limit, settings.max_content_chars)
    bounded = dataclasses.replace(settings, max_content_chars=limit)
    attrs[key] = process_text(value, bounded, attrs)


def feedback(
    target: RequestHandle | str,
    value: bool | float,
    *,
    name: str = semconv.FEEDBACK_DEFAULT_NAME,
    comment: str | None = None,
    user_id: str | None = None,
    correction: str | None = None,
) -> bool:
    """Record what a user said about a request.  Never raises.

    ``target``: a :class:`RequestHandle` from :func:`current_request`, or the request's
    trace id (32 hex digits).  ``value``: a bool (thumbs up is True) or a number in
    [0, 1] (negative below 0.5).  ``name`` tells feedback kinds apart; a repeat of the
    same (request, name, user_id) replaces the earlier one in the collector.

    Returns True when the feedback span was recorded, False when it was dropped (bad
    input, logged once), ragtrace is disabled, or no tracer provider records spans.
    """
    try:
        settings = RUNTIME.settings
        if not settings.enabled:
            return False
        where = _target(target)
        if isinstance(where, str):
            return _drop("target", where)
        trace_id, span_id = where
        parsed = semconv.feedback_number(value)
        if parsed is None:
            return _drop(
                "value",
                f"needs a bool or a finite number in [0, 1] as its value, "
                f"got {type(value).__name__}",
            )
        if not _identifier(name, MAX_NAME_CHARS):
            return _drop("name", f"needs a name of 1 to {MAX_NAME_CHARS} characters")
        if user_id is not None and not _identifier(user_id, MAX_USER_ID_CHARS):
            return _drop("user_id", f"needs a user_id of 1 to {MAX_USER_ID_CHARS} characters")
        number, value_type = parsed
        attrs: dict[str, Any] = {
            semconv.OPENINFERENCE_SPAN_KIND: semconv.OI_KIND_EVALUATOR,
            semconv.RAGTRACE_SPAN_KIND: semconv.KIND_FEEDBACK,
            semconv.FEEDBACK_NAME: name,
            semconv.FEEDBACK_VALUE: number,
            semconv.FEEDBACK_VALUE_TYPE: value_type,
            semconv.FEEDBACK_OUTCOME: semconv.feedback_outcome(number),
        }
        if user_id is not None:
            attrs[semconv.FEEDBACK_USER_ID] = user_id
        _text(semconv.FEEDBACK_COMMENT, comment, "comment", settings, attrs)
        _text(semconv.FEEDBACK_CORRECTION, correction, "correction", settings, attrs)
        return _emit(settings.tracer, trace_id, span_id, attrs)
    except Exception as exc:
        report("recording feedback", exc)
        return False


def _emit(
    tracer: trace_api.Tracer, trace_id: int, span_id: int | None, attrs: dict[str, Any]
) -> bool:
    """Start and end the feedback span under a remote parent in the request's trace."""
    links: list[Link] = []
    if span_id is not None:
        request = SpanContext(trace_id, span_id, is_remote=True, trace_flags=_SAMPLED)
        links.append(Link(request))
        parent = request
    else:
        placeholder = _placeholder_ids.getrandbits(64) or 1
        parent = SpanContext(trace_id, placeholder, is_remote=True, trace_flags=_SAMPLED)
    ctx = trace_api.set_span_in_context(NonRecordingSpan(parent), context_api.Context())
    span = tracer.start_span(
        semconv.FEEDBACK_SPAN_NAME,
        context=ctx,
        kind=SpanKind.INTERNAL,
        attributes=attrs,
        links=links,
    )
    recorded = span.is_recording()
    span.end()
    return recorded
