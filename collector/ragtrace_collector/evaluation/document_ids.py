"""Which id of a retrieved document is compared with the reference ids.

A retrieved document may carry several ids: its own (``document.id``, which an
auto-instrumentor often fills with an id the framework generated, such as a LlamaIndex
node UUID), ids in its metadata (``doc_id``, ``ref_doc_id``, ...) and the id of the
same-rank entry of its retriever's output.  The reference ids name documents at one
granularity; scoring them against another kind of id gives a confident 0 that is not
true.  This module decides which id each document contributes.

**Sources**, as written in ``cases.document_id`` and on the span:

* ``document.id``: the document's own id field (OpenInference ``document.id``,
  ``db.query.result.id``, the ``id`` of a JSON document);
* ``metadata.<key>``: a key of the document's metadata (a dotted key reads nested
  objects: ``metadata.source.id``);
* ``output.id``: the id of the entry at the same rank in the retriever span's output
  (``output.value``), read when the document records no id of its own.

**Default** (no ``cases.document_id``): each document's id is the first it has of
:data:`DEFAULT_SOURCES`.  When a case has reference ids and none of these ids is
among them, but another single source (:data:`CANDIDATE_SOURCES`) of the same
documents has some, that source is used instead (documents without it keep their
default id): the case span says so in ``ragtrace.retrieval.document_id_source`` and
the first switch of a service to a source is logged.  A service remembers its
source, so a later case of it whose ids match under no source is scored with the
same kind of id rather than switching back.  When no source matches and every id is
one a framework generates (a UUID, a hex digest) while no reference id is, a source
holding ids a user chose is compared if the documents have one (a true 0); otherwise
the ids are not comparable and the ID metrics are skipped with a reason
(:attr:`IdChoice.mismatch`), never scored 0.  With ``cases.document_id`` set, its
sources are used, in order, and nothing is switched.

**Overlap watch.**  For each service the last ``cases.id_overlap_window`` cases that
compared ids are kept as "some retrieved id was a reference id" or not.  The share is
exported as ``ragtrace_reference_id_overlap{service}``; a full window with no overlap
at all is a warning in the ``evaluation`` component's detail on ``/healthz``, with
example ids of both sides (the ids are of different kinds, or the retriever is really
failing: both look the same from here).
"""

from __future__ import annotations

import difflib
import re
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

from ragtrace_collector.cases import id_text
from ragtrace_collector.component.lazylog import LazyLogger
from ragtrace_collector.conventions.base import ID_DOCUMENT, ID_OUTPUT, Document

__all__ = [
    "CANDIDATE_SOURCES",
    "DEFAULT_SOURCES",
    "DocumentIds",
    "IdChoice",
    "IdOverlapWatch",
    "check_source",
    "looks_generated",
    "lookup",
]

_METADATA = "metadata."

#: Where a document's id is read by default, in this order (the first it has).
DEFAULT_SOURCES: Final = (
    ID_DOCUMENT,
    "metadata.doc_id",
    "metadata.document_id",
    "metadata.ref_doc_id",
    "metadata.id",
    "metadata._id",
    "metadata.node_id",
    "metadata.chunk_id",
    ID_OUTPUT,
)
#: Tried one by one when the default ids of a case match no reference id: the default
#: sources, then document-level keys that loaders write (LangChain ``source``,
#: LlamaIndex ``file_name`` / ``file_path``).
CANDIDATE_SOURCES: Final = (
    *DEFAULT_SOURCES,
    "metadata.source",
    "metadata.file_name",
    "metadata.file_path",
)
#: Example ids kept per side for the overlap warning.
_EXAMPLES = 3
#: Ids a framework generates: a UUID, or a hex digest (Haystack's SHA-256 of the content).
_GENERATED = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32,}", re.IGNORECASE
)


def looks_generated(value: str) -> bool:
    """True for an id that a framework generated rather than a user chose."""
    return _GENERATED.fullmatch(value) is not None


