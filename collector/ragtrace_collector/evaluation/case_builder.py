"""Evaluation cases from the spans of one trace, whatever instrumented them.

The convention modules (:mod:`ragtrace_collector.conventions`: ragtrace, OpenInference,
OTel GenAI, OpenLLMetry, MLflow, Langfuse) say what each span is
(:class:`~.conventions.Role`) and read its documents, question, answer and session;
this module picks the case spans and builds one :class:`BuiltCase` per case span.
The rest of the collector sees only cases.

**Which span is a case.**

* every ragtrace ``@rag`` span (``ragtrace.span.kind = rag``); nested ``@rag`` spans
  are cases of their own;
* with ``cases.match`` set, also every span that a matcher selects (span name glob,
  attribute values, attributes present); nested matches are cases of their own;
* otherwise (no ``@rag`` span, no ``cases.match``): the *outermost* CHAIN or AGENT
  span (OpenInference), ``invoke_agent``/``invoke_workflow`` span (GenAI) or
  ``workflow``/``agent`` span (OpenLLMetry) that has at least one retriever span below
  it.  A trace with no retriever has no such case (and is forwarded unscored).  A
  retriever named by ``cases.retrievers``
  (:mod:`~ragtrace_collector.evaluation.configured_retrievers`) with no such span above
  it makes its outermost ancestor (the trace's root) the case.

**What a case holds.**

* input and actual output: the question and the answer of the case span, read by the
  convention that claimed it and then by the others (``input.value``,
  ``gen_ai.input.messages``, ``traceloop.entity.input``, ... with JSON reduced to the
  text: :mod:`ragtrace_collector.conventions.text`), or from the attributes named by
  ``cases.question_attribute`` / ``cases.answer_attribute``.  With no question on the
  case span, the first retriever's query stands in;
* the retrieval context: the documents of the retriever spans below the case span
  (not below a nested case span), retriever spans in start-time order, each in rank
  order; when a reranker ran, the output order of the last reranker to finish wins.
  Retriever spans nested in a retriever span are one retrieval: the documents of the
  outermost span that recorded some, those without an id taking the id of the
  same-rank document of a nested span when their contents agree;
* the id of each document: chosen among the ids it carries, one source per service,
  to be of the reference ids' kind (:mod:`~ragtrace_collector.evaluation.document_ids`);
  a case that compares ids says where they were read in
  ``ragtrace.retrieval.document_id_source``.  Documents without any id take them from
  a traceloop-sdk task span above their retriever that returned them with ids; when
  none is found, the ID metrics' reason says where the trace holds ids and the
  setting that reads them;
* ground truth from the span (``ragtrace.expected_output``,
  ``ragtrace.reference_contexts``, ``ragtrace.reference_context_ids``,
  ``ragtrace.expected_outcome``), else from the reference store by input, field by
  field;
* the conversation: the session id (``session.id``, ``gen_ai.conversation.id``,
  Traceloop's ``session_id`` association property) from the case span, else from its
  retriever spans; the turn index from ``ragtrace.turn.index``, else None (in a
  session, the session store then numbers the turn: 1, 2, 3, ... by start time).

A document without captured content still contributes its id to the ID metrics, but
then the text metrics see no retrieval context and are skipped with a reason, rather
than scored on empty strings.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from opentelemetry.proto.trace.v1 import trace_pb2
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ragtrace import semconv
from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.conventions import (
    CONVENTIONS,
    Convention,
    Document,
    Role,
    by_name,
    openllmetry,
)
from ragtrace_collector.conventions.base import Unread, documents_from_attributes, json_value
from ragtrace_collector.conventions.text import read_answer, read_question
from ragtrace_collector.evaluation.configured_retrievers import (
    CaseMatch,
    ConfiguredRetrievers,
    RetrieverRule,
    SpanMatcher,
)
from ragtrace_collector.evaluation.document_ids import DocumentIds, check_source
from ragtrace_collector.otlp.protowire import string_field, varint
from ragtrace_collector.otlp.spanattrs import any_value_to_python, set_attribute
from ragtrace_collector.results import trusted

__all__ = [
    "BuiltCase",
    "CaseMatch",
    "CaseRules",
    "CasesConfig",
    "DocumentSource",
    "ReferenceLookup",
    "RetrieverRule",
    "build_cases",
    "documents_from_attributes",
    "may_hold_case",
]


def _log() -> Any:
    # The config imports this module (cases:); structlog loads only when a case fails.
    from ragtrace_collector.component.logs import get_logger

    return get_logger("case_builder")


#: Ancestors followed up from a retriever, at most (a guard against parent cycles).
_MAX_DEPTH = 256
#: Documents whose metadata keys the "no ids" reason lists, at most.
_REASON_DOCS = 20
#: Serialised spans up to this size are searched as bytes by the prefilter; larger
#: ones are checked attribute by attribute.
_SEARCH_LIMIT = 8192


# -------------------------------------------------------------------- config
class CasesConfig(BaseModel):
    """The ``cases:`` section: which spans become evaluation cases, and how they are read."""

    model_config = ConfigDict(extra="forbid")

    #: Conventions read, of ``ragtrace``, ``openinference``, ``genai``, ``openllmetry``,
    #: ``mlflow``, ``langfuse`` (default all; a span claimed by several is read by the
    #: first in this order).
    conventions: list[str] = Field(default_factory=lambda: [c.name for c in CONVENTIONS])
    #: Matchers choosing the case spans instead of the default rule (the outermost
    #: CHAIN/AGENT/workflow span with a retriever below it); ``@rag`` spans stay cases.
    match: list[CaseMatch] = Field(default_factory=list)
    #: Attribute of the case span holding the question (JSON reduced); default: the
    #: convention's (``input.value``, ``gen_ai.input.messages``, ...).
    question_attribute: str | None = None
    #: Attribute of the case span holding the answer (JSON reduced); default: the
    #: convention's (``output.value``, ``gen_ai.output.messages``, ...).
    answer_attribute: str | None = None
    #: Where a retrieved document's id is read, in order (the first a document has):
    #: ``document.id``, ``metadata.<key>``, ``output.id`` (docs/ground-truth.md); or a
    #: map from convention name (``openinference``, ``cases.retrievers``, ...) to such a
    #: list.  Unset: ``document.id``, then the metadata's ``doc_id``, ``document_id``,
    #: ``ref_doc_id``, ``id``, ``_id``, ``node_id``, ``chunk_id``, then ``output.id``,
    #: or another of the documents' ids chosen per service from its cases to be of the
    #: reference ids' kind (said on the span and logged); ids of different kinds
    #: (generated ids, file names against your ids) are skipped, never scored.
    document_id: list[str] | dict[str, list[str]] | None = None
    #: Cases with reference ids watched per service: when none of the last this many
    #: retrieved a reference id, ``/healthz`` warns (docs/ground-truth.md).
    id_overlap_window: int = Field(50, ge=1, le=100_000)
    #: Retriever spans of any instrumentation, and where their documents are.
    retrievers: list[RetrieverRule] = Field(default_factory=list)

    @field_validator("document_id")
    @classmethod
    def _sources(
        cls, value: list[str] | dict[str, list[str]] | None
    ) -> list[str] | dict[str, list[str]] | None:
        if value is None:
            return None
        lists = value.values() if isinstance(value, dict) else [value]
        for sources in lists:
            if not sources:
                raise ValueError("name at least one id source (document.id, metadata.<key>, ...)")
            for source in sources:
                check_source(source)
        if isinstance(value, dict):
            _check_conventions(value, [c.name for c in CONVENTIONS] + [ConfiguredRetrievers.name])
        return value

    @field_validator("conventions")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        known = [c.name for c in CONVENTIONS]
        _check_conventions(names, known)
        if not names:
            raise ValueError(f"name at least one convention (of: {', '.join(known)})")
        return names


def _check_conventions(names: Iterable[str], known: list[str]) -> None:
    """A ValueError, with a hint, for the first of ``names`` not ``known``."""
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"one of: {', '.join(known)}"
            raise ValueError(f"unknown convention {name!r} ({hint})")


class CaseRules:
    """:class:`CasesConfig` compiled for the hot path (build once, share)."""

    def __init__(self, config: CasesConfig | None = None, *, watch_ids: bool = True) -> None:
        config = config or CasesConfig()
        configured = ConfiguredRetrievers(config.retrievers)
        self.configured = configured
        conventions: tuple[Convention, ...] = by_name(config.conventions)
        self.conventions: tuple[Convention, ...] = (
            (configured, *conventions) if configured else conventions
        )
        sources = config.document_id
        self.document_ids = DocumentIds(
            sources if isinstance(sources, list) else None,
            sources if isinstance(sources, dict) else None,
            window=config.id_overlap_window,
            watch=watch_ids,
        )
        self.matchers = [SpanMatcher.of(m) for m in config.match]
        self.question_attribute = config.question_attribute
        self.answer_attribute = config.answer_attribute
        markers: dict[str, frozenset[str] | None] = {}
        for conv in self.conventions:
            for key, values in conv.markers.items():
                have = markers.get(key, frozenset())
                markers[key] = None if values is None or have is None else have | values
        for _, equals, exists in self.matchers:
            for key in (*equals, *exists):
                markers[key] = None
        self.markers = markers
        self.event_markers = frozenset(e for c in self.conventions for e in c.event_markers)
        self.role_keys = frozenset(k for c in self.conventions for k in c.role_keys)
        self._name_patterns = [p for p, equals, exists in self.matchers if p is not None]
        self._name_patterns += configured.name_patterns
        self.name_suffixes = tuple(s for c in self.conventions for s in c.name_suffixes)
        self._patterns = _marker_patterns(markers, self.event_markers)

    def matches(self, span: trace_pb2.Span, attrs: Mapping[str, Any]) -> bool:
        return any(m.matches(span, attrs) for m in self.matchers)

    def may_hold_case(self, spans: Iterable[trace_pb2.Span]) -> bool:
        """Cheap: could these spans hold a case?  True when a span carries a marker
        attribute (``openinference.span.kind = RETRIEVER``, ``ragtrace.span.kind``,
        ``gen_ai.operation.name = retrieval``, ...), a marker event, or matches a
        ``cases.match`` name glob.  False positives only cost a full decode.

        Spans are not decoded: each span is serialised (C code) and the serialised
        spans are searched, all at once, for the exact protobuf encoding of the marker
        key/value pairs.  A span larger than :data:`_SEARCH_LIMIT` bytes (a long prompt
        or document) is checked attribute by attribute instead, so that the cost stays
        per attribute, not per byte."""
        if self._name_patterns:
            return any(self._span_may_hold(span) for span in spans)
        small: list[bytes] = []
        suffixes = self.name_suffixes
        for span in spans:
            # Span names are checked one by one: cheaper than one more search of the
            # serialised bytes per name ending (benchmarks/prefilter_name_suffixes.py).
            if suffixes and span.name.endswith(suffixes):
                return True
            if span.ByteSize() <= _SEARCH_LIMIT:  # sized without serialising a 10 MB span
                small.append(span.SerializeToString())
            elif self._span_may_hold(span):
                return True
        data = b"".join(small)
        return any(pattern in data for pattern in self._patterns)

    def _span_may_hold(self, span: trace_pb2.Span) -> bool:
        markers = self.markers
        for kv in span.attributes:
            if kv.key in markers:
                values = markers[kv.key]
                if values is None or kv.value.string_value in values:
                    return True
        if self.event_markers and span.events:
            for event in span.events:
                if event.name in self.event_markers:
                    return True
        if self.name_suffixes and span.name.endswith(self.name_suffixes):
            return True
        return any(p.fullmatch(span.name) for p in self._name_patterns)


def _marker_patterns(
    markers: Mapping[str, frozenset[str] | None], events: frozenset[str]
) -> tuple[bytes, ...]:
    """The protobuf encodings searched for: ``KeyValue{key, value: AnyValue{string}}``
    (field 1 ``key``, field 2 ``value``, whose field 1 is ``string_value``), or just
    the key when any value marks; ``Span.Event`` field 2 (``name``) for the events."""
    patterns: list[bytes] = []
    for key, values in markers.items():
        lead = string_field(0x0A, key) + b"\x12"
        if values is None:
            patterns.append(lead)
            continue
        for value in sorted(values):
            inner = string_field(0x0A, value)
            patterns.append(lead + varint(len(inner)) + inner)
    patterns.extend(string_field(0x12, name) for name in sorted(events))
    return tuple(patterns)


DEFAULT_RULES = CaseRules()


def may_hold_case(spans: Iterable[trace_pb2.Span], rules: CaseRules | None = None) -> bool:
    """The evaluator's prefilter: False means no case can be built from ``spans``."""
    return (rules or DEFAULT_RULES).may_hold_case(spans)


