"""Case building per convention, from hand-built spans shaped like each instrumentor's
(the shapes were read from the real instrumentors' output: see tests/e2e/
test_instrumentors.py for the real packages end to end)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.config import ConfigError, parse_config
from ragtrace_collector.conventions import (
    CONVENTIONS,
    Convention,
    genai,
    openinference,
    openllmetry,
)
from ragtrace_collector.conventions.base import Role, Unread, documents_from_attributes
from ragtrace_collector.conventions.text import question_text, reduce_answer, reduce_question
from ragtrace_collector.evaluation.case_builder import (
    CaseRules,
    CasesConfig,
    build_cases,
    may_hold_case,
)
from ragtrace_collector.otlp.spanattrs import attributes_to_dict, set_attributes
from tests.fakes.spans import named_span

TID = os.urandom(16)

#: A Haystack ChatMessage as the OpenInference Haystack instrumentor records a reply.
HAYSTACK_REPLY = (
    "ChatMessage(_role=<ChatRole.ASSISTANT: 'assistant'>, _content=[TextContent("
    "text='Paris is the capital of France.')], _name=None, _meta={'model': 'gpt-4o-mini', "
    "'index': 0, 'finish_reason': 'stop'})"
)
HAYSTACK_QUOTED = (
    "ChatMessage(_role=<ChatRole.ASSISTANT: 'assistant'>, _content=[TextContent("
    "text='It\\'s \"Paris\".')], _name=None, _meta={})"
)


def _hay(role: str, text: str) -> str:
    """A Haystack ChatMessage repr of ``role`` (USER, ASSISTANT, SYSTEM)."""
    return (
        f"ChatMessage(_role=<ChatRole.{role}: '{role.lower()}'>, "
        f"_content=[TextContent(text={text!r})], _name=None, _meta={{}})"
    )


def decode(s: trace_pb2.Span) -> dict[str, Any]:
    return attributes_to_dict(s.attributes)


def span(
    name: str,
    attrs: dict[str, Any],
    *,
    parent: trace_pb2.Span | None = None,
    start: int = 1_000,
    events: list[tuple[str, dict[str, Any]]] | None = None,
) -> trace_pb2.Span:
    s = named_span(name, attrs, tid=TID, parent=parent, start=start, end=start + 1_000)
    for event_name, event_attrs in events or []:
        event = s.events.add(name=event_name)
        set_attributes(event.attributes, event_attrs.items())
    return s


def oi_docs(docs: list[tuple[str | None, str, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {semconv.OPENINFERENCE_SPAN_KIND: "RETRIEVER"}
    for i, (doc_id, content, metadata) in enumerate(docs):
        if doc_id is not None:
            out[semconv.document_attr(semconv.RETRIEVAL_DOCUMENTS, i, semconv.DOCUMENT_ID)] = doc_id
        out[semconv.document_attr(semconv.RETRIEVAL_DOCUMENTS, i, semconv.DOCUMENT_CONTENT)] = (
            content
        )
        if metadata:
            key = semconv.document_attr(semconv.RETRIEVAL_DOCUMENTS, i, semconv.DOCUMENT_METADATA)
            out[key] = json.dumps(metadata)
    return out


# ----------------------------------------------------------------- OpenInference
def _langchain_trace(session: str | None = None) -> list[trace_pb2.Span]:
    """The shape of openinference-instrumentation-langchain's RunnableSequence trace."""
    extra = {semconv.SESSION_ID: session} if session else {}
    root = span(
        "RunnableSequence",
        {
            semconv.OPENINFERENCE_SPAN_KIND: "CHAIN",
            semconv.INPUT_VALUE: json.dumps({"question": "What is the capital of France?"}),
            semconv.INPUT_MIME_TYPE: "application/json",
            semconv.OUTPUT_VALUE: json.dumps({"content": "Paris.", "type": "ai"}),
            semconv.OUTPUT_MIME_TYPE: "application/json",
            **extra,
        },
    )
    parallel = span("RunnableParallel", {semconv.OPENINFERENCE_SPAN_KIND: "CHAIN"}, parent=root)
    inner = span(
        "RunnableSequence",
        {semconv.OPENINFERENCE_SPAN_KIND: "CHAIN", semconv.INPUT_VALUE: "inner"},
        parent=parallel,
    )
    output = {
        "documents": [
            {"id": "kb1", "page_content": "Paris is the capital.", "metadata": {}},
            {"id": "kb2", "page_content": "Berlin is a capital.", "metadata": {}},
            {"page_content": "No id here.", "metadata": {"doc_id": "kb3"}},
        ]
    }
    retriever = span(
        "Retriever",
        {
            **oi_docs(
                [
                    (None, "Paris is the capital.", {"source": "a"}),
                    (None, "Berlin is a capital.", {}),
                    (None, "No id here.", {"doc_id": "kb3"}),
                ]
            ),
            semconv.INPUT_VALUE: "capital of France",
            semconv.OUTPUT_VALUE: json.dumps(output),
        },
        parent=inner,
    )
    llm = span("FakeListLLM", {semconv.OPENINFERENCE_SPAN_KIND: "LLM"}, parent=root)
    return [retriever, inner, parallel, llm, root]


