"""OpenLLMetry (Traceloop) instrumentations.

Read from ``opentelemetry-semantic-conventions-ai`` (``SpanAttributes``, ``Events``,
``EventAttributes``), the LangChain instrumentation and the vector-DB
instrumentations (Chroma, Qdrant, Pinecone, ...) of the openllmetry repository.

* ``traceloop.span.kind``: ``workflow`` and ``agent`` spans may be the case span.
* Retrievers: a span with ``db.query.result`` events (the vector-DB
  instrumentations: one event per result, in rank order, with
  ``db.query.result.{id,score,distance,metadata,document}``), or the LangChain
  instrumentation's retriever span (``gen_ai.operation.name = vector_db_retrieve``),
  whose documents are in ``traceloop.entity.output`` (``{"documents": [...]}``;
  that instrumentation drops ``Document.id``, so ids come only from metadata).
  A distance is kept in the document's metadata, not as its score.
* Question and answer: ``traceloop.entity.input`` / ``traceloop.entity.output``
  (``{"inputs": ...}`` / ``{"outputs": ...}``, JSON reduced).
* Session: ``traceloop.association.properties.session_id``.
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.conventions.base import (
    Attrs,
    Document,
    Role,
    as_text,
    documents_from_json,
    event_attributes,
    json_value,
    text_attribute,
)
from ragtrace_collector.conventions.text import reduce_answer, reduce_question

name: Final = "openllmetry"
markers: Final = {
    semconv.GEN_AI_OPERATION_NAME: frozenset({semconv.TRACELOOP_OPERATION_VECTOR_DB_RETRIEVE})
}
event_markers: Final = frozenset({semconv.DB_QUERY_RESULT_EVENT})
role_keys: Final = frozenset({semconv.GEN_AI_OPERATION_NAME, semconv.TRACELOOP_SPAN_KIND})

_ROOT_KINDS: Final = frozenset({semconv.TRACELOOP_KIND_WORKFLOW, semconv.TRACELOOP_KIND_AGENT})


def role(span: trace_pb2.Span, attrs: Attrs) -> Role | None:
    if attrs.get(semconv.GEN_AI_OPERATION_NAME) == semconv.TRACELOOP_OPERATION_VECTOR_DB_RETRIEVE:
        return Role.RETRIEVER
    if any(e.name == semconv.DB_QUERY_RESULT_EVENT for e in span.events):
        return Role.RETRIEVER
    if attrs.get(semconv.TRACELOOP_SPAN_KIND) in _ROOT_KINDS:
        return Role.ROOT
    return None


def documents(span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document] | None:
    docs = [
        _event_document(event_attributes(e))
        for e in span.events
        if e.name == semconv.DB_QUERY_RESULT_EVENT
    ]
    if docs:
        return docs
    return documents_from_json(attrs.get(semconv.TRACELOOP_ENTITY_OUTPUT))


def _event_document(attrs: Attrs) -> Document:
    doc_id = attrs.get(semconv.DB_QUERY_RESULT_ID)
    content = attrs.get(semconv.DB_QUERY_RESULT_DOCUMENT)
    score = attrs.get(semconv.DB_QUERY_RESULT_SCORE)
    metadata: dict[str, Any] = {}
    raw = json_value(attrs.get(semconv.DB_QUERY_RESULT_METADATA))
    if isinstance(raw, dict):
        metadata = dict(raw)
    distance = attrs.get(semconv.DB_QUERY_RESULT_DISTANCE)
    if isinstance(distance, (int, float)) and not isinstance(distance, bool):
        metadata.setdefault("distance", distance)
    return Document(
        id=None if doc_id is None else str(doc_id),
        content=as_text(content),
        score=float(score)
        if isinstance(score, (int, float)) and not isinstance(score, bool)
        else None,
        metadata=metadata,
    )


def question(attrs: Attrs) -> str | None:
    return reduce_question(attrs.get(semconv.TRACELOOP_ENTITY_INPUT))


def answer(attrs: Attrs) -> str | None:
    return reduce_answer(attrs.get(semconv.TRACELOOP_ENTITY_OUTPUT))


def session_id(attrs: Attrs) -> str | None:
    return text_attribute(attrs, semconv.TRACELOOP_SESSION_ID)


def retrieval_query(attrs: Attrs) -> str | None:
    return reduce_question(attrs.get(semconv.TRACELOOP_ENTITY_INPUT))
