"""Supported matrix: Langfuse's Python SDK (OTel-based, v3 on), ``@observe`` with
``as_type="retriever"`` on the app's retriever, exported by Langfuse itself to a real
collector with no config (``LANGFUSE_BASE_URL`` = the collector,
``LANGFUSE_OTEL_TRACES_EXPORT_PATH=v1/traces``).

The app (tests/frameworks/_tracing_apps.py, a process of its own) retrieves with the
corpus's keyword rule and returns LangChain ``Document(page_content, metadata, id=...)``:
top 2 of "What is the capital of France?" is kb_paris, kb_berlin, so
id_context_recall = 1/1 = 1.0 and id_context_precision = 1/2 = 0.5.  Its top function
is a plain ``@observe()`` (type ``span``); called with the question as a positional
argument, Langfuse records its input as ``{"args": ["..."], "kwargs": {}}``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.e2e._support import JudgeServer, Serve, flat
from tests.fakes.otlp_sink import OtlpSink
from tests.frameworks._matrix import (
    ANSWER_METRICS,
    CASE_METRICS,
    QUESTIONS,
    TURN_METRICS,
    assert_answer_metrics_scored,
    assert_conversation_scored,
    assert_ids_scored,
    assert_text_metrics_scored,
    converse,
    matrix_collector,
    only_case,
    tops,
    wait_scored,
)
from tests.frameworks._tracing_apps import AppProcess

pytestmark = [pytest.mark.slow]

QUESTION = QUESTIONS[0]


def langfuse_env(serve: Serve, service: str) -> dict[str, str]:
    """The settings that make Langfuse export to the collector."""
    return {
        "LANGFUSE_BASE_URL": serve.http_url,
        "LANGFUSE_OTEL_TRACES_EXPORT_PATH": "v1/traces",
        # Required by the SDK to export at all; the collector does not check them.
        "LANGFUSE_PUBLIC_KEY": "pk-lf-local",
        "LANGFUSE_SECRET_KEY": "sk-lf-local",
        "OTEL_SERVICE_NAME": service,
    }


def langfuse_app(
    serve: Serve, service: str, llm: JudgeServer, which: str = "langfuse"
) -> AppProcess:
    """The app ``which`` in a process of its own, exporting to ``serve`` (a context
    manager: closed on leaving)."""
    return AppProcess(which, langfuse_env(serve, service), llm.base_url)


@pytest.mark.parametrize("positional", [True, False], ids=["positional", "keyword"])
def test_langfuse_retriever(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer, positional: bool
) -> None:
    """The top observation is the case: the question from its recorded arguments
    (positional or keyword), documents (id, content, metadata) from the retriever's
    ``langfuse.observation.output``, so the reference store finds the ground truth."""
    metrics: dict[str, dict[str, Any]] = {m: {} for m in (*CASE_METRICS, *ANSWER_METRICS)}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        with langfuse_app(serve, "langfuse-rag", llm_server) as app:
            got = app.ask(QUESTION, positional=positional)
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.span.name == "answer"
    recorded = root.attributes[semconv.LANGFUSE_OBSERVATION_INPUT]
    assert recorded.startswith('{"args": ["' if positional else '{"args": [], "kwargs": {"')
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)
    assert_answer_metrics_scored(root, QUESTION, got.answer, got.texts)


def test_langfuse_sessions(sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer) -> None:
    """``propagate_attributes(session_id=...)``: ``session.id`` on every observation,
    three turns."""
    session = f"langfuse-{uuid.uuid4().hex[:8]}"
    metrics: dict[str, dict[str, Any]] = {name: {} for name in (*TURN_METRICS, "id_context_recall")}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        with langfuse_app(serve, "langfuse-chat", llm_server) as app:
            turns = converse(sink, lambda q: app.ask(q, session=session))
        roots = tops(sink.spans)
    assert [r.attributes[semconv.SESSION_ID] for r in roots] == [session] * 3
    assert_conversation_scored(roots, turns)


def test_langfuse_question_not_recorded(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer
) -> None:
    """The request carries only the question's embedding (``{"args": [[n, 0.5]]}`` on the
    case span, ``{"args": [[n, 0.5], 2]}`` on the retriever): there is no question to
    read, so the metrics that need one are skipped, never judged on the recorded JSON;
    without a question the reference store is not asked, so the id metrics are skipped
    for want of ground truth while the answer metric that needs no question is scored."""
    metrics: dict[str, dict[str, Any]] = {
        m: {} for m in ("contextual_relevancy", "faithfulness", "id_context_recall")
    }
    with matrix_collector(sink, tmp_path, metrics) as serve:
        with langfuse_app(serve, "langfuse-embedded", llm_server) as app:
            got = app.ask(QUESTION, embedded=True)
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.attributes[semconv.LANGFUSE_OBSERVATION_INPUT].startswith('{"args": [[')
    for name in ("contextual_relevancy", "id_context_recall"):
        assert flat(root, name, semconv.EVAL_FIELD_SCORE) is None, name
        assert flat(root, name, semconv.EVAL_FIELD_SKIPPED) is True, name
    reason = flat(root, "contextual_relevancy", semconv.EVAL_FIELD_REASON)
    assert isinstance(reason, str)
    # The reason says what was recorded instead of a question, and the setting that
    # reads one.
    assert "no input: the question recorded is a call's arguments (1 positional, 0 of" in (
        reason
    ), reason
    assert "cases.question_attribute" in reason, reason
    assert_answer_metrics_scored(root, None, got.answer, got.texts, names=("faithfulness",))


def test_langfuse_langchain_handler(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer
) -> None:
    """An LCEL chain traced by ``langfuse.langchain.CallbackHandler``: the chain
    observations (``RunnableSequence`` on top) and the ``retriever`` observation whose
    output is the LangChain documents, ``Document.id`` kept."""
    metrics: dict[str, dict[str, Any]] = {m: {} for m in (*CASE_METRICS, *ANSWER_METRICS)}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        with langfuse_app(serve, "langfuse-lcel", llm_server, "langfuse-langchain") as app:
            got = app.ask(QUESTION)
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.span.name == "RunnableSequence"
    assert root.attributes[semconv.LANGFUSE_OBSERVATION_TYPE] == "chain"
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)
    assert_answer_metrics_scored(root, QUESTION, got.answer, got.texts)
