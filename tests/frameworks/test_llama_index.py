"""Supported matrix: LlamaIndex (a VectorStoreIndex query engine) with the OpenInference
and the OpenLLMetry instrumentors, exported to a real collector with no config.

Every app embeds with the corpus's keyword vectors (:func:`_matrix.keyword_vector`), so
the query engine's top 2 for "What is the capital of France?" is kb_paris, kb_berlin
(cosine 2/√10 and 1/√6, the others 0): id_context_recall 1/1 = 1.0, id_context_precision
1/2 = 0.5 when the collector compares the user's ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.fakes.otlp_sink import OtlpSink
from tests.frameworks._matrix import (
    KB,
    QUESTIONS,
    TOP_2,
    Retrieved,
    assert_ids_scored,
    assert_ids_skipped,
    assert_text_metrics_scored,
    keyword_vector,
    matrix_collector,
    only_case,
    provider,
    wait_scored,
)

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

QUESTION = QUESTIONS[0]


@pytest.fixture
def llama_settings(offline_caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keyword embeddings, a MockLLM and a whitespace tokenizer (no download), for this
    test only (LlamaIndex's global Settings restored after it)."""
    from llama_index.core import Settings
    from llama_index.core.embeddings import BaseEmbedding
    from llama_index.core.llms import MockLLM

    class KeywordEmbedding(BaseEmbedding):
        def _get_query_embedding(self, query: str) -> list[float]:
            return keyword_vector(query)

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return keyword_vector(query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return keyword_vector(text)

    import llama_index.core

    monkeypatch.setattr(llama_index.core, "global_tokenizer", str.split)
    monkeypatch.setattr(Settings, "_tokenizer", str.split)
    monkeypatch.setattr(Settings, "_embed_model", KeywordEmbedding(model_name="keywords"))
    monkeypatch.setattr(Settings, "_llm", MockLLM(max_tokens=12))


def _index(kind: str) -> Any:
    """The corpus indexed as nodes with the user's ids (``nodes``), or as Documents
    split into nodes by a SentenceSplitter: ids in ``Document.metadata`` too
    (``documents+metadata``) or only as ``Document(doc_id=...)`` (``documents``)."""
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.schema import TextNode

    if kind == "nodes":
        return VectorStoreIndex([TextNode(id_=i, text=t) for i, t in KB.items()])
    with_metadata = kind == "documents+metadata"
    docs = [
        Document(text=t, doc_id=i, metadata={"doc_id": i} if with_metadata else {})
        for i, t in KB.items()
    ]
    splitter = SentenceSplitter(chunk_size=128, chunk_overlap=0)
    return VectorStoreIndex.from_documents(docs, transformations=[splitter])


def _query(index: Any) -> tuple[Retrieved, list[str]]:
    """Ask the question; what the app saw (ids: the source documents' ids) and the
    node ids LlamaIndex generated."""
    response = index.as_query_engine(similarity_top_k=2).query(QUESTION)
    nodes = [n.node for n in response.source_nodes]
    doc_ids = [n.ref_doc_id or n.node_id for n in nodes]
    assert doc_ids == TOP_2[QUESTION]  # the hand-computed ranking
    got = Retrieved(doc_ids, [n.get_content() for n in nodes], str(response))
    return got, [n.node_id for n in nodes]


@pytest.fixture
def openinference() -> Iterator[Any]:
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    instrumentor = LlamaIndexInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def openllmetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("TRACELOOP_TRACE_CONTENT", "true")
    from llama_index.core.instrumentation import get_dispatcher
    from opentelemetry.instrumentation.llamaindex import LlamaIndexInstrumentor

    dispatcher = get_dispatcher()
    span_handlers, event_handlers = list(dispatcher.span_handlers), list(dispatcher.event_handlers)
    instrumentor = LlamaIndexInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()
    # Its uninstrument() leaves its handlers on LlamaIndex's root dispatcher: a second
    # instrument() in this process would add a second pair, the two would attach and
    # detach the OTel context in turn, and a span would stay current (the next test's
    # spans joining this trace).  Remove them.
    dispatcher.span_handlers[:] = span_handlers
    dispatcher.event_handlers[:] = event_handlers


def _run(
    sink: OtlpSink, tmp_path: Path, instrumentor: Any, kind: str, service: str, **sections: Any
) -> tuple[Any, Retrieved, list[str]]:
    """Index (not traced), then one traced query through a real collector; the case
    span, what the app saw and the node ids LlamaIndex generated."""
    with matrix_collector(sink, tmp_path, **sections) as serve:
        index = _index(kind)
        tp = provider(serve, service)
        instrumentor.instrument(tracer_provider=tp)
        got, node_ids = _query(index)
        tp.shutdown()
        spans = wait_scored(sink, 1)
    return only_case(spans), got, node_ids


# ------------------------------------------------------------------ OpenInference
def test_openinference_ids_on_nodes(
    sink: OtlpSink, tmp_path: Path, llama_settings: None, openinference: Any
) -> None:
    """``TextNode(id_="kb_paris")``: document.id is the user's id."""
    root, got, _ = _run(sink, tmp_path, openinference, "nodes", "li-oi-nodes")
    assert root.span.name == "RetrieverQueryEngine.query"
    assert root.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)


