"""Supported matrix: OpenLLMetry's own SDK, traceloop-sdk (``Traceloop.init`` with its
LangChain instrumentation, ``@workflow`` and ``@task``), exporting over OTLP/HTTP to
``TRACELOOP_BASE_URL`` (the collector) with no config.

The app (tests/frameworks/_tracing_apps.py, a process of its own) runs ``@workflow
answer`` → ``@task retrieve`` (a LangChain retriever whose documents carry their id
only as ``Document.id``) → the loopback LLM.  The LangChain instrumentation writes the
retriever's documents without that id; the task's ``traceloop.entity.output`` (the
SDK's JSON encoder: ``Document.to_json()``) keeps it as ``kwargs.id``.  Top 2 of "What
is the capital of France?" is kb_paris, kb_berlin: id_context_recall = 1/1 = 1.0 and
id_context_precision = 1/2 = 0.5.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.e2e._support import JudgeServer, Serve
from tests.fakes.otlp_sink import OtlpSink
from tests.frameworks._matrix import (
    QUESTIONS,
    assert_ids_scored,
    assert_ids_skipped,
    assert_text_metrics_scored,
    matrix_collector,
    only_case,
    wait_scored,
)
from tests.frameworks._tracing_apps import AppProcess

pytestmark = [pytest.mark.slow]

QUESTION = QUESTIONS[0]


def traceloop_env(serve: Serve, service: str) -> dict[str, str]:
    """The settings that make traceloop-sdk export to the collector and nowhere else."""
    return {
        "TRACELOOP_BASE_URL": serve.http_url,
        "OTEL_SERVICE_NAME": service,
        # The SDK also sends metrics to the same endpoint, and usage telemetry to its
        # vendor, unless told not to: a test reaches no network.
        "TRACELOOP_METRICS_ENABLED": "false",
        "TRACELOOP_TELEMETRY": "false",
    }


@contextmanager
def traceloop_app(serve: Serve, service: str, llm: JudgeServer) -> Iterator[AppProcess]:
    app = AppProcess("traceloop", traceloop_env(serve, service), llm.base_url)
    try:
        yield app
    finally:
        app.close()


def test_traceloop_task_gives_the_document_ids(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer
) -> None:
    """The workflow span is the case; the retriever span's documents get their ids from
    the task's entity output, so the id metrics score the hand-computed values."""
    with matrix_collector(sink, tmp_path) as serve:
        with traceloop_app(serve, "traceloop-rag", llm_server) as app:
            got = app.ask(QUESTION)
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.span.name == "answer.workflow"
    assert root.attributes[semconv.TRACELOOP_SPAN_KIND] == "workflow"
    task = [s for s in spans if s.span.name == "retrieve.task"]
    assert len(task) == 1
    assert '"id": "kb_paris"' in task[0].attributes[semconv.TRACELOOP_ENTITY_OUTPUT]
    assert_ids_scored(root)
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"
    assert_text_metrics_scored(root, QUESTION, got)


#: The rule the skip reason of the next test names, as a user writes it.
_TASK_RULE: dict[str, Any] = {
    "match": {"span_name": "retrieve.task"},
    "documents": semconv.TRACELOOP_ENTITY_OUTPUT,
    "id": "kwargs.id",
    "content": "kwargs.page_content",
}


def test_traceloop_task_with_other_text_names_the_rule_that_reads_it(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer
) -> None:
    """The task returns its documents shortened (24 characters): they no longer
    match the retriever span's documents by text, so no id is taken from them by
    guess.  The id metrics are skipped, and the reason names the span that holds the ids
    and the ``cases.retrievers`` rule that reads them; with that rule the same app is
    scored."""
    id_metrics: dict[str, dict[str, Any]] = {"id_context_recall": {}, "id_context_precision": {}}
    for name in ("default", "rule"):
        (tmp_path / name).mkdir()
    with matrix_collector(sink, tmp_path / "default", id_metrics) as serve:
        with traceloop_app(serve, "traceloop-reworded", llm_server) as app:
            app.ask(QUESTION, reworded=True)
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert_ids_skipped(root, "no retrieved document ids captured")
    assert_ids_skipped(
        root,
        "span 'retrieve.task' holds the documents with ids in traceloop.entity.output,"
        " not in the retriever's order: read them with cases.retrievers: [{match:"
        " {span_name: 'retrieve.task'}, documents: traceloop.entity.output, id: kwargs.id,"
        " content: kwargs.page_content}]",
    )

    sink.clear()
    rules = {"retrievers": [_TASK_RULE]}
    with matrix_collector(sink, tmp_path / "rule", id_metrics, cases=rules) as serve:
        with traceloop_app(serve, "traceloop-reworded", llm_server) as app:
            app.ask(QUESTION, reworded=True)
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert_ids_scored(root)
