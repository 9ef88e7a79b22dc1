"""ragtrace's own decorators (``ragtrace.span.kind``).

* ``rag``: always a case of its own (nested ``@rag`` spans too);
* ``retriever`` / ``reranker``: the retrieval context, read like OpenInference
  (the SDK writes ``retrieval.documents.N.document.*`` and
  ``reranker.output_documents.N.document.*``);
* question and answer: ``input.value`` / ``output.value`` (JSON reduced when the
  mime type says JSON);
* session: ``session.id``, else ``gen_ai.conversation.id``.
"""

from __future__ import annotations

from typing import Final

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.conventions import openinference
from ragtrace_collector.conventions.base import (
    Attrs,
    Document,
    Role,
    role_from,
    text_attribute,
)

name: Final = "ragtrace"
markers: Final = {
    semconv.RAGTRACE_SPAN_KIND: frozenset(
        {semconv.KIND_RAG, semconv.KIND_RETRIEVER, semconv.KIND_RERANKER}
    )
}
event_markers: Final = frozenset[str]()
name_suffixes: Final = ()
role_keys: Final = frozenset({semconv.RAGTRACE_SPAN_KIND})

_ROLES: Final = {
    semconv.KIND_RAG: Role.CASE,
    semconv.KIND_RETRIEVER: Role.RETRIEVER,
    semconv.KIND_RERANKER: Role.RERANKER,
}


def role(span: trace_pb2.Span, attrs: Attrs) -> Role | None:
    return role_from(attrs, semconv.RAGTRACE_SPAN_KIND, _ROLES)


def documents(span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document]:
    return openinference.documents(span, attrs, role)


question = openinference.question
answer = openinference.answer


def session_id(attrs: Attrs) -> str | None:
    return text_attribute(attrs, semconv.SESSION_ID, semconv.GEN_AI_CONVERSATION_ID)


def retrieval_query(attrs: Attrs) -> str | None:
    query = text_attribute(attrs, semconv.GEN_AI_RETRIEVAL_QUERY_TEXT)
    return query if query is not None else openinference.retrieval_query(attrs)
