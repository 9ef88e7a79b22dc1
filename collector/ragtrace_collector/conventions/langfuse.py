"""Langfuse's Python SDK (v3 and later, built on OpenTelemetry), exported to any OTLP
endpoint.

Read from ``langfuse._client.attributes.LangfuseOtelSpanAttributes`` and what
``@observe`` of langfuse 5.0 exports with ``LANGFUSE_BASE_URL`` pointed at the
collector and ``LANGFUSE_OTEL_TRACES_EXPORT_PATH=v1/traces``.

* ``langfuse.observation.type`` (``@observe(as_type=...)``): ``retriever`` observations
  give the retrieval context; ``span`` (``@observe()``'s default), ``chain``, ``agent``
  and ``generation`` may be the case span (the outermost one above a retriever).
* Documents: ``langfuse.observation.output``, the retriever's return value as JSON
  (any list of records the SDK reads: ``id``/``doc_id``/..., content, score, metadata;
  LangChain documents: :func:`~ragtrace_collector.conventions.base.documents_from_json`).
* Question and answer: ``langfuse.observation.input`` / ``langfuse.observation.output``,
  JSON reduced.  ``@observe`` records a call's arguments as
  ``{"args": [...], "kwargs": {...}}``: the question is read from the keyword
  arguments, else from the first positional argument that holds text.  An output that
  is JSON holding no answer text is no answer (never judged as a JSON document).
* Session: ``session.id`` (``propagate_attributes(session_id=...)`` writes it on every
  observation made inside it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.conventions.base import (
    Attrs,
    Document,
    Role,
    documents_from_json,
    json_value,
    role_from,
    text_attribute,
    unquote,
)
from ragtrace_collector.conventions.text import question_text, reduce_answer

name: Final = "langfuse"
markers: Final = {semconv.LANGFUSE_OBSERVATION_TYPE: frozenset({semconv.LANGFUSE_TYPE_RETRIEVER})}
event_markers: Final = frozenset[str]()
name_suffixes: Final = ()
role_keys: Final = frozenset({semconv.LANGFUSE_OBSERVATION_TYPE})

_ROLES: Final = {
    semconv.LANGFUSE_TYPE_RETRIEVER: Role.RETRIEVER,
    **dict.fromkeys(semconv.LANGFUSE_ROOT_TYPES, Role.ROOT),
}
#: The keys of ``@observe``'s record of a call's arguments.
_CALL_KEYS: Final = frozenset({"args", "kwargs"})


def role(span: trace_pb2.Span, attrs: Attrs) -> Role | None:
    return role_from(attrs, semconv.LANGFUSE_OBSERVATION_TYPE, _ROLES)


def documents(span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document] | None:
    return documents_from_json(attrs.get(semconv.LANGFUSE_OBSERVATION_OUTPUT))


def question(attrs: Attrs) -> str | None:
    value = unquote(attrs.get(semconv.LANGFUSE_OBSERVATION_INPUT))
    parsed = json_value(value)
    if isinstance(parsed, Mapping) and parsed.keys() == _CALL_KEYS:
        return _call_question(parsed["args"], parsed["kwargs"])
    return question_text(value)


def _call_question(args: Any, kwargs: Any) -> str | None:
    """The question of a call recorded as its arguments: the keyword arguments reduced
    as an input object (``question=``, ``query=``, ...), else the first positional
    argument that is text, else the first object (or list of objects) that reduces to
    text."""
    if isinstance(kwargs, Mapping) and kwargs:
        found = question_text(dict(kwargs))
        if found:
            return found
    if not isinstance(args, list):
        return None
    for arg in args:
        if isinstance(arg, str) and arg:
            return question_text(arg)
    for arg in args:
        # An object, or a list of objects (messages): not a list of numbers (an
        # embedding), whose last number is no question.
        if isinstance(arg, Mapping) or (
            isinstance(arg, list) and arg and all(isinstance(a, Mapping) for a in arg)
        ):
            found = question_text(arg)
            if found:
                return found
    return None


def answer(attrs: Attrs) -> str | None:
    return reduce_answer(unquote(attrs.get(semconv.LANGFUSE_OBSERVATION_OUTPUT)))


def session_id(attrs: Attrs) -> str | None:
    return text_attribute(attrs, semconv.SESSION_ID)


def retrieval_query(attrs: Attrs) -> str | None:
    return question(attrs)