# --------------------------------------------------------------------- cases
class ReferenceLookup(Protocol):
    """What the reference store returns for an input (fields may be None)."""

    expected_output: str | None
    reference_contexts: list[str] | None
    reference_context_ids: list[str] | None
    expected_outcome: str | None


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
    #: The convention that claimed the case span (``ragtrace``, ``openinference``, ...).
    convention: str | None = None
    #: Where each retrieved document was read, in the case's rank order (the order of
    #: ``case.retrieval_context``), e.g. for document annotations.  None: no retriever
    #: ran.
    document_sources: list[DocumentSource] | None = None


class DocumentSource(NamedTuple):
    """Where a retrieved document was read: its retriever (or reranker) span, its index
    there, and its id (for document-level results such as Phoenix annotations)."""

    span_id: str
    position: int
    id: str | None = None


class _Node:
    """A span of the trace, its role, and its attributes decoded on first use: only the
    case spans and the retrieval spans under them are read in full (in a trace of an
    auto-instrumented app, the LLM and inner chain spans carry most of the bytes)."""

    __slots__ = ("_attrs", "_keys", "_kvs", "convention", "role", "span")

    def __init__(self, span: trace_pb2.Span, rules: CaseRules) -> None:
        self.span = span
        self._kvs = kvs = list(span.attributes)
        self._keys = keys = [kv.key for kv in kvs]
        self._attrs: dict[str, Any] | None = None
        role_keys = rules.role_keys
        known = {
            k: any_value_to_python(kv.value)
            for k, kv in zip(keys, kvs, strict=True)
            if k in role_keys
        }
        self.role: Role | None = None
        self.convention: Convention | None = None
        for conv in rules.conventions:
            role = conv.role(span, known)
            if role is not None:
                self.role, self.convention = role, conv
                break

    @property
    def attrs(self) -> dict[str, Any]:
        """All attributes (a repeated key keeps its last value, as
        :func:`~ragtrace_collector.otlp.spanattrs.attributes_to_dict`)."""
        attrs = self._attrs
        if attrs is None:
            attrs = self._attrs = {
                k: any_value_to_python(kv.value)
                for k, kv in zip(self._keys, self._kvs, strict=True)
            }
            self._kvs = []  # the wrappers are not needed again
        return attrs


