"""Turning captured values into span attribute text: serialise, redact, truncate.

Order for every captured text: serialise (``str`` as is, anything else as JSON) →
``redact`` (the user's callable) → truncate to ``max_content_chars`` with a visible
marker.  Redaction runs before truncation so that a secret straddling the cut is still
redacted; a text far beyond the limit is first cut to the limit plus a margin, so a
megabyte-long document does not cost a megabyte of regex work.

If ``redact`` raises or returns a non-string, the text is *withheld* (replaced by a
marker), never recorded unredacted.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

from ragtrace import semconv
from ragtrace._config import Settings
from ragtrace._safety import report

__all__ = [
    "REDACTION_FAILED",
    "REDACT_MARGIN",
    "TRUNCATION_MARKER",
    "json_text",
    "process_text",
    "put_value",
    "serialize",
]

#: Appended to a cut text; ``{}`` is the number of characters removed.
TRUNCATION_MARKER = "… [ragtrace: truncated {} characters]"
#: Recorded instead of a text whose redaction failed.
REDACTION_FAILED = "[ragtrace: redaction failed, text withheld]"
#: Characters kept beyond the limit for the redactor to see (see module doc).
REDACT_MARGIN = 1024

_Attrs = dict[str, Any]


def _json_default(value: Any) -> Any:
    """JSON fallback for values json cannot encode natively."""
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):  # pydantic v2
        return model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)


#: One shared encoder: ``json.dumps`` with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(default=_json_default, ensure_ascii=False)


def json_text(value: Any) -> str:
    """``value`` as JSON text; anything unknown goes through ``str()``.  May raise."""
    return _ENCODER.encode(value)


def serialize(value: Any) -> tuple[str, str]:
    """``(text, mime type)``: strings as plain text, everything else as JSON.  May raise."""
    if isinstance(value, str):
        return str(value), semconv.MIME_TEXT
    return json_text(value), semconv.MIME_JSON


def process_text(text: str, settings: Settings, attrs: _Attrs, omitted: int = 0) -> str:
    """Redact and truncate one captured text.

    ``omitted`` counts characters the caller already dropped (a stream kept only up to
    the limit).  Sets ``ragtrace.content_truncated`` in ``attrs`` when it cuts.
    """
    limit = settings.max_content_chars
    redact = settings.redact
    if redact is not None:
        if limit and len(text) > limit + REDACT_MARGIN:
            omitted += len(text) - (limit + REDACT_MARGIN)
            text = text[: limit + REDACT_MARGIN]
        try:
            redacted: object = redact(text)
        except Exception as exc:
            report("the redact callable", exc)
            return REDACTION_FAILED
        if not isinstance(redacted, str):
            report(
                "the redact callable",
                TypeError(f"redact returned {type(redacted).__name__}, expected str"),
            )
            return REDACTION_FAILED
        text = redacted
    if limit and len(text) + omitted > limit:
        cut = len(text) + omitted - limit
        text = text[:limit] + TRUNCATION_MARKER.format(cut)
        attrs[semconv.RAGTRACE_CONTENT_TRUNCATED] = True
    return text


def put_value(
    attrs: _Attrs, value_key: str, mime_key: str, value: Any, settings: Settings, what: str
) -> str | None:
    """Record ``value`` as ``value_key`` (+ its mime type); returns the recorded text.

    ``None`` records nothing.  A value that cannot be serialised is reported once and
    skipped.
    """
    if value is None:
        return None
    if type(value) is str and settings.redact is None:
        limit = settings.max_content_chars
        if not limit or len(value) <= limit:  # the common case: nothing to do
            attrs[value_key] = value
            attrs[mime_key] = semconv.MIME_TEXT
            return value
    try:
        text, mime = serialize(value)
    except Exception as exc:
        report(f"serialising the {what}", exc)
        return None
    text = process_text(text, settings, attrs)
    attrs[value_key] = text
    attrs[mime_key] = mime
    return text
