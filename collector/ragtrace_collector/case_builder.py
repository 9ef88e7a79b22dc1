"""Evaluation cases from the spans of one trace.

Each ``@rag`` span (``ragtrace.span.kind = rag``) becomes one :class:`BuiltCase`:

* input and actual output from ``input.value`` / ``output.value``;
* ground truth from the span (``ragtrace.expected_output``, ``ragtrace.reference_contexts``,
  ``ragtrace.reference_context_ids``, ``ragtrace.expected_outcome``), else from the
  reference store, field by field;
* the retrieval context from the retriever spans *under* that ``@rag`` span (nested
  ``@rag`` spans are cases of their own and are not descended into), in rank order,
  retriever spans taken in start-time order.  When a reranker ran, the output order of
  the last reranker to finish wins;
* the conversation fields (``session.id``, ``user.id``, ``ragtrace.turn.index``).

A document without captured content (``capture_content=False`` in the SDK) still
contributes its id to the ID metrics, but then the text metrics see no retrieval
context and are skipped with a reason, rather than scored on empty strings.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.spanattrs import attributes_to_dict

__all__ = [
    "BuiltCase",
    "DocumentSource",
    "ReferenceLookup",
    "build_cases",
    "documents_from_attributes",
]


class ReferenceLookup(Protocol):
    """What the reference store returns for an input (fields may be None)."""

    expected_output: str | None
    reference_contexts: list[str] | None
    reference_context_ids: list[str] | None
    expected_outcome: str | None


@dataclass(frozen=True)
class DocumentSource:
    """A retrieved document's place: its retriever (or reranker) span and index there."""

    span_id: str
    position: int
    id: str | None = None


@dataclass
class BuiltCase:
    """One case plus where it came from and where its results go."""

    span: trace_pb2.Span
    case: RAGCase
    trace_id: str
    span_id: str
    service: str
    session_id: str | None = None
    user_id: str | None = None
    turn_index: int | None = None
    expected_outcome: str | None = None
    #: "span", "reference_store", or None when the case carries no ground truth
    ground_truth_source: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    #: Where each retrieved document sits, in rank order (the order of the retrieval
    #: context, when it was captured).
    document_sources: list[DocumentSource] = field(default_factory=list)


@dataclass
class _Doc:
    id: str | None = None
    content: str | None = None
    score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The span that lists it and its index there (see BuiltCase.document_sources).
    source: DocumentSource | None = None


def documents_from_attributes(attrs: dict[str, Any], prefix: str) -> list[_Doc]:
    """The ``<prefix>.N.document.*`` records of a span, in index (rank) order."""
    lead = prefix + "."
    by_index: dict[int, _Doc] = {}
    for key, value in attrs.items():
        if not key.startswith(lead):
            continue
        index_text, _, fld = key[len(lead) :].partition(".")
        if not index_text.isdigit():
            continue
        doc = by_index.setdefault(int(index_text), _Doc())
        if fld == semconv.DOCUMENT_ID:
            doc.id = None if value is None else str(value)
        elif fld == semconv.DOCUMENT_CONTENT:
            doc.content = None if value is None else str(value)
        elif fld == semconv.DOCUMENT_SCORE:
            doc.score = float(value) if isinstance(value, (int, float)) else None
        elif fld == semconv.DOCUMENT_METADATA:
            doc.metadata = _json_object(value)
    return [by_index[i] for i in sorted(by_index)]


def _located(span: trace_pb2.Span, docs: list[_Doc]) -> list[_Doc]:
    for position, doc in enumerate(docs):
        doc.source = DocumentSource(span.span_id.hex(), position, doc.id)
    return docs


def _json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return {"value": value}
        return parsed if isinstance(parsed, dict) else {"value": parsed}
    return {}


def _json_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return [value]
        if isinstance(parsed, list):
            return [str(v) for v in parsed]
        return [str(parsed)]
    return [str(value)]


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def build_cases(
    spans: Sequence[trace_pb2.Span],
    *,
    service_of: Callable[[trace_pb2.Span], str] | None = None,
    reference_lookup: Callable[[str], ReferenceLookup | None] | None = None,
) -> list[BuiltCase]:
    """One :class:`BuiltCase` per ``@rag`` span in ``spans`` (one trace's spans)."""
    if not any(_is_rag(span) for span in spans):
        return []  # the common case for non-RAG traffic: no attribute decoding at all
    attrs_of: dict[bytes, dict[str, Any]] = {}
    children: dict[bytes, list[trace_pb2.Span]] = defaultdict(list)
    rag_spans: list[trace_pb2.Span] = []
    for span in spans:
        attrs = attributes_to_dict(span.attributes)
        attrs_of[span.span_id] = attrs
        if span.parent_span_id:
            children[span.parent_span_id].append(span)
        if attrs.get(semconv.RAGTRACE_SPAN_KIND) == semconv.KIND_RAG:
            rag_spans.append(span)

    built: list[BuiltCase] = []
    for rag in rag_spans:
        attrs = attrs_of[rag.span_id]
        retrievers, rerankers = _retrieval_spans_under(rag, children, attrs_of)
        docs = _context_docs(retrievers, rerankers, attrs_of)
        built.append(
            _build_one(
                rag,
                attrs,
                docs,
                service=service_of(rag) if service_of else "unknown",
                reference_lookup=reference_lookup,
            )
        )
    return built


