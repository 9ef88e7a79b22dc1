"""Evaluated spans in a real Arize Phoenix: the SDK app -> collector (evaluation on)
-> Phoenix over OTLP, read back through Phoenix's REST API."""

from __future__ import annotations

from typing import Any

import pytest

import ragtrace
from ragtrace import semconv
from tests.e2e import _app
from tests.e2e._app import KB
from tests.e2e._support import evaluating_collector
from tests.fakes.harness import collector_config
from tests.fakes.phoenix import PhoenixServer

# tests/conftest.py keeps every Phoenix test on one xdist worker: one Phoenix start.
pytestmark = [pytest.mark.services, pytest.mark.slow]

QUESTION = "What is the capital of France?"


def _flatten(attributes: dict[str, Any]) -> dict[str, Any]:
    """Phoenix may return attributes as dotted keys or nested objects: read either."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value) and value:
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)
        else:
            out[prefix] = value

    walk("", attributes)
    return out


def _evaluations(attrs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    by_index: dict[str, dict[str, Any]] = {}
    lead = semconv.EVALUATIONS + "."
    for key, value in attrs.items():
        if key.startswith(lead):
            index, _, fld = key[len(lead) :].partition(".")
            by_index.setdefault(index, {})[fld] = value
    return {str(r[semconv.EVALUATION_NAME]): r for r in by_index.values()}


@pytest.mark.parametrize("exporter", ["otlp_http", "otlp_grpc"])
def test_evaluated_span_is_readable_in_phoenix(
    phoenix: PhoenixServer,
    monkeypatch: pytest.MonkeyPatch,
    exporter: str,
) -> None:
    project = f"ragtrace-e2e-eval-{exporter}"
    endpoint = phoenix.otlp_http_url if exporter == "otlp_http" else phoenix.otlp_grpc_endpoint
    _app.route(QUESTION, ["doc_paris", "doc_louvre", "doc_berlin"])
    config = collector_config(
        exporters={"phoenix": {"type": exporter, "endpoint": endpoint}},
        sampling={"rate": 1.0},
        metrics={"id_context_recall": {}, "non_llm_context_recall": {}},
    )
    # Phoenix files spans under the resource's project name.
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"openinference.project.name={project}")
    with evaluating_collector(config) as collector:
        ragtrace.configure(service_name="e2e-bot", endpoint=collector.http_url)
        _app.answer(
            QUESTION,
            {
                "reference_context_ids": ["doc_paris", "doc_eiffel"],
                "reference_contexts": [KB["doc_paris"], KB["doc_eiffel"]],
            },
        )
        assert ragtrace.flush(30)
    # Leaving the block stopped the collector gracefully: everything was exported.
    stored = phoenix.wait_for_spans(project, [], count=3)
    assert len(stored) == 3
    rag = [s for s in stored if s["span_kind"] == semconv.OI_KIND_CHAIN]
    assert len(rag) == 1
    attrs = _flatten(rag[0]["attributes"])
    # Flat keys: searchable in Phoenix's span attributes.
    assert attrs[semconv.eval_attr("id_context_recall", semconv.EVAL_FIELD_SCORE)] == 0.5
    assert attrs[semconv.eval_attr("non_llm_context_recall", semconv.EVAL_FIELD_SCORE)] == 0.5
    assert attrs[semconv.eval_attr("id_context_recall", semconv.EVAL_FIELD_PASSED)] is True
    assert attrs[semconv.eval_attr("id_context_recall", semconv.EVAL_FIELD_REASON)]
    assert attrs[semconv.EVAL_MODEL] == "offline"
    assert attrs[semconv.EVAL_SAMPLE_RATE] == 1.0
    assert attrs[semconv.EVAL_LATENCY_MS] >= 0
    # OpenInference inline evaluations.
    evaluations = _evaluations(attrs)
    assert set(evaluations) == {"id_context_recall", "non_llm_context_recall"}
    for name, record in evaluations.items():
        assert record[semconv.EVALUATION_SCORE] == 0.5, name
        assert record[semconv.EVALUATION_LABEL] == semconv.LABEL_PASS
        assert record[semconv.EVALUATION_EXPLANATION]
        assert record[semconv.EVALUATION_ANNOTATOR_KIND] == "CODE"
    # The GenAI evaluation events came through as span events.
    events = [e for e in rag[0]["events"] if e["name"] == semconv.GEN_AI_EVALUATION_RESULT_EVENT]
    assert len(events) == 2
    names = {_flatten(e["attributes"])[semconv.GEN_AI_EVALUATION_NAME] for e in events}
    assert names == {"id_context_recall", "non_llm_context_recall"}
    for event in events:
        assert _flatten(event["attributes"])[semconv.GEN_AI_EVALUATION_SCORE_VALUE] == 0.5
    # The other spans carry no evaluation.
    for span in stored:
        if span is not rag[0]:
            assert not any(k.startswith(semconv.EVAL_PREFIX) for k in _flatten(span["attributes"]))
