"""Duck-typed documents: whatever a retriever returns becomes (id, content, score, metadata).

Recognised shapes (no framework is imported):

* ``str``: the content.
* mappings: id from ``id``/``doc_id``/``document_id``/``_id``/``node_id``/``chunk_id``;
  content from ``content``/``text``/``page_content``/``chunk``/``body``/``passage``;
  score from ``score``/``relevance_score``/``similarity``/``_score``/``rerank_score``;
  metadata from ``metadata``/``meta``.  A wrapper such as ``{"document": {...},
  "score": 0.8}`` (keys ``document``/``doc``/``node``) is unwrapped.
* LlamaIndex ``NodeWithScore`` (``.node.get_content()``, ``.node.node_id``, ``.score``,
  ``.node.metadata``) and bare nodes (``get_content()`` + ``node_id``).
* Any other object, read by attribute with the same names as for mappings: LangChain
  ``Document`` (``page_content``, ``metadata``, ``id``), pydantic models, dataclasses,
  Haystack documents, plain classes.
* ``(doc, score)`` pairs: the pair's score wins over the document's own.

Ids are the document's own (its id field, or an id key in its metadata).  When a
document has none, no id is recorded: ragtrace never invents ids that look real.

The container itself may be a list/tuple, a mapping holding the list under
``documents``/``docs``/``nodes``/``source_nodes``/``results``/``hits``/``matches``/
``contexts``, or an object with ``source_nodes`` (a LlamaIndex response).  Iterators are
not consumed (that would take them from the caller).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from ragtrace import semconv
from ragtrace._capture import json_text, process_text
from ragtrace._config import Settings
from ragtrace._safety import report

__all__ = ["MAX_DOCUMENTS", "DocumentRecord", "extract_document", "iter_documents", "put_documents"]

#: Documents recorded per list (the count attribute still tells the full number).
MAX_DOCUMENTS = 100

_ID_KEYS = ("id", "doc_id", "document_id", "_id", "node_id", "chunk_id")
_CONTENT_KEYS = ("content", "text", "page_content", "chunk", "body", "passage")
_SCORE_KEYS = ("score", "relevance_score", "similarity", "_score", "rerank_score")
_METADATA_KEYS = ("metadata", "meta")
_NESTED_KEYS = ("document", "doc", "node")
_LIST_KEYS = (
    "documents",
    "docs",
    "nodes",
    "source_nodes",
    "results",
    "hits",
    "matches",
    "contexts",
)


class DocumentRecord(NamedTuple):
    """One document as ragtrace records it; ``content`` is raw (serialised later)."""

    id: str | None
    content: Any
    score: float | None
    metadata: Any


_EMPTY = DocumentRecord(None, None, None, None)


def _as_id(value: Any) -> str | None:
    if value is None:
        return None
    text = value if type(value) is str else str(value)
    return text or None


def _as_score(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if type(value) is float:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _metadata_id(metadata: Any) -> str | None:
    if isinstance(metadata, Mapping):
        for key in _ID_KEYS:
            value = metadata.get(key)
            if value is not None and value != "":
                return _as_id(value)
    return None


def _metadata_score(metadata: Any) -> float | None:
    """A reranker's score kept in metadata (LangChain's Cohere and FlashRank rerankers
    write ``metadata["relevance_score"]``)."""
    if isinstance(metadata, Mapping):
        for key in _SCORE_KEYS:
            value = metadata.get(key)
            if value is not None:
                return _as_score(value)
    return None


def _record(doc_id: Any, content: Any, score: Any, metadata: Any) -> DocumentRecord:
    """The record, with the id and score taken from metadata when the document has none
    (an empty ``id=""``, as LangChain's ``Document`` defaults to, counts as none)."""
    resolved_id = (doc_id if type(doc_id) is str else _as_id(doc_id)) or _metadata_id(metadata)
    if type(score) is not float:
        score = _as_score(score) if score is not None else _metadata_score(metadata)
    return DocumentRecord(resolved_id, content, score, metadata)


def _from_str(doc: Any) -> DocumentRecord:
    return DocumentRecord(None, doc, None, None)


def _first(get: Any, keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` that is present and not None."""
    for key in keys:
        value = get(key)
        if value is not None:
            return value
    return None


def _from_mapping(doc: Any) -> DocumentRecord:
    get = doc.get
    doc_id = _first(get, _ID_KEYS)
    content = _first(get, _CONTENT_KEYS)
    score = _first(get, _SCORE_KEYS)
    metadata = get("metadata")
    if metadata is None:
        metadata = get("meta")
    if content is None:
        for key in _NESTED_KEYS:
            nested = get(key)
            if nested is not None and not isinstance(nested, (str, list, tuple)):
                inner = extract_document(nested)
                return DocumentRecord(
                    _as_id(doc_id) if doc_id is not None else inner.id,
                    inner.content,
                    _as_score(score) if score is not None else inner.score,
                    metadata if metadata is not None else inner.metadata,
                )
            if isinstance(nested, str):
                content = nested
                break
    return _record(doc_id, content, score, metadata)


def _first_attr(doc: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = getattr(doc, name, None)
        if value is not None:
            return value
    return None


def _from_attributes(doc: Any) -> DocumentRecord:
    doc_id = _first_attr(doc, _ID_KEYS)
    content = _first_attr(doc, _CONTENT_KEYS)
    score = _first_attr(doc, _SCORE_KEYS)
    metadata = _first_attr(doc, _METADATA_KEYS)
    if content is None and doc_id is None and score is None:
        # Not a document-like object: use its text if its type defines one.
        cls: Any = type(doc)
        if cls.__str__ is not object.__str__:
            content = str(doc)
        elif cls.__repr__ is not object.__repr__:
            content = repr(doc)
    return _record(doc_id, content, score, metadata)


def _from_llama_node(doc: Any, score_holder: Any = None) -> DocumentRecord:
    doc_id = getattr(doc, "node_id", None)
    if doc_id is None:
        doc_id = getattr(doc, "id_", None)
    holder = doc if score_holder is None else score_holder
    return _record(
        doc_id, doc.get_content(), getattr(holder, "score", None), getattr(doc, "metadata", None)
    )


def _from_node_with_score(doc: Any) -> DocumentRecord:
    node = doc.node
    if not callable(getattr(node, "get_content", None)):
        return _from_attributes(doc)
    return _from_llama_node(node, doc)


def _is_score(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    # numpy and other numeric scalars
    return hasattr(value, "__float__") and not isinstance(value, (str, bytes))


def _from_sequence(doc: Any) -> DocumentRecord:
    if len(doc) == 2 and _is_score(doc[1]):
        inner = extract_document(doc[0])
        return DocumentRecord(inner.id, inner.content, _as_score(doc[1]), inner.metadata)
    return DocumentRecord(None, doc, None, None)


def _choose(doc: Any) -> Callable[[Any], DocumentRecord]:
    if isinstance(doc, str):
        return _from_str
    if isinstance(doc, Mapping):
        return _from_mapping
    if isinstance(doc, (tuple, list)):
        return _from_sequence
    if callable(getattr(getattr(doc, "node", None), "get_content", None)):
        return _from_node_with_score
    if callable(getattr(doc, "get_content", None)) and (
        hasattr(doc, "node_id") or hasattr(doc, "id_")
    ):
        return _from_llama_node
    return _from_attributes


_EXTRACTORS: dict[type, Callable[[Any], DocumentRecord]] = {
    str: _from_str,
    dict: _from_mapping,
    tuple: _from_sequence,
    list: _from_sequence,
}
_MAX_CACHED_TYPES = 512


def extract_document(doc: Any) -> DocumentRecord:
    """One document as a record.  May raise (the caller reports it)."""
    if doc is None:
        return _EMPTY
    cls = type(doc)
    extractor = _EXTRACTORS.get(cls)
    if extractor is None:
        extractor = _choose(doc)
        if len(_EXTRACTORS) < _MAX_CACHED_TYPES:
            _EXTRACTORS[cls] = extractor
    return extractor(doc)


def iter_documents(value: Any) -> Sequence[Any] | None:
    """The documents held by a retriever's return value, or None if it holds none we may
    read (None, an iterator)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Mapping):
        for key in _LIST_KEYS:
            held = value.get(key)
            if isinstance(held, (list, tuple)):
                return held
        return (value,)
    if isinstance(value, (Iterator, AsyncIterator)):
        return None
    source_nodes = getattr(value, "source_nodes", None)
    if isinstance(source_nodes, (list, tuple)):
        return source_nodes
    if isinstance(value, Sequence):
        return value
    if isinstance(value, (set, frozenset)):
        return tuple(value)
    return (value,)


# ------------------------------------------------------------------ attributes

_Keys = tuple[str, str, str, str]
_KEYS: dict[str, list[_Keys]] = {}
_KEYS_LOCK = threading.Lock()


def _keys_for(prefix: str, count: int) -> list[_Keys]:
    """``<prefix>.N.document.{id,content,score,metadata}`` for N < count, cached."""
    keys = _KEYS.get(prefix)
    if keys is not None and len(keys) >= count:
        return keys
    with _KEYS_LOCK:
        keys = _KEYS.get(prefix, [])
        if len(keys) < count:
            keys = keys + [
                (
                    f"{prefix}.{i}.{semconv.DOCUMENT_ID}",
                    f"{prefix}.{i}.{semconv.DOCUMENT_CONTENT}",
                    f"{prefix}.{i}.{semconv.DOCUMENT_SCORE}",
                    f"{prefix}.{i}.{semconv.DOCUMENT_METADATA}",
                )
                for i in range(len(keys), max(count, 16))
            ]
            _KEYS[prefix] = keys
        return keys


for _prefix in (
    semconv.RETRIEVAL_DOCUMENTS,
    semconv.RERANKER_INPUT_DOCUMENTS,
    semconv.RERANKER_OUTPUT_DOCUMENTS,
):
    _keys_for(_prefix, 32)


def put_documents(
    attrs: dict[str, Any], prefix: str, docs: Sequence[Any], settings: Settings
) -> int:
    """Record up to :data:`MAX_DOCUMENTS` documents under ``prefix``; returns the count
    of documents in ``docs``.  A document that cannot be read is reported and skipped
    (its index stays empty); never raises for a bad document."""
    total = len(docs)
    count = total if total <= MAX_DOCUMENTS else MAX_DOCUMENTS
    keys = _keys_for(prefix, count)
    capture = settings.capture_content
    limit = settings.max_content_chars
    plain = settings.redact is None
    for index in range(count):
        try:
            doc = docs[index]
            record = _from_mapping(doc) if type(doc) is dict else extract_document(doc)
            key_id, key_content, key_score, key_metadata = keys[index]
            if record.id is not None:
                attrs[key_id] = record.id
            if record.score is not None:
                attrs[key_score] = record.score
            if not capture:
                continue
            content = record.content
            if content is not None:
                text = content if type(content) is str else _content_text(content)
                if not plain or (limit and len(text) > limit):
                    text = process_text(text, settings, attrs)
                attrs[key_content] = text
            metadata = record.metadata
            if metadata:
                text = json_text(metadata)
                if not plain or (limit and len(text) > limit):
                    text = process_text(text, settings, attrs)
                attrs[key_metadata] = text
        except Exception as exc:
            report("reading a document", exc)
    return total


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return str(content)
    return json_text(content)
