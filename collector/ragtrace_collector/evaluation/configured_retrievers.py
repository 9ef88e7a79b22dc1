"""Retriever spans named in the config (``cases.retrievers``), for any instrumentation.

Each rule says which spans are retrievers (a matcher, as ``cases.match``) and where
their documents are: one attribute holding them, and the keys of each document's id,
content, score and metadata.  The attribute may hold

* a JSON array of document objects (or a span array attribute of JSON strings, one per
  document, as OpenLLMetry writes ``traceloop.entity.output``),
* a JSON object holding the array under ``documents``, ``nodes``, ``results``,
  ``hits``, ... (the SDK's container keys),
* or nothing: then ``<attribute>.N.<field>`` attributes are read as document N
  (``app.hits.0.id``, ``app.hits.0.text``, ...), flattened as OpenInference does.

A key is a field of the document, dotted for nested objects (``meta.doc_id``); a
document without it has no such value.  An unset key falls back to the SDK's
duck-typed reading (id from ``id``/``doc_id``/..., content from ``content``/``text``/...).
The id read is the document's ``document.id`` source
(:mod:`~ragtrace_collector.evaluation.document_ids`).

The rules act as a convention of their own, asked before the others: a span a rule
matches is a retriever whatever else claims it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from opentelemetry.proto.trace.v1 import trace_pb2
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragtrace._documents import extract_document, iter_documents
from ragtrace_collector.cases import id_text
from ragtrace_collector.conventions.base import (
    ID_DOCUMENT,
    Attrs,
    Document,
    Role,
    as_float,
    as_text,
    json_value,
)
from ragtrace_collector.conventions.text import reduce_question
from ragtrace_collector.evaluation.document_ids import lookup
from ragtrace_collector.evaluation.sampling import AttrScalar

__all__ = ["CaseMatch", "ConfiguredRetrievers", "RetrieverRule", "SpanMatcher"]

#: Documents read from one span, at most (a guard on untrusted input).
_MAX_DOCUMENTS = 1000


class CaseMatch(BaseModel):
    """Selects spans; every condition listed must hold on the span itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Span name, exact or a glob (``answer*``, ``*.query``).
    span_name: str | None = None
    #: attribute == value, e.g. ``{app.step: answer}``
    equals: dict[str, AttrScalar] = Field(default_factory=dict)
    #: every listed attribute is present
    exists: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> CaseMatch:
        if self.span_name is None and not self.equals and not self.exists:
            raise ValueError("a matcher needs span_name, equals or exists")
        return self


class SpanMatcher(NamedTuple):
    """A :class:`CaseMatch` compiled: the name glob as a pattern."""

    pattern: re.Pattern[str] | None
    equals: dict[str, Any]
    exists: list[str]

    @classmethod
    def of(cls, match: CaseMatch) -> SpanMatcher:
        pattern = None if match.span_name is None else fnmatch.translate(match.span_name)
        return cls(
            None if pattern is None else re.compile(pattern), dict(match.equals), list(match.exists)
        )

    def matches(self, span: trace_pb2.Span, attrs: Attrs) -> bool:
        if self.pattern is not None and not self.pattern.fullmatch(span.name):
            return False
        if any(attrs.get(k) != v for k, v in self.equals.items()):
            return False
        return all(k in attrs for k in self.exists)


