"""With the ragtrace SDK and an in-memory provider: the spans one request produces."""

from __future__ import annotations

import json

import pytest

from examples.support_bot import Conversation, SupportBot, load_golden, run_conversations
from ragtrace import semconv as sc
from tests.examples.conftest import SpanRecorder, attrs


def _doc_ids(span_attrs: dict[str, object], prefix: str) -> list[str]:
    ids: list[str] = []
    index = 0
    while (key := sc.document_attr(prefix, index, sc.DOCUMENT_ID)) in span_attrs:
        ids.append(str(span_attrs[key]))
        index += 1
    return ids


def test_one_request_is_a_rag_span_with_retriever_reranker_generator_children(
    recorder: SpanRecorder,
) -> None:
    bot = SupportBot()
    question = "Do you ship to Australia?"
    answer = bot.answer(question)

    spans = recorder.spans()
    assert len(spans) == 4
    [rag] = recorder.of_kind(sc.KIND_RAG)
    [retriever] = recorder.of_kind(sc.KIND_RETRIEVER)
    [reranker] = recorder.of_kind(sc.KIND_RERANKER)
    [generator] = recorder.of_kind(sc.KIND_GENERATOR)

    assert rag.parent is None
    for child in (retriever, reranker, generator):
        assert child.parent is not None
        assert child.parent.span_id == rag.context.span_id
        assert child.context.trace_id == rag.context.trace_id
    starts = [span.start_time or 0 for span in (retriever, reranker, generator)]
    assert starts == sorted(starts)

    rag_attrs = attrs(rag)
    assert rag_attrs[sc.OPENINFERENCE_SPAN_KIND] == sc.OI_KIND_CHAIN
    assert rag_attrs[sc.INPUT_VALUE] == question
    assert rag_attrs[sc.OUTPUT_VALUE] == answer.text

    ret_attrs = attrs(retriever)
    assert ret_attrs[sc.GEN_AI_OPERATION_NAME] == sc.GEN_AI_OPERATION_RETRIEVAL
    assert ret_attrs[sc.GEN_AI_RETRIEVAL_QUERY_TEXT] == question
    retrieved = _doc_ids(ret_attrs, sc.RETRIEVAL_DOCUMENTS)
    assert retrieved == [h["id"] for h in answer.candidates]
    assert retrieved[0] == "kb-shipping-003"
    first_content = ret_attrs[sc.document_attr(sc.RETRIEVAL_DOCUMENTS, 0, sc.DOCUMENT_CONTENT)]
    assert first_content == bot.kb.by_id["kb-shipping-003"].text
    assert isinstance(
        ret_attrs[sc.document_attr(sc.RETRIEVAL_DOCUMENTS, 0, sc.DOCUMENT_SCORE)], float
    )

    rr_attrs = attrs(reranker)
    assert _doc_ids(rr_attrs, sc.RERANKER_INPUT_DOCUMENTS) == retrieved
    assert _doc_ids(rr_attrs, sc.RERANKER_OUTPUT_DOCUMENTS) == answer.context_ids
    assert rr_attrs[sc.RERANKER_TOP_K] == 3
    assert rr_attrs[sc.RERANKER_QUERY] == question

    gen_attrs = attrs(generator)
    assert gen_attrs[sc.OPENINFERENCE_SPAN_KIND] == sc.OI_KIND_LLM
    assert gen_attrs[sc.OUTPUT_VALUE] == answer.text
    assert gen_attrs[sc.LLM_MODEL_NAME] == "extractive"


def test_golden_traffic_carries_its_ground_truth(recorder: SpanRecorder) -> None:
    item = load_golden()[5]  # two reference articles
    assert len(item.reference_context_ids) == 2
    SupportBot().answer(item.input, reference=item)
    [rag] = recorder.of_kind(sc.KIND_RAG)
    rag_attrs = attrs(rag)
    assert rag_attrs[sc.EXPECTED_OUTPUT] == item.expected_output
    assert json.loads(str(rag_attrs[sc.REFERENCE_CONTEXT_IDS])) == list(item.reference_context_ids)
    assert json.loads(str(rag_attrs[sc.REFERENCE_CONTEXTS])) == list(item.reference_contexts)


def test_without_reference_no_ground_truth_is_recorded(recorder: SpanRecorder) -> None:
    SupportBot().answer(load_golden()[0].input)
    [rag] = recorder.of_kind(sc.KIND_RAG)
    assert not set(attrs(rag)) & set(sc.GROUND_TRUTH_ATTRIBUTES)


def test_conversations_become_sessions_with_numbered_turns(recorder: SpanRecorder) -> None:
    runs = run_conversations(SupportBot(), count=2, session_prefix="test")
    rag_spans = recorder.of_kind(sc.KIND_RAG)
    assert len(rag_spans) == sum(len(r.answers) for r in runs)
    for run in runs:
        turns = [attrs(s) for s in rag_spans if attrs(s).get(sc.SESSION_ID) == run.session_id]
        assert [t[sc.TURN_INDEX] for t in turns] == list(range(len(run.conversation.turns)))
        assert [t[sc.INPUT_VALUE] for t in turns] == list(run.conversation.turns)
        for t in turns:
            assert t[sc.GEN_AI_CONVERSATION_ID] == run.session_id
            assert t[sc.USER_ID] == run.conversation.user_id
            assert t[sc.EXPECTED_OUTCOME] == run.conversation.expected_outcome
    # Each turn is its own trace.
    assert len({s.context.trace_id for s in rag_spans}) == len(rag_spans)


def test_conversation_must_be_entered_before_asking(recorder: SpanRecorder) -> None:
    chat = Conversation(SupportBot(), "s-1")
    with pytest.raises(RuntimeError, match="context manager"):
        chat.ask("hello there, my camera is offline")
    assert recorder.spans() == []


def test_a_failing_request_is_recorded_and_raised(recorder: SpanRecorder) -> None:
    with pytest.raises(ValueError, match="empty"):
        SupportBot().answer("  ")
    [rag] = recorder.of_kind(sc.KIND_RAG)
    assert not rag.status.is_ok
    assert any(event.name == "exception" for event in rag.events)