def _is_rag(span: trace_pb2.Span) -> bool:
    for kv in span.attributes:
        if kv.key == semconv.RAGTRACE_SPAN_KIND:
            return bool(kv.value.string_value == semconv.KIND_RAG)
    return False


def _retrieval_spans_under(
    rag: trace_pb2.Span,
    children: dict[bytes, list[trace_pb2.Span]],
    attrs_of: dict[bytes, dict[str, Any]],
) -> tuple[list[trace_pb2.Span], list[trace_pb2.Span]]:
    retrievers: list[trace_pb2.Span] = []
    rerankers: list[trace_pb2.Span] = []
    stack = list(children.get(rag.span_id, ()))
    while stack:
        span = stack.pop()
        kind = attrs_of[span.span_id].get(semconv.RAGTRACE_SPAN_KIND)
        if kind == semconv.KIND_RAG:
            continue  # a nested @rag span is a case of its own
        if kind == semconv.KIND_RETRIEVER:
            retrievers.append(span)
        elif kind == semconv.KIND_RERANKER:
            rerankers.append(span)
        stack.extend(children.get(span.span_id, ()))
    retrievers.sort(key=lambda s: (s.start_time_unix_nano, s.span_id))
    rerankers.sort(key=lambda s: (s.end_time_unix_nano, s.span_id))
    return retrievers, rerankers


def _context_docs(
    retrievers: Iterable[trace_pb2.Span],
    rerankers: list[trace_pb2.Span],
    attrs_of: dict[bytes, dict[str, Any]],
) -> list[_Doc] | None:
    if rerankers:
        last = rerankers[-1]
        return _located(
            last,
            documents_from_attributes(attrs_of[last.span_id], semconv.RERANKER_OUTPUT_DOCUMENTS),
        )
    docs: list[_Doc] = []
    found = False
    for span in retrievers:
        found = True
        docs.extend(
            _located(
                span, documents_from_attributes(attrs_of[span.span_id], semconv.RETRIEVAL_DOCUMENTS)
            )
        )
    return docs if found else None


def _build_one(
    rag: trace_pb2.Span,
    attrs: dict[str, Any],
    docs: list[_Doc] | None,
    *,
    service: str,
    reference_lookup: Callable[[str], ReferenceLookup | None] | None,
) -> BuiltCase:
    user_input = _str_or_none(attrs.get(semconv.INPUT_VALUE))
    expected_output = _str_or_none(attrs.get(semconv.EXPECTED_OUTPUT))
    reference_contexts = _json_list(attrs.get(semconv.REFERENCE_CONTEXTS))
    reference_ids = _json_list(attrs.get(semconv.REFERENCE_CONTEXT_IDS))
    expected_outcome = _str_or_none(attrs.get(semconv.EXPECTED_OUTCOME))
    source = (
        "span"
        if any(v is not None for v in (expected_output, reference_contexts, reference_ids))
        else None
    )

    if (
        reference_lookup is not None
        and user_input
        and (
            expected_output is None
            or reference_contexts is None
            or reference_ids is None
            or expected_outcome is None
        )
    ):
        entry = reference_lookup(user_input)
        if entry is not None:
            filled = False
            if expected_output is None and entry.expected_output is not None:
                expected_output, filled = entry.expected_output, True
            if reference_contexts is None and entry.reference_contexts is not None:
                reference_contexts, filled = list(entry.reference_contexts), True
            if reference_ids is None and entry.reference_context_ids is not None:
                reference_ids, filled = [str(i) for i in entry.reference_context_ids], True
            if expected_outcome is None and entry.expected_outcome is not None:
                expected_outcome = entry.expected_outcome
            if filled and source is None:
                source = "reference_store"

    retrieval_context: list[ContextItem] | None = None
    retrieved_ids: list[str] | None = None
    if docs is not None:
        ids = [d.id for d in docs if d.id is not None]
        # No document carried an id: the ID metrics have nothing to compare (skipped).
        # No document at all: an empty retrieval, which the ID metrics score as 0.
        retrieved_ids = ids if (ids or not docs) else None
        if all(d.content is not None for d in docs):
            retrieval_context = [
                ContextItem(content=d.content or "", id=d.id, score=d.score, metadata=d.metadata)
                for d in docs
            ]

    turn = attrs.get(semconv.TURN_INDEX)
    trace_id = rag.trace_id.hex()
    span_id = rag.span_id.hex()
    case = RAGCase(
        input=user_input,
        actual_output=_str_or_none(attrs.get(semconv.OUTPUT_VALUE)),
        expected_output=expected_output,
        retrieval_context=retrieval_context,
        reference_contexts=reference_contexts,
        reference_context_ids=reference_ids,
        retrieved_context_ids=retrieved_ids,
        case_id=f"{trace_id}:{span_id}",
    )
    return BuiltCase(
        span=rag,
        case=case,
        trace_id=trace_id,
        span_id=span_id,
        service=service,
        session_id=_str_or_none(
            attrs.get(semconv.SESSION_ID) or attrs.get(semconv.GEN_AI_CONVERSATION_ID)
        ),
        user_id=_str_or_none(attrs.get(semconv.USER_ID)),
        turn_index=int(turn) if isinstance(turn, (int, float)) else None,
        expected_outcome=expected_outcome,
        ground_truth_source=source,
        attributes=attrs,
        document_sources=[d.source for d in docs or () if d.source is not None],
    )