def test_openinference_outermost_chain_with_ids_from_output_and_metadata() -> None:
    spans = _langchain_trace()
    [built] = build_cases(spans, service_of=lambda s: "svc")
    assert built.span is spans[-1]  # the root, not the inner chain that holds the retriever
    assert built.convention == "openinference"
    case = built.case
    assert case.input == "What is the capital of France?"
    assert case.actual_output == "Paris."
    # kb1/kb2 from output.value (no document.id recorded), kb3 from the metadata.
    assert case.retrieved_context_ids == ["kb1", "kb2", "kb3"]
    assert [c.content for c in case.retrieval_context or []] == [
        "Paris is the capital.",
        "Berlin is a capital.",
        "No id here.",
    ]
    assert built.session_id is None
    assert built.turn_index is None
    retriever = spans[0]
    assert built.document_sources is not None
    assert [s[:2] for s in built.document_sources] == [
        (retriever.span_id.hex(), i) for i in range(3)
    ]


def test_plain_text_that_looks_like_json_is_kept() -> None:
    """input.value is reduced only when its mime type says JSON."""
    attrs = {semconv.INPUT_VALUE: "[1, 2]", semconv.OUTPUT_VALUE: '{"a": "b"}'}
    assert openinference.question(attrs) == "[1, 2]"
    assert openinference.answer(attrs) == '{"a": "b"}'
    attrs[semconv.OUTPUT_MIME_TYPE] = "application/json"
    assert openinference.answer(attrs) == "b"


def test_output_ids_are_not_taken_when_the_content_differs() -> None:
    docs = oi_docs([(None, "A", {}), (None, "B", {})])
    docs[semconv.OUTPUT_VALUE] = json.dumps(
        {"documents": [{"id": "x", "page_content": "A"}, {"id": "y", "page_content": "other"}]}
    )
    role = openinference.role(trace_pb2.Span(), docs)
    assert role is Role.RETRIEVER
    got = openinference.documents(trace_pb2.Span(), docs, role)
    assert [d.id for d in got] == ["x", None]


def test_session_from_openinference_leaves_the_numbering_to_the_store() -> None:
    """No ragtrace.turn.index: no invented index (the session store numbers the turn)."""
    spans = _langchain_trace(session="s-1")
    [built] = build_cases(spans)
    assert built.session_id == "s-1"
    assert built.turn_index is None


def test_trace_without_retriever_has_no_case_and_is_never_decoded() -> None:
    root = span(
        "RunnableSequence", {semconv.OPENINFERENCE_SPAN_KIND: "CHAIN", semconv.INPUT_VALUE: "hi"}
    )
    llm = span("LLM", {semconv.OPENINFERENCE_SPAN_KIND: "LLM"}, parent=root)
    assert not may_hold_case([root, llm])
    assert build_cases([root, llm]) == []
    # A retriever with no chain or agent above it: no case either.
    lone = span("Retriever", oi_docs([("a", "A", {})]))
    assert may_hold_case([lone])
    assert build_cases([lone]) == []


def test_reranker_output_order_wins() -> None:
    root = span("chain", {semconv.OPENINFERENCE_SPAN_KIND: "AGENT", semconv.INPUT_VALUE: "q"})
    ret = span("ret", oi_docs([("a", "A", {}), ("b", "B", {})]), parent=root, start=1)
    rerank_attrs: dict[str, Any] = {semconv.OPENINFERENCE_SPAN_KIND: "RERANKER"}
    for i, (doc_id, content) in enumerate([("b", "B"), ("a", "A")]):
        prefix = semconv.RERANKER_OUTPUT_DOCUMENTS
        rerank_attrs[semconv.document_attr(prefix, i, semconv.DOCUMENT_ID)] = doc_id
        rerank_attrs[semconv.document_attr(prefix, i, semconv.DOCUMENT_CONTENT)] = content
    rr = span("rerank", rerank_attrs, parent=root, start=5)
    [built] = build_cases([root, ret, rr])
    assert built.case.retrieved_context_ids == ["b", "a"]
    assert built.document_sources is not None
    assert [s[:2] for s in built.document_sources] == [(rr.span_id.hex(), 0), (rr.span_id.hex(), 1)]


def test_llama_index_shape() -> None:
    root = span(
        "RetrieverQueryEngine.query",
        {
            semconv.OPENINFERENCE_SPAN_KIND: "CHAIN",
            semconv.INPUT_VALUE: "capital of France",
            semconv.OUTPUT_VALUE: "Paris",
        },
    )
    inner = span(
        "RetrieverQueryEngine._query",
        {
            semconv.OPENINFERENCE_SPAN_KIND: "CHAIN",
            semconv.INPUT_VALUE: json.dumps({"query_bundle": {"query_str": "capital of France"}}),
        },
        parent=root,
    )
    ret = span("VectorIndexRetriever.retrieve", oi_docs([("n1", "Paris.", {})]), parent=inner)
    [built] = build_cases([root, inner, ret])
    assert (built.case.input, built.case.actual_output) == ("capital of France", "Paris")
    assert built.case.retrieved_context_ids == ["n1"]


