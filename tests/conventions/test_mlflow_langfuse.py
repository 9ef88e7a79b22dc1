"""Case building from MLflow and Langfuse spans, with the attribute values exactly as
the real SDKs export them (captured from mlflow-tracing 3.17.2 and langfuse 5.0.4 into
an OTLP sink; tests/frameworks/test_mlflow.py and test_langfuse.py run the real
packages end to end)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.conventions import CONVENTIONS, langfuse, mlflow
from ragtrace_collector.conventions.base import Role, Unread, unquote
from ragtrace_collector.evaluation.case_builder import build_cases, may_hold_case
from tests.fakes.spans import named_span

QUESTION = "What is the capital of France?"
ANSWER = "Paris is the capital of France."

#: What ``@mlflow.trace(span_type=SpanType.RETRIEVER)`` exports for a function returning
#: MLflow ``Document``s.
MLFLOW_DOCUMENTS = json.dumps(
    [
        {
            "page_content": "Paris is the capital of France and its largest city.",
            "metadata": {"doc_uri": "kb/kb_paris", "chunk_id": "c-1", "score": 0.9},
            "id": "kb_paris",
        },
        {
            "page_content": "Berlin is the capital of Germany.",
            "metadata": {"doc_uri": "kb/kb_berlin"},
            "id": "kb_berlin",
        },
    ]
)
#: What ``@observe(as_type="retriever")`` exports for LangChain ``Document``s.
LANGFUSE_DOCUMENTS = json.dumps(
    [
        {
            "id": "kb_paris",
            "metadata": {"source": "kb/kb_paris"},
            "page_content": "Paris is the capital of France and its largest city.",
            "type": "Document",
        },
        {
            "id": "kb_berlin",
            "metadata": {"source": "kb/kb_berlin"},
            "page_content": "Berlin is the capital of Germany.",
            "type": "Document",
        },
    ]
)


def _trace(
    top: dict[str, Any], retriever: dict[str, Any], llm: dict[str, Any] | None = None
) -> list[trace_pb2.Span]:
    tid = os.urandom(16)
    root = named_span("answer", top, tid=tid)
    spans = [named_span("retrieve", retriever, tid=tid, parent=root, start=1_100)]
    if llm is not None:
        spans.append(named_span("generate", llm, tid=tid, parent=root, start=1_500))
    return [*spans, root]


def _mlflow_trace(
    *, top_type: str = '"UNKNOWN"', output: str = json.dumps(ANSWER), session: str | None = None
) -> list[trace_pb2.Span]:
    top = {
        semconv.MLFLOW_SPAN_TYPE: top_type,
        semconv.MLFLOW_SPAN_INPUTS: json.dumps({"question": QUESTION, "session": session}),
        semconv.MLFLOW_SPAN_OUTPUTS: output,
        "mlflow.traceRequestId": '"tr-dfe471ded3bd2841dde44918bf8675ad"',
    }
    if session is not None:
        top[semconv.SESSION_ID] = json.dumps(session)  # span.set_attribute: JSON-quoted
    retriever = {
        semconv.MLFLOW_SPAN_TYPE: '"RETRIEVER"',
        semconv.MLFLOW_SPAN_INPUTS: json.dumps({"query": QUESTION}),
        semconv.MLFLOW_SPAN_OUTPUTS: MLFLOW_DOCUMENTS,
    }
    llm = {
        semconv.MLFLOW_SPAN_TYPE: '"LLM"',
        semconv.MLFLOW_SPAN_INPUTS: json.dumps({"question": QUESTION, "docs": []}),
        semconv.MLFLOW_SPAN_OUTPUTS: json.dumps(ANSWER),
    }
    return _trace(top, retriever, llm)


def _langfuse_trace(
    *,
    top_type: str = "span",
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    output: str = ANSWER,
    session: str | None = None,
) -> list[trace_pb2.Span]:
    recorded = json.dumps({"args": [QUESTION] if args is None else args, "kwargs": kwargs or {}})
    extra = {semconv.SESSION_ID: session} if session is not None else {}
    top = {
        "langfuse.internal.is_app_root": True,
        semconv.LANGFUSE_OBSERVATION_INPUT: recorded,
        semconv.LANGFUSE_OBSERVATION_TYPE: top_type,
        semconv.LANGFUSE_OBSERVATION_OUTPUT: output,
        **extra,
    }
    retriever = {
        semconv.LANGFUSE_OBSERVATION_INPUT: recorded,
        semconv.LANGFUSE_OBSERVATION_TYPE: "retriever",
        semconv.LANGFUSE_OBSERVATION_OUTPUT: LANGFUSE_DOCUMENTS,
        **extra,
    }
    llm = {
        semconv.LANGFUSE_OBSERVATION_INPUT: json.dumps({"args": [QUESTION, []], "kwargs": {}}),
        semconv.LANGFUSE_OBSERVATION_TYPE: "generation",
        semconv.LANGFUSE_OBSERVATION_OUTPUT: ANSWER,
        **extra,
    }
    return _trace(top, retriever, llm)


def test_both_are_registered_after_the_others() -> None:
    names = [c.name for c in CONVENTIONS]
    assert names[-2:] == ["mlflow", "langfuse"]


# ------------------------------------------------------------------------ MLflow
def test_mlflow_case_from_the_top_span() -> None:
    spans = _mlflow_trace(session="s-1")
    [built] = build_cases(spans, service_of=lambda s: "svc")
    assert built.span is spans[-1]
    assert built.convention == "mlflow"
    case = built.case
    assert case.input == QUESTION
    assert case.actual_output == ANSWER  # unquoted, not '"Paris is ..."'
    assert case.retrieved_context_ids == ["kb_paris", "kb_berlin"]
    context = case.retrieval_context or []
    assert [c.content for c in context] == [
        "Paris is the capital of France and its largest city.",
        "Berlin is the capital of Germany.",
    ]
    assert context[0].metadata["doc_uri"] == "kb/kb_paris"
    assert context[0].score == 0.9  # MLflow's Document has no score: the metadata's
    assert built.session_id == "s-1"  # unquoted


@pytest.mark.parametrize(
    ("span_type", "role"),
    [
        ('"RETRIEVER"', Role.RETRIEVER),
        ('"RERANKER"', Role.RERANKER),
        ('"CHAIN"', Role.ROOT),
        ('"AGENT"', Role.ROOT),
        ('"UNKNOWN"', Role.ROOT),
        ('"LLM"', Role.ROOT),
        ('"TOOL"', None),
        ('"EMBEDDING"', None),
    ],
)
def test_mlflow_roles(span_type: str, role: Role | None) -> None:
    assert mlflow.role(trace_pb2.Span(), {semconv.MLFLOW_SPAN_TYPE: span_type}) is role


def test_mlflow_answer_that_is_json_without_text_is_no_answer() -> None:
    """A JSON output with no answer in it is not the answer (never judged as JSON)."""
    output = json.dumps({"sources": ["kb_paris"], "n": 2})
    [built] = build_cases(_mlflow_trace(output=output))
    assert built.case.actual_output is None
    [built] = build_cases(_mlflow_trace(output=json.dumps({"answer": ANSWER, "n": 2})))
    assert built.case.actual_output == ANSWER


def test_mlflow_quoted_question() -> None:
    """``mlflow.langchain.autolog()`` records a chain called with a string as that
    string, JSON-quoted."""
    attrs = {semconv.MLFLOW_SPAN_INPUTS: json.dumps(QUESTION)}
    assert mlflow.question(attrs) == QUESTION
    assert mlflow.retrieval_query(attrs) == QUESTION


def test_mlflow_trace_without_retriever_is_not_decoded() -> None:
    spans = _mlflow_trace()
    assert may_hold_case(spans)
    without = [s for s in spans if s.name != "retrieve"]
    assert not may_hold_case(without)
    assert build_cases(without) == []


# ---------------------------------------------------------------------- Langfuse
def test_langfuse_case_from_positional_arguments() -> None:
    """``{"args": ["<question>"], "kwargs": {}}`` is read as the question."""
    spans = _langfuse_trace(session="s-2")
    [built] = build_cases(spans, service_of=lambda s: "svc")
    assert built.span is spans[-1]
    assert built.convention == "langfuse"
    case = built.case
    assert case.input == QUESTION
    assert case.actual_output == ANSWER
    assert case.retrieved_context_ids == ["kb_paris", "kb_berlin"]
    assert (case.retrieval_context or [])[1].metadata == {"source": "kb/kb_berlin"}
    assert built.session_id == "s-2"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ([], {"question": QUESTION}),
        ([], {"q": QUESTION}),  # the one text argument
        ([3, QUESTION], {}),  # the first text argument, not the number
        ([QUESTION, [{"id": "kb_paris"}]], {}),
        ([{"messages": [{"role": "user", "content": QUESTION}]}], {}),
    ],
)
def test_langfuse_call_arguments(args: list[Any], kwargs: dict[str, Any]) -> None:
    recorded = json.dumps({"args": args, "kwargs": kwargs})
    assert langfuse.question({semconv.LANGFUSE_OBSERVATION_INPUT: recorded}) == QUESTION


def test_langfuse_arguments_without_text_are_no_question() -> None:
    """No argument holds text (a number, an object of numbers, an embedding), on the case
    span nor on the retriever: the case has no input, so the metrics that need one are
    skipped, never judged on the recorded JSON."""
    [built] = build_cases(_langfuse_trace(args=[7, {"vector": [0.1, 0.2]}, [0.3, 0.4]]))
    assert built.case.input is None
    assert built.case.actual_output == ANSWER


def test_langfuse_and_mlflow_say_what_they_found_instead_of_text() -> None:
    """A question or an answer that is JSON holding no text is reported as what it
    holds, so the metrics that need it are skipped with that reason (was: no reason at
    all from these two conventions)."""
    [built] = build_cases(
        _langfuse_trace(args=[[0.1, 0.2]], output=json.dumps({"ids": [1, 2], "n": 2}))
    )
    assert built.case.input is None
    assert built.case.actual_output is None
    assert "a call's arguments (1 positional, 0 of them text" in (built.case.input_unreadable or "")
    assert "a JSON object with keys ids, n" in (built.case.output_unreadable or "")
    assert mlflow.answer({semconv.MLFLOW_SPAN_OUTPUTS: json.dumps({"ids": [1]})}) == Unread(
        "a JSON object with keys ids"
    )


def test_langfuse_plain_and_json_inputs() -> None:
    assert langfuse.question({semconv.LANGFUSE_OBSERVATION_INPUT: QUESTION}) == QUESTION
    value = json.dumps({"query": QUESTION})
    assert langfuse.question({semconv.LANGFUSE_OBSERVATION_INPUT: value}) == QUESTION


@pytest.mark.parametrize(
    ("top_type", "cases"), [("span", 1), ("agent", 1), ("chain", 1), ("generation", 1), ("tool", 0)]
)
def test_langfuse_roots(top_type: str, cases: int) -> None:
    assert len(build_cases(_langfuse_trace(top_type=top_type))) == cases


def test_langfuse_trace_without_retriever_is_not_decoded() -> None:
    spans = _langfuse_trace()
    without = [s for s in spans if s.name != "retrieve"]
    assert may_hold_case(spans)
    assert not may_hold_case(without)


def test_unquote() -> None:
    assert unquote('"RETRIEVER"') == "RETRIEVER"
    assert unquote('"a \\"b\\""') == 'a "b"'
    assert unquote("plain") == "plain"
    assert unquote('"not json') == '"not json'
    assert unquote('"1" and "2"') == '"1" and "2"'  # not one JSON string
    assert unquote(None) is None
    assert unquote(3) == 3


def test_mlflow_doc_uri_is_compared_when_configured() -> None:
    """MLflow's retrieval evaluation names documents by ``metadata.doc_uri``: with no
    ``Document.id``, ``cases.document_id: [metadata.doc_uri]`` compares it."""
    from ragtrace_collector.evaluation.case_builder import CaseRules, CasesConfig

    docs = json.loads(MLFLOW_DOCUMENTS)
    for doc in docs:
        doc["id"] = None  # what MLflow writes for a Document made without an id
        doc["metadata"].pop("chunk_id", None)
    spans = _mlflow_trace()
    spans[0].attributes[2].value.string_value = json.dumps(docs)
    assert spans[0].attributes[2].key == semconv.MLFLOW_SPAN_OUTPUTS
    [built] = build_cases(spans)
    assert built.case.retrieved_context_ids is None  # no id of a kind read by default
    rules = CaseRules(CasesConfig(document_id=["metadata.doc_uri"]))
    [built] = build_cases(spans, rules=rules)
    assert built.case.retrieved_context_ids == ["kb/kb_paris", "kb/kb_berlin"]
