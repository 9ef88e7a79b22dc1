"""What every convention module provides, and the pieces they share.

A convention module maps one span (its decoded attributes and its events) to a
:class:`Role` and, for the spans it claims, reads what a case needs: retrieved
documents, the question, the answer, the session.  It never sees a trace and never
builds a case; :mod:`ragtrace_collector.evaluation.case_builder` does that from what the modules
say, so the rest of the collector sees only cases.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace._documents import extract_document, iter_documents
from ragtrace_collector.otlp.spanattrs import attributes_to_dict

__all__ = [
    "ID_DOCUMENT",
    "ID_OUTPUT",
    "Attrs",
    "Convention",
    "Document",
    "Role",
    "Unread",
    "as_float",
    "as_text",
    "documents_from_attributes",
    "documents_from_json",
    "event_attributes",
    "fill_ids",
    "json_value",
    "role_from",
    "text_attribute",
    "unquote",
]

Attrs = Mapping[str, Any]

#: Sources of :attr:`Document.ids`: the document's own id field, and the id of the
#: same-rank entry of the retriever's output.
ID_DOCUMENT: Final = "document.id"
ID_OUTPUT: Final = "output.id"

#: Elements read from one JSON document list, at most (a guard on untrusted input).
_MAX_JSON_DOCUMENTS = 1000


class Role(enum.Enum):
    """What a span is to case building."""

    #: Always a case of its own (a ragtrace ``@rag`` span).
    CASE = "case"
    #: May be a case: the outermost such span with a retriever below it is one
    #: (an OpenInference CHAIN/AGENT, a GenAI agent or workflow, a Traceloop workflow).
    ROOT = "root"
    RETRIEVER = "retriever"
    RERANKER = "reranker"


@dataclass
class Document:
    """One retrieved document as read from a span."""

    id: str | None = None
    content: str | None = None
    score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Every id the span recorded for the document, by source: ``document.id`` (its own
    #: id field, not one taken from its metadata) and ``output.id`` (the same-rank entry
    #: of the retriever's output).  ``id`` is the default pick; the case builder may
    #: choose another (:mod:`ragtrace_collector.evaluation.document_ids`).
    ids: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Unread:
    """A question or answer value that holds no text a person would call the question
    (or the answer): what was found instead, e.g. "a JSON object with keys a, b, c"
    (:mod:`ragtrace_collector.conventions.text`)."""

    found: str


class Convention(Protocol):
    """One instrumentation convention (a module of this package)."""

    @property
    def name(self) -> str:
        """The name used in ``cases.conventions``."""
        ...

    @property
    def markers(self) -> Mapping[str, frozenset[str] | None]:
        """Attribute keys that mark a span this convention may use, each with the string
        values that do (None: any value).  The prefilter
        (:func:`~ragtrace_collector.evaluation.case_builder.may_hold_case`) reads only these, so a
        trace without them is never decoded."""
        ...

    @property
    def event_markers(self) -> frozenset[str]:
        """Span event names that mark a retriever span."""
        ...

    @property
    def name_suffixes(self) -> tuple[str, ...]:
        """Span name endings that mark a span this convention may use (the prefilter
        searches the serialised spans for them, as for :attr:`markers`)."""
        ...

    @property
    def role_keys(self) -> frozenset[str]:
        """Every attribute key :meth:`role` reads: case building decodes only these
        before it knows which spans it needs (the rest of a span's attributes are
        decoded only for the case span and the retrieval spans under it)."""
        ...

    def role(self, span: trace_pb2.Span, attrs: Attrs) -> Role | None:
        """The span's role; ``attrs`` may hold only :attr:`role_keys`."""
        ...

    def documents(self, span: trace_pb2.Span, attrs: Attrs, role: Role) -> list[Document] | None:
        """The documents of a RETRIEVER span (rank order), or a RERANKER's output; None
        when the span does not record them (an empty list: it found none)."""
        ...

    def question(self, attrs: Attrs) -> str | Unread | None:
        """The question of a case span: its text, what was found instead when the span
        records a value that holds none (:class:`Unread`), or None."""
        ...

    def answer(self, attrs: Attrs) -> str | Unread | None:
        """The answer of a case span, as :meth:`question`."""
        ...

    def session_id(self, attrs: Attrs) -> str | None: ...

    def retrieval_query(self, attrs: Attrs) -> str | None:
        """What a RETRIEVER span searched for (the question when the case span has none)."""
        ...


# ------------------------------------------------------------------ helpers
def json_value(value: Any) -> Any:
    """``value`` parsed as JSON when it is a string holding a JSON object or array;
    otherwise ``value`` unchanged.  Never raises."""
    if isinstance(value, str):
        text = value.lstrip()
        if text[:1] in ("{", "["):
            try:
                return json.loads(text)
            except (ValueError, RecursionError):
                return value
    return value