# ----------------------------------------------------------------------- GenAI
def test_genai_agent_retrieval_and_messages() -> None:
    agent = span(
        "invoke_agent bot",
        {
            semconv.GEN_AI_OPERATION_NAME: "invoke_agent",
            semconv.GEN_AI_CONVERSATION_ID: "conv-7",
            semconv.GEN_AI_INPUT_MESSAGES: json.dumps(
                [
                    {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
                    {"role": "user", "parts": [{"type": "text", "content": "Old question"}]},
                    {"role": "assistant", "parts": [{"type": "text", "content": "Old answer"}]},
                    {"role": "user", "parts": [{"type": "text", "content": "Capital of France?"}]},
                ]
            ),
            semconv.GEN_AI_OUTPUT_MESSAGES: json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "Paris."}]}]
            ),
        },
    )
    docs = [{"id": "d1", "score": 0.9, "content": "Paris."}, {"id": "d2", "score": 0.5}]
    ret = span(
        "retrieval kb",
        {
            semconv.GEN_AI_OPERATION_NAME: "retrieval",
            semconv.GEN_AI_RETRIEVAL_QUERY_TEXT: "capital france",
            semconv.GEN_AI_RETRIEVAL_DOCUMENTS: json.dumps(docs),
        },
        parent=agent,
    )
    [built] = build_cases([agent, ret])
    assert built.convention == "genai"
    assert built.case.input == "Capital of France?"
    assert built.case.actual_output == "Paris."
    assert built.case.retrieved_context_ids == ["d1", "d2"]
    # d2 has no content: the text metrics get no context (skipped), ids still count.
    assert built.case.retrieval_context is None
    assert built.session_id == "conv-7"
    got = genai.documents(
        ret, {semconv.GEN_AI_RETRIEVAL_DOCUMENTS: json.dumps(docs)}, Role.RETRIEVER
    )
    assert [d.score for d in got or []] == [0.9, 0.5]


def test_genai_question_falls_back_to_the_retrieval_query() -> None:
    agent = span("invoke_workflow", {semconv.GEN_AI_OPERATION_NAME: "invoke_workflow"})
    ret = span(
        "retrieval",
        {
            semconv.GEN_AI_OPERATION_NAME: "retrieval",
            semconv.GEN_AI_RETRIEVAL_QUERY_TEXT: "what is ragtrace",
            semconv.GEN_AI_RETRIEVAL_DOCUMENTS: json.dumps([{"id": "x", "content": "X"}]),
        },
        parent=agent,
    )
    [built] = build_cases([agent, ret])
    assert built.case.input == "what is ragtrace"
    assert built.case.actual_output is None


def test_haystack_pipeline_trace() -> None:
    """openinference-instrumentation-haystack: Pipeline.run CHAIN whose input and output
    are component maps, a RETRIEVER component below it."""
    question = "What is the capital of France?"
    pipeline = span(
        "Pipeline.run",
        {
            semconv.OPENINFERENCE_SPAN_KIND: "CHAIN",
            semconv.INPUT_VALUE: json.dumps(
                {
                    "data": {
                        "retriever": {"query": question},
                        "prompt_builder": {"question": question},
                    }
                }
            ),
            semconv.INPUT_MIME_TYPE: "application/json",
            semconv.OUTPUT_VALUE: json.dumps({"llm": {"replies": [HAYSTACK_REPLY]}}),
            semconv.OUTPUT_MIME_TYPE: "application/json",
        },
    )
    retriever = span(
        "InMemoryBM25Retriever.run",
        {
            **oi_docs([("kb-paris", "Paris is the capital of France.", {"source": "wiki"})]),
            semconv.INPUT_VALUE: json.dumps({"query": question, "filters": None, "top_k": 1}),
            semconv.INPUT_MIME_TYPE: "application/json",
        },
        parent=pipeline,
    )
    [built] = build_cases([pipeline, retriever])
    assert built.case.input == question
    assert built.case.actual_output == "Paris is the capital of France."
    assert built.case.retrieved_context_ids == ["kb-paris"]


# ----------------------------------------------------------------- OpenLLMetry
def _llama_node(node_id: str, text: str, score: float, **extra: Any) -> str:
    """One element of the LlamaIndex instrumentation's retriever output: a NodeWithScore
    serialised to a JSON string (inside the JSON list)."""
    node = {"id_": node_id, "embedding": None, "text": text, "class_name": "TextNode", **extra}
    return json.dumps({"node": node, "score": score, "class_name": "NodeWithScore"})


