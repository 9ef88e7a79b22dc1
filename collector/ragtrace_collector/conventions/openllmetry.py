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
  that instrumentation drops ``Document.id``, so ids come from metadata, or from a
  traceloop-sdk task above it, below).
  A distance is kept in the document's metadata, not as its score.
* The LlamaIndex instrumentation (``opentelemetry-instrumentation-llamaindex``) makes
  every LlamaIndex span a plain ``task`` (a ``workflow`` at the top) named
  ``<class>.task``; a span whose name ends in ``Retriever.task`` or
  ``Retriever.workflow`` is a retriever (:data:`name_suffixes`, which the prefilter
  also searches for, so that no other task span costs more).  Its documents are in
  ``traceloop.entity.output``: a JSON list of ``NodeWithScore`` objects, each itself a
  JSON string (``{"node": {"id_", "text", "metadata", "relationships"}, "score"}``).
  A document's id is the node's ``id_`` (as OpenInference's ``document.id``); its
  metadata is the node's, plus ``ref_doc_id`` (the source document's id, from the
  node's SOURCE relationship) when the node's metadata has none.
* traceloop-sdk's own ``@task`` / ``@workflow`` spans write the function's return value
  in ``traceloop.entity.output`` with the SDK's JSON encoder, which writes a LangChain
  ``Document`` as its ``to_json()`` (``{"lc": 1, "type": "constructor", "kwargs":
  {"id", "page_content", "metadata"}}``).  :func:`entity_documents` reads them; the
  case builder takes from such a span above a retriever the ids that the retriever
  span lacks (the LangChain instrumentation drops ``Document.id``).
* Question and answer: ``traceloop.entity.input`` / ``traceloop.entity.output``
  (``{"inputs": ...}`` / ``{"outputs": ...}``, LlamaIndex's
  ``{"str_or_query_bundle": ...}`` / ``{"response": ...}``, JSON reduced).
* Session: ``traceloop.association.properties.session_id``.
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.conventions.base import (
    ID_DOCUMENT,
    Attrs,
    Document,
    Role,
    Unread,
    as_float,
    as_text,
    documents_from_json,
    event_attributes,
    json_value,
    text_attribute,
)
from ragtrace_collector.conventions.text import question_text, read_answer, read_question

name: Final = "openllmetry"
markers: Final = {
    semconv.GEN_AI_OPERATION_NAME: frozenset({semconv.TRACELOOP_OPERATION_VECTOR_DB_RETRIEVE})
}
event_markers: Final = frozenset({semconv.DB_QUERY_RESULT_EVENT})
#: Span names of the LlamaIndex instrumentation's retriever spans (``VectorIndexRetriever.task``).
name_suffixes: Final = ("Retriever.task", "Retriever.workflow")
role_keys: Final = frozenset({semconv.GEN_AI_OPERATION_NAME, semconv.TRACELOOP_SPAN_KIND})

_ROOT_KINDS: Final = frozenset({semconv.TRACELOOP_KIND_WORKFLOW, semconv.TRACELOOP_KIND_AGENT})
_LLAMA_INDEX_KINDS: Final = frozenset(
    {semconv.TRACELOOP_KIND_TASK, semconv.TRACELOOP_KIND_WORKFLOW}
)
#: Nodes read from one retriever output, at most (a guard on untrusted input).
_MAX_NODES = 1000
#: LlamaIndex's ``NodeRelationship.SOURCE``: the document a node was split from.
_SOURCE = "1"


def role(span: trace_pb2.Span, attrs: Attrs) -> Role | None:
    if attrs.get(semconv.GEN_AI_OPERATION_NAME) == semconv.TRACELOOP_OPERATION_VECTOR_DB_RETRIEVE:
        return Role.RETRIEVER
    if any(e.name == semconv.DB_QUERY_RESULT_EVENT for e in span.events):
        return Role.RETRIEVER
    kind = attrs.get(semconv.TRACELOOP_SPAN_KIND)
    if kind in _LLAMA_INDEX_KINDS and span.name.endswith(name_suffixes):
        return Role.RETRIEVER
    if kind in _ROOT_KINDS:
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
    output = json_value(attrs.get(semconv.TRACELOOP_ENTITY_OUTPUT))  # parsed once, for both
    nodes = _llama_index_nodes(output)
    return nodes if nodes is not None else documents_from_json(_unwrapped(output))


def entity_documents(attrs: Attrs) -> list[Document] | None:
    """The documents in a span's ``traceloop.entity.output`` (a traceloop-sdk task's
    return value), None when it holds none."""
    output = attrs.get(semconv.TRACELOOP_ENTITY_OUTPUT)
    if not isinstance(output, str) or not output.startswith(("[", "{")):
        return None
    return documents_from_json(_unwrapped(json_value(output)))


def _unwrapped(parsed: Any) -> Any:
    """``parsed`` with LangChain-serialised objects (``{"lc": 1, "type":
    "constructor", "kwargs": {...}}``) replaced by their ``kwargs``, in a list or
    under a container key, one level deep."""
    if isinstance(parsed, list):
        return [_lc_kwargs(item) for item in parsed[:_MAX_NODES]]
    if isinstance(parsed, dict):
        if "lc" in parsed:
            return _lc_kwargs(parsed)
        return {k: _unwrapped(v) if isinstance(v, list) else v for k, v in parsed.items()}
    return parsed


def _lc_kwargs(item: Any) -> Any:
    if (
        isinstance(item, dict)
        and item.get("lc") == 1
        and item.get("type") == "constructor"
        and isinstance(item.get("kwargs"), dict)
    ):
        return item["kwargs"]
    return item


def _llama_index_nodes(parsed: Any) -> list[Document] | None:
    """The documents of a LlamaIndex retriever's output (parsed), a list of
    ``NodeWithScore`` (each a JSON string or an object); None when it is not one."""
    if not isinstance(parsed, list) or not parsed:
        return None
    docs: list[Document] = []
    for item in parsed[:_MAX_NODES]:
        held = json_value(item)
        if not isinstance(held, dict):
            return None
        node = held.get("node")
        if not isinstance(node, dict) or not ("id_" in node or "text" in node):
            return None
        docs.append(_node_document(node, held.get("score")))
    return docs


def _node_document(node: dict[str, Any], score: Any) -> Document:
    raw_id = node.get("id_")
    doc_id = None if raw_id is None or raw_id == "" else str(raw_id)
    text = node.get("text")
    if text is None and isinstance(node.get("text_resource"), dict):
        text = node["text_resource"].get("text")
    raw = node.get("metadata")
    metadata: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
    relationships = node.get("relationships")
    source = relationships.get(_SOURCE) if isinstance(relationships, dict) else None
    if isinstance(source, dict) and source.get("node_id") is not None:
        metadata.setdefault("ref_doc_id", str(source["node_id"]))
    doc = Document(
        id=doc_id,
        content=as_text(text),
        score=as_float(score),
        metadata=metadata,
    )
    if doc_id is not None:
        doc.ids[ID_DOCUMENT] = doc_id
    return doc


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
    doc = Document(
        id=None if doc_id is None else str(doc_id),
        content=as_text(content),
        score=as_float(score),
        metadata=metadata,
    )
    if doc.id is not None:
        doc.ids[ID_DOCUMENT] = doc.id
    return doc


def question(attrs: Attrs) -> str | Unread | None:
    return read_question(attrs.get(semconv.TRACELOOP_ENTITY_INPUT))


def answer(attrs: Attrs) -> str | Unread | None:
    return read_answer(attrs.get(semconv.TRACELOOP_ENTITY_OUTPUT))


def session_id(attrs: Attrs) -> str | None:
    return text_attribute(attrs, semconv.TRACELOOP_SESSION_ID)


def retrieval_query(attrs: Attrs) -> str | None:
    return question_text(attrs.get(semconv.TRACELOOP_ENTITY_INPUT))
