"""Score segments: config and label naming, where a case's values are read, the
bounded top values, the segment labels on ragtrace_eval_score / ragtrace_eval_results,
and the values written onto the case span."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from prometheus_client import CollectorRegistry, generate_latest

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.component.telemetry import ResultBook, Telemetry
from ragtrace_collector.config import ConfigError, parse_config
from ragtrace_collector.evaluation.segments import Segments
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.otlp.spanattrs import attributes_to_dict, set_attributes
from ragtrace_collector.segments import OTHER, UNSET, SegmentKey, prometheus_label
from ragtrace_collector.service.stages import build_stage
from tests.fakes.spans import make_span


def _kvs(values: dict[str, Any]) -> Any:
    span = trace_pb2.Span()
    set_attributes(span.attributes, list(values.items()))
    return span.attributes


# ------------------------------------------------------------------ config
def test_labels_are_the_prometheus_safe_form_of_the_key() -> None:
    assert prometheus_label("service.version") == "service_version"
    assert prometheus_label("deployment.environment") == "deployment_environment"
    assert prometheus_label("app.index-version/ü") == "app_index_version__"
    assert prometheus_label("9lives") == "_9lives"


def test_segments_config_accepts_keys_and_per_key_limits() -> None:
    cfg = parse_config(
        {"segments": ["deployment.environment", {"key": "app.index_version", "max_values": 3}]},
        env={},
    )
    assert cfg.segments == [
        SegmentKey(key="deployment.environment", max_values=20),
        SegmentKey(key="app.index_version", max_values=3),
    ]
    assert parse_config({}, env={}).segments == []


@pytest.mark.parametrize(
    ("segments", "message"),
    [
        (["service"], "label 'service' is one the collector already uses"),
        (["outcome"], "already uses"),
        (["le"], "already uses"),
        (["a.b", "a-b"], "segments 'a.b' and 'a-b' have the same Prometheus label 'a_b'"),
        (["a.b", "a.b"], "segment 'a.b' is listed twice"),
        (["__name"], "already uses"),
        ([{"key": "x", "max_values": 0}], "max_values"),
    ],
)
def test_a_colliding_or_bad_segment_is_a_config_error(segments: list[Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"segments": segments}, env={})


def test_a_rule_on_a_key_that_is_not_a_segment_is_a_config_error() -> None:
    rule = {"metric": "id_context_recall", "group_by": ["app.index_version"]}
    with pytest.raises(ConfigError, match=r"'app.index_version' is not one of the `segments:`"):
        parse_config({"segments": ["service.version"], "alerts": [rule]}, env={})
    canary = {"metric": "id_context_recall", "kind": "canary", "segment": "x"}
    with pytest.raises(ConfigError, match=r"'x' is not one of the `segments:` keys"):
        parse_config({"alerts": [canary]}, env={})
    parse_config({"segments": ["x"], "alerts": [canary]}, env={})


# ------------------------------------------------------------ reading values
def test_values_come_from_span_then_resource_then_retrievers() -> None:
    segments = Segments(
        [
            SegmentKey(key="deployment.environment"),
            SegmentKey(key="service.version"),
            SegmentKey(key="app.index_version"),
            SegmentKey(key=semconv.SEGMENT_RETRIEVER_NAME),
            SegmentKey(key="tenant.tier"),
        ]
    )
    retriever = trace_pb2.Span(name="VectorStoreRetriever")
    set_attributes(retriever.attributes, [("app.index_version", "v2"), ("service.version", "x")])
    span_attrs = {"deployment.environment": "canary", "tenant.tier": ""}
    resource = _kvs({"deployment.environment": "production", "service.version": "2.4.0"})
    values = segments.read(span_attrs, resource, [retriever])
    assert values.values == ("canary", "2.4.0", "v2", "VectorStoreRetriever", None)
    assert segments.labels(values) == ("canary", "2.4.0", "v2", "VectorStoreRetriever", UNSET)
    # Only what the span lacks is written onto it (never a placeholder).
    assert segments.missing_on_span(values, span_attrs) == [
        ("service.version", "2.4.0"),
        ("app.index_version", "v2"),
        (semconv.SEGMENT_RETRIEVER_NAME, "VectorStoreRetriever"),
    ]
    none = segments.read({}, None, [])
    assert segments.labels(none) == (UNSET,) * 5
    assert segments.missing_on_span(none, {}) == []


def test_non_string_values_become_label_text() -> None:
    segments = Segments([SegmentKey(key="a"), SegmentKey(key="b"), SegmentKey(key="c")])
    values = segments.read({"a": 3, "b": True, "c": "x" * 500}, None)
    assert values.values == ("3", "true", "x" * 128)


# ---------------------------------------------------------------- top values
def test_values_beyond_the_limit_count_as_other_and_memory_stays_bounded() -> None:
    segments = Segments([SegmentKey(key="k", max_values=3)])
    out = [segments.labels(segments.read({"k": f"v{i}"}, None)) for i in range(50_000)]
    assert out[:3] == [("v0",), ("v1",), ("v2",)]
    assert {o for o in out[3:]} <= {(OTHER,), ("v0",), ("v1",), ("v2",)} | {
        (f"v{i}",) for i in range(50_000)
    }
    top = segments._tops[0]
    assert len(top.kept) <= 3
    assert len(top.candidates) <= 3
    # Every label value ever used stays within limit + other, at any moment.
    assert len(set(segments.kept("k"))) <= 3


def test_a_value_that_becomes_frequent_takes_the_place_of_a_rare_one() -> None:
    evicted: list[tuple[int, str]] = []
    segments = Segments(
        [SegmentKey(key="env"), SegmentKey(key="k", max_values=2)],
        on_evict=lambda i, v: evicted.append((i, v)),
    )

    def label(value: str) -> str:
        return segments.labels(segments.read({"env": "prod", "k": value}, None))[1]

    assert [label("rare"), label("common"), label("new")] == ["rare", "common", OTHER]
    for i in range(3000):
        label("common" if i % 2 else "new")
    assert evicted == [(1, "rare")]
    assert sorted(segments.kept("k")) == ["common", "new"]
    assert label("new") == "new"
    assert label("rare") == OTHER


# ---------------------------------------------------------------- ResultBook
def test_result_book_exposes_the_segment_labels_in_order() -> None:
    registry = CollectorRegistry()
    book = ResultBook(registry=registry)
    book.set_segment_labels(["deployment_environment", "app_index_version"])
    book.record("shop", "recall", "passed", 0.9, ("production", "v1"))
    book.record("shop", "recall", "failed", 0.3, ("production", "v2"))
    book.record("shop", "recall", "skipped", None, ("canary", UNSET))
    labels = {"service": "shop", "metric": "recall", "deployment_environment": "production"}
    get = registry.get_sample_value
    assert get("ragtrace_eval_score_count", {**labels, "app_index_version": "v1"}) == 1
    assert get("ragtrace_eval_score_sum", {**labels, "app_index_version": "v2"}) == 0.3
    assert get("ragtrace_eval_score_count", {**labels, "app_index_version": UNSET}) is None
    skipped = {
        "service": "shop",
        "metric": "recall",
        "deployment_environment": "canary",
        "app_index_version": UNSET,
        "outcome": "skipped",
    }
    assert get("ragtrace_eval_results_total", skipped) == 1
    exposition = generate_latest(registry).decode()
    assert (
        'ragtrace_eval_results_total{app_index_version="v2",deployment_environment="production",'
        'metric="recall",outcome="failed",service="shop"} 1.0' in exposition
    )
    assert (
        'ragtrace_eval_score_bucket{app_index_version="v1",deployment_environment="production",'
        'le="0.9",metric="recall",service="shop"} 1.0' in exposition
    )
    # forget: the series of a value that lost its place go away.
    book.forget(1, "v2")
    assert get("ragtrace_eval_score_count", {**labels, "app_index_version": "v2"}) is None
    failed = {**labels, "app_index_version": "v2", "outcome": "failed"}
    assert get("ragtrace_eval_results_total", failed) is None
    assert get("ragtrace_eval_score_count", {**labels, "app_index_version": "v1"}) == 1


def test_result_book_refuses_late_labels_and_wrong_value_counts() -> None:
    book = ResultBook()
    book.set_segment_labels(["a"])
    with pytest.raises(ValueError, match="1 labels"):
        book.record("s", "m", "passed", 1.0)
    book.record("s", "m", "passed", 1.0, ("x",))
    with pytest.raises(RuntimeError, match="before the first result"):
        book.set_segment_labels(["a", "b"])


# ------------------------------------------------------------------ end to end
def _trace(version: str | None, index: str) -> AssembledTrace:
    tid = os.urandom(16)
    attrs: dict[str, Any] = {
        semconv.INPUT_VALUE: "How do I reset my password?",
        semconv.OUTPUT_VALUE: "answer",
        semconv.REFERENCE_CONTEXT_IDS: json.dumps(["doc_1", "doc_2"]),
        "tenant.tier": "gold",
    }
    rag = make_span(tid, "rag", attrs=attrs)
    ret = make_span(tid, "retriever", parent=rag, docs=[("doc_1", "text")])
    set_attributes(ret.attributes, [("app.index_version", index)])
    resource = resource_pb2.Resource()
    values = [("service.name", "shop")]
    if version is not None:
        values.append(("service.version", version))
    set_attributes(resource.attributes, values)
    group = SpanGroup(resource, "", common_pb2.InstrumentationScope(), "", [rag, ret])
    now = time.monotonic()
    return AssembledTrace(tid, [group], ReleaseReason.READY, now, now, True)


async def test_scores_carry_segment_labels_and_the_span_gets_the_missing_values() -> None:
    config = parse_config(
        {
            "metrics": {"id_context_recall": {}},
            "evaluation": {"processes": 0},
            "segments": ["service.version", "app.index_version", "tenant.tier"],
            "alerts": {
                "log": {"enabled": False},
                "rules": [
                    {
                        "metric": "id_context_recall",
                        "group_by": ["app.index_version"],
                        "window": "60s",
                        "baseline": "600s",
                    }
                ],
            },
        },
        env={},
    )
    telemetry = Telemetry()
    stage = build_stage(config, telemetry)
    stage.evaluator.start()
    forwarded: list[AssembledTrace] = []
    both = asyncio.Event()

    def forward(trace: AssembledTrace) -> None:
        forwarded.append(trace)
        if len(forwarded) == 2:
            both.set()

    try:
        for trace in (_trace("2.4.0", "v2"), _trace(None, "v1")):
            stage.processor.submit(trace, forward)
        await asyncio.wait_for(both.wait(), 30)
    finally:
        await stage.evaluator.drain()
        await stage.aclose()
    assert len(forwarded) == 2
    get = telemetry.registry.get_sample_value
    base = {"service": "shop", "metric": "id_context_recall", "tenant_tier": "gold"}
    assert (
        get(
            "ragtrace_eval_score_count",
            {**base, "service_version": "2.4.0", "app_index_version": "v2"},
        )
        == 1
    )
    assert get(
        "ragtrace_eval_score_sum",
        {**base, "service_version": UNSET, "app_index_version": "v1"},
    ) == pytest.approx(0.5)
    rag = next(
        s
        for s, _ in forwarded[0].spans()
        if attributes_to_dict(s.attributes).get(semconv.RAGTRACE_SPAN_KIND) == "rag"
    )
    attrs = attributes_to_dict(rag.attributes)
    assert attrs["service.version"] == "2.4.0"
    assert attrs["app.index_version"] == "v2"
    assert [kv.key for kv in rag.attributes].count("tenant.tier") == 1  # already there
    assert stage.detector is not None
    (status,) = [s for s in stage.detector.status() if s.segments == {"app.index_version": "v2"}]
    assert status.window_count == 1
    assert status.service == "shop"


# ------------------------------------------------- values that come and go (issue 28)
class _FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_new_release_gets_its_label_within_seconds_of_the_old_one_going_quiet() -> None:
    """Two versions kept (max_values 2) at 20 cases/s each for ten minutes; then v1 is
    replaced by v3.  v3 is counted as ``other`` (on the stable side of a rollout gate)
    only for seconds, not until a rebalance 1,000 cases later that it would then lose
    to v1's accumulated count."""
    clock = _FakeClock()
    segments = Segments([SegmentKey(key="service.version", max_values=2)], clock=clock)

    def label(version: str) -> str:
        return segments.labels(segments.read({"service.version": version}, None))[0]

    for _ in range(600 * 20):
        clock.t += 0.025
        label("v1")
        clock.t += 0.025
        label("v2")
    started = clock.t
    first_own: float | None = None
    for _ in range(60 * 20):
        clock.t += 0.025
        if label("v3") == "v3" and first_own is None:
            first_own = clock.t
        clock.t += 0.025
        assert label("v2") == "v2"
    assert first_own is not None
    assert first_own - started <= 20.0  # idle 10s, then the next 5s rebalance
    assert sorted(segments.kept("service.version")) == ["v2", "v3"]