def _llama_index_traceloop_trace() -> list[trace_pb2.Span]:
    """The shape of opentelemetry-instrumentation-llamaindex's RetrieverQueryEngine trace."""
    kind = semconv.TRACELOOP_SPAN_KIND
    root = span(
        "RetrieverQueryEngine.workflow",
        {
            kind: "workflow",
            "traceloop.entity.name": "RetrieverQueryEngine.workflow",
            semconv.TRACELOOP_ENTITY_INPUT: json.dumps({"str_or_query_bundle": "Who wrote it?"}),
            semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps(
                {"response": "Ada.", "metadata": {"u1": {"doc_id": "kb-ada"}}}
            ),
        },
    )
    task = span("RetrieverQueryEngine.task", {kind: "task"}, parent=root)
    nodes = [
        _llama_node(
            "u1",
            "Ada wrote it.",
            0.9,
            metadata={"doc_id": "kb-ada"},
            relationships={"1": {"node_id": "kb-ada", "node_type": "4", "metadata": {}}},
        ),
        _llama_node(
            "u2",
            "Other.",
            0.5,
            metadata={},
            relationships={"1": {"node_id": "kb-other", "node_type": "4", "metadata": {}}},
        ),
    ]
    retriever = span(
        "VectorIndexRetriever.task",
        {
            kind: "task",
            "traceloop.entity.name": "VectorIndexRetriever.task",
            semconv.TRACELOOP_ENTITY_INPUT: json.dumps(
                {"str_or_query_bundle": {"query_str": "Who wrote it?", "embedding": None}}
            ),
            semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps(nodes),
        },
        parent=task,
    )
    splitter = span("SentenceSplitter.task", {kind: "task"}, parent=task)
    # retrieve() -> _retrieve(): a second retriever span inside the first, same nodes.
    inner = span("VectorIndexRetriever.task", decode(retriever), parent=retriever, start=1_100)
    return [root, task, retriever, splitter, inner]


def test_openllmetry_llama_index_retriever_task() -> None:
    root, task, retriever, splitter, inner = _llama_index_traceloop_trace()
    role_of = {s.name: openllmetry.role(s, decode(s)) for s in (root, task, retriever, splitter)}
    assert role_of == {
        "RetrieverQueryEngine.workflow": Role.ROOT,
        "RetrieverQueryEngine.task": None,
        "VectorIndexRetriever.task": Role.RETRIEVER,
        "SentenceSplitter.task": None,
    }
    attrs = decode(retriever)
    docs = openllmetry.documents(retriever, attrs, Role.RETRIEVER) or []
    assert [(d.id, d.content, d.score) for d in docs] == [
        ("u1", "Ada wrote it.", 0.9),
        ("u2", "Other.", 0.5),
    ]
    # The node's metadata, kept for the id choice; the source document's id added as
    # ref_doc_id when the metadata has none.
    assert [d.metadata for d in docs] == [
        {"doc_id": "kb-ada", "ref_doc_id": "kb-ada"},
        {"ref_doc_id": "kb-other"},
    ]
    assert [d.ids for d in docs] == [{"document.id": "u1"}, {"document.id": "u2"}]
    assert openllmetry.retrieval_query(attrs) == "Who wrote it?"

    spans = [root, task, retriever, splitter, inner]
    assert may_hold_case(spans)
    [built] = build_cases(spans)
    assert built.convention == "openllmetry"
    assert (built.case.input, built.case.actual_output) == ("Who wrote it?", "Ada.")
    # The nested pair is one retrieval: each node once.
    assert [c.content for c in built.case.retrieval_context or []] == ["Ada wrote it.", "Other."]
    assert not may_hold_case([root, task, splitter])  # no retriever: never decoded


def test_openllmetry_llama_index_output_of_another_shape_is_read_generically() -> None:
    attrs = {
        semconv.TRACELOOP_SPAN_KIND: "task",
        semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps({"nodes": [{"id": "a", "text": "A."}]}),
    }
    s = span("BM25Retriever.task", attrs)
    assert openllmetry.role(s, attrs) is Role.RETRIEVER
    docs = openllmetry.documents(s, attrs, Role.RETRIEVER) or []
    assert [(d.id, d.content) for d in docs] == [("a", "A.")]
    # Not a retriever's output at all: recorded nothing rather than a made-up document.
    attrs[semconv.TRACELOOP_ENTITY_OUTPUT] = json.dumps({"response": "text"})
    assert openllmetry.documents(s, attrs, Role.RETRIEVER) is None