def _json_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    parsed = json_value(value)
    if isinstance(parsed, list):
        return [str(v) for v in parsed]
    return [str(parsed)]


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def build_cases(
    spans: Sequence[trace_pb2.Span],
    *,
    service_of: Callable[[trace_pb2.Span], str] | None = None,
    reference_lookup: Callable[[str], ReferenceLookup | None] | None = None,
    rules: CaseRules | None = None,
    prefiltered: bool = False,
) -> list[BuiltCase]:
    """One :class:`BuiltCase` per case span in ``spans`` (one trace's spans).
    ``prefiltered``: the caller already found that they may hold a case
    (:func:`may_hold_case`)."""
    rules = rules or DEFAULT_RULES
    if not prefiltered and not rules.may_hold_case(spans):
        return []  # the common case for non-RAG traffic: no attribute decoding at all
    nodes: dict[bytes, _Node] = {}
    children: dict[bytes, list[_Node]] = defaultdict(list)
    for span in spans:
        nodes[span.span_id] = _Node(span, rules)
    for node in nodes.values():
        if node.span.parent_span_id:
            children[node.span.parent_span_id].append(node)

    explicit = [
        n
        for n in nodes.values()
        if n.role is Role.CASE or (rules.matchers and rules.matches(n.span, n.attrs))
    ]
    # @rag spans or matched spans when there are any (or matchers are set), else the
    # outermost root above each retriever.
    if explicit or rules.matchers:
        case_nodes = explicit
    else:
        case_nodes = _outermost_roots(nodes, rules.configured)
    stops = {n.span.span_id for n in case_nodes}

    built: list[BuiltCase] = []
    for node in case_nodes:
        groups, rerankers = _retrieval_under(node, children, stops)
        try:
            case = _build_one(
                node,
                groups,
                rerankers,
                rules=rules,
                service=service_of(node.span) if service_of else "unknown",
                reference_lookup=reference_lookup,
                nodes=nodes,
            )
        except Exception as exc:  # spans are untrusted: that case is skipped, not the trace
            _log().warning(
                "case_build_failed",
                trace_id=node.span.trace_id.hex(),
                span_id=node.span.span_id.hex(),
                error=repr(exc),
            )
            continue
        built.append(case)
    return built


