"""Apps instrumented by others, scored with no code change: the real instrumentors
(OpenInference for LangChain and LlamaIndex, OpenLLMetry for LangChain) and spans
built to the OTel GenAI conventions, exported over OTLP/HTTP to a real
``ragtrace-collector serve`` process, whose output reaches an OTLP sink.

Each test checks the case span (the root chain, query engine, agent or workflow span)
for exact ID and string scores with ground truth from the reference store, and a
referenceless score, each equal to what the metric gives offline on the case the app
itself saw; and that no other span was scored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.e2e._instrumented import (
    CASE_METRICS,
    KB,
    QUESTION,
    Retrieved,
    assert_case_scored,
    collector,
    conversation_scores,
    provider,
)
from tests.e2e._support import flat
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CASE_METRIC_CONFIG: dict[str, dict[str, Any]] = {name: {} for name in CASE_METRICS}


def _scored(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if any(k.startswith(semconv.EVAL_PREFIX + ".") for k in s.attributes)]


def _tops(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The spans whose parent is not among ``spans``, in start order (the roots; an
    instrumentor's leftover context from an earlier test may give them a parent that
    went elsewhere)."""
    ids = {s.span.span_id for s in spans}
    tops = [s for s in spans if s.span.parent_span_id not in ids]
    return sorted(tops, key=lambda s: s.span.start_time_unix_nano)


def _wait_scored(sink: OtlpSink, count: int, timeout: float = 60.0) -> list[ReceivedSpan]:
    sink.wait_until(lambda: len(_scored(sink.spans)) >= count, timeout)
    return sink.spans


# ------------------------------------------------------------------ LangChain
def _langchain_app(
    ids_in_metadata: bool,
) -> tuple[Any, dict[str, Retrieved], dict[str, list[Any]]]:
    """A RunnableSequence: retriever (in-memory documents) -> prompt -> FakeListLLM.
    Returns the chain, what the app saw per question, and the retriever's results."""
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import PromptTemplate
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnablePassthrough

    documents = [
        Document(
            id=doc_id,
            page_content=text,
            metadata={"source": "kb", **({"id": doc_id} if ids_in_metadata else {})},
        )
        for doc_id, text in KB.items()
    ]
    seen: dict[str, list[Any]] = {}

    class KeywordRetriever(BaseRetriever):
        docs: list[Document]

        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            words = {w.strip("?.,").lower() for w in query.split() if len(w) > 3}
            ranked = sorted(
                self.docs,
                key=lambda d: -sum(w in d.page_content.lower() for w in words),
            )
            seen[query] = ranked[:3]
            return ranked[:3]

    answers = ["Paris is the capital of France.", "It was completed in 1889.", "Yes, the Louvre."]
    chain = (
        {
            "context": KeywordRetriever(docs=documents)
            | (lambda docs: "\n".join(d.page_content for d in docs)),
            "question": RunnablePassthrough(),
        }
        | PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
        | FakeListLLM(responses=answers)
        | StrOutputParser()
    )
    return chain, {}, seen


def _run_chain(chain: Any, seen: dict[str, list[Any]], question: str) -> Retrieved:
    answer = chain.invoke(question)
    docs = seen[question]
    return Retrieved([d.id for d in docs], [d.page_content for d in docs], answer)


@pytest.fixture
def openinference_langchain() -> Iterator[Any]:
    from openinference.instrumentation.langchain import LangChainInstrumentor

    instrumentor = LangChainInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


