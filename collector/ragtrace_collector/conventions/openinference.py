"""OpenInference (Phoenix, Arize; LangChain, LlamaIndex, Haystack, DSPy instrumentors).

Spec: openinference ``spec/semantic_conventions.md`` and the
``openinference-semantic-conventions`` package; what the LangChain and LlamaIndex
instrumentors actually write was read from their output.

* ``openinference.span.kind``: ``CHAIN`` and ``AGENT`` spans may be the case span,
  ``RETRIEVER`` spans give the retrieval context, a ``RERANKER``'s output order wins.
* Documents: ``retrieval.documents.N.document.{id,content,score,metadata}``
  (``reranker.output_documents.N.document.*`` on rerankers).  The LangChain
  instrumentor records no ``document.id`` even when ``Document.id`` is set, so a
  missing id comes from the metadata (the SDK's id keys), else from the document at
  the same rank in the span's ``output.value`` JSON (``{"documents": [{"id": ...}]}``).
* Question and answer: ``input.value`` / ``output.value``, JSON reduced
  (:mod:`~ragtrace_collector.conventions.text`) when ``input.mime_type`` /
  ``output.mime_type`` is ``application/json``, else taken as written.  Session: ``session.id``
  (``openinference.instrumentation.using_session``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.conventions.base import (
    Attrs,
    Document,
    Role,
    Unread,
    documents_from_attributes,
    documents_from_json,
    fill_ids,
    role_from,
    text_attribute,
)
from ragtrace_collector.conventions.text import read_answer, read_question

name: Final = "openinference"
markers: Final = {semconv.OPENINFERENCE_SPAN_KIND: frozenset({semconv.OI_KIND_RETRIEVER})}
event_markers: Final = frozenset[str]()
name_suffixes: Final = ()
role_keys: Final = frozenset({semconv.OPENINFERENCE_SPAN_KIND})

_ROLES: Final = {
    semconv.OI_KIND_CHAIN: Role.ROOT,
    semconv.OI_KIND_AGENT: Role.ROOT,
    semconv.OI_KIND_RETRIEVER: Role.RETRIEVER,
    semconv.OI_KIND_RERANKER: Role.RERANKER,
}


def role(span: trace_pb2.Span, attrs: Attrs) -> Role | None:
    return role_from(attrs, semconv.OPENINFERENCE_SPAN_KIND, _ROLES)


def documents(span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document]:
    if role is Role.RERANKER:
        return documents_from_attributes(attrs, semconv.RERANKER_OUTPUT_DOCUMENTS)
    docs = documents_from_attributes(attrs, semconv.RETRIEVAL_DOCUMENTS)
    if any(d.id is None for d in docs):
        fill_ids(docs, documents_from_json(attrs.get(semconv.OUTPUT_VALUE)))
    return docs


def question(attrs: Attrs) -> str | Unread | None:
    return _read(attrs, semconv.INPUT_VALUE, semconv.INPUT_MIME_TYPE, read_question)


def answer(attrs: Attrs) -> str | Unread | None:
    return _read(attrs, semconv.OUTPUT_VALUE, semconv.OUTPUT_MIME_TYPE, read_answer)


def _read(
    attrs: Attrs, key: str, mime_key: str, reduce: Callable[[Any], str | Unread | None]
) -> str | Unread | None:
    """The value, JSON reduced only when its mime type says JSON: a plain-text question
    that happens to look like JSON (``[1, 2]``) is kept as written."""
    if attrs.get(mime_key) == semconv.MIME_JSON:
        return reduce(attrs.get(key))
    return text_attribute(attrs, key)


def session_id(attrs: Attrs) -> str | None:
    return text_attribute(attrs, semconv.SESSION_ID)


def retrieval_query(attrs: Attrs) -> str | None:
    query = question(attrs)
    return query if isinstance(query, str) else None