def test_openinference_ids_on_documents_through_a_splitter(
    sink: OtlpSink, tmp_path: Path, llama_settings: None, openinference: Any
) -> None:
    """``Document(doc_id=..., metadata={"doc_id": ...})`` split into nodes: the
    instrumentor writes the generated node UUIDs as document.id and the metadata; the
    collector compares the metadata's doc_id (the reference ids' kind) and says so."""
    root, got, node_ids = _run(sink, tmp_path, openinference, "documents+metadata", "li-oi-docs")
    assert not set(node_ids) & set(KB)  # LlamaIndex generated the node ids
    assert root.span.name == "RetrieverQueryEngine.query"
    assert_ids_scored(root)
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "metadata.doc_id"
    assert_text_metrics_scored(root, QUESTION, got)


def test_openinference_document_ids_not_recorded(
    sink: OtlpSink, tmp_path: Path, llama_settings: None, openinference: Any
) -> None:
    """``Document(doc_id=...)`` with no metadata: the instrumentor records only the
    generated node UUIDs (never the node's ref_doc_id), so no id of the reference ids'
    kind reaches the collector.  The id metrics are skipped, never a 0: the reason says
    what was compared and what to do (an id in the metadata, or cases.document_id)."""
    root, got, node_ids = _run(sink, tmp_path, openinference, "documents", "li-oi-uuids")
    assert not set(node_ids) & set(KB)
    assert_ids_skipped(root, "ids the framework generated")
    reason = root.attributes[semconv.eval_attr("id_context_recall", semconv.EVAL_FIELD_REASON)]
    assert node_ids[0] in reason
    assert "cases.document_id" in reason
    assert_text_metrics_scored(root, QUESTION, got)


# ------------------------------------------------------------------ OpenLLMetry
def test_openllmetry_ids_on_nodes(
    sink: OtlpSink, tmp_path: Path, llama_settings: None, openllmetry: Any
) -> None:
    """OpenLLMetry's retriever is a plain ``task`` span (``VectorIndexRetriever.task``)
    whose output is the nodes as JSON strings; the case is the ``workflow`` root."""
    root, got, _ = _run(sink, tmp_path, openllmetry, "nodes", "li-tl-nodes")
    assert root.span.name == "RetrieverQueryEngine.workflow"
    assert root.attributes[semconv.TRACELOOP_SPAN_KIND] == "workflow"
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)


def test_openllmetry_ids_on_documents_through_a_splitter(
    sink: OtlpSink, tmp_path: Path, llama_settings: None, openllmetry: Any
) -> None:
    """Documents split into nodes, ids in the metadata: compared by metadata.doc_id."""
    root, got, _ = _run(sink, tmp_path, openllmetry, "documents+metadata", "li-tl-docs")
    assert root.span.name == "RetrieverQueryEngine.workflow"
    assert_ids_scored(root)
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "metadata.doc_id"
    assert_text_metrics_scored(root, QUESTION, got)


def test_openllmetry_document_ids_from_the_source_relationship(
    sink: OtlpSink, tmp_path: Path, llama_settings: None, openllmetry: Any
) -> None:
    """``Document(doc_id=...)`` with no metadata: OpenLLMetry's node JSON keeps the
    node's SOURCE relationship, whose node_id is the Document's doc_id: compared."""
    root, got, node_ids = _run(sink, tmp_path, openllmetry, "documents", "li-tl-refdoc")
    assert not set(node_ids) & set(KB)
    assert_ids_scored(root)
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "metadata.ref_doc_id"
    assert_text_metrics_scored(root, QUESTION, got)