def unquote(value: Any) -> Any:
    """``value`` unquoted when it is a string holding a JSON string literal (``"Paris"``,
    quotes included: how MLflow writes every text attribute); otherwise unchanged.
    Never raises."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        try:
            held = json.loads(value)
        except (ValueError, RecursionError):
            return value
        if isinstance(held, str):
            return held
    return value


def _json_object(value: Any) -> dict[str, Any]:
    parsed = json_value(value)
    if isinstance(parsed, dict):
        return parsed
    if parsed is None or parsed == "":
        return {}
    return {"value": parsed}


def as_float(value: Any) -> float | None:
    """A number as a float; None for anything else (a bool too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def as_text(value: Any) -> str | None:
    """A string as is, None as None, anything else as JSON."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, default=str)


def documents_from_attributes(attrs: Attrs, prefix: str) -> list[Document]:
    """The OpenInference ``<prefix>.N.document.*`` records of a span, in index order.

    A document without ``document.id`` takes its id from its metadata, with the keys
    the SDK reads (``id``, ``doc_id``, ...: :func:`ragtrace._documents.extract_document`).
    """
    fields: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        where = _document_key(key, prefix)
        if where is not None:
            index, fld = where
            found = fields.get(index)
            if found is None:
                found = fields[index] = {}
            found[fld] = value
    docs: list[Document] = []
    for index in sorted(fields):
        found = fields[index]
        value = found.get(semconv.DOCUMENT_ID)
        doc_id = None if value is None else str(value)
        value = found.get(semconv.DOCUMENT_CONTENT)
        metadata = (
            _json_object(found[semconv.DOCUMENT_METADATA])
            if semconv.DOCUMENT_METADATA in found
            else {}
        )
        if doc_id is None and metadata:
            doc_id = _record_id({"metadata": metadata})
        doc = Document(
            doc_id,
            None if value is None else str(value),
            as_float(found.get(semconv.DOCUMENT_SCORE)),
            metadata,
        )
        if doc_id is not None and semconv.DOCUMENT_ID in found:
            doc.ids[ID_DOCUMENT] = doc_id
        docs.append(doc)
    return docs


#: ``(index, field)`` of a document attribute key, by (key, prefix); None for any other
#: key.  Span keys repeat from trace to trace, so each is split once.
_DOCUMENT_KEYS: dict[tuple[str, str], tuple[int, str] | None] = {}
_MAX_DOCUMENT_KEYS = 16384


def _document_key(key: str, prefix: str) -> tuple[int, str] | None:
    try:
        return _DOCUMENT_KEYS[key, prefix]
    except KeyError:
        pass
    where: tuple[int, str] | None = None
    lead = prefix + "."
    if key.startswith(lead):
        index_text, _, fld = key[len(lead) :].partition(".")
        if index_text.isdecimal():  # any field: a document of unknown fields still counts
            where = (int(index_text), fld)
    if len(_DOCUMENT_KEYS) >= _MAX_DOCUMENT_KEYS:
        _DOCUMENT_KEYS.clear()  # untrusted keys: bounded, whatever a client sends
    _DOCUMENT_KEYS[key, prefix] = where
    return where


def _record_id(item: Any) -> str | None:
    try:
        return extract_document(item).id
    except Exception:  # untrusted JSON of any shape: no id rather than a failed case
        return None


def documents_from_json(value: Any) -> list[Document] | None:
    """Documents from a JSON value (or a string holding one): a list of documents, or an
    object holding one under ``documents``/``nodes``/``results``/... (the SDK's
    duck-typed reading: ids, content, score and metadata under the keys it knows).
    None when ``value`` holds no list."""
    parsed = json_value(value)
    if not isinstance(parsed, (list, dict)):
        return None
    try:
        items = iter_documents(parsed)
    except Exception:
        return None
    if items is None or (isinstance(parsed, dict) and len(items) == 1 and items[0] is parsed):
        return None  # an object that is not a container of documents
    docs: list[Document] = []
    for item in list(items)[:_MAX_JSON_DOCUMENTS]:
        try:
            record = extract_document(item)
        except Exception:
            docs.append(Document())
            continue
        metadata = record.metadata if isinstance(record.metadata, dict) else {}
        doc = Document(
            id=record.id,
            content=as_text(record.content),
            score=as_float(record.score),
            metadata=dict(metadata),
        )
        if record.id is not None and record.id != _record_id({"metadata": metadata}):
            doc.ids[ID_DOCUMENT] = record.id  # its own id, not one read from its metadata
        docs.append(doc)
    return docs


def fill_ids(docs: Sequence[Document], fallback: Sequence[Document] | None) -> None:
    """Give the documents without an id the id of the document at the same rank in
    ``fallback`` (e.g. read from the span's ``output.value``), when that one has the
    same content or either content is unknown."""
    if not fallback or len(fallback) != len(docs):
        return
    for doc, other in zip(docs, fallback, strict=True):
        same = doc.content is None or other.content is None or doc.content == other.content
        if other.id is not None and same:
            doc.ids[ID_OUTPUT] = other.id
            if doc.id is None:
                doc.id = other.id


def event_attributes(event: trace_pb2.Span.Event) -> dict[str, Any]:
    return attributes_to_dict(event.attributes)


def role_from(attrs: Attrs, key: str, roles: Mapping[str, Role]) -> Role | None:
    """The role that ``roles`` gives the string value of ``key``, if any."""
    value = attrs.get(key)
    return roles.get(value) if isinstance(value, str) else None


def text_attribute(attrs: Attrs, *keys: str) -> str | None:
    """The first of ``keys`` that is set and not empty, as text."""
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return str(value)
    return None
