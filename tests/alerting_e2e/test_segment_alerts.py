"""A recall drop confined to one index version is reported as that segment's drop.

The in-process collector (real OTLP/HTTP receiver, evaluation stage, detector and a
webhook on loopback) gets traces of one service on two index versions, ``v1`` and
``v2``: the index version is an attribute of the retriever span, the release
(``service.version``) one of the resource.  With ``segments:`` and a rule
``group_by: [app.index_version]``, retrieval on ``v2`` breaks while ``v1`` holds:

* the webhook hears one firing alert, for ``app.index_version=v2``, with its window mean
  and baseline, ``v1`` beside it holding, and example traces that are all ``v2`` ones;
* a canary rule comparing ``service.version`` ``2.0`` (which serves ``v2``) with the
  other release fires too, with both sides' means and counts and the p-value;
* ``ragtrace_eval_score`` carries the segment labels, and the exported case span
  carries the index version it did not have.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ragtrace import semconv
from ragtrace_collector.config import parse_config
from tests.alerting_e2e._support import (
    DETECTOR_RULE,
    METRIC,
    SEGMENT_SERVICE,
    EvalCollectorThread,
    ReleaseSender,
    collector_data,
    hook_receiver,
)
from tests.fakes.otlp_sink import OtlpSink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def _config(sink: OtlpSink, hook_url: str) -> dict[str, Any]:
    drop = {**DETECTOR_RULE, "name": "recall-by-index", "group_by": ["app.index_version"]}
    canary = {
        "name": "release-canary",
        "kind": "canary",
        "metric": METRIC,
        "segment": "service.version",
        "candidate": "2.0",
        "window": "6s",
        "drop": 0.2,
        "min_samples": 20,
    }
    alerts = {
        "evaluation_interval": "500ms",
        "rules": [drop, canary],
        "log": {"enabled": True},
        "webhook": {"url": hook_url, "max_attempts": 3, "backoff": "100ms"},
    }
    data = collector_data(sink, alerts)
    data["segments"] = ["service.version", "app.index_version"]
    return data


def _firing(hooks: Any, rule: str) -> Any:
    return next(
        (b for b in hooks.on("/ragtrace") if b["rule"] == rule and b["status"] == "firing"), None
    )


async def test_a_drop_on_one_index_version_names_it_beside_the_healthy_one(
    sink: OtlpSink,
) -> None:
    async with hook_receiver() as hooks:
        config = parse_config(_config(sink, hooks.url + "/ragtrace"), env={})
        collector = EvalCollectorThread(config)
        collector.start()
        sender = ReleaseSender(collector.http_url)
        try:
            sender.start()
            await asyncio.sleep(15)  # a window and most of a baseline, healthy
            assert hooks.on("/ragtrace") == [], "healthy traffic paged"
            broken_at = time.time()
            sender.broken = True
            by_index = await hooks.wait_for(
                lambda h: _firing(h, "recall-by-index"), within=40, what="the segment alert"
            )
            canary = await hooks.wait_for(
                lambda h: _firing(h, "release-canary"), within=20, what="the canary alert"
            )
        finally:
            await asyncio.to_thread(sender.stop)
            labels = {
                "service": SEGMENT_SERVICE,
                "metric": METRIC,
                "service_version": "1.0",
                "app_index_version": "v1",
            }
            v1_scores = collector.metric("ragtrace_eval_score_count", labels)
            await asyncio.to_thread(collector.stop)

    assert by_index["segments"] == {"app.index_version": "v2"}
    assert by_index["service"] == SEGMENT_SERVICE
    assert by_index["window_mean"] < by_index["baseline"] - 0.2
    assert by_index["baseline"] > 0.8
    (sibling,) = by_index["siblings"]
    assert sibling["segments"] == {"app.index_version": "v1"}
    assert sibling["window_mean"] > 0.8
    assert sibling["dropped"] is False
    assert "app.index_version=v2 is" in by_index["summary"]
    assert "app.index_version=v1 holds at" in by_index["summary"]
    assert by_index["example_trace_ids"]
    assert {sender.sent[t] for t in by_index["example_trace_ids"]} == {"v2"}
    assert time.time() - broken_at < 60

    assert canary["kind"] == "canary"
    assert canary["segments"] == {"service.version": "2.0"}
    assert canary["against"] == "service.version!=2.0"
    assert canary["window_mean"] < canary["baseline"] - 0.2
    assert canary["sample_count"] >= 20
    assert canary["baseline_sample_count"] >= 20
    assert canary["p_value"] <= 0.05
    assert "against service.version!=2.0 at" in canary["summary"]

    assert v1_scores > 0  # the scores carry both segment labels
    rag_spans = [s for s in sink.spans if s.attributes.get(semconv.RAGTRACE_SPAN_KIND) == "rag"]
    assert rag_spans
    assert {s.attributes.get("app.index_version") for s in rag_spans} == {"v1", "v2"}
    assert {s.attributes.get("service.version") for s in rag_spans} == {"1.0", "2.0"}