class RetrieverRule(BaseModel):
    """One kind of retriever span and where its documents are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The retriever spans (span name glob, attribute values, attributes present).
    match: CaseMatch
    #: Span attribute holding the documents (a JSON array, an object holding one, a
    #: list of JSON strings), or the prefix of ``<attribute>.N.<field>`` attributes.
    documents: str = Field(min_length=1)
    #: Key of a document's id, dotted for nested objects (``meta.doc_id``); default:
    #: ``id``, ``doc_id``, ``document_id``, ``_id``, ``node_id``, ``chunk_id``.
    id: str | None = Field(None, min_length=1)
    #: Key of a document's text; default: ``content``, ``text``, ``page_content``, ...
    content: str | None = Field(None, min_length=1)
    #: Key of a document's score; default: ``score``, ``relevance_score``, ...
    score: str | None = Field(None, min_length=1)
    #: Key of a document's metadata (an object, or JSON text of one); default:
    #: ``metadata`` or ``meta``.
    metadata: str | None = Field(None, min_length=1)
    #: Span attribute holding the query (JSON reduced); it stands in for the question
    #: when the case span has none.
    query: str | None = Field(None, min_length=1)


class ConfiguredRetrievers:
    """``cases.retrievers`` as a :class:`~ragtrace_collector.conventions.base.Convention`."""

    name: Final = "cases.retrievers"

    def __init__(self, rules: Sequence[RetrieverRule]) -> None:
        self._rules = [(SpanMatcher.of(r.match), r) for r in rules]
        markers: dict[str, frozenset[str] | None] = {}
        for matcher, _ in self._rules:
            if matcher.pattern is not None:
                continue  # found by name: the prefilter tries the name patterns
            for key in (*matcher.equals, *matcher.exists):
                markers[key] = None
        self.markers: Mapping[str, frozenset[str] | None] = markers
        self.event_markers: frozenset[str] = frozenset()
        self.name_suffixes: tuple[str, ...] = ()
        self.role_keys: frozenset[str] = frozenset(
            k for m, _ in self._rules for k in (*m.equals, *m.exists)
        )
        #: Span name patterns of the rules that have one (for the prefilter).
        self.name_patterns = [m.pattern for m, _ in self._rules if m.pattern is not None]

    def __bool__(self) -> bool:
        return bool(self._rules)

    def _rule(self, span: trace_pb2.Span, attrs: Attrs) -> RetrieverRule | None:
        for matcher, rule in self._rules:
            if matcher.matches(span, attrs):
                return rule
        return None

    def role(self, span: trace_pb2.Span, attrs: Attrs) -> Role | None:
        return Role.RETRIEVER if self._rule(span, attrs) is not None else None

    def documents(self, span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document] | None:
        rule = self._rule(span, attrs)
        if rule is None:
            return None
        items = _items(attrs, rule.documents)
        if items is None:
            return None
        return [_document(rule, item) for item in items[:_MAX_DOCUMENTS]]

    def retrieval_query(self, attrs: Attrs) -> str | None:
        for _, rule in self._rules:
            if rule.query is not None and rule.query in attrs:
                return reduce_question(attrs[rule.query])
        return None

    def question(self, attrs: Attrs) -> str | None:
        return None

    def answer(self, attrs: Attrs) -> str | None:
        return None

    def session_id(self, attrs: Attrs) -> str | None:
        return None


def _items(attrs: Attrs, key: str) -> Sequence[Any] | None:
    """The documents' raw values; None when the span does not record them."""
    value = attrs.get(key)
    if value is None:
        return _flattened(attrs, key)
    parsed = json_value(value)
    if isinstance(parsed, (list, tuple)):
        return [json_value(item) for item in parsed]
    if isinstance(parsed, Mapping):
        held = iter_documents(parsed)
        return list(held) if held is not None else None
    return [parsed]


def _flattened(attrs: Attrs, prefix: str) -> list[Any] | None:
    """``<prefix>.N.<field>`` attributes as one nested object per N, in index order."""
    lead = prefix + "."
    records: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(lead):
            continue
        index, _, rest = key[len(lead) :].partition(".")
        if not index.isdecimal() or not rest:
            continue
        record = records.setdefault(int(index), {})
        record[rest] = value  # the flat key (``document.id``) is a path that works too
        node = record
        *parents, last = rest.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node.setdefault(last, value)
    if not records:
        return None
    return [records[i] for i in sorted(records)]


def _document(rule: RetrieverRule, item: Any) -> Document:
    try:
        record = extract_document(item)
    except Exception:  # untrusted JSON of any shape: an empty document, still ranked
        return Document()
    mapping = item if isinstance(item, Mapping) else {}
    doc_id = _text(lookup(mapping, rule.id)) if rule.id is not None else record.id
    content = lookup(mapping, rule.content) if rule.content is not None else record.content
    score = lookup(mapping, rule.score) if rule.score is not None else record.score
    metadata = json_value(
        lookup(mapping, rule.metadata) if rule.metadata is not None else record.metadata
    )
    doc = Document(
        id=doc_id,
        content=as_text(content),
        score=as_float(score),
        metadata=dict(metadata) if isinstance(metadata, Mapping) else {},
    )
    if doc_id is not None and (
        rule.id is not None or doc_id != extract_document({"metadata": record.metadata}).id
    ):
        doc.ids[ID_DOCUMENT] = doc_id  # its own id, not one read from its metadata
    return doc


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (bool, dict, list)) or value == "":
        return None
    return id_text(value)
