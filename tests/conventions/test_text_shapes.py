"""The question and the answer read as a person reads them (issue 29, item 2), from
real framework objects serialised the way their instrumentors serialise them:

* LangChain / LangGraph messages through the OpenInference LangChain instrumentor's own
  encoder (``message_to_dict``: ``{"type": "ai", "data": {...}}``) and through
  ``langchain_core.load.dumpd`` (``{"lc": 1, "type": "constructor", ...}``, what it
  writes for an LLM span's messages);
* Haystack ``GeneratedAnswer`` and ``ChatMessage`` objects through the OpenInference
  Haystack instrumentor's ``safe_json_dumps`` (their reprs), and ``to_dict``;
* JSON-quoted strings and recorded calls (``{"args": [...], "kwargs": {...}}``).

A value that holds no text reads as :class:`Unread` with what was found, never as the
JSON, and never as the other side's text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("haystack")

from haystack import Document as HaystackDocument
from haystack.dataclasses import ChatMessage, GeneratedAnswer, ToolCall
from langchain_core.load import dumpd
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from openinference.instrumentation import safe_json_dumps
from openinference.instrumentation.langchain._tracer import (
    _json_dumps as langchain_json,
)

from ragtrace import semconv
from ragtrace_collector.conventions import openinference, openllmetry
from ragtrace_collector.conventions.base import Unread
from ragtrace_collector.conventions.text import read_answer, read_question

Q1, A1 = "What is the capital of France?", "Paris is the capital of France."
Q2, A2 = "And of Germany?", "Berlin is the capital of Germany."
TOOL_TEXT = "Paris is the capital of France.\n\nBerlin is the capital of Germany."


def _call(n: int) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": "search_kb", "args": {"query": "capital"}, "id": f"call_{n}"}],
    )


def _tool(n: int) -> ToolMessage:
    return ToolMessage(content=TOOL_TEXT, tool_call_id=f"call_{n}", name="search_kb")


#: A LangGraph ReAct agent's state after two turns of one thread, two retrievals a turn.
THREAD = [
    HumanMessage(Q1), _call(0), _tool(0), _call(1), _tool(1), AIMessage(A1),
    HumanMessage(Q2), _call(2), _tool(2), AIMessage(A2),
]  # fmt: skip


def _state(messages: list[Any]) -> str:
    """A LangGraph state as the OpenInference instrumentor writes it (output.value)."""
    return langchain_json({"messages": messages})


# ------------------------------------------------------------------ LangChain / LangGraph
def test_langgraph_state_answer_is_the_last_ai_text_of_the_last_turn() -> None:
    value = _state(THREAD)
    assert '"type": "ai", "data": {' in value  # the shape of issue 29
    assert read_answer(value) == A2
    assert read_question(value) == Q2
    assert read_answer(_state(THREAD[:6])) == A1


def test_langgraph_turn_in_progress_has_no_answer_not_the_question() -> None:
    """Turn 2 ended on a tool call: no answer, and never turn 1's (or the question)."""
    for messages in (THREAD[:7], THREAD[:8], THREAD[:9]):
        got = read_answer(_state(messages))
        assert isinstance(got, Unread), got
    assert read_answer(_state(THREAD[:8])) == Unread(
        '{"messages": ...} holding 8 messages whose last AI message calls a tool (no answer text)'
    )
    assert read_answer(_state(THREAD[:7])) == Unread(
        '{"messages": ...} holding 7 messages with no AI message after the last user message'
    )


def test_a_single_serialised_message() -> None:
    ai = langchain_json(AIMessage(A1))
    assert json.loads(ai)["type"] == "ai"
    assert read_answer(ai) == A1
    assert isinstance(read_question(ai), Unread)
    human = langchain_json(HumanMessage(Q1))
    assert read_question(human) == Q1
    assert read_answer(human) == Unread("a user message, not an AI message")
    assert read_answer(langchain_json(_call(0))) == Unread(
        "an AI message that calls a tool (no answer text)"
    )


def test_lc_constructor_messages() -> None:
    """``dumpd``: the form of an LLM span's input messages and its generations."""
    messages = [dumpd(m) for m in (SystemMessage("Be brief."), HumanMessage(Q1))]
    assert messages[1]["id"][-1] == "HumanMessage"
    assert read_question(json.dumps({"messages": [messages]})) == Q1
    generation = {"generations": [[{"text": A1, "message": dumpd(AIMessage(A1))}]]}
    assert read_answer(json.dumps(generation)) == A1
    calling = {"generations": [[{"text": "", "message": dumpd(_call(0))}]]}
    assert isinstance(read_answer(json.dumps(calling)), Unread)


def test_langgraph_input_in_openai_form() -> None:
    value = json.dumps({"messages": [{"role": "user", "content": Q1}]})
    assert read_question(value) == Q1
    assert isinstance(read_answer(value), Unread)


def test_openinference_reads_the_langgraph_root_span() -> None:
    attrs = {
        semconv.INPUT_VALUE: json.dumps({"messages": [{"role": "user", "content": Q2}]}),
        semconv.INPUT_MIME_TYPE: semconv.MIME_JSON,
        semconv.OUTPUT_VALUE: _state(THREAD),
        semconv.OUTPUT_MIME_TYPE: semconv.MIME_JSON,
    }
    assert openinference.question(attrs) == Q2
    assert openinference.answer(attrs) == A2


# ------------------------------------------------------------------ Haystack
def _answer(data: str | None = A1) -> GeneratedAnswer:
    docs = [HaystackDocument(id="kb_paris", content=A1)]
    return GeneratedAnswer(
        data=data, query=Q1, documents=docs, meta={"all_messages": [ChatMessage.from_assistant(A1)]}
    )


