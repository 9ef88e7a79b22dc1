"""Supported matrix: MLflow tracing (``mlflow-tracing``), ``@mlflow.trace`` with
``span_type=SpanType.RETRIEVER`` on the app's retriever, exported over OTLP by MLflow
itself (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``..._PROTOCOL=http/protobuf``) to a
real collector with no config.

The app (tests/frameworks/_tracing_apps.py, a process of its own) retrieves with the
corpus's keyword rule and returns MLflow ``Document(page_content, metadata, id=...)``:
top 2 of "What is the capital of France?" is kb_paris, kb_berlin, so
id_context_recall = 1/1 = 1.0 and id_context_precision = 1/2 = 0.5.  Its top function
is ``@mlflow.trace`` with no span type (``"UNKNOWN"``), its answer a JSON-quoted string.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.e2e._support import JudgeServer, Serve
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


def mlflow_env(serve: Serve, service: str) -> dict[str, str]:
    """The settings that make MLflow export over OTLP to the collector."""
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{serve.http_url}/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": service,
        # mlflow-tracing 3.17 resolves its default tracking store on first use, which
        # imports a module it does not ship (sqlparse): any URI that is not Databricks'
        # avoids it; with the OTLP endpoint set, nothing is sent there.
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:9",
        # MLflow sends usage telemetry to its own servers unless told not to: a test
        # reaches no network.
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }


def mlflow_app(serve: Serve, service: str, llm: JudgeServer, which: str = "mlflow") -> AppProcess:
    """The app ``which`` in a process of its own, exporting to ``serve`` (a context
    manager: closed on leaving)."""
    return AppProcess(which, mlflow_env(serve, service), llm.base_url)


def test_mlflow_retriever(sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer) -> None:
    """The top ``@mlflow.trace`` span is the case: question from its bound arguments,
    documents (id, content, metadata) from the retriever's ``mlflow.spanOutputs``, the
    answer unquoted."""
    metrics: dict[str, dict[str, Any]] = {m: {} for m in (*CASE_METRICS, *ANSWER_METRICS)}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        with mlflow_app(serve, "mlflow-rag", llm_server) as app:
            got = app.ask(QUESTION)
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.span.name == "answer"
    assert root.attributes[semconv.MLFLOW_SPAN_TYPE] == '"UNKNOWN"'
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)
    assert got.answer == "Paris is the capital of France."
    assert_answer_metrics_scored(root, QUESTION, got.answer, got.texts)


def test_mlflow_conversation(sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer) -> None:
    """``session.id`` set on the top span (JSON-quoted by MLflow): three turns."""
    session = f"mlflow-{uuid.uuid4().hex[:8]}"
    metrics: dict[str, dict[str, Any]] = {name: {} for name in (*TURN_METRICS, "id_context_recall")}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        with mlflow_app(serve, "mlflow-chat", llm_server) as app:
            turns = converse(sink, lambda q: app.ask(q, session=session))
        roots = tops(sink.spans)
    assert [r.attributes[semconv.SESSION_ID] for r in roots] == [f'"{session}"'] * 3
    assert_conversation_scored(roots, turns)


def test_mlflow_langchain_autolog(sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer) -> None:
    """An LCEL chain traced by ``mlflow.langchain.autolog()``: ``"CHAIN"`` spans
    (``RunnableSequence`` on top, its question a JSON-quoted string) and the
    ``"RETRIEVER"`` span whose outputs are the LangChain documents, ``Document.id`` kept."""
    metrics: dict[str, dict[str, Any]] = {m: {} for m in (*CASE_METRICS, *ANSWER_METRICS)}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        with mlflow_app(serve, "mlflow-lcel", llm_server, "mlflow-langchain") as app:
            got = app.ask(QUESTION)
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.span.name == "RunnableSequence"
    assert root.attributes[semconv.MLFLOW_SPAN_INPUTS] == f'"{QUESTION}"'
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)
    assert_answer_metrics_scored(root, QUESTION, got.answer, got.texts)