def test_series_stay_within_the_bound_under_drifting_values() -> None:
    """200,000 cases whose values drift (a new popular value every 2,000 cases, and a
    long tail), max_values 5, fed to the score metrics as the evaluator does: at every
    moment the series on /metrics carry at most the 5 kept values, ``other`` and
    ``unset``, and never a value that lost its place.  Before issue 28 the case that
    triggered a rebalance re-created the series of the value it evicted, for good."""
    import random

    clock = _FakeClock()
    rng = random.Random(3)
    book = ResultBook(registry=CollectorRegistry())
    segments = Segments([SegmentKey(key="k", max_values=5)], clock=clock)
    book.set_segment_labels(segments.labels_names)
    segments.add_evict_listener(book.forget)
    for i in range(200_000):
        clock.t += 0.001
        epoch = i // 2000
        u = rng.random()
        if u < 0.05:
            raw: str | None = None
        elif u < 0.6:
            raw = f"hot{epoch - rng.randrange(3)}"
        else:
            raw = f"tail{rng.randrange(400)}"
        labels = segments.labels(segments.read({"k": raw} if raw else {}, None))
        book.record("shop", "recall", "passed", 0.8, labels)
        if i % 997 == 0:
            values = {key[2][0] for key in book._scores}
            kept = set(segments.kept("k"))
            assert values <= kept | {OTHER, UNSET}, (i, values - kept)
            assert len(values) <= 5 + 2
    assert len({key[2][0] for key in book._scores}) <= 7