def _outermost_roots(nodes: Mapping[bytes, _Node], configured: ConfiguredRetrievers) -> list[_Node]:
    """The outermost ROOT ancestor of every retriever, each once, in span order; for a
    retriever of ``cases.retrievers`` (``configured``) with none, its outermost ancestor."""
    chosen: dict[bytes, _Node] = {}
    for node in nodes.values():
        if node.role is not Role.RETRIEVER:
            continue
        top: _Node | None = None
        outermost: _Node | None = None
        parent_id = node.span.parent_span_id
        for _ in range(_MAX_DEPTH):
            parent = nodes.get(parent_id) if parent_id else None
            if parent is None:
                break
            outermost = parent
            if parent.role is Role.ROOT:
                top = parent
            parent_id = parent.span.parent_span_id
        if top is None and node.convention is configured:
            top = outermost  # in-house spans: no chain span above, the trace's root is
        if top is not None:
            chosen.setdefault(top.span.span_id, top)
    order = {sid: i for i, sid in enumerate(nodes)}
    return sorted(chosen.values(), key=lambda n: order[n.span.span_id])


def _retrieval_under(
    case: _Node, children: Mapping[bytes, list[_Node]], stops: set[bytes]
) -> tuple[list[list[_Node]], list[_Node]]:
    """The retrievers below ``case`` (not below a nested case span) as groups: the
    outermost retriever span of each, in start order, followed by the retriever spans
    nested in it (a LlamaIndex ``retrieve`` > ``_retrieve``, DSPy ``Retrieve`` >
    ``ColBERTv2``), which are one retrieval, not several; and the rerankers in end order."""
    groups: dict[bytes, list[_Node]] = {}
    rerankers: list[_Node] = []
    seen: set[bytes] = {case.span.span_id}
    stack: list[tuple[_Node, _Node | None]] = [
        (child, None) for child in children.get(case.span.span_id, ())
    ]
    while stack:
        node, outer = stack.pop()
        sid = node.span.span_id
        if sid in stops or sid in seen:
            continue  # a nested case span is a case of its own
        seen.add(sid)
        if node.role is Role.RETRIEVER:
            if outer is None:
                groups[sid] = [node]
                outer = node
            else:
                groups[outer.span.span_id].append(node)
        elif node.role is Role.RERANKER:
            rerankers.append(node)
        stack.extend((child, outer) for child in children.get(sid, ()))
    ordered = sorted(groups.values(), key=lambda g: _start_order(g[0]))
    for group in ordered:
        group[1:] = sorted(group[1:], key=_start_order)
    rerankers.sort(key=lambda n: (n.span.end_time_unix_nano, n.span.span_id))
    return ordered, rerankers


