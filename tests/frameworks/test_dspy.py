"""Supported matrix: DSPy (a Module: ``dspy.Retrieve(k=2)`` then ``dspy.Predict``, the
LM DSPy's own DummyLM) with the OpenInference instrumentor, exported to a real collector
with no config.

The retrieval model ranks with the corpus's keyword rule: top 2 of "What is the capital
of France?" is kb_paris, kb_berlin, so with the user's ids id_context_recall = 1/1 = 1.0
and id_context_precision = 1/2 = 0.5.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from ragtrace import semconv
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.frameworks._matrix import (
    KB,
    QUESTIONS,
    TOP_2,
    Retrieved,
    assert_ids_scored,
    assert_ids_skipped,
    assert_text_metrics_scored,
    matrix_collector,
    only_case,
    provider,
    rank,
    wait_scored,
)
from tests.frameworks.conftest import answer_for

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

QUESTION = QUESTIONS[0]


class _ColBERTHandler(BaseHTTPRequestHandler):
    """The ColBERTv2 server API DSPy's client calls: ``GET ?query=&k=`` ->
    ``{"topk": [{"pid", "text", "score"}]}``, ranked by the corpus's keyword rule."""

    def do_GET(self) -> None:
        params = parse_qs(urlparse(self.path).query)
        query, k = params["query"][0], int(params["k"][0])
        topk = [
            {"pid": doc_id, "text": KB[doc_id], "score": float(10 - n)}
            for n, doc_id in enumerate(rank(query, k))
        ]
        body = json.dumps({"topk": topk}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def colbert_url() -> Iterator[str]:
    """A ColBERTv2 retrieval server on loopback."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ColBERTHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def openinference(offline_caches: Path) -> Iterator[Any]:
    from openinference.instrumentation.dspy import DSPyInstrumentor

    instrumentor = DSPyInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


def _run(
    sink: OtlpSink, tmp_path: Path, instrumentor: Any, rm: Any, service: str
) -> tuple[ReceivedSpan, list[ReceivedSpan], Retrieved]:
    import dspy
    from dspy.utils import DummyLM

    class RAG(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.retrieve = dspy.Retrieve(k=2)
            self.generate = dspy.Predict("context, question -> answer")

        def forward(self, question: str) -> Any:
            passages = self.retrieve(question).passages
            return self.generate(context=passages, question=question)

    with matrix_collector(sink, tmp_path) as serve:
        tp = provider(serve, service)
        instrumentor.instrument(tracer_provider=tp)
        lm = DummyLM([{"answer": answer_for(QUESTION)}])
        with dspy.context(lm=lm, rm=rm):
            prediction = RAG()(question=QUESTION)
        tp.shutdown()
        spans = wait_scored(sink, 1)
    root = only_case(spans)
    assert root.span.name == "RAG.forward"
    assert root.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    ids = TOP_2[QUESTION]
    return root, spans, Retrieved(ids, [KB[i] for i in ids], prediction.answer)


def _retrievers(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    kind = semconv.OPENINFERENCE_SPAN_KIND
    found = [s for s in spans if s.attributes.get(kind) == "RETRIEVER"]
    return sorted(found, key=lambda s: s.span.start_time_unix_nano)


def test_openinference_colbert_ids(
    sink: OtlpSink, tmp_path: Path, openinference: Any, colbert_url: str
) -> None:
    """``dspy.ColBERTv2`` as the retrieval model: two nested RETRIEVER spans,
    ``Retrieve.forward`` (the passages' text only) and ``ColBERTv2.__call__`` below it
    (pid, text, score).  They are one retrieval: two documents, compared by pid."""
    import dspy

    root, spans, got = _run(
        sink, tmp_path, openinference, dspy.ColBERTv2(url=colbert_url), "dspy-colbert"
    )
    assert [s.span.name for s in _retrievers(spans)] == ["Retrieve.forward", "ColBERTv2.__call__"]
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)


def test_openinference_retrieval_model_without_ids(
    sink: OtlpSink, tmp_path: Path, openinference: Any
) -> None:
    """Any other retrieval model (a callable returning passages): only
    ``Retrieve.forward`` is traced, and it records the passages' text, never an id.
    The id metrics are skipped (nothing to compare), the text metrics score."""
    from dspy.dsp.utils import dotdict

    def keyword_rm(query: str, k: int = 2, **_: Any) -> list[Any]:
        return [dotdict(long_text=KB[i], pid=i) for i in rank(query, k)]

    root, spans, got = _run(sink, tmp_path, openinference, keyword_rm, "dspy-custom-rm")
    assert [s.span.name for s in _retrievers(spans)] == ["Retrieve.forward"]
    assert_ids_skipped(root, "no retrieved document ids")
    assert_text_metrics_scored(root, QUESTION, got)
