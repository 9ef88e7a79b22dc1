"""``ragtrace.set_reference()``: ground truth on the current ``@rag`` span.

Use it for golden or canary traffic, from inside the ``@rag`` function or anything it
calls (the current ``@rag`` call is tracked in a ``ContextVar``).  Recorded as:

* ``ragtrace.expected_output``: text;
* ``ragtrace.reference_contexts``: JSON list of strings;
* ``ragtrace.reference_context_ids``: JSON list of strings.

Ground truth is data the application chose to send, so it is recorded even with
``capture_content=False``; ``redact`` and ``max_content_chars`` still apply to each text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any, Protocol

from opentelemetry.trace import Span

from ragtrace import semconv
from ragtrace._capture import process_text, serialize
from ragtrace._config import Settings
from ragtrace._safety import report, warn_once

__all__ = ["CURRENT_RAG", "RagFrame", "current_rag", "set_reference"]


class RagFrame(Protocol):
    """What a running ``@rag`` call exposes to :func:`set_reference` and nested calls."""

    span: Span
    settings: Settings
    #: the session the call belongs to (a ``ragtrace.Session``), if any
    session: Any
    turn: int | None


#: The innermost running ``@rag`` call in this context.  A ``ContextVar`` of its own
#: (set and reset in C) rather than a key in the OTel context, which would cost a
#: context copy per call.  Streaming wrappers set it around each step, with the span.
CURRENT_RAG: ContextVar[RagFrame | None] = ContextVar("ragtrace_current_rag", default=None)


def current_rag() -> RagFrame | None:
    """The innermost running ``@rag`` call in this context, if any."""
    return CURRENT_RAG.get()


def _texts(values: Any) -> Iterable[Any]:
    if isinstance(values, (str, bytes)):
        return (values,)
    return values  # type: ignore[no-any-return]


def _text_list(values: Any, settings: Settings, attrs: dict[str, Any], what: str) -> str:
    out: list[str] = []
    for value in _texts(values):
        try:
            text = serialize(value)[0]
        except Exception as exc:
            report(f"serialising a {what}", exc)
            continue
        out.append(process_text(text, settings, attrs))
    return json.dumps(out, ensure_ascii=False)


def _id_list(values: Any) -> str:
    out: list[str] = []
    for value in _texts(values):
        try:
            out.append(value if isinstance(value, str) else str(value))
        except Exception as exc:
            report("reading a reference context id", exc)
    return json.dumps(out, ensure_ascii=False)


def set_reference(
    expected_output: str | None = None,
    reference_contexts: Iterable[str] | None = None,
    reference_context_ids: Iterable[str] | None = None,
) -> None:
    """Attach ground truth to the current ``@rag`` span.  Never raises.

    Outside a ``@rag`` call it does nothing (and logs a warning once).
    """
    try:
        frame = current_rag()
        if frame is None:
            warn_once(
                "set_reference-outside",
                "set_reference() was called outside a @ragtrace.rag function; ignored",
            )
            return
        span = frame.span
        if not span.is_recording():
            return
        settings = frame.settings
        attrs: dict[str, Any] = {}
        if expected_output is not None:
            try:
                text = serialize(expected_output)[0]
            except Exception as exc:
                report("serialising the expected output", exc)
            else:
                attrs[semconv.EXPECTED_OUTPUT] = process_text(text, settings, attrs)
        if reference_contexts is not None:
            attrs[semconv.REFERENCE_CONTEXTS] = _text_list(
                reference_contexts, settings, attrs, "reference context"
            )
        if reference_context_ids is not None:
            attrs[semconv.REFERENCE_CONTEXT_IDS] = _id_list(reference_context_ids)
        if attrs:
            span.set_attributes(attrs)
    except Exception as exc:
        report("set_reference", exc)