def test_openinference_langchain(
    sink: OtlpSink, tmp_path: Path, openinference_langchain: Any
) -> None:
    with collector(sink, tmp_path, CASE_METRIC_CONFIG) as serve:
        tp = provider(serve, "lc-app")
        openinference_langchain.instrument(tracer_provider=tp)
        chain, _, seen = _langchain_app(ids_in_metadata=False)
        got = _run_chain(chain, seen, QUESTION)
        tp.shutdown()
        spans = _wait_scored(sink, 1)
    roots = _tops(spans)
    assert len(roots) == 1
    assert roots[0].span.name == "RunnableSequence"
    assert roots[0].attributes[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    # The instrumentor records no document.id: the ids came from output.value.
    [retriever] = [s for s in spans if s.attributes.get("openinference.span.kind") == "RETRIEVER"]
    assert not any(k.endswith(".document.id") for k in retriever.attributes)
    assert _scored(spans) == roots
    assert_case_scored(roots[0], got)


# ------------------------------------------------------------------ OpenLLMetry
@pytest.fixture
def openllmetry_langchain(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("TRACELOOP_TRACE_CONTENT", "true")
    from langchain_core.callbacks import BaseCallbackManager
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor
    from opentelemetry.instrumentation.utils import unwrap

    instrumentor = LangchainInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()
    # Its uninstrument() misses its own wrapper (it unwraps the attribute
    # "BaseCallbackManager.__init__" of the module langchain_core.callbacks, which does
    # not exist), so every later LangChain run in this process would still get its
    # handler: spans parented to its spans, which a shut-down provider never exports,
    # and traces the collector must wait out.  Unwrap it where it is.
    unwrap(BaseCallbackManager, "__init__")
    assert not hasattr(BaseCallbackManager.__init__, "__wrapped__")


def test_openllmetry_langchain(sink: OtlpSink, tmp_path: Path, openllmetry_langchain: Any) -> None:
    """OpenLLMetry's LangChain instrumentation drops ``Document.id`` from its retriever
    output, so this app keeps its ids in the metadata too (as many do); the ids are
    read from there with the SDK's id keys."""
    with collector(sink, tmp_path, CASE_METRIC_CONFIG) as serve:
        tp = provider(serve, "lc-traceloop-app")
        openllmetry_langchain.instrument(tracer_provider=tp)
        chain, _, seen = _langchain_app(ids_in_metadata=True)
        got = _run_chain(chain, seen, QUESTION)
        tp.shutdown()
        spans = _wait_scored(sink, 1)
    roots = _tops(spans)
    assert len(roots) == 1
    assert roots[0].attributes[semconv.TRACELOOP_SPAN_KIND] == "workflow"
    assert _scored(spans) == roots
    assert_case_scored(roots[0], got)


# ------------------------------------------------------------------ LlamaIndex
@pytest.fixture
def llama_index_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """LlamaIndex with no network: mock embedding and LLM, a whitespace tokenizer
    (no tiktoken download), caches in the test's tmp dir."""
    monkeypatch.setenv("LLAMA_INDEX_CACHE_DIR", str(tmp_path / "llama_cache"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken_cache"))
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk_data"))
    from llama_index.core import Settings
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import MockLLM
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    Settings.tokenizer = str.split
    Settings.embed_model = MockEmbedding(embed_dim=8)
    Settings.llm = MockLLM(max_tokens=12)
    instrumentor = LlamaIndexInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


def test_openinference_llama_index(
    sink: OtlpSink, tmp_path: Path, llama_index_offline: Any
) -> None:
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    with collector(sink, tmp_path, CASE_METRIC_CONFIG) as serve:
        tp = provider(serve, "llama-app")
        index = VectorStoreIndex([TextNode(id_=i, text=t) for i, t in KB.items()])
        llama_index_offline.instrument(tracer_provider=tp)  # after indexing: query spans only
        engine = index.as_query_engine(similarity_top_k=3)
        response = engine.query(QUESTION)
        tp.shutdown()
        spans = _wait_scored(sink, 1)
    nodes = response.source_nodes
    got = Retrieved(
        [n.node.node_id for n in nodes], [n.node.get_content() for n in nodes], str(response)
    )
    roots = _tops(spans)
    assert len(roots) == 1
    assert roots[0].span.name == "RetrieverQueryEngine.query"
    assert _scored(spans) == roots
    assert_case_scored(roots[0], got)


# ------------------------------------------------------------------ OTel GenAI
def test_otel_genai_spans(sink: OtlpSink, tmp_path: Path) -> None:
    """An agent built by hand to the GenAI conventions: ``invoke_agent`` root, a
    ``retrieval`` span with ``gen_ai.retrieval.documents`` (JSON) and a ``chat`` span."""
    ids = ["kb_paris", "kb_berlin", "kb_louvre"]
    answer = "Paris."
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    with collector(sink, tmp_path, CASE_METRIC_CONFIG) as serve:
        tp = provider(serve, "genai-app")
        tracer = tp.get_tracer("genai-app")
        user = [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
        with tracer.start_as_current_span("invoke_agent kb-agent") as agent:
            agent.set_attribute(semconv.GEN_AI_OPERATION_NAME, "invoke_agent")
            agent.set_attribute(semconv.GEN_AI_CONVERSATION_ID, conversation)
            agent.set_attribute(semconv.GEN_AI_INPUT_MESSAGES, json.dumps(user))
            with tracer.start_as_current_span("retrieval kb") as ret:
                ret.set_attribute(semconv.GEN_AI_OPERATION_NAME, "retrieval")
                ret.set_attribute(semconv.GEN_AI_RETRIEVAL_QUERY_TEXT, QUESTION)
                docs = [
                    {"id": i, "score": 1.0 - r / 10, "content": KB[i]} for r, i in enumerate(ids)
                ]
                ret.set_attribute(semconv.GEN_AI_RETRIEVAL_DOCUMENTS, json.dumps(docs))
            with tracer.start_as_current_span("chat fake-model") as chat:
                chat.set_attribute(semconv.GEN_AI_OPERATION_NAME, "chat")
                chat.set_attribute(semconv.GEN_AI_INPUT_MESSAGES, json.dumps(user))
                out = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
                chat.set_attribute(semconv.GEN_AI_OUTPUT_MESSAGES, json.dumps(out))
            agent.set_attribute(semconv.GEN_AI_OUTPUT_MESSAGES, json.dumps(out))
        tp.shutdown()
        spans = _wait_scored(sink, 1)
    [root] = _tops(spans)
    assert _scored(spans) == [root]
    assert_case_scored(root, Retrieved(ids, [KB[i] for i in ids], answer))


# ------------------------------------------------------------------ conversation
CONVERSATION_METRICS = ("turn_contextual_relevancy",)


def test_openinference_conversation(
    sink: OtlpSink, tmp_path: Path, openinference_langchain: Any
) -> None:
    """Three turns of one ``using_session`` conversation through the LangChain chain:
    each root CHAIN span gets the window score and the running conversation score
    the metric gives offline on the same turns."""
    from openinference.instrumentation import using_session

    questions = [QUESTION, "When was the Eiffel Tower completed?", "Which museum is in Paris?"]
    session = f"sess-{uuid.uuid4().hex[:8]}"
    metrics: dict[str, dict[str, Any]] = {name: {} for name in CONVERSATION_METRICS}
    turns: list[tuple[str, Retrieved]] = []
    with collector(sink, tmp_path, metrics) as serve:
        tp = provider(serve, "lc-chat")
        openinference_langchain.instrument(tracer_provider=tp)
        chain, _, seen = _langchain_app(ids_in_metadata=False)
        with using_session(session):
            for n, question in enumerate(questions, 1):
                turns.append((question, _run_chain(chain, seen, question)))
                tp.force_flush()
                _wait_scored(sink, n)  # a user waits for each answer
        tp.shutdown()
        spans = sink.spans
    roots = _tops(spans)
    assert [r.attributes[semconv.SESSION_ID] for r in roots] == [session] * 3
    expected = conversation_scores(turns, CONVERSATION_METRICS)
    for name in CONVERSATION_METRICS:
        for root, (window, running) in zip(roots, expected[name], strict=True):
            assert flat(root, name, semconv.EVAL_FIELD_SCORE) == pytest.approx(window)
            got = flat(root, name, semconv.EVAL_FIELD_CONVERSATION_SCORE)
            assert got == pytest.approx(running)


# ------------------------------------------------------------------ overrides
def test_cases_overrides_choose_the_span_and_the_question(sink: OtlpSink, tmp_path: Path) -> None:
    """A hand-rolled app whose root is a plain span: ``cases.match`` makes it the case
    span and ``cases.question_attribute`` / ``answer_attribute`` say where the question
    and the answer are."""
    ids = ["kb_eiffel", "kb_paris"]
    answer = "Paris."
    cases = {
        "match": [{"span_name": "handle *", "exists": ["app.question"]}],
        "question_attribute": "app.question",
        "answer_attribute": "app.answer",
    }
    with collector(sink, tmp_path, CASE_METRIC_CONFIG, cases=cases) as serve:
        tp = provider(serve, "custom-app")
        tracer = tp.get_tracer("custom-app")
        with tracer.start_as_current_span("handle request") as root:
            root.set_attribute("app.question", json.dumps({"question": QUESTION}))
            with tracer.start_as_current_span("search") as ret:
                ret.set_attribute(semconv.OPENINFERENCE_SPAN_KIND, "RETRIEVER")
                for rank, doc_id in enumerate(ids):
                    prefix = semconv.RETRIEVAL_DOCUMENTS
                    ret.set_attribute(
                        semconv.document_attr(prefix, rank, semconv.DOCUMENT_ID), doc_id
                    )
                    ret.set_attribute(
                        semconv.document_attr(prefix, rank, semconv.DOCUMENT_CONTENT), KB[doc_id]
                    )
            root.set_attribute("app.answer", answer)
        tp.shutdown()
        spans = _wait_scored(sink, 1)
    [top] = _tops(spans)
    assert top.span.name == "handle request"
    assert _scored(spans) == [top]
    assert_case_scored(top, Retrieved(ids, [KB[i] for i in ids], answer))
