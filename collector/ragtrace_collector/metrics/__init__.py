"""The metric suite (docs/metrics.md).

>>> metric = build_metric("contextual_recall", {"threshold": 0.7})
>>> result = await metric.measure(case, judge)          # doctest: +SKIP

Every metric has a ``name``, ``uses_judge``, ``kind`` (``"case"`` or
``"conversation"``), ``options`` and ``async measure(case, judge)``; conversation
metrics add ``measure_conversation``, ``measure_window`` and ``conversation_result``
(see :mod:`ragtrace_collector.metrics.conversation` for the online form).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from ragtrace_collector.metrics.base import (
    HEURISTIC_PREFIX,
    ConversationMetric,
    JudgeFreeMetric,
    Metric,
    MetricBase,
    MetricOptions,
    ScoreColumn,
    average_precision,
    normalise_verdict,
)
from ragtrace_collector.metrics.conversation import (
    NOTHING_RETRIEVED_YET,
    TurnContextualPrecision,
    TurnContextualRecall,
    TurnContextualRelevancy,
    Window,
    conversation_windows,
    split_unit_ranges,
    split_units,
    unit_index_of_turn,
    window_at,
)
from ragtrace_collector.metrics.entities import (
    DEFAULT_ENTITY_CACHE,
    ContextEntityRecall,
    EntityCache,
    normalise_entity,
)
from ragtrace_collector.metrics.generation import AnswerRelevancy, Faithfulness
from ragtrace_collector.metrics.ids import IDContextPrecision, IDContextRecall
from ragtrace_collector.metrics.nonllm import NonLLMContextPrecision, NonLLMContextRecall
from ragtrace_collector.metrics.precision import ContextualPrecision
from ragtrace_collector.metrics.recall import ContextualRecall
from ragtrace_collector.metrics.relevancy import ContextualRelevancy
from ragtrace_collector.metrics.rubric import ContextPrecisionRubric, ContextRecallRubric

__all__ = [
    "DEFAULT_ENTITY_CACHE",
    "HEURISTIC_PREFIX",
    "METRIC_NAMES",
    "NOTHING_RETRIEVED_YET",
    "NO_JUDGE_METRICS",
    "OFFLINE_METRICS",
    "ConversationMetric",
    "EntityCache",
    "JudgeFreeMetric",
    "Metric",
    "MetricOptions",
    "ScoreColumn",
    "UnknownMetricError",
    "Window",
    "average_precision",
    "build_metric",
    "build_metrics",
    "conversation_windows",
    "is_conversation_metric",
    "normalise_entity",
    "normalise_verdict",
    "parse_metric_names",
    "split_unit_ranges",
    "split_units",
    "unit_index_of_turn",
    "window_at",
]

_REGISTRY: dict[str, Callable[[MetricOptions], MetricBase]] = {
    cls.name: cls
    for cls in (
        ContextualRecall,
        ContextEntityRecall,
        NonLLMContextRecall,
        IDContextRecall,
        IDContextPrecision,
        ContextualPrecision,
        NonLLMContextPrecision,
        ContextualRelevancy,
        ContextPrecisionRubric,
        ContextRecallRubric,
        TurnContextualPrecision,
        TurnContextualRecall,
        TurnContextualRelevancy,
        Faithfulness,
        AnswerRelevancy,
    )
}

#: Every metric name, in the order of docs/metrics.md.
METRIC_NAMES: tuple[str, ...] = tuple(_REGISTRY)

#: Metrics that never call a judge.
NO_JUDGE_METRICS: tuple[str, ...] = tuple(
    n for n, cls in _REGISTRY.items() if not getattr(cls, "uses_judge", True)
)

#: The metrics the offline judge serves well (the default online set): the no-judge
#: metrics plus the retrieval metrics whose lexical verdicts track relevance.  The
#: rubric and generation metrics run offline too, but a lexical judge cannot grade a
#: rubric or spot a contradiction well, so they are opt-in.
OFFLINE_METRICS: tuple[str, ...] = (
    "contextual_recall",
    "context_entity_recall",
    "non_llm_context_recall",
    "id_context_recall",
    "id_context_precision",
    "contextual_precision",
    "non_llm_context_precision",
    "contextual_relevancy",
    "turn_contextual_precision",
    "turn_contextual_recall",
    "turn_contextual_relevancy",
)


class UnknownMetricError(ValueError):
    """An unknown metric name (the message lists the close matches)."""


def _unknown(name: str) -> UnknownMetricError:
    close = difflib.get_close_matches(name, METRIC_NAMES, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return UnknownMetricError(
        f"unknown metric {name!r}.{hint} Known metrics: {', '.join(METRIC_NAMES)}"
    )


def build_metric(name: str, options: MetricOptions | Mapping[str, Any] | None = None) -> Metric:
    """The metric called ``name`` with ``options``.

    Raises :class:`UnknownMetricError` for an unknown name (with a did-you-mean) and
    ``ValueError`` naming the metric for invalid options.
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        raise _unknown(name)
    if options is None:
        opts = MetricOptions()
    elif isinstance(options, MetricOptions):
        opts = options
    else:
        try:
            opts = MetricOptions.model_validate(dict(options))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ValueError(f"invalid options for metric {name!r}: {problems}") from None
    return factory(opts)


def parse_metric_names(text: str | Iterable[str]) -> list[str]:
    """``"contextual_recall, id_context_recall"`` -> names, checked, duplicates dropped."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    names = [p.strip() for p in parts if p.strip()]
    for n in names:
        if n not in _REGISTRY:
            raise _unknown(n)
    return list(dict.fromkeys(names))


def build_metrics(
    names: Iterable[str],
    options: Mapping[str, MetricOptions | Mapping[str, Any]] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
) -> list[Metric]:
    """Several metrics: per-metric ``options`` layered over shared ``defaults``
    (e.g. ``{"threshold": 0.7}``); metrics with ``enabled: false`` are left out."""
    built: list[Metric] = []
    for name in parse_metric_names(list(names)):
        own = (options or {}).get(name)
        if isinstance(own, MetricOptions):
            merged: dict[str, Any] = {**(defaults or {}), **own.model_dump(exclude_unset=True)}
        else:
            merged = {**(defaults or {}), **dict(own or {})}
        metric = build_metric(name, merged)
        if metric.options.enabled:
            built.append(metric)
    return built


def is_conversation_metric(metric: Metric) -> bool:
    return metric.kind == "conversation"