def test_openllmetry_vector_db_events_under_a_workflow() -> None:
    workflow = span(
        "rag.workflow",
        {
            semconv.TRACELOOP_SPAN_KIND: "workflow",
            semconv.TRACELOOP_ENTITY_INPUT: json.dumps(
                {"inputs": {"question": "Who wrote it?"}, "tags": [], "kwargs": {}}
            ),
            semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps({"outputs": "Ada.", "kwargs": {}}),
            semconv.TRACELOOP_SESSION_ID: "tl-1",
        },
    )
    query = span(
        "chroma.query",
        {"db.system": "chroma", "db.operation": "query"},
        parent=workflow,
        events=[
            (
                semconv.DB_QUERY_RESULT_EVENT,
                {
                    semconv.DB_QUERY_RESULT_ID: "c1",
                    semconv.DB_QUERY_RESULT_DISTANCE: 0.1,
                    semconv.DB_QUERY_RESULT_DOCUMENT: "Ada wrote it.",
                    semconv.DB_QUERY_RESULT_METADATA: json.dumps({"page": 3}),
                },
            ),
            ("unrelated", {}),
            (
                semconv.DB_QUERY_RESULT_EVENT,
                {semconv.DB_QUERY_RESULT_ID: "c2", semconv.DB_QUERY_RESULT_DOCUMENT: "Other."},
            ),
        ],
    )
    assert may_hold_case([workflow, query])
    [built] = build_cases([workflow, query])
    assert built.convention == "openllmetry"
    assert (built.case.input, built.case.actual_output) == ("Who wrote it?", "Ada.")
    assert built.case.retrieved_context_ids == ["c1", "c2"]
    first = (built.case.retrieval_context or [])[0]
    assert first.metadata == {"page": 3, "distance": 0.1}
    assert first.score is None  # a distance is not a relevance score
    assert built.session_id == "tl-1"


def test_openllmetry_langchain_retriever_span() -> None:
    attrs = {
        semconv.GEN_AI_OPERATION_NAME: "vector_db_retrieve",
        semconv.TRACELOOP_SPAN_KIND: "task",
        semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps(
            {
                "documents": [
                    {"page_content": "A.", "metadata": {"id": "a"}},
                    {"page_content": "B.", "metadata": {"chunk_id": 7}},
                ],
                "count": 2,
            }
        ),
    }
    s = span("vector_db_retrieve R", attrs)
    assert openllmetry.role(s, attrs) is Role.RETRIEVER
    docs = openllmetry.documents(s, attrs, Role.RETRIEVER)
    assert [(d.id, d.content) for d in docs or []] == [("a", "A."), ("7", "B.")]


# --------------------------------------------------------------------- ragtrace
def test_rag_spans_win_over_the_chain_default() -> None:
    chain = span("chain", {semconv.OPENINFERENCE_SPAN_KIND: "CHAIN", semconv.INPUT_VALUE: "x"})
    rag = span(
        "answer",
        {
            semconv.RAGTRACE_SPAN_KIND: "rag",
            semconv.OPENINFERENCE_SPAN_KIND: "CHAIN",
            semconv.INPUT_VALUE: "q",
            semconv.TURN_INDEX: 2,
            semconv.SESSION_ID: "s",
        },
        parent=chain,
    )
    ret = span(
        "search",
        {semconv.RAGTRACE_SPAN_KIND: "retriever", **oi_docs([("a", "A", {})])},
        parent=rag,
    )
    [built] = build_cases([chain, rag, ret])
    assert built.span is rag
    assert built.convention == "ragtrace"
    assert built.turn_index == 2


# -------------------------------------------------------------------- overrides
def test_match_and_attributes_override_the_default() -> None:
    root = span("app", {semconv.OPENINFERENCE_SPAN_KIND: "CHAIN"})
    step = span(
        "answer-step",
        {"app.step": "answer", "app.q": json.dumps({"input": "Q?"}), "app.a": "A!"},
        parent=root,
    )
    ret = span("ret", oi_docs([("a", "A", {})]), parent=step)
    rules = CaseRules(
        CasesConfig(
            match=[{"span_name": "answer-*", "equals": {"app.step": "answer"}}],
            question_attribute="app.q",
            answer_attribute="app.a",
        )
    )
    [built] = build_cases([root, step, ret], rules=rules)
    assert built.span is step
    assert (built.case.input, built.case.actual_output) == ("Q?", "A!")
    assert built.case.retrieved_context_ids == ["a"]
    # A matcher on the name alone also makes a trace without retriever a candidate.
    plain = span("answer-only", {})
    name_rules = CaseRules(CasesConfig(match=[{"span_name": "answer-*"}]))
    assert may_hold_case([plain], name_rules)
    assert not may_hold_case([plain])
    [only] = build_cases([plain], rules=name_rules)
    assert only.case.retrieved_context_ids is None


def test_conventions_can_be_switched_off() -> None:
    spans = _langchain_trace()
    rules = CaseRules(CasesConfig(conventions=["ragtrace", "genai"]))
    assert not may_hold_case(spans, rules)
    assert build_cases(spans, rules=rules) == []


def test_cases_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"conventions": ["openinferance"]}})
    assert "did you mean 'openinference'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"question_atribute": "x"}})
    assert "did you mean 'question_attribute'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"match": [{}]}})
    assert "cases.match[0]: a matcher needs" in str(info.value)


