"""What a scored case span says was judged (issue 29, item 2): the question and the
answer as read from the span go on it as ``ragtrace.eval.input`` / ``.output``, cut at
``enrichment.max_text_chars``; an answer that cannot be read as text skips the metrics
that need it, with what was found, and is never replaced by the question."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.evaluation.enrichment import EnrichmentConfig
from ragtrace_collector.metrics import MetricOptions
from ragtrace_collector.otlp.codec import SpanGroup
from tests.e2e._instrumented import offline_scores
from tests.evaluation.test_evaluator import _evaluator, _Forwarded, _rag_attrs, _resource
from tests.fakes.spans import make_span

pytest.importorskip("langchain_core")
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from openinference.instrumentation.langchain._tracer import (
    _json_dumps as langchain_json,
)
from opentelemetry.proto.common.v1 import common_pb2

Q1, A1 = "How do I reset my password?", "Open Settings and choose Reset password."
Q2, A2 = "Where are my refunds?", "Card refunds are issued within five days."
DOCS = [
    ("kb_reset", "To reset your password, open Settings and choose Reset password."),
    ("kb_refunds", "Card refunds are issued within five days of the return."),
]
GENERATION = ("answer_relevancy", "faithfulness")


def _call(n: int) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": "search_kb", "args": {"query": "q"}, "id": f"c{n}"}]
    )


def _trace(question: str, output: str, service: str = "graph-bot") -> AssembledTrace:
    """A case span recording a LangGraph run as the OpenInference instrumentor does."""
    tid = os.urandom(16)
    attrs: dict[str, Any] = {
        semconv.INPUT_VALUE: json.dumps({"messages": [{"role": "user", "content": question}]}),
        semconv.INPUT_MIME_TYPE: semconv.MIME_JSON,
        semconv.OUTPUT_VALUE: output,
        semconv.OUTPUT_MIME_TYPE: semconv.MIME_JSON,
    }
    rag = make_span(tid, "rag", attrs=attrs)
    ret = make_span(tid, "retriever", parent=rag, docs=DOCS)
    group = SpanGroup(_resource(service), "", common_pb2.InstrumentationScope(), "", [rag, ret])
    now = time.monotonic()
    return AssembledTrace(tid, [group], ReleaseReason.READY, now, now, True)


def _thread(second_turn_answered: bool) -> str:
    messages = [HumanMessage(Q1), _call(0), ToolMessage("...", tool_call_id="c0"), AIMessage(A1)]
    messages += [HumanMessage(Q2), _call(1), ToolMessage("...", tool_call_id="c1")]
    if second_turn_answered:
        messages.append(AIMessage(A2))
    return langchain_json({"messages": messages})


async def _score(
    trace: AssembledTrace, enrichment: EnrichmentConfig | None = None
) -> dict[str, Any]:
    ev = _evaluator(metrics={m: MetricOptions() for m in GENERATION}, enrichment=enrichment)
    ev.start()
    fwd = _Forwarded()
    ev.submit(trace, fwd)
    await fwd.wait_for(1)
    await ev.drain()
    return _rag_attrs(fwd.traces[0])


async def test_the_judged_text_is_on_the_span_and_scores_as_offline() -> None:
    attrs = await _score(_trace(Q2, _thread(second_turn_answered=True)))
    assert attrs[semconv.EVAL_INPUT] == Q2
    assert attrs[semconv.EVAL_OUTPUT] == A2
    case = RAGCase(
        input=Q2, actual_output=A2, retrieval_context=[ContextItem(content=t) for _, t in DOCS]
    )
    expected = await asyncio.to_thread(offline_scores, case, GENERATION)
    for name, score in expected.items():
        assert attrs[semconv.eval_attr(name, semconv.EVAL_FIELD_SCORE)] == pytest.approx(score)


async def test_an_answer_that_is_a_tool_call_is_skipped_never_the_question() -> None:
    attrs = await _score(_trace(Q2, _thread(second_turn_answered=False)))
    assert attrs[semconv.EVAL_INPUT] == Q2
    assert semconv.EVAL_OUTPUT not in attrs
    for name in GENERATION:
        assert attrs.get(semconv.eval_attr(name, semconv.EVAL_FIELD_SCORE)) is None
        assert attrs[semconv.eval_attr(name, semconv.EVAL_FIELD_SKIPPED)] is True
        reason = attrs[semconv.eval_attr(name, semconv.EVAL_FIELD_REASON)]
        assert "no actual_output: the answer recorded is" in reason
        assert "last AI message calls a tool" in reason
        assert "cases.answer_attribute" in reason


async def test_an_answer_that_is_json_says_which_keys() -> None:
    output = json.dumps({"status": "ok", "tokens": 12, "trace": {"steps": 3}})
    attrs = await _score(_trace(Q1, output))
    reason = attrs[semconv.eval_attr("faithfulness", semconv.EVAL_FIELD_REASON)]
    assert "a JSON object with keys status, tokens, trace" in reason
    assert semconv.EVAL_OUTPUT not in attrs


async def test_the_judged_text_is_cut_at_max_text_chars() -> None:
    long_answer = "Card refunds are issued within five days. " * 20
    output = langchain_json({"messages": [HumanMessage(Q2), AIMessage(long_answer)]})
    attrs = await _score(_trace(Q2, output), EnrichmentConfig(max_text_chars=40))
    assert attrs[semconv.EVAL_OUTPUT] == long_answer[:39] + "…"
    assert attrs[semconv.EVAL_INPUT] == Q2
    attrs = await _score(_trace(Q2, output), EnrichmentConfig(max_text_chars=0))
    assert semconv.EVAL_OUTPUT not in attrs
    assert semconv.EVAL_INPUT not in attrs