def test_overflow_and_evictions_are_counted_and_logged_once_per_value() -> None:
    from structlog.testing import capture_logs

    clock = _FakeClock()
    telemetry = Telemetry()
    segments = Segments(
        [SegmentKey(key="app.index_version", max_values=1)], telemetry=telemetry, clock=clock
    )

    def label(value: str) -> str:
        return segments.labels(segments.read({"app.index_version": value}, None))[0]

    get = telemetry.registry.get_sample_value
    with capture_logs() as logs:
        assert label("v1") == "v1"
        assert [label("v2") for _ in range(3)] == [OTHER] * 3
        clock.t += 30.0  # v1 idle: v2 takes its place at the next case
        assert label("v2") == "v2"
        assert label("v1") == OTHER
        assert label("v1") == OTHER
    overflow = get("ragtrace_segment_overflow_total", {"key": "app.index_version"})
    assert overflow == 5
    assert get("ragtrace_segment_evictions_total", {"key": "app.index_version"}) == 1
    events = [(e["event"], e.get("value")) for e in logs if e["event"].startswith("segment_")]
    assert events == [
        ("segment_value_overflow", "v2"),
        ("segment_value_evicted", "v1"),
        ("segment_value_overflow", "v1"),
    ]


def test_a_long_tail_of_values_does_not_flood_the_log() -> None:
    from structlog.testing import capture_logs

    clock = _FakeClock()
    telemetry = Telemetry()
    segments = Segments([SegmentKey(key="user", max_values=2)], telemetry=telemetry, clock=clock)
    with capture_logs() as logs:
        for i in range(1000):
            clock.t += 0.01  # 10 s in all
            segments.labels(segments.read({"user": f"u{i}"}, None))
    lines = [e for e in logs if e["event"] == "segment_value_overflow"]
    assert len(lines) == 10
    get = telemetry.registry.get_sample_value
    assert get("ragtrace_segment_overflow_total", {"key": "user"}) == 998
