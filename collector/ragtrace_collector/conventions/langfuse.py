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
  reduced by :mod:`~ragtrace_collector.conventions.text` (``@observe`` records a
  call's arguments as ``{"args": [...], "kwargs": {...}}``, an argument map there).
  A value that holds no text is reported as what it holds (never judged as a JSON
  document).
* Session: ``session.id`` (``propagate_attributes(session_id=...)`` writes it on every
  observation made inside it).
"""

from __future__ import annotations

from typing import Final

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.conventions.base import (
    Attrs,
    Document,
    Role,
    Unread,
    documents_from_json,
    role_from,
    text_attribute,
    unquote,
)
from ragtrace_collector.conventions.text import question_text, read_answer, read_question

name: Final = "langfuse"
markers: Final = {semconv.LANGFUSE_OBSERVATION_TYPE: frozenset({semconv.LANGFUSE_TYPE_RETRIEVER})}
event_markers: Final = frozenset[str]()
name_suffixes: Final = ()
role_keys: Final = frozenset({semconv.LANGFUSE_OBSERVATION_TYPE})

_ROLES: Final = {
    semconv.LANGFUSE_TYPE_RETRIEVER: Role.RETRIEVER,
    **dict.fromkeys(semconv.LANGFUSE_ROOT_TYPES, Role.ROOT),
}


def role(span: trace_pb2.Span, attrs: Attrs) -> Role | None:
    return role_from(attrs, semconv.LANGFUSE_OBSERVATION_TYPE, _ROLES)


def documents(span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document] | None:
    return documents_from_json(attrs.get(semconv.LANGFUSE_OBSERVATION_OUTPUT))


def question(attrs: Attrs) -> str | Unread | None:
    return read_question(unquote(attrs.get(semconv.LANGFUSE_OBSERVATION_INPUT)))


def answer(attrs: Attrs) -> str | Unread | None:
    return read_answer(unquote(attrs.get(semconv.LANGFUSE_OBSERVATION_OUTPUT)))


def session_id(attrs: Attrs) -> str | None:
    return text_attribute(attrs, semconv.SESSION_ID)


def retrieval_query(attrs: Attrs) -> str | None:
    return question_text(unquote(attrs.get(semconv.LANGFUSE_OBSERVATION_INPUT)))