# ------------------------------------------------------------- JSON reduction
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain text", "plain text"),
        (json.dumps({"input": "Q", "chat_history": []}), "Q"),
        (json.dumps({"question": "Q", "context": "C"}), "Q"),
        (json.dumps({"query_str": "Q"}), "Q"),
        (json.dumps({"inputs": "Q", "tags": [], "metadata": {}}), "Q"),
        (
            json.dumps(
                [
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": [{"type": "text", "text": "second"}]},
                ]
            ),
            "second",
        ),
        (json.dumps({"messages": [{"type": "human", "content": "Q"}]}), "Q"),
        (
            json.dumps(
                {
                    "lc": 1,
                    "type": "constructor",
                    "id": ["langchain", "schema", "messages", "HumanMessage"],
                    "kwargs": {"content": "Q"},
                }
            ),
            "Q",
        ),
        ("[not json", "[not json"),
        # JSON with no question in it is no question (never the JSON itself).
        (json.dumps({"unknown": 1, "other": 2}), None),
        # Haystack 2 pipeline input: a component map; "question" beats "query".
        (json.dumps({"data": {"retriever": {"query": "R"}, "prompt_builder": {"question": "Q"}}}),
         "Q"),
        (json.dumps({"data": {"retriever": {"query": "Q", "top_k": 3}}}), "Q"),
        # LlamaIndex (OpenLLMetry): a QueryBundle, or the plain string.
        (json.dumps({"str_or_query_bundle": {"query_str": "Q", "embedding": None}}), "Q"),
        (json.dumps({"str_or_query_bundle": "Q"}), "Q"),
        # LlamaIndex chat engine (OpenLLMetry): chat(message, chat_history).
        (json.dumps({"message": "Q", "chat_history": [{"role": "user", "content": "old"}]}), "Q"),
        # Haystack ChatMessage reprs: the last user message, not the system prompt.
        (json.dumps({"llm": {"messages": [_hay("SYSTEM", "Be brief."), _hay("USER", "Q"),
                                          _hay("ASSISTANT", "A")]}}),
         "Q"),
    ],
)  # fmt: skip
def test_reduce_question(value: str, expected: str | None) -> None:
    assert reduce_question(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Paris.", "Paris."),
        (json.dumps({"output": "A", "intermediate_steps": []}), "A"),
        (json.dumps({"answer": "A", "context": ["x"]}), "A"),
        (json.dumps({"content": "A", "type": "ai"}), "A"),
        (json.dumps({"generations": [[{"text": "A", "type": "Generation"}]]}), "A"),
        (json.dumps({"response": "A", "source_nodes": []}), "A"),
        (json.dumps({"outputs": "A", "kwargs": {"tags": []}}), "A"),
        (json.dumps({"choices": [{"message": {"role": "assistant", "content": "A"}}]}), "A"),
        (
            json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "A"}], "x": 1}]
            ),
            "A",
        ),
        # Haystack 2: a generator's replies, plain or a ChatMessage repr (the
        # OpenInference Haystack instrumentor's output.value).
        (json.dumps({"llm": {"replies": ["A"], "meta": [{"model": "m"}]}}), "A"),
        (json.dumps({"llm": {"replies": [HAYSTACK_REPLY]}}), "Paris is the capital of France."),
        (json.dumps({"llm": {"replies": [HAYSTACK_QUOTED]}}), 'It\'s "Paris".'),
        (json.dumps({"retriever": {"documents": ["Document(id=1)"]}, "llm": {"replies": ["A"]}}),
         "A"),
        (json.dumps({"response": "A", "metadata": {"n1": {"doc_id": "kb"}}}), "A"),
    ],
)  # fmt: skip
def test_reduce_answer(value: str, expected: str) -> None:
    assert reduce_answer(value) == expected


def test_a_json_question_without_text_is_no_question() -> None:
    """Conventions read questions with question_text: JSON that holds no question text
    is None (the case builder then asks the retrievers), plain text stays as written."""
    unknown = json.dumps({"unknown": 1, "other": 2})
    assert question_text(unknown) is None
    assert question_text("[not json") == "[not json"
    assert question_text(json.dumps({"question": "Q"})) == "Q"
    attrs = {semconv.INPUT_VALUE: unknown, semconv.INPUT_MIME_TYPE: "application/json"}
    # The conventions say what they found instead (the skip reason of the metrics).
    found = Unread("a JSON object with keys unknown, other")
    assert openinference.question(attrs) == found
    assert openllmetry.question({semconv.TRACELOOP_ENTITY_INPUT: unknown}) == found


def test_a_question_that_does_not_reduce_gives_way_to_the_retriever_query() -> None:
    chain = span(
        "Pipeline.run",
        {
            semconv.OPENINFERENCE_SPAN_KIND: "CHAIN",
            semconv.INPUT_VALUE: json.dumps({"data": {"embedder": {"vector": [0.1, 0.2]}}}),
            semconv.INPUT_MIME_TYPE: "application/json",
        },
    )
    retriever = span(
        "Retriever.run",
        {
            **oi_docs([("kb1", "Paris.", {})]),
            semconv.INPUT_VALUE: json.dumps({"query": "capital of France", "top_k": 1}),
            semconv.INPUT_MIME_TYPE: "application/json",
        },
        parent=chain,
    )
    [built] = build_cases([chain, retriever])
    assert built.case.input == "capital of France"