def check_source(text: str) -> str:
    """``text`` if it names an id source, else a ValueError with a hint."""
    if text in (ID_DOCUMENT, ID_OUTPUT) or (
        text.startswith(_METADATA) and text[len(_METADATA) :].strip(".")
    ):
        return text
    known = [ID_DOCUMENT, ID_OUTPUT, "metadata.doc_id"]
    close = difflib.get_close_matches(text, [*known, *DEFAULT_SOURCES], n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else "document.id, output.id or metadata.<key>"
    raise ValueError(f"unknown document id source {text!r} ({hint})")


def lookup(record: Any, path: str) -> Any:
    """The value at ``path`` in ``record``: the key ``path`` itself, else a dotted path
    through nested mappings (``source.id``).  None when absent."""
    if not isinstance(record, Mapping):
        return None
    if path in record:
        return record[path]
    head, dot, rest = path.partition(".")
    while dot:
        if head in record:
            return lookup(record[head], rest)
        more, dot, rest = rest.partition(".")
        head = f"{head}.{more}"
    return None


def _as_id(value: Any) -> str | None:
    """An id as the text ids are compared by; None for no value or a non-scalar."""
    if value is None or isinstance(value, bool) or value == "":
        return None
    if isinstance(value, (str, int, float)):
        return value if type(value) is str else id_text(value)
    return None


def _value(doc: Document, source: str) -> str | None:
    if source.startswith(_METADATA):
        return _as_id(lookup(doc.metadata, source[len(_METADATA) :])) if doc.metadata else None
    return doc.ids.get(source)


def _pick(doc: Document, sources: Sequence[str], fallback: bool) -> tuple[str | None, str | None]:
    """(id, source) of the first of ``sources`` that ``doc`` has.  With ``fallback``
    (not configured), a document whose convention gave it an id without saying where
    (not in :attr:`Document.ids`) still has that id, as its ``document.id``."""
    for source in sources:
        value = _value(doc, source)
        if value is not None:
            return value, source
    if fallback and doc.id is not None:
        return doc.id, ID_DOCUMENT
    return None, None


class IdChoice(NamedTuple):
    """The id of each document (rank order; None: it has none) and where they came from."""

    ids: list[str | None]
    #: The sources used, in order of first use, comma-separated; None: no id at all.
    source: str | None
    #: Set when the ids are of another kind than the reference ids: why (the ID
    #: metrics are skipped with it).
    mismatch: str | None = None


def _choose(
    docs: Sequence[Document], orders: Sequence[Sequence[str]], *, fallback: bool
) -> IdChoice:
    ids: list[str | None] = []
    used: list[str] = []
    for doc, order in zip(docs, orders, strict=True):
        value, source = _pick(doc, order, fallback or order is DEFAULT_SOURCES)
        ids.append(value)
        if source is not None and source not in used:
            used.append(source)
    return IdChoice(ids, ", ".join(used) if used else None)


class _Gauge(Protocol):
    def labels(self, *values: str) -> Any: ...


@dataclass
class _ServiceWindow:
    hits: deque[bool]
    overlapping: int = 0
    retrieved: list[str] = field(default_factory=list)
    reference: list[str] = field(default_factory=list)
    source: str | None = None
    warned: bool = False
    gauge: Any = None


class IdOverlapWatch:
    """Per service, whether the last ``window`` id-comparing cases had any retrieved id
    among their reference ids.  Safe to call from several threads."""

    def __init__(self, window: int, gauge: _Gauge | None = None) -> None:
        self.window = window
        self._gauge = gauge
        self._services: dict[str, _ServiceWindow] = {}
        self._lock = threading.Lock()
        self._log = LazyLogger("document_ids")

    def bind(self, gauge: _Gauge) -> None:
        """Export the share of overlapping cases as ``gauge{service}``."""
        self._gauge = gauge

    def observe(
        self,
        service: str,
        retrieved: Sequence[str],
        reference: Sequence[str],
        source: str | None,
    ) -> None:
        """One case that compared ids: ``retrieved`` (rank order) against ``reference``."""
        ref = set(reference)
        hit = any(i in ref for i in retrieved)
        with self._lock:
            state = self._services.get(service)
            if state is None:
                state = self._services[service] = _ServiceWindow(deque(maxlen=self.window))
                if self._gauge is not None:
                    state.gauge = self._gauge.labels(service)
            if len(state.hits) == self.window and state.hits[0]:
                state.overlapping -= 1
            state.hits.append(hit)
            state.overlapping += hit
            if not hit:
                state.retrieved = list(dict.fromkeys(retrieved))[:_EXAMPLES]
                state.reference = list(dict.fromkeys(reference))[:_EXAMPLES]
                state.source = source
            share = state.overlapping / len(state.hits)
            if state.gauge is not None:
                state.gauge.set(share)
            failing = len(state.hits) == self.window and not state.overlapping
            changed = failing != state.warned
            state.warned = failing
            message = self._message(service, state) if failing and changed else None
        if message is not None:
            self._log.warning("reference_id_overlap_none", service=service, detail=message)
        elif changed:
            self._log.info("reference_id_overlap_back", service=service, share=share)

    def shares(self) -> dict[str, float]:
        """Service -> share of its last cases whose ids overlapped the reference ids."""
        with self._lock:
            return {s: w.overlapping / len(w.hits) for s, w in self._services.items() if w.hits}

    def warning(self) -> str | None:
        """The warning for ``/healthz``, or None while every service has overlap."""
        with self._lock:
            parts = [self._message(s, w) for s, w in sorted(self._services.items()) if w.warned]
        return " | ".join(parts) if parts else None

    def _message(self, service: str, state: _ServiceWindow) -> str:
        read = f" (read from {state.source})" if state.source else ""
        return (
            f"service {service!r}: none of the last {len(state.hits)} cases with reference"
            f" ids retrieved a reference id; retrieved ids{read} e.g."
            f" {', '.join(state.retrieved) or '(none)'}; reference ids e.g."
            f" {', '.join(state.reference)}. If these are different kinds of id, name where"
            " the reference kind is in cases.document_id (e.g. [metadata.doc_id,"
            " document.id]) or in cases.retrievers[].id; if they are the same kind, the"
            " retriever is really returning none of the reference documents."
        )


class DocumentIds:
    """Chooses the ids of a case's documents (``cases.document_id``), remembers each
    service's choice, and feeds the :class:`IdOverlapWatch`."""

    def __init__(
        self,
        sources: Sequence[str] | None = None,
        per_convention: Mapping[str, Sequence[str]] | None = None,
        *,
        window: int = 50,
        watch: bool = True,
    ) -> None:
        self._sources = tuple(sources) if sources else None
        self._per_convention = {k: tuple(v) for k, v in (per_convention or {}).items()}
        self.watch: IdOverlapWatch | None = IdOverlapWatch(window) if watch else None
        #: service -> the source a switch chose for it
        self._remembered: dict[str, str] = {}
        #: services whose generated ids were logged as not comparable
        self._mismatched: set[str] = set()
        self._log = LazyLogger("document_ids")

    def choose(
        self,
        service: str,
        docs: Sequence[Document],
        conventions: Sequence[str | None],
        reference_ids: Sequence[str] | None,
    ) -> IdChoice:
        """The ids of ``docs`` (each read by the convention at the same index)."""
        configured = False
        orders: list[Sequence[str]] = []
        for name in conventions:
            order = self._per_convention.get(name or "") or self._sources
            if order is None:
                orders.append(DEFAULT_SOURCES)
            else:
                orders.append(order)
                configured = True
        choice = _choose(docs, orders, fallback=False)
        if configured or not reference_ids or not docs:
            return choice
        ref = set(reference_ids)
        if any(i in ref for i in choice.ids if i is not None):
            return choice
        best, best_count = None, 0
        for source in CANDIDATE_SOURCES:
            found = {v for d in docs if (v := _value(d, source)) is not None}
            count = len(found & ref)
            if count > best_count:
                best, best_count = source, count
        if best is None:
            best = self._remembered.get(service)
            if best is None or all(_value(d, best) is None for d in docs):
                return self._no_overlap(service, docs, choice, reference_ids)
        elif self._remembered.get(service) != best:
            self._remembered[service] = best
            self._log.warning(
                "document_id_source_switched",
                service=service,
                source=best,
                default=choice.source,
                detail=f"the retrieved ids read from {choice.source} match no reference id and"
                f" those of {best} do: {best} is compared for this service (set"
                " cases.document_id to choose yourself)",
            )
        return _choose(docs, [(best, *DEFAULT_SOURCES)] * len(docs), fallback=True)

    def _no_overlap(
        self,
        service: str,
        docs: Sequence[Document],
        choice: IdChoice,
        reference_ids: Sequence[str],
    ) -> IdChoice:
        """No source matches a reference id.  When the default ids are all generated
        ones and the reference ids are not, they cannot be compared: another source
        holding ids a user chose is used if the documents have one (a true 0), else
        the ID metrics are skipped with a reason (never a 0 from comparing a UUID with
        a document name)."""
        ids = [i for i in choice.ids if i is not None]
        if not ids or not all(map(looks_generated, ids)):
            return choice
        if any(map(looks_generated, reference_ids)):
            return choice
        for source in CANDIDATE_SOURCES:
            values = [_value(d, source) for d in docs]
            if any(v is not None and not looks_generated(v) for v in values):
                return _choose(docs, [(source, *DEFAULT_SOURCES)] * len(docs), fallback=True)
        mismatch = (
            f"retrieved ids (read from {choice.source}: {', '.join(ids[:2])}) are ids the"
            " framework generated and the reference ids"
            f" ({', '.join(list(reference_ids)[:2])}) are not: not compared. Keep your"
            " document id in the document's metadata (e.g. doc_id), or name where it is"
            " with cases.document_id"
        )
        if service not in self._mismatched:
            self._mismatched.add(service)
            self._log.warning("document_ids_not_comparable", service=service, detail=mismatch)
        return IdChoice(choice.ids, choice.source, mismatch)

    def observe(
        self, service: str, retrieved: Sequence[str], reference: Sequence[str], source: str | None
    ) -> None:
        if self.watch is not None:
            self.watch.observe(service, retrieved, reference, source)

    def warning(self) -> str | None:
        return self.watch.warning() if self.watch is not None else None
