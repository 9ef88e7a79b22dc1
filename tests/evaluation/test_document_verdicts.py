"""Per-document verdicts: built without validation on the hot path, so these check
that each one equals its validated twin, and that what a judge's counts make of a
document outside the model's range is dropped rather than failing the case."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import TypeAdapter

from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.evaluation.case_builder import DocumentSource
from ragtrace_collector.evaluation.document_verdicts import (
    DocumentVerdict,
    decode_verdicts,
    document_verdicts,
    verdicts_json,
)
from ragtrace_collector.results import MetricResult

SOURCES = [DocumentSource(f"{i:016x}", i, f"d{i}") for i in range(4)]
CASE = RAGCase(
    input="q",
    actual_output="a",
    retrieval_context=[ContextItem(content=f"text {i}", id=f"d{i}") for i in range(4)],
    reference_context_ids=["d1", "d3", "x"],
)


def _result(metric: str, details: dict[str, Any]) -> MetricResult:
    return MetricResult(metric=metric, score=0.5, details=details)


@pytest.mark.parametrize(
    ("metric", "details"),
    [
        ("id_context_precision", {}),
        (
            "non_llm_context_precision",
            {"similarities": [0.9, 0.1, 1.0, 0.0], "similarity_threshold": 0.5},
        ),
        (
            "contextual_precision",
            {
                "verdicts": [
                    {"node": 1, "verdict": "yes", "reason": "ünïcode"},
                    {"node": 4, "verdict": "no"},
                ]
            },
        ),
        ("contextual_relevancy", {"nodes": [{"node": 2, "relevant": 1, "statements": 3}]}),
    ],
)
def test_each_verdict_equals_its_validated_twin(metric: str, details: dict[str, Any]) -> None:
    result = _result(metric, details)
    verdicts = document_verdicts(result, CASE, SOURCES)
    assert verdicts
    for v in verdicts:
        assert DocumentVerdict.model_validate(v.model_dump()) == v
        assert type(v.score) is float
    text = verdicts_json(result, CASE, SOURCES)
    assert text is not None
    assert decode_verdicts(text) == verdicts
    # The JSON written is what pydantic writes for the models (label left out when None).
    assert json.loads(text) == json.loads(
        TypeAdapter(list[DocumentVerdict]).dump_json(verdicts, exclude_none=True)
    )


def test_counts_outside_the_range_are_dropped_not_raised() -> None:
    nodes = [
        {"node": 1, "relevant": 5, "statements": 2},  # more relevant than there are
        {"node": 2, "relevant": -1, "statements": 2},
        {"node": 3, "relevant": 2, "statements": 2},
    ]
    verdicts = document_verdicts(_result("contextual_relevancy", {"nodes": nodes}), CASE, SOURCES)
    assert [(v.position, v.score) for v in verdicts] == [(2, 1.0)]
    assert (
        verdicts_json(_result("contextual_relevancy", {"nodes": nodes[:2]}), CASE, SOURCES) is None
    )
