"""The metric API: names, options, build_metric."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragtrace_collector.metrics import (
    METRIC_NAMES,
    NO_JUDGE_METRICS,
    ConversationMetric,
    Metric,
    MetricOptions,
    UnknownMetricError,
    build_metric,
    build_metrics,
    parse_metric_names,
)

METRICS_MD = Path("/work/shared/METRICS.md")


def test_names_are_exactly_the_specified_ones() -> None:
    specified = [
        "contextual_recall", "context_entity_recall", "non_llm_context_recall",
        "id_context_recall", "id_context_precision", "contextual_precision",
        "non_llm_context_precision", "contextual_relevancy", "context_precision_rubric",
        "context_recall_rubric", "turn_contextual_precision", "turn_contextual_recall",
        "turn_contextual_relevancy", "faithfulness", "answer_relevancy",
    ]  # fmt: skip
    assert list(METRIC_NAMES) == specified
    if METRICS_MD.exists():  # the spec lives outside the repository
        in_spec = set(re.findall(r"`([a-z_]+)`", METRICS_MD.read_text()))
        assert set(specified) <= in_spec


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_every_metric_builds_and_follows_the_protocol(name: str) -> None:
    metric = build_metric(name)
    assert isinstance(metric, Metric)
    assert metric.name == name
    assert metric.uses_judge == (name not in NO_JUDGE_METRICS)
    assert metric.kind == ("conversation" if name.startswith("turn_") else "case")
    assert isinstance(metric, ConversationMetric) == (metric.kind == "conversation")


def test_no_judge_metrics() -> None:
    assert set(NO_JUDGE_METRICS) == {
        "non_llm_context_recall", "non_llm_context_precision",
        "id_context_recall", "id_context_precision",
    }  # fmt: skip


def test_unknown_metric_did_you_mean() -> None:
    with pytest.raises(UnknownMetricError, match="Did you mean 'contextual_recall'"):
        build_metric("contextual_recal")
    with pytest.raises(UnknownMetricError, match="Known metrics"):
        parse_metric_names("id_context_recall, nonsense_xyz")


def test_options() -> None:
    o = MetricOptions()
    assert (o.threshold, o.strict, o.reference, o.window_size, o.distance) == (
        0.5, False, "expected_output", 10, "levenshtein",
    )  # fmt: skip
    with pytest.raises(ValueError, match="invalid options for metric 'contextual_recall'"):
        build_metric("contextual_recall", {"treshold": 0.5})
    with pytest.raises(ValueError, match="threshold"):
        build_metric("contextual_recall", {"threshold": 1.5})
    with pytest.raises(ValueError, match="window_size"):
        build_metric("turn_contextual_recall", {"window_size": 0})
    metric = build_metric("contextual_precision", MetricOptions(reference="auto"))
    assert metric.options.reference == "auto"


def test_build_metrics_layers_and_disables() -> None:
    metrics = build_metrics(
        ["contextual_recall", "id_context_recall", "faithfulness", "contextual_recall"],
        {"id_context_recall": {"threshold": 0.9}, "faithfulness": {"enabled": False}},
        defaults={"threshold": 0.7},
    )
    assert [(m.name, m.options.threshold) for m in metrics] == [
        ("contextual_recall", 0.7),
        ("id_context_recall", 0.9),
    ]
