"""Duck-typed document extraction, and how documents land on retriever spans."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import ragtrace
from ragtrace import semconv
from ragtrace._config import RUNTIME
from ragtrace._documents import (
    MAX_DOCUMENTS,
    DocumentRecord,
    extract_document,
    iter_documents,
    put_documents,
)

from .conftest import Recorder

# Look-alikes of framework types: same attribute shapes, no framework import.


class LangChainDocument:
    def __init__(self, page_content: str, metadata: dict[str, Any], id: str | None = None):
        self.page_content = page_content
        self.metadata = metadata
        self.id = id


class LlamaTextNode:
    def __init__(self, node_id: str, text: str, metadata: dict[str, Any]):
        self.node_id = node_id
        self.id_ = node_id
        self._text = text
        self.metadata = metadata

    def get_content(self) -> str:
        return self._text


class NodeWithScore:
    def __init__(self, node: LlamaTextNode, score: float | None):
        self.node = node
        self.score = score


class Passage(BaseModel):
    doc_id: str
    text: str
    relevance_score: float
    meta: dict[str, str] = {}


@dataclass
class HaystackDocument:
    content: str
    id: str
    score: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class Float32:
    """A numpy-like scalar: not a float, but converts to one."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        return self.value


class Opaque:
    pass


class Titled:
    def __str__(self) -> str:
        return "titled object"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("plain text", DocumentRecord(None, "plain text", None, None)),
        (
            {"id": 7, "content": "c", "score": 0.5, "metadata": {"k": "v"}},
            DocumentRecord("7", "c", 0.5, {"k": "v"}),
        ),
        ({"doc_id": "a", "text": "t"}, DocumentRecord("a", "t", None, None)),
        (
            {"_id": "mongo", "page_content": "p", "_score": 3},
            DocumentRecord("mongo", "p", 3.0, None),
        ),
        (
            {"content": "c", "meta": {"document_id": "from-meta"}},
            DocumentRecord("from-meta", "c", None, {"document_id": "from-meta"}),
        ),
        (
            {"document": {"id": "inner", "text": "nested"}, "score": 0.8},
            DocumentRecord("inner", "nested", 0.8, None),
        ),
        (
            LangChainDocument("lc text", {"source": "a.md"}, id="lc-1"),
            DocumentRecord("lc-1", "lc text", None, {"source": "a.md"}),
        ),
        (
            LangChainDocument("lc text", {"source": "a.md", "doc_id": "m-9"}),
            DocumentRecord("m-9", "lc text", None, {"source": "a.md", "doc_id": "m-9"}),
        ),
        (
            LangChainDocument("no id anywhere", {"source": "b.md"}),
            DocumentRecord(None, "no id anywhere", None, {"source": "b.md"}),
        ),
        (
            NodeWithScore(LlamaTextNode("n-1", "node text", {"file": "x"}), 0.42),
            DocumentRecord("n-1", "node text", 0.42, {"file": "x"}),
        ),
        (
            LlamaTextNode("n-2", "bare node", {}),
            DocumentRecord("n-2", "bare node", None, {}),
        ),
        (
            Passage(doc_id="p-1", text="pydantic", relevance_score=0.7, meta={"lang": "en"}),
            DocumentRecord("p-1", "pydantic", 0.7, {"lang": "en"}),
        ),
        (
            HaystackDocument(content="hay", id="h-1", score=0.1),
            DocumentRecord("h-1", "hay", 0.1, {}),
        ),
        (("tuple text", 0.3), DocumentRecord(None, "tuple text", 0.3, None)),
        (({"id": "t", "text": "x", "score": 0.1}, 0.9), DocumentRecord("t", "x", 0.9, None)),
        (("numpy score", Float32(0.25)), DocumentRecord(None, "numpy score", 0.25, None)),
        (Titled(), DocumentRecord(None, "titled object", None, None)),
        (
            {"score": True, "text": "bool is not a score"},
            DocumentRecord(None, "bool is not a score", None, None),
        ),
    ],
)
def test_extract_document_shapes(doc: Any, expected: DocumentRecord) -> None:
    assert extract_document(doc) == expected


