"""The OpenTelemetry GenAI semantic conventions.

Spec: ``gen-ai-spans.md`` of the GenAI semantic conventions (retrievals, agents,
workflows) and ``gen_ai_attributes`` of ``opentelemetry-semantic-conventions``.

* ``gen_ai.operation.name``: ``invoke_agent`` and ``invoke_workflow`` spans may be
  the case span; ``retrieval`` spans give the retrieval context.
* Documents: ``gen_ai.retrieval.documents``, an array of objects (``id``, ``score``
  and, where recorded, the content and metadata), as a JSON string or structured.
* Question: the last user message of ``gen_ai.input.messages``; answer: the last
  assistant message of ``gen_ai.output.messages`` (text parts joined).  A retrieval
  span's query is ``gen_ai.retrieval.query.text``.
* Session: ``gen_ai.conversation.id``.
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
)
from ragtrace_collector.conventions.text import read_answer, read_question

name: Final = "genai"
markers: Final = {semconv.GEN_AI_OPERATION_NAME: frozenset({semconv.GEN_AI_OPERATION_RETRIEVAL})}
event_markers: Final = frozenset[str]()
name_suffixes: Final = ()
role_keys: Final = frozenset({semconv.GEN_AI_OPERATION_NAME})

_ROLES: Final = {
    semconv.GEN_AI_OPERATION_RETRIEVAL: Role.RETRIEVER,
    semconv.GEN_AI_OPERATION_INVOKE_AGENT: Role.ROOT,
    semconv.GEN_AI_OPERATION_INVOKE_WORKFLOW: Role.ROOT,
}


def role(span: trace_pb2.Span, attrs: Attrs) -> Role | None:
    return role_from(attrs, semconv.GEN_AI_OPERATION_NAME, _ROLES)


def documents(span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document] | None:
    # Opt-in in the spec: absent (or unreadable) means "not recorded", not "none found".
    return documents_from_json(attrs.get(semconv.GEN_AI_RETRIEVAL_DOCUMENTS))


def question(attrs: Attrs) -> str | Unread | None:
    return read_question(attrs.get(semconv.GEN_AI_INPUT_MESSAGES))


def answer(attrs: Attrs) -> str | Unread | None:
    return read_answer(attrs.get(semconv.GEN_AI_OUTPUT_MESSAGES))


def session_id(attrs: Attrs) -> str | None:
    return text_attribute(attrs, semconv.GEN_AI_CONVERSATION_ID)


def retrieval_query(attrs: Attrs) -> str | None:
    return text_attribute(attrs, semconv.GEN_AI_RETRIEVAL_QUERY_TEXT)