def test_haystack_answer_builder_output() -> None:
    """What the instrumentor writes for AnswerBuilder and for the pipeline around it."""
    builder = safe_json_dumps({"answers": [_answer()]})
    assert "GeneratedAnswer(data=" in builder  # the repr, with the query and the documents
    assert Q1 in builder
    assert read_answer(builder) == A1
    pipeline = safe_json_dumps({"answer_builder": {"answers": [_answer()]}})
    assert read_answer(pipeline) == A1
    # The generator's replies next to it read the same.
    both = safe_json_dumps(
        {
            "llm": {"replies": [ChatMessage.from_assistant(A1)]},
            "answer_builder": {"answers": [_answer()]},
        }
    )
    assert read_answer(both) == A1


def test_haystack_answer_to_dict_and_quotes() -> None:
    assert read_answer(json.dumps({"answers": [_answer().to_dict()]}, default=str)) == A1
    quoted = 'It\'s "Paris".'
    assert read_answer(safe_json_dumps({"answers": [_answer(quoted)]})) == quoted


def test_haystack_answer_without_data_is_unread() -> None:
    got = read_answer(safe_json_dumps({"answers": [_answer(None)]}))
    assert isinstance(got, Unread)
    assert "answers" in got.found


def test_haystack_tool_call_reply_is_no_answer() -> None:
    reply = ChatMessage.from_assistant(
        tool_calls=[ToolCall(tool_name="search", arguments={"query": "capital"})]
    )
    got = read_answer(safe_json_dumps({"llm": {"replies": [reply]}}))
    assert isinstance(got, Unread), got


# ------------------------------------------------------------------ strings and calls
@pytest.mark.parametrize(
    "value", [json.dumps(A1), json.dumps(json.dumps(A1)), f"  {json.dumps(A1)}\n"]
)
def test_json_quoted_strings(value: str) -> None:
    assert read_answer(value) == A1
    assert read_question(value) == A1


def test_traceloop_quoted_output() -> None:
    assert openllmetry.answer({semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps(A1)}) == A1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"args": [Q1], "kwargs": {}}, Q1),
        ({"args": [Q1, 3], "kwargs": {"top_k": 2}}, Q1),
        ({"args": [], "kwargs": {"question": Q1, "session": "s"}}, Q1),
        ({"args": ["ignored"], "kwargs": {"query": Q1}}, Q1),
        ({"args": [], "kwargs": {"q": Q1}}, Q1),  # no text argument: kwargs' only text
        ({"args": [3, Q1], "kwargs": {"session": "s"}}, Q1),  # the text argument first
        ({"args": [{"messages": [{"role": "user", "content": Q1}]}], "kwargs": {}}, Q1),
        ({"args": [[0.1, 0.2], {"question": Q1}]}, Q1),  # an embedding is never read
        ({"query": Q1, "top_k": 2}, Q1),
        ({"question": Q1}, Q1),
        ({"input": Q1, "chat_history": []}, Q1),
    ],
)
def test_argument_maps(value: dict[str, Any], expected: str) -> None:
    assert read_question(json.dumps(value)) == expected


def test_argument_maps_without_one_text_are_unread() -> None:
    got = read_question(json.dumps({"args": ["a", "b"], "kwargs": {}}))
    assert got == Unread(
        "a call's arguments (2 positional, 2 of them text, and no question keyword)"
    )
    assert isinstance(read_answer(json.dumps({"args": [A1], "kwargs": {}})), Unread)


def test_unknown_objects_say_what_they_hold() -> None:
    got = read_answer(json.dumps({"a": 1, "b": [2], "c": {"d": 3}}))
    assert got == Unread("a JSON object with keys a, b, c")
    assert read_answer("Plain text {not json") == "Plain text {not json"
    assert read_answer("") is None
    assert read_answer(None) is None


# ------------------------------------------------------------------ the guarantee
def _strategy() -> Any:
    from hypothesis import strategies as st

    kinds = st.sampled_from(("human", "ai", "ai_call", "tool", "system"))
    return st.lists(kinds, min_size=1, max_size=12)


def _build(kinds: list[str]) -> list[Any]:
    out: list[Any] = []
    for n, kind in enumerate(kinds):
        text = f"{kind} text {n}."
        if kind == "human":
            out.append(HumanMessage(text))
        elif kind == "ai":
            out.append(AIMessage(text))
        elif kind == "ai_call":
            out.append(_call(n))
        elif kind == "tool":
            out.append(ToolMessage(text, tool_call_id=f"call_{n}"))
        else:
            out.append(SystemMessage(text))
    return out


def test_the_answer_is_never_another_turn_or_role() -> None:
    """Any sequence of messages, as a LangGraph state or a bare list: the answer is the
    text of the last AI message after the last user message (if that one calls no
    tool), else nothing; the question is the last user message's text."""
    from hypothesis import given, settings

    @settings(max_examples=200, deadline=None)
    @given(_strategy())
    def check(kinds: list[str]) -> None:
        messages = _build(kinds)
        users = [i for i, k in enumerate(kinds) if k == "human"]
        after = kinds[users[-1] + 1 :] if users else kinds
        ais = [i for i, k in enumerate(after) if k in ("ai", "ai_call")]
        expected = None
        if ais and after[ais[-1]] == "ai":
            expected = messages[len(kinds) - len(after) + ais[-1]].content
        question = messages[users[-1]].content if users else None
        for value in (_state(messages), langchain_json(messages)):
            got = read_answer(value)
            assert (got if isinstance(got, str) else None) == expected, (kinds, got)
            asked = read_question(value)
            assert (asked if isinstance(asked, str) else None) == question, (kinds, asked)

    check()