def test_opaque_object_gets_no_content_and_no_invented_id() -> None:
    record = extract_document(Opaque())
    assert record.id is None
    assert record.content is None


def test_iter_documents_containers() -> None:
    docs = ["a", "b"]
    assert iter_documents(docs) is docs
    assert iter_documents(None) is None
    assert iter_documents("single") == ("single",)
    assert iter_documents({"documents": docs, "total": 2}) is docs
    assert iter_documents({"hits": docs}) is docs
    assert iter_documents({"id": "x", "text": "one doc"}) == ({"id": "x", "text": "one doc"},)

    class Response:
        source_nodes = docs

    assert iter_documents(Response()) is docs
    # iterators belong to the caller: never consumed
    it = iter(docs)
    assert iter_documents(it) is None
    assert next(it) == "a"


def test_documents_on_span_without_invented_ids(recorder: Recorder) -> None:
    @ragtrace.retriever
    def search(query: str) -> list[Any]:
        return [
            LangChainDocument("first", {"source": "a.md"}),
            NodeWithScore(LlamaTextNode("node-7", "second", {"page": 2}), 0.5),
            ("third", 0.25),
        ]

    search("q")
    attrs = recorder.attrs("search")
    assert attrs[semconv.RETRIEVAL_DOCUMENT_COUNT] == 3
    ids = {k: v for k, v in attrs.items() if k.endswith(".document.id")}
    assert ids == {"retrieval.documents.1.document.id": "node-7"}
    assert attrs["retrieval.documents.0.document.content"] == "first"
    assert json.loads(attrs["retrieval.documents.0.document.metadata"]) == {"source": "a.md"}
    assert json.loads(attrs["retrieval.documents.1.document.metadata"]) == {"page": 2}
    assert attrs["retrieval.documents.1.document.score"] == 0.5
    assert attrs["retrieval.documents.2.document.score"] == 0.25
    assert "retrieval.documents.2.document.metadata" not in attrs


def test_retriever_output_callable_and_wrapped_result(recorder: Recorder) -> None:
    @ragtrace.retriever(output=lambda result: result["payload"]["items"])
    def search(query: str) -> dict[str, Any]:
        return {"payload": {"items": [{"id": "i1", "body": "from body"}]}}

    search("q")
    attrs = recorder.attrs("search")
    assert attrs["retrieval.documents.0.document.id"] == "i1"
    assert attrs["retrieval.documents.0.document.content"] == "from body"


def test_document_cap_keeps_count(recorder: Recorder) -> None:
    @ragtrace.retriever
    def search(query: str) -> list[str]:
        return [f"doc {i}" for i in range(MAX_DOCUMENTS + 20)]

    search("q")
    attrs = recorder.attrs("search")
    assert attrs[semconv.RETRIEVAL_DOCUMENT_COUNT] == MAX_DOCUMENTS + 20
    assert f"retrieval.documents.{MAX_DOCUMENTS - 1}.document.content" in attrs
    assert f"retrieval.documents.{MAX_DOCUMENTS}.document.content" not in attrs


def test_non_text_content_is_json() -> None:
    attrs: dict[str, Any] = {}
    put_documents(attrs, semconv.RETRIEVAL_DOCUMENTS, [{"content": {"a": 1}}], RUNTIME.settings)
    assert attrs["retrieval.documents.0.document.content"] == '{"a": 1}'


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["id", "text", "content", "score", "metadata", "document", "x"]),
            children,
            max_size=5,
        )
        | st.tuples(children, children)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=_json_values)
def test_any_return_value_is_safe(value: Any) -> None:
    """Whatever a retriever returns, recording it never raises and never changes it."""
    attrs: dict[str, Any] = {}
    docs = iter_documents(value)
    if docs is not None:
        count = put_documents(attrs, semconv.RETRIEVAL_DOCUMENTS, docs, RUNTIME.settings)
        assert count == len(docs)
    for key, item in attrs.items():
        assert key.startswith("retrieval.documents.")
        assert isinstance(item, (str, float, bool))