def _between(node: _Node, case: _Node, nodes: Mapping[bytes, _Node]) -> Iterable[_Node]:
    """The spans above ``node`` up to the case span (not included), nearest first."""
    parent_id = node.span.parent_span_id
    for _ in range(_MAX_DEPTH):
        parent = nodes.get(parent_id) if parent_id else None
        if parent is None or parent is case:
            return
        yield parent
        parent_id = parent.span.parent_span_id


def _start_order(node: _Node) -> tuple[int, bytes]:
    return node.span.start_time_unix_nano, node.span.span_id


class _Found(NamedTuple):
    """The case's documents in rank order, and for each the convention that read it and
    where (span id hex, position on that span)."""

    docs: list[Document]
    conventions: list[str]
    where: list[tuple[str, int]]
    #: A span above a retriever holding documents with ids the collector could not
    #: give the retriever's documents (for the "no ids" reason); None: none.
    elsewhere: _Node | None = None


def _context_docs(
    groups: list[list[_Node]],
    rerankers: list[_Node],
    above: Callable[[_Node], Iterable[_Node]] | None = None,
) -> _Found | None:
    """The case's documents; None when no retriever ran or none recorded its documents
    (then the ID metrics are skipped rather than scored on "found none").  ``above``:
    the spans between a retriever and the case span, searched for the ids the
    retriever's documents lack (:func:`_fill_from_above`)."""
    elsewhere: _Node | None = None
    if rerankers:
        node = rerankers[-1]
        assert node.convention is not None
        read = node.convention.documents(node.span, node.attrs, Role.RERANKER)
        sources = [] if read is None else [(node, read)]
    else:
        sources = [r for r in map(_group_documents, groups) if r is not None]
        if above is not None:
            for node, found in sources:
                if found and any(d.id is None for d in found):
                    elsewhere = _fill_from_above(found, above(node)) or elsewhere
    if not sources:
        return None
    docs: list[Document] = []
    conventions: list[str] = []
    where: list[tuple[str, int]] = []
    for node, found in sources:
        assert node.convention is not None
        docs.extend(found)
        conventions.extend([node.convention.name] * len(found))
        span_hex = node.span.span_id.hex()
        where.extend((span_hex, i) for i in range(len(found)))
    return _Found(docs, conventions, where, elsewhere)


