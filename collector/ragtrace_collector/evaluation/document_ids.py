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

**The source of a service** (no ``cases.document_id``).  Every case of a service
compares the same source, chosen from the evidence of its cases with reference ids:

* *the default*: each document's id is the first it has of :data:`DEFAULT_SOURCES`.
  It is chosen for the service as soon as a case's default ids meet a reference id;
* *another source* (one of :data:`CANDIDATE_SOURCES`) is chosen when a case's
  default ids meet no reference id while that source's do, and either the default ids
  cannot be of the reference ids' kind (none at all, or all of another kind: ids a
  framework generated against ids a user chose, file names against names) or the
  source is one the default already read for some of the documents; or, failing that,
  once it met the reference ids in :data:`SWITCH_AFTER` cases and the default in
  none.  Documents without it keep their default id.  The switch is logged
  (``document_id_source_switched``) once.

Until a service's source is chosen, a case is scored with the default ids, which
give the same scores as any source when no source meets a reference id; a case whose
default ids miss while another source's meet (the one case where the source changes
the score) is skipped with a reason (the tally so far and ``cases.document_id``),
neither 0 nor 1.  Every case that compares ids says where they were read in
``ragtrace.retrieval.document_id_source``.

**Ids of different kinds are not compared.**  When no retrieved id meets a reference
id and the retrieved ids are of another kind (:func:`id_kind`: generated ids, file
names; before the service's source is chosen also chunk ids that extend a reference
id, ``kb-01#3`` against ``kb-01``), another source holding the reference ids' kind is
compared if the documents have one (a true 0); otherwise the ID metrics are skipped
with a reason naming both kinds and the setting that fixes it
(:attr:`IdChoice.mismatch`), never scored 0.  Numbers are ids like any other.  With
``cases.document_id`` set, its sources are used, in order, and nothing is switched.

The per-service state is bounded: :data:`MAX_SERVICES` services (the least recently
seen is forgotten and chooses again) and a tally of at most one counter per source.

**Overlap watch.**  For each service the last ``cases.id_overlap_window`` cases that
compared ids are kept as "some retrieved id was a reference id" or not; the window
restarts when the service's source is chosen, so it holds what that source matched.
The share is exported as ``ragtrace_reference_id_overlap{service}``; a full window with
no overlap at all is a warning in the ``evaluation`` component's detail on
``/healthz``, naming the source and how it was chosen, with example ids of both sides
(the ids are of different kinds, or the retriever is really failing: both look the
same from here).
"""

from __future__ import annotations

import difflib
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

from ragtrace_collector.cases import id_text
from ragtrace_collector.component.lazylog import LazyLogger
from ragtrace_collector.conventions.base import ID_DOCUMENT, ID_OUTPUT, Document

__all__ = [
    "CANDIDATE_SOURCES",
    "DEFAULT_SOURCES",
    "MAX_SERVICES",
    "SWITCH_AFTER",
    "DocumentIds",
    "IdChoice",
    "IdOverlapWatch",
    "check_source",
    "id_kind",
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
#: Cases in which another source met the reference ids while the default ids (of a
#: plausible kind) met none, before that source is chosen for the service.
SWITCH_AFTER: Final = 5
#: Services whose choice (and overlap window) is kept, at most: the least recently
#: seen is forgotten beyond this.
MAX_SERVICES: Final = 1000
#: Example ids kept per side for the overlap warning and the reasons.
_EXAMPLES = 3
#: Ids checked for their kind in one case, at most (the reasons need a few).
_KIND_SAMPLE = 64
#: Ids a framework generates: a UUID, or a hex digest (Haystack's SHA-256 of the content).
_GENERATED = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32,}", re.IGNORECASE
)
#: A file name or path: a separator, or a name with an extension of 1-5 characters
#: holding a letter (``refunds.md``, ``/srv/kb/a.pdf``; not ``7.5`` or ``v1.2``).
_FILE = re.compile(r".*[/\\].*|[^\s]*[^\s.]\.(?=[0-9]*[A-Za-z])[A-Za-z0-9]{1,5}")
#: What separates a chunk's number from its document's id (``kb-01#3``, ``kb-01_2``).
_CHUNK_SEPARATORS = "#:_-/.@"

#: The kinds of :func:`id_kind`.
GENERATED: Final = "ids the framework generated (UUIDs, content hashes)"
FILE: Final = "file names"
NAME: Final = "ids you chose"
CHUNK: Final = "chunk ids (a reference id and a chunk number)"
#: The "source" a service commits to when its default ids met the reference ids.
_DEFAULT = "default"
_FIX = (
    "Keep your document id in the document's metadata (e.g. doc_id), or name where it"
    " is with cases.document_id (e.g. [metadata.doc_id, document.id])"
)


def id_kind(value: str) -> str:
    """:data:`GENERATED`, :data:`FILE` or :data:`NAME` (any other name or number)."""
    if len(value) < 32 and "." not in value and "/" not in value and "\\" not in value:
        return NAME  # the common case, without a regular expression
    if _GENERATED.fullmatch(value) is not None:
        return GENERATED
    if _FILE.fullmatch(value) is not None:
        return FILE
    return NAME


def _chunk_of(value: str, reference: Sequence[str]) -> str | None:
    """The reference id that ``value`` extends as a chunk id does (``kb-01#3`` of
    ``kb-01``), if any."""
    for ref in reference:
        if (
            len(value) > len(ref) + 1
            and value.startswith(ref)
            and value[len(ref)] in _CHUNK_SEPARATORS
        ):
            return ref
    return None


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
    #: Set when the ids are not compared: why (the ID metrics are skipped with it).
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


def _from(docs: Sequence[Document], source: str) -> IdChoice:
    """Each document's ``source``, else its default id."""
    if source == _DEFAULT:
        return _choose(docs, [DEFAULT_SOURCES] * len(docs), fallback=True)
    return _choose(docs, [(source, *DEFAULT_SOURCES)] * len(docs), fallback=True)


#: The metadata keys of :data:`CANDIDATE_SOURCES` (all plain keys), and their sources.
_CANDIDATE_KEYS: Final = {
    s[len(_METADATA) :]: s for s in CANDIDATE_SOURCES if s.startswith(_METADATA)
}
_RANK: Final = {s: i for i, s in enumerate(CANDIDATE_SOURCES)}


def _best_source(docs: Sequence[Document], ref: set[str]) -> tuple[str | None, int]:
    """The candidate source whose distinct ids meet most reference ids (the first in
    :data:`CANDIDATE_SOURCES` on a tie), and how many; (None, 0): none meets one.
    Each document's metadata is walked once, not once per source."""
    met: dict[str, set[str]] = {}
    for doc in docs:
        for source, value in doc.ids.items():
            if value in ref and source in _RANK:
                met.setdefault(source, set()).add(value)
        metadata = doc.metadata
        if metadata:
            for key, source in _CANDIDATE_KEYS.items():
                if key in metadata:
                    found = _as_id(metadata[key])
                    if found is not None and found in ref:
                        met.setdefault(source, set()).add(found)
    if not met:
        return None, 0
    best = min(met, key=lambda s: (-len(met[s]), _RANK[s]))
    return best, len(met[best])


def _examples(values: Sequence[str | None]) -> str:
    return ", ".join(list(dict.fromkeys(v for v in values if v is not None))[:_EXAMPLES])


class _Gauge(Protocol):
    def labels(self, *values: str) -> Any: ...


@dataclass
class _ServiceWindow:
    hits: deque[bool]
    overlapping: int = 0
    retrieved: list[str] = field(default_factory=list)
    reference: list[str] = field(default_factory=list)
    source: str | None = None
    #: How the source was chosen (said in the warning).
    how: str = ""
    warned: bool = False
    gauge: Any = None


class IdOverlapWatch:
    """Per service, whether the last ``window`` id-comparing cases had any retrieved id
    among their reference ids.  Safe to call from several threads."""

    def __init__(
        self, window: int, gauge: _Gauge | None = None, *, max_services: int = MAX_SERVICES
    ) -> None:
        self.window = window
        self.max_services = max_services
        self._gauge = gauge
        self._services: OrderedDict[str, _ServiceWindow] = OrderedDict()
        self._lock = threading.Lock()
        self._log = LazyLogger("document_ids")

    def bind(self, gauge: _Gauge) -> None:
        """Export the share of overlapping cases as ``gauge{service}``."""
        self._gauge = gauge

    def restart(self, service: str) -> None:
        """Forget the service's window: its source changed, the next cases are of it."""
        with self._lock:
            state = self._services.get(service)
            if state is not None:
                state.hits.clear()
                state.overlapping = 0
                state.warned = False

    def observe(
        self,
        service: str,
        retrieved: Sequence[str],
        reference: Sequence[str],
        source: str | None,
        how: str = "",
    ) -> None:
        """One case that compared ids: ``retrieved`` (rank order) against ``reference``,
        read from ``source`` (chosen as ``how`` says)."""
        ref = set(reference)
        hit = any(i in ref for i in retrieved)
        with self._lock:
            state = self._services.get(service)
            if state is None:
                state = self._services[service] = _ServiceWindow(deque(maxlen=self.window))
                if self._gauge is not None:
                    state.gauge = self._gauge.labels(service)
                if len(self._services) > self.max_services:
                    self._forget(*self._services.popitem(last=False))
            else:
                self._services.move_to_end(service)
            if len(state.hits) == self.window and state.hits[0]:
                state.overlapping -= 1
            state.hits.append(hit)
            state.overlapping += hit
            state.source, state.how = source, how
            if not hit:
                state.retrieved = list(dict.fromkeys(retrieved))[:_EXAMPLES]
                state.reference = list(dict.fromkeys(reference))[:_EXAMPLES]
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

    def _forget(self, service: str, state: _ServiceWindow) -> None:
        remove = getattr(self._gauge, "remove", None)
        if state.gauge is not None and remove is not None:
            try:
                remove(service)
            except KeyError:
                pass

    def shares(self) -> dict[str, float]:
        """Service -> share of its last cases whose ids overlapped the reference ids."""
        with self._lock:
            return {s: w.overlapping / len(w.hits) for s, w in self._services.items() if w.hits}

    def report(self) -> dict[str, tuple[str | None, int, int]]:
        """Service -> (source, cases in its window, of which some retrieved id was a
        reference id): what the service's source matched over its window."""
        with self._lock:
            return {
                s: (w.source, len(w.hits), w.overlapping)
                for s, w in self._services.items()
                if w.hits
            }

    def warning(self) -> str | None:
        """The warning for ``/healthz``, or None while every service has overlap."""
        with self._lock:
            parts = [self._message(s, w) for s, w in sorted(self._services.items()) if w.warned]
        return " | ".join(parts) if parts else None

    def _message(self, service: str, state: _ServiceWindow) -> str:
        how = f"; {state.how}" if state.how else ""
        read = f" (read from {state.source}{how})" if state.source else ""
        return (
            f"service {service!r}: the retrieved ids{read} met no reference id in the last"
            f" {len(state.hits)} cases with reference ids; retrieved ids e.g."
            f" {', '.join(state.retrieved) or '(none)'}; reference ids e.g."
            f" {', '.join(state.reference)}. If these are different kinds of id, name where"
            " the reference kind is in cases.document_id (e.g. [metadata.doc_id,"
            " document.id]) or in cases.retrievers[].id; if they are the same kind, the"
            " retriever is really returning none of the reference documents."
        )


@dataclass
class _Service:
    """What a service's cases showed about its ids."""

    #: The source chosen for it (:data:`_DEFAULT`: the default order); None: not yet.
    source: str | None = None
    #: Pending: per source, the cases where it met the reference ids and the default
    #: ids (of a plausible kind) did not.  At most one counter per candidate source.
    tally: dict[str, int] = field(default_factory=dict)
    #: Whether ids of another kind were logged for it.
    mismatch_logged: bool = False


class DocumentIds:
    """Chooses the ids of a case's documents (``cases.document_id``), one source per
    service, and feeds the :class:`IdOverlapWatch`.  Safe to call from several threads."""

    def __init__(
        self,
        sources: Sequence[str] | None = None,
        per_convention: Mapping[str, Sequence[str]] | None = None,
        *,
        window: int = 50,
        watch: bool = True,
        max_services: int = MAX_SERVICES,
    ) -> None:
        self._sources = tuple(sources) if sources else None
        self._per_convention = {k: tuple(v) for k, v in (per_convention or {}).items()}
        self.watch: IdOverlapWatch | None = (
            IdOverlapWatch(window, max_services=max_services) if watch else None
        )
        self.max_services = max_services
        self._services: OrderedDict[str, _Service] = OrderedDict()
        self._lock = threading.Lock()
        self._log = LazyLogger("document_ids")

    def source_of(self, service: str) -> str | None:
        """The source chosen for ``service`` (``default``: the default order), or None."""
        with self._lock:
            state = self._services.get(service)
            return None if state is None else state.source

    def _state(self, service: str) -> _Service:
        with self._lock:
            state = self._services.get(service)
            if state is None:
                state = self._services[service] = _Service()
                if len(self._services) > self.max_services:
                    self._services.popitem(last=False)
            else:
                self._services.move_to_end(service)
            return state

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
        if configured or not reference_ids or not docs:
            return _choose(docs, orders, fallback=False)
        ref = set(reference_ids)
        state = self._state(service)
        chosen = state.source
        if chosen is not None:
            choice = _from(docs, chosen)
            if any(i in ref for i in choice.ids if i is not None):
                return choice
            return self._no_overlap(service, state, docs, choice, reference_ids, soft=False)
        choice = _from(docs, _DEFAULT)
        if any(i in ref for i in choice.ids if i is not None):
            self._commit(service, state, _DEFAULT, choice.source)
            return choice
        best, best_count = _best_source(docs, ref)
        if best is None:
            return self._no_overlap(service, state, docs, choice, reference_ids, soft=True)
        used = choice.source.split(", ") if choice.source else []
        # Decisive: the default ids cannot be of the reference kind (a chunk-shaped id
        # is not enough: the first chunk's id may be the document's name), or the
        # documents disagree on the default source and this one meets the reference.
        if best in used or self._unlike(choice.ids, reference_ids, soft=False) is not None:
            self._commit(service, state, best, choice.source)
            return _from(docs, best)
        with self._lock:
            seen = state.tally[best] = state.tally.get(best, 0) + 1
        if seen >= SWITCH_AFTER:
            self._commit(service, state, best, choice.source)
            return _from(docs, best)
        mismatch = (
            f"not compared yet: service {service!r} has not shown which of its ids the"
            f" reference ids are. Read from {choice.source}, the retrieved ids"
            f" ({_examples(choice.ids)}) meet none of the reference ids"
            f" ({_examples(reference_ids)}); read from {best}, they meet"
            f" {best_count}. {best} is chosen for the service after {SWITCH_AFTER} such"
            f" cases ({seen} so far), {choice.source} as soon as its ids meet a reference"
            " id; set cases.document_id to choose now"
        )
        return IdChoice(choice.ids, choice.source, mismatch)

    def _commit(self, service: str, state: _Service, source: str, default: str | None) -> None:
        with self._lock:
            if state.source is not None:
                return
            state.source = source
            state.tally.clear()
        if self.watch is not None:
            self.watch.restart(service)
        if source == _DEFAULT:
            self._log.info("document_id_source_chosen", service=service, source=default)
            return
        self._log.warning(
            "document_id_source_switched",
            service=service,
            source=source,
            default=default,
            detail=f"the retrieved ids read from {default} match no reference id and"
            f" those of {source} do: {source} is compared for every case of this service"
            " (set cases.document_id to choose yourself)",
        )

    def how(self, service: str) -> str:
        """How the service's source was chosen, for the overlap warning."""
        if self._sources is not None or self._per_convention:
            return "as cases.document_id says"
        source = self.source_of(service)
        if source is None:
            return "the default (no case has shown another yet)"
        if source == _DEFAULT:
            return "the default, chosen from the service's cases"
        return "chosen from the service's cases"

    @staticmethod
    def _unlike(ids: Sequence[str | None], reference: Sequence[str], *, soft: bool) -> str | None:
        """Why ``ids`` (none of which is a reference id) cannot be of the reference
        ids' kind: their kind(s) and examples; None when they may be."""
        values = [i for i in ids if i is not None][:_KIND_SAMPLE]
        if not values:
            return "no ids"
        ref_kinds = {id_kind(r) for r in reference[:_KIND_SAMPLE]}
        kinds = [id_kind(v) for v in values]
        if not ref_kinds.intersection(kinds):
            order = [k for k in (GENERATED, FILE, NAME) if k in kinds]
            return " and ".join(order)
        if soft:
            chunks = [v for v in values if _chunk_of(v, reference) is not None]
            if chunks and len(chunks) * 2 >= len(values):
                return CHUNK
        return None

    def _no_overlap(
        self,
        service: str,
        state: _Service,
        docs: Sequence[Document],
        choice: IdChoice,
        reference_ids: Sequence[str],
        *,
        soft: bool,
    ) -> IdChoice:
        """No retrieved id is a reference id.  Ids of the reference ids' kind are
        compared (a true 0); ids of another kind are not: another source holding the
        reference ids' kind is, if the documents have one, else the ID metrics are
        skipped with a reason naming both kinds (never a 0 from comparing a UUID or a
        file name with a document name)."""
        kind = self._unlike(choice.ids, reference_ids, soft=soft)
        if kind is None or kind == "no ids":
            return choice
        tried = []
        for source in CANDIDATE_SOURCES:
            values = [_value(d, source) for d in docs]
            found = self._unlike(values, reference_ids, soft=soft)
            if found is None and any(v is not None for v in values):
                return _from(docs, source)
            tried.append((source, values, found))
        held = [
            f"{source} holds {found} ({_examples(values)})"
            for source, values, found in tried
            if found not in (None, "no ids")
        ]
        if not held:  # the kinds differ between documents, not between sources
            held.append(f"{choice.source} holds {kind} ({_examples(choice.ids)})")
        ref_kind = " and ".join(sorted({id_kind(r) for r in reference_ids[:_KIND_SAMPLE]}))
        mismatch = (
            f"retrieved ids of another kind than the reference ids"
            f" ({_examples(reference_ids)}: {ref_kind}): {'; '.join(held)}; not compared."
            f" {_FIX}"
        )
        with self._lock:
            logged, state.mismatch_logged = state.mismatch_logged, True
        if not logged:
            self._log.warning("document_ids_not_comparable", service=service, detail=mismatch)
        return IdChoice(choice.ids, choice.source, mismatch)

    def observe(
        self, service: str, retrieved: Sequence[str], reference: Sequence[str], source: str | None
    ) -> None:
        if self.watch is not None:
            self.watch.observe(service, retrieved, reference, source, self.how(service))

    def warning(self) -> str | None:
        return self.watch.warning() if self.watch is not None else None
