"""Helpers for the tests of apps instrumented by others (OpenInference, OpenLLMetry,
OTel GenAI): a real ``ragtrace-collector serve`` process, an OTel SDK tracer provider
exporting to it over OTLP/HTTP, and the scores the metrics give offline on the case
built from what the app itself did (so the collector's case building is checked
against the app, never against hard-coded numbers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from ragtrace_collector.cases import ContextItem, Conversation, RAGCase, Turn
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import ConversationMetric, build_metric
from tests.e2e._support import Serve, assert_scored, serve_config
from tests.fakes.otlp_sink import OtlpSink

#: Exact ID metrics, string metrics (both need ground truth) and a referenceless one.
ID_METRICS = ("id_context_recall", "id_context_precision")
STRING_METRICS = ("non_llm_context_recall", "non_llm_context_precision")
REFERENCELESS = ("contextual_relevancy",)
CASE_METRICS = ID_METRICS + STRING_METRICS + REFERENCELESS

#: A small knowledge base: id -> text.
KB: dict[str, str] = {
    "kb_paris": "Paris is the capital of France and its largest city.",
    "kb_eiffel": "The Eiffel Tower in Paris was completed in 1889.",
    "kb_berlin": "Berlin is the capital of Germany.",
    "kb_louvre": "The Louvre in Paris is the most visited museum in the world.",
}
QUESTION = "What is the capital of France?"
#: Ground truth for QUESTION, served by the collector's reference store.
REFERENCE_IDS = ["kb_paris", "kb_eiffel"]


@dataclass
class Retrieved:
    """What the app retrieved, in rank order, and what it answered."""

    ids: list[str]
    texts: list[str]
    answer: str


def write_references(tmp_path: Path, references: Mapping[str, list[str]] | None = None) -> Path:
    """A reference store file: question -> reference ids (their texts from :data:`KB`);
    by default :data:`QUESTION` -> :data:`REFERENCE_IDS`."""
    path = tmp_path / "references.jsonl"
    lines = [
        {
            "input": question,
            "reference_context_ids": ids,
            "reference_contexts": [KB[i] for i in ids],
        }
        for question, ids in (references or {QUESTION: REFERENCE_IDS}).items()
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@contextmanager
def collector(
    sink: OtlpSink,
    tmp_path: Path,
    metrics: dict[str, dict[str, Any]],
    *,
    references: Mapping[str, list[str]] | None = None,
    **sections: Any,
) -> Iterator[Serve]:
    """``ragtrace-collector serve`` with the reference store (``references``, see
    :func:`write_references`), exporting to ``sink``."""
    path = write_references(tmp_path, references)
    config = serve_config(
        sink,
        metrics=metrics,
        reference_store={"path": str(path), "reload_interval": 0},
        **sections,
    )
    serve = Serve(config, tmp_path)
    try:
        yield serve
    finally:
        serve.kill()


def provider(serve: Serve, service: str) -> TracerProvider:
    """An OTel SDK tracer provider exporting each span to the collector over OTLP/HTTP."""
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{serve.http_url}/v1/traces")))
    return tp


def offline_scores(case: RAGCase, names: tuple[str, ...] = CASE_METRICS) -> dict[str, float]:
    """The scores the metrics give ``case`` offline (offline judge, as the collector)."""

    async def run() -> dict[str, float]:
        out: dict[str, float] = {}
        for name in names:
            result = await build_metric(name).measure(case, OfflineJudge())
            assert result.score is not None, f"{name}: {result.reason}"
            out[name] = result.score
        return out

    return asyncio.run(run())


def expected_case(got: Retrieved, question: str = QUESTION) -> RAGCase:
    """The case as the app saw it, with the reference store's ground truth."""
    return RAGCase(
        input=question,
        actual_output=got.answer,
        retrieval_context=[
            ContextItem(content=t, id=i) for i, t in zip(got.ids, got.texts, strict=True)
        ],
        reference_context_ids=REFERENCE_IDS if question == QUESTION else None,
        reference_contexts=[KB[i] for i in REFERENCE_IDS] if question == QUESTION else None,
    )


def assert_case_scored(span: Any, got: Retrieved) -> None:
    """Every case metric scored on ``span`` (all three forms) as it scores offline."""
    expected = offline_scores(expected_case(got))
    for name, score in expected.items():
        assert_scored(span, name, score)


def conversation_scores(
    turns: list[tuple[str, Retrieved]], names: tuple[str, ...]
) -> dict[str, list[tuple[float, float]]]:
    """Metric -> (window score, running conversation score) after each turn, offline."""

    def conversation(upto: int) -> Conversation:
        out: list[Turn] = []
        for question, got in turns[:upto]:
            out.append(Turn(role="user", content=question))
            out.append(
                Turn(
                    role="assistant",
                    content=got.answer,
                    retrieval_context=[
                        ContextItem(content=t, id=i)
                        for i, t in zip(got.ids, got.texts, strict=True)
                    ],
                )
            )
        return Conversation(turns=out)

    async def run() -> dict[str, list[tuple[float, float]]]:
        scores: dict[str, list[tuple[float, float]]] = {}
        for name in names:
            metric = build_metric(name)
            assert isinstance(metric, ConversationMetric)
            for k in range(1, len(turns) + 1):
                result = await metric.measure_conversation(conversation(k), OfflineJudge())
                assert result.score is not None, result.reason
                window = result.details["window_scores"][-1]
                scores.setdefault(name, []).append((window, result.score))
        return scores

    return asyncio.run(run())