def _read_documents(node: _Node) -> list[Document] | None:
    assert node.convention is not None
    return node.convention.documents(node.span, node.attrs, Role.RETRIEVER)


def _group_documents(group: list[_Node]) -> tuple[_Node, list[Document]] | None:
    """The documents of one retrieval (a retriever span and those nested in it): those
    of the outermost span that recorded some; a document there without an id takes the
    id of the same-rank document of a nested span when their contents agree.  None:
    no span of the group recorded its documents."""
    empty: _Node | None = None
    for index, node in enumerate(group):
        docs = _read_documents(node)
        if docs is None:
            continue  # this span did not record its documents (not: found none)
        if not docs:
            empty = empty or node
            continue
        for inner in group[index + 1 :]:
            if all(d.id is not None for d in docs):
                break
            _fill_from(docs, _read_documents(inner))
        return node, docs
    return (empty, []) if empty is not None else None


def _fill_from(docs: list[Document], inner: list[Document] | None) -> None:
    """Ids (and metadata) for the documents without one, from ``inner`` by rank."""
    if not inner:
        return
    for doc, other in zip(docs, inner, strict=False):
        if doc.id is not None or other.id is None:
            continue
        if doc.content is not None and other.content is not None:
            if doc.content != other.content:
                continue
        elif len(docs) != len(inner):
            continue
        doc.id = other.id
        for source, value in other.ids.items():
            doc.ids.setdefault(source, value)
        if not doc.metadata:
            doc.metadata = other.metadata


def _fill_from_above(docs: list[Document], spans: Iterable[_Node]) -> _Node | None:
    """Ids for the documents without one from a span above their retriever whose
    ``traceloop.entity.output`` holds the same documents with ids: traceloop-sdk's
    ``@task`` that returned them (the LangChain instrumentation drops
    ``Document.id``; the SDK's encoder keeps it).  Read only when ids are missing.
    Returns a span holding documents with ids when some documents are still without
    one (for the reason), else None."""
    holder: _Node | None = None
    for node in spans:
        found = openllmetry.entity_documents(node.attrs)
        if found and any(d.id is not None for d in found):
            _fill_from(docs, found)
            if all(d.id is not None for d in docs):
                return None
            holder = holder or node
    return holder


