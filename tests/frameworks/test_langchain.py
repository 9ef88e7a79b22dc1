"""Supported matrix: LangChain (an LCEL RunnableSequence: retriever -> prompt ->
FakeListLLM) with the OpenInference and the OpenLLMetry instrumentors, exported to a
real collector with no config; single requests and three-turn conversations.

The retriever ranks with the corpus's keyword rule (:func:`_matrix.rank`): top 2 of
"What is the capital of France?" is kb_paris, kb_berlin, so with the user's ids
id_context_recall = 1/1 = 1.0 and id_context_precision = 1/2 = 0.5.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.e2e._support import JudgeServer, Serve
from tests.e2e.test_instrumentors import (  # the instrumentor fixtures, with their clean-ups
    openinference_langchain,
    openllmetry_langchain,
)
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.frameworks._matrix import (
    KB,
    QUESTIONS,
    TOP_2,
    TURN_METRICS,
    Retrieved,
    assert_conversation_scored,
    assert_ids_scored,
    assert_ids_skipped,
    assert_text_metrics_scored,
    converse,
    matrix_collector,
    only_case,
    provider,
    rank,
    tops,
    wait_scored,
)
from tests.frameworks._tracing_apps import AppProcess
from tests.frameworks.conftest import answer_for

__all__ = ["openinference_langchain", "openllmetry_langchain"]

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

QUESTION = QUESTIONS[0]


def _chain(ids_in_metadata: bool) -> tuple[Any, dict[str, list[Any]]]:
    """The app: each Document has its ``id`` (and, if asked, the same id in its
    metadata); returns the chain and the documents it retrieved per question."""
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import PromptTemplate
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnablePassthrough

    documents = {
        i: Document(
            id=i,
            page_content=t,
            metadata={"source": "kb", **({"id": i} if ids_in_metadata else {})},
        )
        for i, t in KB.items()
    }
    seen: dict[str, list[Any]] = {}

    class KeywordRetriever(BaseRetriever):
        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            seen[query] = [documents[i] for i in rank(query)]
            return seen[query]

    chain = (
        {
            "context": KeywordRetriever() | (lambda docs: "\n".join(d.page_content for d in docs)),
            "question": RunnablePassthrough(),
        }
        | PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
        | FakeListLLM(responses=[answer_for(q) for q in QUESTIONS])
        | StrOutputParser()
    )
    return chain, seen


def _ask(chain: Any, seen: dict[str, list[Any]], question: str, **config: Any) -> Retrieved:
    answer = chain.invoke(question, config=config or None)
    docs = seen[question]
    assert [d.id for d in docs] == TOP_2[question]  # the hand-computed ranking
    return Retrieved([d.id for d in docs], [d.page_content for d in docs], answer)


def _single(
    sink: OtlpSink, tmp_path: Path, instrumentor: Any, service: str, ids_in_metadata: bool
) -> tuple[ReceivedSpan, Retrieved]:
    with matrix_collector(sink, tmp_path) as serve:
        tp = provider(serve, service)
        instrumentor.instrument(tracer_provider=tp)
        chain, seen = _chain(ids_in_metadata)
        got = _ask(chain, seen, QUESTION)
        tp.shutdown()
        spans = wait_scored(sink, 1)
    return only_case(spans), got


# ------------------------------------------------------------------ single requests
def test_openinference(sink: OtlpSink, tmp_path: Path, openinference_langchain: Any) -> None:
    """No document.id recorded; the ids come from the retriever's output.value."""
    root, got = _single(sink, tmp_path, openinference_langchain, "lc-oi", ids_in_metadata=False)
    assert root.span.name == "RunnableSequence"
    assert root.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)


def test_openllmetry_ids_in_metadata(
    sink: OtlpSink, tmp_path: Path, openllmetry_langchain: Any
) -> None:
    root, got = _single(sink, tmp_path, openllmetry_langchain, "lc-tl-meta", ids_in_metadata=True)
    assert root.attributes[semconv.TRACELOOP_SPAN_KIND] == "workflow"
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)


def test_openllmetry_drops_document_ids(
    sink: OtlpSink, tmp_path: Path, openllmetry_langchain: Any
) -> None:
    """OpenLLMetry's LangChain instrumentation writes each Document without its ``id``:
    with the id only there, nothing is left to compare, so the id metrics are skipped
    (never 0) and the text metrics still score."""
    root, got = _single(sink, tmp_path, openllmetry_langchain, "lc-tl-noid", ids_in_metadata=False)
    assert root.attributes[semconv.TRACELOOP_SPAN_KIND] == "workflow"
    assert_ids_skipped(root, "no retrieved document ids")
    assert_text_metrics_scored(root, QUESTION, got)


def _traceloop_entity(tracer: Any, name: str, kind: str, inputs: dict[str, Any]) -> Any:
    """A span as traceloop-sdk's ``@workflow`` / ``@task`` decorators open it (name
    ``<name>.<kind>``, ``traceloop.span.kind``, ``traceloop.entity.name``, the call's
    arguments as ``{"args": [...], "kwargs": {...}}``).  traceloop-sdk itself is not in
    the lock: this is the shape its decorators write, around the real instrumentation."""
    import json

    span = tracer.start_as_current_span(f"{name}.{kind}")
    entered = span.__enter__()
    entered.set_attribute(semconv.TRACELOOP_SPAN_KIND, kind)
    entered.set_attribute("traceloop.entity.name", name)
    entered.set_attribute(semconv.TRACELOOP_ENTITY_INPUT, json.dumps(inputs))
    return span, entered


