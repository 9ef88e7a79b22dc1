"""What crosses to the evaluation workers and back: results encoded for the span in a
worker are the bytes the collector process would have written, and are used only
where they fit."""

from __future__ import annotations

import os
import random
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.evaluation.enrichment import (
    EnrichmentConfig,
    EvalSummary,
    encode_result,
    enrich_span,
)
from ragtrace_collector.evaluation.pool import PoolStats
from ragtrace_collector.otlp import protowire
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.otlp.spanattrs import attributes_to_dict, set_attribute
from ragtrace_collector.results import MetricResult
from tests.fakes.spans import make_span

from .test_eval_pool import _evaluator, _rag_trace, _without_span_ids
from .test_evaluator import _Forwarded


def _span_results(span: trace_pb2.Span) -> dict[str, Any]:
    """Every attribute but the latency, and every event's name and attributes."""
    attrs = {k: v for k, v in attributes_to_dict(span.attributes).items()}
    attrs.pop(semconv.EVAL_LATENCY_MS, None)
    events = [(e.name, attributes_to_dict(e.attributes)) for e in span.events]
    return {"attributes": attrs, "events": events}


async def _through(processes: int, traces: list[AssembledTrace]) -> PoolStats | None:
    """Evaluate ``traces`` (all forwarded); the pool's counters, None without a pool."""
    fwd = _Forwarded()
    ev = _evaluator(processes)
    ev.start()
    try:
        for trace in traces:
            ev.submit(trace, fwd)
        await fwd.wait_for(len(traces), limit=60)
        return None if ev.pool is None else ev.pool.stats
    finally:
        await ev.drain()


async def _spans(processes: int) -> tuple[list[dict[str, Any]], int]:
    traces = [_rag_trace(random.Random(11 + i)) for i in range(5)]
    stats = await _through(processes, traces)
    out = []
    for trace in traces:
        result = _span_results(trace.groups[0].spans[0])
        (result["attributes"],) = _without_span_ids([result["attributes"]])
        out.append(result)
    return out, stats.encoded if stats is not None else 0


async def test_results_encoded_in_a_worker_equal_those_encoded_here() -> None:
    here, _ = await _spans(0)
    pooled, encoded = await _spans(1)
    assert encoded >= 5 * 7, "the worker encoded the case metrics' results"
    assert len(here[0]["events"]) >= 8
    assert pooled == here


def test_an_encoded_result_is_used_only_at_its_evaluation_index() -> None:
    config = EnrichmentConfig()
    result = MetricResult(metric="m", score=0.75, passed=True, reason="why")
    blob = encode_result(result, 0, None, config, 1)
    summary = EvalSummary(model="offline", sample_rate=1.0, latency_ms=1.0)

    fresh = make_span(os.urandom(16), "rag")
    enrich_span(fresh, [result], summary, config, encoded={("m", 0): blob}, now_ns=1)
    assert attributes_to_dict(fresh.attributes)["evaluations.0.evaluation.name"] == "m"

    # Another evaluator already wrote evaluations.0: this result is number 1, so the
    # bytes made for number 0 must not be used.
    taken = make_span(os.urandom(16), "rag")
    set_attribute(taken.attributes, "evaluations.0.evaluation.name", "upstream")
    enrich_span(taken, [result], summary, config, encoded={("m", 0): blob}, now_ns=1)
    attrs = attributes_to_dict(taken.attributes)
    assert attrs["evaluations.0.evaluation.name"] == "upstream"
    assert attrs["evaluations.1.evaluation.name"] == "m"
    assert attrs["evaluations.1.evaluation.score"] == 0.75
    keys = [kv.key for kv in taken.attributes]
    assert len(keys) == len(set(keys))


def test_wire_encoding_equals_the_protobuf_api() -> None:
    values: list[Any] = [
        "text",
        "",
        "é ✓ 漢字",
        "x" * 300,
        True,
        False,
        0,
        7,
        -5,
        2**63 - 1,
        -(2**63),
        0.0,
        -1.5,
        float("inf"),
        [1, 2],
        {"a": "b"},
    ]
    for value in values:
        expected = common_pb2.KeyValueList()
        set_attribute(expected.values, "k", value)
        assert protowire.key_value("k", value) == expected.values[0].SerializeToString(), value
        span = trace_pb2.Span()
        span.MergeFromString(protowire.attribute(protowire.SPAN_ATTRIBUTE, "k", value))
        assert list(span.attributes) == list(expected.values), value
    span = trace_pb2.Span()
    span.MergeFromString(protowire.event(42, "ev", [("a", 1.5), ("b", "x")]))
    assert span.events[0].time_unix_nano == 42
    assert span.events[0].name == "ev"
    assert attributes_to_dict(span.events[0].attributes) == {"a": 1.5, "b": "x"}


async def test_a_malformed_span_does_not_cost_a_worker() -> None:
    """A retriever span id of the wrong length makes the per-document verdicts fail:
    in the worker that must not kill the process; the trace goes on as without a pool."""
    rng = random.Random(5)
    good = _rag_trace(rng)
    bad = _rag_trace(rng)
    rag, retriever = bad.groups[0].spans[:2]
    retriever.span_id = b"\x01\x02\x03"  # 3 bytes: not a valid OTLP span id
    spans = [rag, retriever]
    bad = AssembledTrace(
        bad.trace_id,
        [SpanGroup(bad.groups[0].resource, "", common_pb2.InstrumentationScope(), "", spans)],
        ReleaseReason.READY,
        0.0,
        0.0,
        True,
    )
    stats = await _through(1, [bad, good])
    assert stats is not None
    assert stats.replaced == 0, "a worker was lost over a malformed span"
    assert stats.encoded > 0
    good_attrs = attributes_to_dict(good.groups[0].spans[0].attributes)
    assert good_attrs.get("ragtrace.eval.id_context_precision.documents")
