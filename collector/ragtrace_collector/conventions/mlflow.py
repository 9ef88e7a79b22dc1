"""MLflow tracing (``mlflow`` / ``mlflow-tracing``), exported over OTLP.

Read from ``mlflow.tracing.constant.SpanAttributeKey``, ``mlflow.entities.SpanType``
and what ``@mlflow.trace`` of mlflow-tracing 3.17 exports with
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set.  MLflow writes **every** span attribute as
JSON: a span type is the JSON-quoted string (``"RETRIEVER"``, quotes included), a text
output is ``"Paris is ..."``, inputs are the call's arguments bound to their names
(``{"question": "...", "k": 2}``).

* ``mlflow.spanType``: ``"RETRIEVER"`` spans give the retrieval context, a
  ``"RERANKER"``'s output order wins; ``"CHAIN"``, ``"AGENT"``, ``"WORKFLOW"``,
  ``"UNKNOWN"`` (``@mlflow.trace`` without a span type) and the generation types
  ``"LLM"`` / ``"CHAT_MODEL"`` may be the case span (the outermost one above a
  retriever).
* Documents: ``mlflow.spanOutputs``, the retriever's return value as JSON: MLflow's
  ``Document`` (``{"page_content", "metadata", "id"}``), LangChain documents, or any
  list of records the SDK reads (``id``/``doc_id``/``chunk_id``..., content, score,
  metadata: :func:`~ragtrace_collector.conventions.base.documents_from_json`).  A
  ``Document.id`` is the document's own id; without it the metadata's id keys
  (``doc_id``, ``chunk_id``, ...) give one.
* Question and answer: ``mlflow.spanInputs`` / ``mlflow.spanOutputs``, unquoted and
  JSON reduced; a value that holds no text is reported as what it holds (never judged
  as a JSON document).
* Session: ``session.id`` (MLflow's own attribute key; JSON-quoted when set through
  ``span.set_attribute``).  ``mlflow.tracing.context(session_id=...)`` keeps the
  session in the trace's metadata, which the OTLP export does not carry.
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

name: Final = "mlflow"
#: A retriever marks a trace that may hold a case (a reranker comes with one, as in
#: OpenInference): one pattern more for the prefilter, not two.
markers: Final = {semconv.MLFLOW_SPAN_TYPE: frozenset({semconv.MLFLOW_TYPE_RETRIEVER})}
event_markers: Final = frozenset[str]()
name_suffixes: Final = ()
role_keys: Final = frozenset({semconv.MLFLOW_SPAN_TYPE})

_ROLES: Final = {
    semconv.MLFLOW_TYPE_RETRIEVER: Role.RETRIEVER,
    semconv.MLFLOW_TYPE_RERANKER: Role.RERANKER,
    **dict.fromkeys(semconv.MLFLOW_ROOT_TYPES, Role.ROOT),
}


def role(span: trace_pb2.Span, attrs: Attrs) -> Role | None:
    return role_from(attrs, semconv.MLFLOW_SPAN_TYPE, _ROLES)


def documents(span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document] | None:
    return documents_from_json(attrs.get(semconv.MLFLOW_SPAN_OUTPUTS))


def question(attrs: Attrs) -> str | Unread | None:
    return read_question(unquote(attrs.get(semconv.MLFLOW_SPAN_INPUTS)))


def answer(attrs: Attrs) -> str | Unread | None:
    return read_answer(unquote(attrs.get(semconv.MLFLOW_SPAN_OUTPUTS)))


def session_id(attrs: Attrs) -> str | None:
    value = unquote(attrs.get(semconv.SESSION_ID))
    return text_attribute({semconv.SESSION_ID: value}, semconv.SESSION_ID)


def retrieval_query(attrs: Attrs) -> str | None:
    return question_text(unquote(attrs.get(semconv.MLFLOW_SPAN_INPUTS)))
