"""Supported matrix: Haystack (a Pipeline: InMemoryBM25Retriever -> ChatPromptBuilder ->
OpenAIChatGenerator on the loopback server) with the OpenInference instrumentor,
exported to a real collector with no config.

BM25 over the corpus ranks kb_paris (3.74), kb_berlin (2.56), kb_louvre (0.59), ... for
"What is the capital of France?"; with top_k=2 the user's ids give id_context_recall
1/1 = 1.0 and id_context_precision 1/2 = 0.5.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.e2e._support import JUDGE_KEY_ENV, JudgeServer, flat, llm_judge
from tests.fakes.openai_server import RecordedRequest, Reply
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.frameworks._matrix import (
    ANSWER_METRICS,
    CASE_METRICS,
    KB,
    QUESTIONS,
    TOP_2,
    TURN_METRICS,
    Retrieved,
    assert_conversation_scored,
    assert_generation_scored,
    assert_ids_scored,
    assert_ids_skipped,
    assert_text_metrics_scored,
    converse,
    matrix_collector,
    only_case,
    provider,
    tops,
    wait_scored,
)
from tests.frameworks.conftest import answer_for

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

QUESTION = QUESTIONS[0]


@pytest.fixture
def openinference() -> Iterator[Any]:
    from openinference.instrumentation.haystack import HaystackInstrumentor

    instrumentor = HaystackInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


def _pipeline(server: JudgeServer, ids: str, answer_builder: bool = False) -> Any:
    """The corpus in an InMemoryDocumentStore, each Document with the user's ``id``
    (``ids="id"``) or none, Haystack then hashing the content (``ids="meta"``: the
    user's id only in ``meta``); with ``answer_builder``, the replies and the documents
    go on to an ``AnswerBuilder`` (the pipeline's output is then its GeneratedAnswer)."""
    from haystack import Document, Pipeline
    from haystack.components.builders import AnswerBuilder, ChatPromptBuilder
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.dataclasses import ChatMessage
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import Secret

    store = InMemoryDocumentStore()
    store.write_documents(
        [
            Document(id=i, content=t) if ids == "id" else Document(content=t, meta={"doc_id": i})
            for i, t in KB.items()
        ]
    )
    template = [
        ChatMessage.from_user(
            "Context:\n{% for d in documents %}{{ d.content }}\n{% endfor %}\n"
            "Question: {{ question }}"
        )
    ]
    pipeline = Pipeline()
    pipeline.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=2))
    pipeline.add_component(
        "prompt_builder",
        ChatPromptBuilder(template=template, required_variables=["question", "documents"]),
    )
    pipeline.add_component(
        "llm",
        OpenAIChatGenerator(
            api_key=Secret.from_token("sk-loopback"),
            model="gpt-4o-mini",
            api_base_url=server.base_url,
        ),
    )
    pipeline.connect("retriever.documents", "prompt_builder.documents")
    pipeline.connect("prompt_builder.prompt", "llm.messages")
    if answer_builder:
        pipeline.add_component("answer_builder", AnswerBuilder())
        pipeline.connect("llm.replies", "answer_builder.replies")
        pipeline.connect("retriever.documents", "answer_builder.documents")
    return pipeline


def _ask(pipeline: Any, question: str) -> Retrieved:
    out = pipeline.run(
        {"retriever": {"query": question}, "prompt_builder": {"question": question}},
        include_outputs_from={"retriever"},
    )
    docs = out["retriever"]["documents"]
    ids = [d.id if d.id in KB else d.meta["doc_id"] for d in docs]
    # The hand-computed ranking.  For the conversation's later questions BM25's second
    # document is kb_louvre (it shares "the" three times), not the keyword rule's
    # kb_paris: recall 1/1 and precision 1/2 all the same.
    assert ids[0] == TOP_2[question][0]
    assert len(ids) == 2
    if question == QUESTION:
        assert ids == TOP_2[question]
    answer = out["llm"]["replies"][0].text
    assert answer == answer_for(question)
    return Retrieved(ids, [d.content for d in docs], answer)


def _single(
    sink: OtlpSink, tmp_path: Path, server: JudgeServer, instrumentor: Any, ids: str
) -> tuple[ReceivedSpan, Retrieved]:
    with matrix_collector(sink, tmp_path) as serve:
        tp = provider(serve, f"haystack-{ids}")
        pipeline = _pipeline(server, ids)
        instrumentor.instrument(tracer_provider=tp)
        got = _ask(pipeline, QUESTION)
        tp.shutdown()
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.span.name == "Pipeline.run"
    assert root.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    return root, got


def test_openinference_ids_on_documents(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer, openinference: Any
) -> None:
    """``Document(id="kb_paris")``: document.id is the user's id.  The pipeline's input
    ({"data": {"retriever": {"query": ...}, ...}}) and output ({"llm": {"replies":
    [ChatMessage repr]}}) are reduced to the question and the answer: the reference
    store matches the question, so the ground-truth metrics run."""
    root, got = _single(sink, tmp_path, llm_server, openinference, "id")
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)