def _no_ids_reason(docs: Sequence[Document], elsewhere: _Node | None) -> str:
    """Why the ID metrics are skipped when no document has an id, and the setting that
    reads the ids the trace holds elsewhere."""
    parts = ["no retrieved document ids captured"]
    if elsewhere is not None:
        raw = elsewhere.attrs.get(semconv.TRACELOOP_ENTITY_OUTPUT)
        fields = (
            "id: kwargs.id, content: kwargs.page_content"
            if isinstance(raw, str) and '"lc": 1' in raw
            else "id: id"
        )
        parts.append(
            f"span {elsewhere.span.name!r} holds the documents with ids in"
            f" {semconv.TRACELOOP_ENTITY_OUTPUT}, not in the retriever's order: read them"
            f" with cases.retrievers: [{{match: {{span_name: {elsewhere.span.name!r}}},"
            f" documents: {semconv.TRACELOOP_ENTITY_OUTPUT}, {fields}}}]"
        )
    keys = list(
        dict.fromkeys(
            k
            for d in docs[:_REASON_DOCS]
            for k, v in (d.metadata or {}).items()
            if isinstance(v, (str, int)) and not isinstance(v, bool)
        )
    )[:5]
    if keys:
        parts.append(
            f"the documents' metadata has {', '.join(keys)}: if one of these is your"
            f" document id, name it with cases.document_id (e.g. [metadata.{keys[0]}])"
        )
    else:
        parts.append(
            "the retriever span records its documents without ids; if another span"
            " holds them, name it with cases.retrievers (docs/already-instrumented.md)"
        )
    return "; ".join(parts)


def _read_order(node: _Node, rules: CaseRules) -> list[Convention]:
    first = [node.convention] if node.convention is not None else []
    return first + [c for c in rules.conventions if c is not node.convention]


def _first(readers: Iterable[Callable[[Mapping[str, Any]], str | None]], attrs: Any) -> str | None:
    for read in readers:
        value = read(attrs)
        if value:
            return value
    return None


def _first_text(
    readers: Iterable[Callable[[Mapping[str, Any]], str | Unread | None]], attrs: Any
) -> str | Unread | None:
    """The first text the readers give; else what the first of them found instead."""
    unread: Unread | None = None
    for read in readers:
        value = read(attrs)
        if isinstance(value, Unread):
            unread = unread or value
        elif value:
            return value
    return unread


def _unreadable(value: str | Unread | None, what: str, where: str | None) -> str | None:
    """The skip reason of a question or answer that was recorded but is not text."""
    if not isinstance(value, Unread):
        return None
    held = f"the {what} recorded" + (f" in {where}" if where else "")
    key = "question_attribute" if what == "question" else "answer_attribute"
    return (
        f"{held} is {value.found}, not text; set cases.{key} to an attribute that holds "
        f"the {what} text"
    )