def test_reduction_is_bounded_on_deep_json() -> None:
    deep: Any = "bottom"
    for _ in range(200):
        deep = {"input": deep}
    # Deeper than the bound: nothing reduces, and the JSON is not taken for the question.
    text = json.dumps(deep)
    assert reduce_question(text) is None


# ------------------------------------------------------------------ prefilter
def _marked_spans() -> list[tuple[str, trace_pb2.Span]]:
    """(what marks it, span) for every marker of every convention."""
    return [
        ("rag", span("a", {semconv.RAGTRACE_SPAN_KIND: "rag"})),
        ("oi retriever", span("b", {"x": 1, semconv.OPENINFERENCE_SPAN_KIND: "RETRIEVER"})),
        ("genai retrieval", span("c", {semconv.GEN_AI_OPERATION_NAME: "retrieval"})),
        ("traceloop retriever", span("d", {semconv.GEN_AI_OPERATION_NAME: "vector_db_retrieve"})),
        ("vector-db event", span("e", {}, events=[(semconv.DB_QUERY_RESULT_EVENT, {})])),
        (
            "llamaindex retriever task",
            span("VectorIndexRetriever.task", {semconv.TRACELOOP_SPAN_KIND: "task"}),
        ),
    ]


def _unmarked_spans() -> list[trace_pb2.Span]:
    return [
        span("f", {semconv.OPENINFERENCE_SPAN_KIND: "CHAIN", semconv.INPUT_VALUE: "RETRIEVER"}),
        span("g", {semconv.GEN_AI_OPERATION_NAME: "chat", "note": "retrieval"}),
        span("h", {"http.method": "GET"}, events=[("exception", {"db.query.result": "x"})]),
        # A task span of another LlamaIndex class, naming a retriever only in its text.
        span(
            "RetrieverQueryEngine.task",
            {
                semconv.TRACELOOP_SPAN_KIND: "task",
                semconv.TRACELOOP_ENTITY_INPUT: "VectorIndexRetriever.task",
            },
        ),
    ]


@pytest.mark.parametrize("padding", [0, 20_000], ids=["small", "large"])
def test_prefilter_finds_every_marker_and_nothing_else(padding: int) -> None:
    """Small spans are searched as bytes, large ones attribute by attribute: both
    paths find each convention's marker, and neither fires on look-alikes."""
    pad = {"llm.prompt": "x" * padding} if padding else {}
    for what, marked in _marked_spans():
        set_attributes(marked.attributes, pad.items())
        for others in ([], _unmarked_spans()):
            assert may_hold_case([*others, marked]), what
    unmarked = _unmarked_spans()
    for s in unmarked:
        set_attributes(s.attributes, pad.items())
    assert not may_hold_case(unmarked)


def test_prefilter_encodes_long_keys_and_values() -> None:
    """Matcher keys longer than 127 bytes need a two-byte length in the search."""
    key = "app." + "k" * 200
    rules = CaseRules(CasesConfig(match=[{"exists": [key]}]))
    assert may_hold_case([span("x", {key: "v"})], rules)
    assert not may_hold_case([span("x", {key[:-1]: "v"})], rules)


def test_genai_structured_attributes() -> None:
    """GenAI attributes recorded structured (OTLP arrays of key-value lists), not as
    JSON strings, read the same."""
    agent = span(
        "invoke_agent",
        {
            semconv.GEN_AI_OPERATION_NAME: "invoke_agent",
            semconv.GEN_AI_INPUT_MESSAGES: [
                {"role": "user", "parts": [{"type": "text", "content": "Q?"}]}
            ],
        },
    )
    ret = span(
        "retrieval",
        {
            semconv.GEN_AI_OPERATION_NAME: "retrieval",
            semconv.GEN_AI_RETRIEVAL_DOCUMENTS: [
                {"id": "d1", "score": 0.9, "content": "One."},
                {"id": "d2", "score": 0.4, "content": "Two."},
            ],
        },
        parent=agent,
    )
    [built] = build_cases([agent, ret])
    assert built.case.input == "Q?"
    assert built.case.retrieved_context_ids == ["d1", "d2"]
    assert [c.score for c in built.case.retrieval_context or []] == [0.9, 0.4]


def test_a_case_that_cannot_be_built_is_skipped_not_raised() -> None:
    spans = _langchain_trace()

    def broken_store(text: str) -> Any:
        raise RuntimeError("reference store down")

    assert build_cases(spans, reference_lookup=broken_store) == []
    # Garbage where documents and messages should be: a case, with what could be read.
    agent = span(
        "invoke_agent",
        {
            semconv.GEN_AI_OPERATION_NAME: "invoke_agent",
            semconv.GEN_AI_INPUT_MESSAGES: "[{not json",
        },
    )
    ret = span(
        "retrieval",
        {semconv.GEN_AI_OPERATION_NAME: "retrieval", semconv.GEN_AI_RETRIEVAL_DOCUMENTS: "42"},
        parent=agent,
    )
    [built] = build_cases([agent, ret])
    assert built.case.input == "[{not json"
    # Unreadable documents are "not recorded", not "retrieved nothing": no 0 scores.
    assert built.case.retrieved_context_ids is None
    assert built.document_sources is None