@pytest.mark.slow
def test_openinference_question_and_answer_reduced(
    sink: OtlpSink,
    tmp_path: Path,
    llm_server: JudgeServer,
    openinference: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What an LLM judge is shown: the question (from the pipeline's component map) and
    the answer (the text of the generator's ChatMessage reply), not the JSON or the
    repr the instrumentor recorded."""
    from tests.fakes.openai_server import auto_reply, fenced_blocks

    monkeypatch.setenv(JUDGE_KEY_ENV, "sk-judge")
    judge = JudgeServer(auto_reply).start()
    try:
        metrics: dict[str, dict[str, Any]] = {"answer_relevancy": {}, "faithfulness": {}}
        with matrix_collector(sink, tmp_path, metrics, judge=llm_judge(judge)) as serve:
            tp = provider(serve, "haystack-judge")
            pipeline = _pipeline(llm_server, "id")
            openinference.instrument(tracer_provider=tp)
            got = _ask(pipeline, QUESTION)
            tp.shutdown()
            [root] = tops(wait_scored(sink, 1))
        prompts = [fenced_blocks(r.prompt_text) for r in judge.server.requests]
    finally:
        judge.stop()
    assert flat(root, "answer_relevancy", semconv.EVAL_FIELD_SCORE) is not None
    assert flat(root, "faithfulness", semconv.EVAL_FIELD_SCORE) is not None
    shown = [body for blocks in prompts for bodies in blocks.values() for body in bodies]
    assert QUESTION in shown
    assert got.answer in shown
    assert not [t for t in shown if "ChatMessage(" in t or '"data"' in t]


#: A wrong claim at the end of the AnswerBuilder cell's answers: kb_berlin, retrieved,
#: says the opposite, so the true answer scores faithfulness 1/2 offline.  The raw
#: pipeline output the collector judged before issue 29 (the GeneratedAnswer repr with
#: the query and the documents) scores otherwise.
SLIP = " Berlin is not the capital of Germany."


@pytest.mark.slow
def test_openinference_answer_builder(sink: OtlpSink, tmp_path: Path, openinference: Any) -> None:
    """Pipeline output ``{"answer_builder": {"answers": ["GeneratedAnswer(data=...,
    query=..., documents=[...], meta=...)"]}}``: the answer is ``data``, never the repr."""

    def reply(request: RecordedRequest) -> Reply:
        return Reply.text(answer_for(request.last_user_text) + SLIP)

    server = JudgeServer(reply).start()
    metrics: dict[str, dict[str, Any]] = {n: {} for n in (*CASE_METRICS, *ANSWER_METRICS)}
    try:
        with matrix_collector(sink, tmp_path, metrics) as serve:
            tp = provider(serve, "haystack-answers")
            pipeline = _pipeline(server, "id", answer_builder=True)
            openinference.instrument(tracer_provider=tp)
            out = pipeline.run(
                {
                    "retriever": {"query": QUESTION},
                    "prompt_builder": {"question": QUESTION},
                    "answer_builder": {"query": QUESTION},
                },
                include_outputs_from={"retriever"},
            )
            tp.shutdown()
            spans = wait_scored(sink, 1)
    finally:
        server.stop()
    [answer] = out["answer_builder"]["answers"]
    assert answer.data == answer_for(QUESTION) + SLIP
    docs = out["retriever"]["documents"]
    assert [d.id for d in docs] == TOP_2[QUESTION]
    root = only_case(spans)
    assert "GeneratedAnswer(data=" in root.attributes[semconv.OUTPUT_VALUE]
    got = Retrieved([d.id for d in docs], [d.content for d in docs], answer.data)
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)
    assert_generation_scored(root, QUESTION, got)


def test_openinference_ids_in_meta(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer, openinference: Any
) -> None:
    """No ``id`` given: Haystack's document.id is a hash of the content; the user's id
    in ``meta["doc_id"]`` is the one that matches the ground truth, and is used."""
    root, got = _single(sink, tmp_path, llm_server, openinference, "meta")
    assert_ids_scored(root)
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "metadata.doc_id"
    assert_text_metrics_scored(root, QUESTION, got)


def test_openinference_content_hash_ids_are_not_compared(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer, openinference: Any
) -> None:
    """No id of the user's anywhere: the content hashes are not compared with the
    reference ids (skipped, with what to do), the text metrics still score."""
    from haystack import Document

    with matrix_collector(sink, tmp_path) as serve:
        tp = provider(serve, "haystack-hash")
        pipeline = _pipeline(llm_server, "meta")
        store = pipeline.get_component("retriever").document_store
        store.delete_documents([d.id for d in store.filter_documents()])
        store.write_documents([Document(content=t) for t in KB.values()])
        openinference.instrument(tracer_provider=tp)
        out = pipeline.run(
            {"retriever": {"query": QUESTION}, "prompt_builder": {"question": QUESTION}},
            include_outputs_from={"retriever"},
        )
        tp.shutdown()
        spans = wait_scored(sink, 1)
    docs = out["retriever"]["documents"]
    [root] = tops(spans)
    assert_ids_skipped(root, "not compared")
    got = Retrieved([d.id for d in docs], [d.content for d in docs], out["llm"]["replies"][0].text)
    assert_text_metrics_scored(root, QUESTION, got)


def test_openinference_conversation(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer, openinference: Any
) -> None:
    """``using_session`` around three pipeline runs: three turns of one session."""
    from openinference.instrumentation import using_session

    session = f"sess-{uuid.uuid4().hex[:8]}"
    metrics: dict[str, dict[str, Any]] = {name: {} for name in (*TURN_METRICS, "id_context_recall")}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        tp = provider(serve, "haystack-chat")
        pipeline = _pipeline(llm_server, "id")
        openinference.instrument(tracer_provider=tp)
        with using_session(session):
            turns = converse(sink, lambda q: _ask(pipeline, q), tp.force_flush)
        tp.shutdown()
        roots = tops(sink.spans)
    assert [r.attributes[semconv.SESSION_ID] for r in roots] == [session] * 3
    assert_conversation_scored(roots, turns)