def _build_one(
    node: _Node,
    groups: list[list[_Node]],
    rerankers: list[_Node],
    *,
    rules: CaseRules,
    service: str,
    reference_lookup: Callable[[str], ReferenceLookup | None] | None,
    nodes: Mapping[bytes, _Node] | None = None,
) -> BuiltCase:
    attrs = node.attrs
    order = _read_order(node, rules)
    retrievers = [n for group in groups for n in group]  # outermost first
    question: str | Unread | None
    if rules.question_attribute is not None:
        question = read_question(attrs.get(rules.question_attribute))
    else:
        question = _first_text((c.question for c in order), attrs)
        if not isinstance(question, str):
            # No question text on the case span: the first retriever's query stands in.
            for retriever in retrievers:
                query = _first(
                    (c.retrieval_query for c in _read_order(retriever, rules)), retriever.attrs
                )
                if query:
                    question = query
                    break
    user_input = question if isinstance(question, str) else None
    # An answer that is not text stays no answer (never the question, never the JSON).
    answer = (
        read_answer(attrs.get(rules.answer_attribute))
        if rules.answer_attribute is not None
        else _first_text((c.answer for c in order), attrs)
    )
    actual_output = answer if isinstance(answer, str) else None
    session_id = _first((c.session_id for c in order), attrs)
    for retriever in retrievers:
        if session_id:
            break
        session_id = _first((c.session_id for c in _read_order(retriever, rules)), retriever.attrs)

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
                reference_contexts, filled = [str(t) for t in entry.reference_contexts], True
            if reference_ids is None and entry.reference_context_ids is not None:
                reference_ids, filled = [str(i) for i in entry.reference_context_ids], True
            if expected_outcome is None and entry.expected_outcome is not None:
                expected_outcome = entry.expected_outcome
            if filled and source is None:
                source = "reference_store"

    found = _context_docs(
        groups, rerankers, None if nodes is None else lambda r: _between(r, node, nodes)
    )
    retrieval_context: list[ContextItem] | None = None
    retrieved_ids: list[str] | None = None
    document_sources: list[DocumentSource] | None = None
    mismatch: str | None = None
    if found is not None:
        docs = found.docs
        choice = rules.document_ids.choose(service, docs, found.conventions, reference_ids)
        doc_ids = choice.ids
        mismatch = choice.mismatch
        document_sources = [
            DocumentSource(span_hex, position, doc_id)
            for (span_hex, position), doc_id in zip(found.where, doc_ids, strict=True)
        ]
        ids = [i for i in doc_ids if i is not None]
        # No document carried an id: the ID metrics have nothing to compare (skipped,
        # with what in the trace could give them one).  No document at all: an empty
        # retrieval, which the ID metrics score as 0.
        retrieved_ids = ids if (ids or not docs) else None
        if retrieved_ids is None:
            mismatch = _no_ids_reason(docs, found.elsewhere)
        if reference_ids and ids:
            if choice.mismatch is None:
                rules.document_ids.observe(service, ids, reference_ids, choice.source)
            if choice.source is not None:
                set_attribute(node.span.attributes, semconv.DOCUMENT_ID_SOURCE, choice.source)
                attrs[semconv.DOCUMENT_ID_SOURCE] = choice.source
        if all(d.content is not None for d in docs):
            # Built without validation: every value already has the type ContextItem
            # declares (read as such above), ids as the text they are compared by.
            retrieval_context = [
                trusted(
                    ContextItem,
                    {
                        "content": d.content or "",
                        "id": doc_id,
                        "score": d.score,
                        "metadata": d.metadata,
                    },
                )
                for d, doc_id in zip(docs, doc_ids, strict=True)
            ]

    span = node.span
    turn = attrs.get(semconv.TURN_INDEX)
    # No index: None, and the session store numbers the turn (1, 2, 3, ... by start).
    turn_index = (
        int(turn) if isinstance(turn, (int, float)) and not isinstance(turn, bool) else None
    )
    trace_id = span.trace_id.hex()
    span_id = span.span_id.hex()
    case = trusted(
        RAGCase,
        {
            "input": user_input,
            "actual_output": actual_output,
            "expected_output": expected_output,
            "retrieval_context": retrieval_context,
            "reference_contexts": reference_contexts,
            "reference_context_ids": reference_ids,
            "retrieved_context_ids": retrieved_ids,
            "case_id": f"{trace_id}:{span_id}",
            "retrieved_ids_mismatch": mismatch,
            "input_unreadable": _unreadable(question, "question", rules.question_attribute),
            "output_unreadable": _unreadable(answer, "answer", rules.answer_attribute),
        },
    )
    return BuiltCase(
        span=span,
        case=case,
        trace_id=trace_id,
        span_id=span_id,
        service=service,
        session_id=session_id,
        user_id=_str_or_none(attrs.get(semconv.USER_ID)),
        turn_index=turn_index,
        expected_outcome=expected_outcome,
        ground_truth_source=source,
        attributes=attrs,
        convention=node.convention.name if node.convention is not None else None,
        document_sources=document_sources,
    )