def _sdk_output(value: Any) -> str:
    """The SDK's JSONEncoder: an object with ``to_json()`` (a LangChain Document) is
    written as that."""
    import json

    return json.dumps(value, default=lambda o: o.to_json() if hasattr(o, "to_json") else str(o))


def test_openllmetry_task_gives_the_dropped_document_ids(
    sink: OtlpSink, tmp_path: Path, openllmetry_langchain: Any
) -> None:
    """traceloop-sdk: ``@workflow answer`` calls ``@task retrieve`` (the LangChain
    retriever, whose instrumented span drops ``Document.id``) and then the chain.  The
    task's output holds the Documents with their ids: the id metrics are scored."""
    from langchain_core.prompts import PromptTemplate

    with matrix_collector(sink, tmp_path) as serve:
        tp = provider(serve, "lc-tl-task")
        openllmetry_langchain.instrument(tracer_provider=tp)
        chain, _ = _chain(ids_in_metadata=False)
        retriever = chain.first.steps__["context"].first
        tracer = tp.get_tracer("traceloop.sdk")
        flow, flow_span = _traceloop_entity(
            tracer, "answer", "workflow", {"args": [], "kwargs": {"question": QUESTION}}
        )
        task, task_span = _traceloop_entity(
            tracer, "retrieve", "task", {"args": [], "kwargs": {"question": QUESTION}}
        )
        docs = retriever.invoke(QUESTION)
        task_span.set_attribute(semconv.TRACELOOP_ENTITY_OUTPUT, _sdk_output(docs))
        task.__exit__(None, None, None)
        prompt = PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
        context = "\n".join(d.page_content for d in docs)
        answer = answer_for(prompt.format(context=context, question=QUESTION))
        flow_span.set_attribute(semconv.TRACELOOP_ENTITY_OUTPUT, _sdk_output(answer))
        flow.__exit__(None, None, None)
        tp.shutdown()
        spans = wait_scored(sink, 1)
    assert [d.id for d in docs] == TOP_2[QUESTION]
    root = only_case(spans)
    assert root.span.name == "answer.workflow"
    assert_ids_scored(root)
    assert root.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"


# ------------------------------------------------------------------ traceloop-sdk
# OpenLLMetry's own SDK for real (``Traceloop.init`` with its LangChain instrumentation,
# ``@workflow`` and ``@task``), exporting over OTLP/HTTP to ``TRACELOOP_BASE_URL`` with
# no config.  The app (tests/frameworks/_tracing_apps.py, a process of its own: the SDK
# sets up its export once per process) runs ``@workflow answer`` > ``@task retrieve``
# (the LangChain retriever, ``Document.id`` only) > the loopback LLM.  The LangChain
# instrumentation writes the documents without that id; the task's
# ``traceloop.entity.output`` (``Document.to_json()``) keeps it as ``kwargs.id``.


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


def traceloop_app(serve: Serve, service: str, llm: JudgeServer) -> AppProcess:
    """The traceloop-sdk app in a process of its own, exporting to ``serve`` (a context
    manager: closed on leaving)."""
    return AppProcess("traceloop", traceloop_env(serve, service), llm.base_url)


@pytest.mark.slow
def test_traceloop_sdk_task_gives_the_document_ids(
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


@pytest.mark.slow
def test_traceloop_sdk_task_with_other_text_names_the_rule_that_reads_it(
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


# ------------------------------------------------------------------ conversations
def _conversation(
    sink: OtlpSink, tmp_path: Path, instrumentor: Any, service: str, **per_turn: Any
) -> tuple[list[ReceivedSpan], list[tuple[str, Retrieved]]]:
    """Three questions of one conversation, each answered before the next is asked."""
    metrics: dict[str, dict[str, Any]] = {name: {} for name in TURN_METRICS}
    metrics["id_context_recall"] = {}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        tp = provider(serve, service)
        instrumentor.instrument(tracer_provider=tp)
        chain, seen = _chain(ids_in_metadata=True)
        turns = converse(sink, lambda q: _ask(chain, seen, q, **per_turn), tp.force_flush)
        tp.shutdown()
        spans = sink.spans
    roots = tops(spans)
    assert len(roots) == len(QUESTIONS)
    return roots, turns


def test_openinference_conversation(
    sink: OtlpSink, tmp_path: Path, openinference_langchain: Any
) -> None:
    """``using_session``: every span carries ``session.id``, no turn index."""
    from openinference.instrumentation import using_session

    session = f"sess-{uuid.uuid4().hex[:8]}"
    with using_session(session):
        roots, turns = _conversation(sink, tmp_path, openinference_langchain, "lc-oi-chat")
    assert [r.attributes[semconv.SESSION_ID] for r in roots] == [session] * 3
    assert_conversation_scored(roots, turns)


def test_openllmetry_conversation(
    sink: OtlpSink, tmp_path: Path, openllmetry_langchain: Any
) -> None:
    """The session id as LangChain run metadata, which OpenLLMetry writes as
    ``traceloop.association.properties.session_id`` on every span."""
    session = f"sess-{uuid.uuid4().hex[:8]}"
    roots, turns = _conversation(
        sink, tmp_path, openllmetry_langchain, "lc-tl-chat", metadata={"session_id": session}
    )
    assert [r.attributes[semconv.TRACELOOP_SESSION_ID] for r in roots] == [session] * 3
    assert_conversation_scored(roots, turns)