def test_document_attributes_by_index_whatever_the_key_order_and_shape() -> None:
    """Documents are read by index (not key order); a document with only unknown
    fields still holds its rank; keys that only look like document keys are ignored;
    the same key read under another prefix is not confused with the first."""
    lead = semconv.RETRIEVAL_DOCUMENTS
    attrs = {
        semconv.document_attr(lead, 10, semconv.DOCUMENT_CONTENT): "ten",
        semconv.document_attr(lead, 2, semconv.DOCUMENT_SCORE): 0.5,
        semconv.document_attr(lead, 2, semconv.DOCUMENT_CONTENT): "two",
        semconv.document_attr(lead, 2, semconv.DOCUMENT_METADATA): '{"doc_id": "m-2"}',
        semconv.document_attr(lead, 3, "document.title"): "no content",
        semconv.document_attr(lead, 10, semconv.DOCUMENT_ID): 10,
        f"{lead}.x.{semconv.DOCUMENT_CONTENT}": "not an index",
        f"{lead}.².{semconv.DOCUMENT_CONTENT}": "a digit that is not a decimal",
        f"{lead}x.1.{semconv.DOCUMENT_CONTENT}": "another prefix",
        semconv.document_attr(lead, 4, semconv.DOCUMENT_SCORE): True,
    }
    for _ in range(2):  # the second read comes from the parsed-key cache
        docs = documents_from_attributes(attrs, lead)
        assert [(d.id, d.content, d.score) for d in docs] == [
            ("m-2", "two", 0.5),
            (None, None, None),
            (None, None, None),  # a bool is not a score
            ("10", "ten", None),
        ]
        assert docs[0].metadata == {"doc_id": "m-2"}
        assert documents_from_attributes(attrs, semconv.RERANKER_OUTPUT_DOCUMENTS) == []


class _Recording(dict[str, Any]):
    """A mapping that records which keys were read."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


@pytest.mark.parametrize("convention", CONVENTIONS, ids=lambda c: c.name)
def test_role_reads_only_the_role_keys(convention: Convention) -> None:
    """Case building decodes only ``role_keys`` before it knows the roles: a role
    that read any other key would be decided on a missing value."""
    every = {
        semconv.RAGTRACE_SPAN_KIND: semconv.KIND_RETRIEVER,
        semconv.OPENINFERENCE_SPAN_KIND: "RETRIEVER",
        semconv.GEN_AI_OPERATION_NAME: semconv.GEN_AI_OPERATION_RETRIEVAL,
        semconv.TRACELOOP_SPAN_KIND: semconv.TRACELOOP_KIND_WORKFLOW,
        semconv.INPUT_VALUE: "q",
        semconv.OUTPUT_VALUE: "a",
        semconv.SESSION_ID: "s",
    }
    for present in [every, {}, {semconv.TRACELOOP_SPAN_KIND: semconv.TRACELOOP_KIND_AGENT}]:
        attrs = _Recording(present)
        convention.role(span("s", present), attrs)
        assert attrs.read <= convention.role_keys


def test_spans_outside_the_case_are_not_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Of an LLM span and an inner chain span (OpenInference), only the role key is
    decoded; the case span and its retriever are read in full."""
    import ragtrace_collector.evaluation.case_builder as case_builder

    decoded: list[Any] = []
    real = case_builder.any_value_to_python

    def counting(value: Any) -> Any:
        decoded.append(value)
        return real(value)

    monkeypatch.setattr(case_builder, "any_value_to_python", counting)
    root = span("chain", {semconv.OPENINFERENCE_SPAN_KIND: "CHAIN", semconv.INPUT_VALUE: "q?"})
    inner = span(
        "inner",
        {semconv.OPENINFERENCE_SPAN_KIND: "CHAIN", **{f"x.{i}": "y" * 100 for i in range(20)}},
        parent=root,
    )
    ret = span("retrieve", oi_docs([("d1", "text", {})]), parent=inner)
    llm = span(
        "llm",
        {semconv.OPENINFERENCE_SPAN_KIND: "LLM", **{f"llm.{i}": "z" * 1000 for i in range(30)}},
        parent=inner,
    )
    (built,) = build_cases([root, inner, ret, llm])
    assert built.span is root
    assert built.case.input == "q?"
    assert built.document_sources is not None
    assert len(built.document_sources) == 1
    payloads = [v for v in decoded if v.string_value in ("y" * 100, "z" * 1000)]
    assert payloads == []  # none of the 50 other attributes of the inner and LLM spans
    # the role key of each of the four spans; then in full the case span (2) and the
    # retriever (kind, id, content)
    assert len(decoded) == 4 + 2 + 3
