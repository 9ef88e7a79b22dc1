"""Supported matrix: a LangGraph tool-calling agent (``create_react_agent``, the
retriever as a tool, two retrievals per question) with the OpenInference LangChain
instrumentor, exported to a real collector with no config; one request, and a
three-turn thread (one checkpointer thread, one session).

The model is a scripted chat model (no network): for each question it calls the
retriever tool with the question, then with :data:`FOLLOW_UP`, then answers
:func:`conftest.answer_for` followed by :data:`SLIP`, a claim the retrieved kb_eiffel
contradicts (1899, not 1889).  So the true answer scores faithfulness 1/2 offline, while
the question taken for the answer (what the collector did before issue 29) scores 1.0:
the generation cells tell the two apart.  The keyword retriever (:func:`_matrix.rank`) returns, for
"What is the capital of France?", kb_paris and kb_berlin, then for "Paris landmarks"
kb_paris and kb_eiffel (one shared word each; ties keep corpus order).  So the case
retrieves kb_paris, kb_berlin, kb_paris, kb_eiffel: id_context_recall 1/1 = 1.0 and
id_context_precision 1/3 (three distinct ids, one a reference id).

LangGraph's root span records the whole thread state as output (``{"messages": [...]}``
with every earlier turn, each message as ``{"type": ..., "data": {...}}``): the answer
is the last AI message of the last turn, the question the last user message.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.e2e.test_instrumentors import openinference_langchain
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.frameworks._matrix import (
    ANSWER_METRICS,
    CASE_METRICS,
    KB,
    QUESTIONS,
    TURN_METRICS,
    Retrieved,
    assert_conversation_scored,
    assert_generation_scored,
    assert_ids_scored,
    assert_text_metrics_scored,
    converse,
    matrix_collector,
    only_case,
    provider,
    rank,
    tops,
    wait_scored,
)
from tests.frameworks.conftest import answer_for

__all__ = ["openinference_langchain"]

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

QUESTION = QUESTIONS[0]
#: The agent's second search, after the question itself.
FOLLOW_UP = "Paris landmarks"
EXPECTED_PRECISION = 1 / 3
#: A wrong claim at the end of every answer (the context says 1889).
SLIP = " The Eiffel Tower was completed in 1899."


def _agent() -> tuple[Any, list[list[Any]]]:
    """The agent, and the documents each retriever call returned (in call order)."""
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.tools import create_retriever_tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.prebuilt import create_react_agent

    documents = {i: Document(id=i, page_content=t) for i, t in KB.items()}
    calls: list[list[Any]] = []

    class KeywordRetriever(BaseRetriever):
        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            calls.append([documents[i] for i in rank(query)])
            return calls[-1]

    class ScriptedModel(BaseChatModel):
        """Searches for the question, then for FOLLOW_UP, then answers."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            turn: list[BaseMessage] = []
            for message in reversed(messages):
                if isinstance(message, HumanMessage):
                    question = str(message.content)
                    break
                turn.append(message)
            searched = sum(isinstance(m, ToolMessage) for m in turn)
            if searched < 2:
                query = question if searched == 0 else FOLLOW_UP
                call = {
                    "name": "search_kb",
                    "args": {"query": query},
                    "id": f"call_{uuid.uuid4().hex[:8]}",
                }
                reply = AIMessage(content="", tool_calls=[call])
            else:
                reply = AIMessage(content=answer_for(question) + SLIP)
            return ChatResult(generations=[ChatGeneration(message=reply)])

    tool = create_retriever_tool(KeywordRetriever(), "search_kb", "Search the knowledge base.")
    return create_react_agent(ScriptedModel(), [tool], checkpointer=InMemorySaver()), calls


def _ask(agent: Any, calls: list[list[Any]], question: str, thread: str) -> Retrieved:
    before = len(calls)
    state = agent.invoke(
        {"messages": [{"role": "user", "content": question}]},
        {"configurable": {"thread_id": thread}},
    )
    docs = [d for found in calls[before:] for d in found]
    assert len(calls) - before == 2  # two retrievals in this trace
    assert [d.id for d in docs[2:]] == rank(FOLLOW_UP) == ["kb_paris", "kb_eiffel"]
    answer = state["messages"][-1].content
    assert answer == answer_for(question) + SLIP
    return Retrieved([d.id for d in docs], [d.page_content for d in docs], answer)


_METRICS = {name: {} for name in (*CASE_METRICS, *ANSWER_METRICS)}


@pytest.mark.slow
def test_openinference_agent(sink: OtlpSink, tmp_path: Path, openinference_langchain: Any) -> None:
    with matrix_collector(sink, tmp_path, dict(_METRICS)) as serve:
        tp = provider(serve, "langgraph-oi")
        openinference_langchain.instrument(tracer_provider=tp)
        agent, calls = _agent()
        got = _ask(agent, calls, QUESTION, thread=uuid.uuid4().hex)
        tp.shutdown()
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.span.name == "LangGraph"
    assert root.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert got.ids[:2] == ["kb_paris", "kb_berlin"]
    assert_ids_scored(root, precision=EXPECTED_PRECISION)
    assert_text_metrics_scored(root, QUESTION, got)
    assert_generation_scored(root, QUESTION, got)


@pytest.mark.slow
def test_openinference_thread(sink: OtlpSink, tmp_path: Path, openinference_langchain: Any) -> None:
    """Three turns of one checkpointer thread.  The instrumentor writes the thread id as
    ``session.id`` (no ``using_session`` needed); each turn's state holds the earlier
    turns, and each case judges its own question and answer (issue 29: every turn's
    "answer" was turn 1's question)."""
    thread = f"thread-{uuid.uuid4().hex[:8]}"
    metrics: dict[str, dict[str, Any]] = {
        name: {} for name in (*TURN_METRICS, *ANSWER_METRICS, "id_context_recall")
    }
    with matrix_collector(sink, tmp_path, metrics) as serve:
        tp = provider(serve, "langgraph-oi-thread")
        openinference_langchain.instrument(tracer_provider=tp)
        agent, calls = _agent()
        turns = converse(sink, lambda q: _ask(agent, calls, q, thread), tp.force_flush)
        tp.shutdown()
        roots: list[ReceivedSpan] = tops(sink.spans)
    assert len(roots) == len(QUESTIONS)
    assert [r.attributes[semconv.SESSION_ID] for r in roots] == [thread] * 3
    for root, (question, got) in zip(roots, turns, strict=True):
        assert_generation_scored(root, question, got)
    assert_conversation_scored(roots, turns)
