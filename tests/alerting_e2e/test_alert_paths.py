"""A retrieval drop pages through both alert paths, with real components only.

The support bot asks its golden questions through the SDK (OTLP/HTTP) to a
``ragtrace-collector serve`` subprocess, which scores ``id_context_recall`` (exact and
offline: golden traffic carries its reference ids) and exports the enriched spans to a
recording OTLP backend.  Around it run a real Prometheus, scraping the collector's
admin ``/metrics`` and evaluating the shipped rules rendered with windows of seconds
(``with_durations(SHIPPED_ALERTS, ...)``: same generator, same drop and minimum
counts as ``docker/prometheus/rules/ragtrace.rules.yml``), and a real Alertmanager.
The collector's own drop detector posts to that Alertmanager and to a webhook in the
test.

Good retrieval, then ``wrong_index`` (ID recall 1.0 -> ~0.07), then good again:

* both alerts reach Alertmanager and are read back through ``GET /api/v2/alerts``;
* the webhook payload names the rule and metric, carries the window mean, baseline,
  sample count and example trace ids, and every example is the trace id of a degraded
  request that the backend received with a low ``ragtrace.eval.id_context_recall.score``;
* restoring retrieval resolves the detector's alert (webhook ``resolved``; Alertmanager
  drops it and notifies ``resolved``), and Prometheus' alert resolves too.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.alerts.promrules import SHIPPED_ALERTS, render_rules, with_durations
from tests.alerting_e2e._support import (
    DETECTOR_ALERTNAME,
    DETECTOR_RULE,
    METRIC,
    SCORE_ATTR,
    SERVICE,
    CollectorProcess,
    HookReceiver,
    Traffic,
    alerts_section,
    am_alerts,
    collector_data,
    configure_sdk,
    hook_receiver,
    prom_alerts,
    prom_query,
    rag_span,
)
from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.services import (
    alertmanager_config,
    async_alertmanager,
    async_prometheus,
    await_condition,
    prometheus_config,
)

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(180)]

#: Prometheus rule windows (seconds): the mean of the last 10s against the 30s before.
PROM_WINDOW, PROM_BASELINE, PROM_FOR = 10, 30, 2
PROM_ALERTNAME = "RagtraceRecallDrop"
RULE = DETECTOR_RULE["name"]
HOOK, AM_HOOK = "/ragtrace", "/alertmanager"


def _epoch_ns(ts: str) -> int:
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1e9)


def _detector_events(hooks: HookReceiver, status: str) -> list[dict[str, Any]]:
    return [b for b in hooks.on(HOOK) if b["status"] == status]


def _am_notified(hooks: HookReceiver, alertname: str, status: str) -> list[dict[str, Any]]:
    """Alerts Alertmanager itself notified (its webhook receiver, ``send_resolved``)."""
    return [
        alert
        for body in hooks.on(AM_HOOK)
        for alert in body["alerts"]
        if alert["labels"]["alertname"] == alertname and alert["status"] == status
    ]


async def test_a_retrieval_drop_pages_through_prometheus_and_the_detector(
    tmp_path: Path, sink: OtlpSink
) -> None:
    rules = tmp_path / "ragtrace.rules.yml"
    fast = with_durations(SHIPPED_ALERTS, window=PROM_WINDOW, baseline=PROM_BASELINE, for_=PROM_FOR)
    rules.write_text(render_rules(fast), encoding="utf-8")
    async with (
        hook_receiver() as hooks,
        async_alertmanager(tmp_path / "am", alertmanager_config(hooks.url + AM_HOOK)) as am,
    ):
        alerts = alerts_section(webhook_url=hooks.url + HOOK, alertmanager_url=am.url)
        collector = CollectorProcess(tmp_path / "collector", collector_data(sink, alerts))
        try:
            await asyncio.to_thread(collector.wait_ready)
            config = prometheus_config(
                scrape_targets=[collector.admin_address],
                rule_files=[rules],
                alertmanager_address=am.address,
            )
            async with async_prometheus(tmp_path / "prom", config) as prom:
                configure_sdk(collector.http_base_url)
                traffic = Traffic(rate=10.0).start()
                try:
                    await _scenario(prom.url, am.url, hooks, traffic, sink)
                finally:
                    await asyncio.to_thread(traffic.stop)
        finally:
            code = await asyncio.to_thread(collector.stop)
            print(f"collector log tail:\n{collector.log_tail()}")
        assert code == 0, "graceful shutdown"
        events = [r["event"] for r in collector.log_lines() if r.get("rule") == RULE]
        assert "alert_firing" in events  # the log notifier too
        assert "alert_resolved" in events


async def _scenario(
    prom: str, am: str, hooks: HookReceiver, traffic: Traffic, sink: OtlpSink
) -> None:
    # 1. Good retrieval until Prometheus' baseline window holds the rule's minimum
    #    (which also fills the detector's 20-score baseline: its window is shorter).
    base_count = (
        f"service_metric:ragtrace_eval_score_count:increase_{PROM_BASELINE}s_offset_{PROM_WINDOW}s"
    )
    await await_condition(
        lambda: prom_query(prom, f'{base_count}{{metric="{METRIC}"}} >= 30') or None,
        within=60,
        what="a full baseline in Prometheus",
    )
    (mean,) = prom_query(prom, "sum(ragtrace_eval_score_sum) / sum(ragtrace_eval_score_count)")
    assert float(mean["value"][1]) == 1.0  # exact: every golden answer retrieved its docs
    assert hooks.received == []
    assert am_alerts(am, DETECTOR_ALERTNAME) == am_alerts(am, PROM_ALERTNAME) == []
    assert prom_alerts(prom, PROM_ALERTNAME) == []  # not even pending

    # 2. Retrieval breaks.  The detector's webhook fires first-hand ...
    broken_at = traffic.set(fault="wrong_index")
    (firing,) = await hooks.wait_for(
        lambda h: _detector_events(h, "firing"), within=60, what="the detector's webhook"
    )
    assert firing["rule"] == RULE
    assert firing["metric"] == METRIC
    assert firing["service"] == SERVICE
    assert firing["repeat"] is False
    assert firing["labels"]["severity"] == "page"
    assert firing["window_seconds"] == 6.0
    assert firing["baseline_kind"] == "trailing"
    assert firing["baseline_window_seconds"] == 30.0
    assert firing["sample_count"] >= DETECTOR_RULE["min_samples"]
    assert firing["baseline_sample_count"] >= 20
    assert firing["baseline"] >= 0.9  # good retrieval scores 1.0
    assert firing["window_mean"] <= firing["baseline"] - DETECTOR_RULE["drop"]
    assert firing["drop"] == pytest.approx(firing["baseline"] - firing["window_mean"])
    assert firing["p_value"] <= 0.05
    assert _epoch_ns(firing["started_at"]) >= broken_at - 10**9  # ms rounding, clock quantum
    assert 1 <= len(firing["example_trace_ids"]) <= 5

    # ... and both alerts reach Alertmanager.
    (detector_alert,) = await await_condition(
        lambda: am_alerts(am, DETECTOR_ALERTNAME) or None,
        within=30,
        what="the detector's alert in Alertmanager",
    )
    assert detector_alert["status"]["state"] == "active"
    assert detector_alert["labels"] == {
        "alertname": DETECTOR_ALERTNAME,
        "rule": RULE,
        "metric": METRIC,
        "service": SERVICE,
        "severity": "page",
    }
    notes = detector_alert["annotations"]
    assert float(notes["window_mean"]) <= float(notes["baseline"]) - DETECTOR_RULE["drop"]
    assert int(notes["sample_count"]) >= DETECTOR_RULE["min_samples"]
    (prom_alert,) = await await_condition(
        lambda: am_alerts(am, PROM_ALERTNAME) or None,
        within=60,
        what="Prometheus' recall alert in Alertmanager",
    )
    assert prom_alert["labels"]["service"] == SERVICE
    assert prom_alert["labels"]["metric"] == METRIC
    assert prom_alert["labels"]["source"] == "ragtrace"
    assert prom_alert["status"]["state"] == "active"
    assert "below its mean over the 30s before" in prom_alert["annotations"]["description"]
    # Prometheus also sees the detector's state, through the collector's /metrics
    await await_condition(
        lambda: prom_query(prom, f'ragtrace_alert_firing{{rule="{RULE}"}} == 1') or None,
        within=30,
        what="ragtrace_alert_firing == 1 in Prometheus",
    )

    # 3. The evidence leads back to bad traces: every example trace id is a degraded
    #    request that the backend received, scored low.
    examples = set(firing["example_trace_ids"]) | set(notes["example_trace_ids"].split(","))
    for trace_id in sorted(examples):
        span = await asyncio.to_thread(_wait_for_rag_span, sink, trace_id)
        score = span.attributes[SCORE_ATTR]
        assert score < 0.5, (trace_id, score)
        request = traffic.request_at(span.span.start_time_unix_nano)
        assert request is not None, f"{trace_id} is no request of this test"
        assert request.start_ns >= broken_at
        assert request.fault == "wrong_index"
        assert request.recall == score  # the collector's score is the bot's true recall

    # 4. Retrieval is restored: the detector resolves its alert everywhere.
    fixed_at = traffic.set(fault="none")
    (resolved,) = await hooks.wait_for(
        lambda h: _detector_events(h, "resolved"), within=60, what="the webhook's resolve"
    )
    assert resolved["rule"] == RULE
    assert resolved["started_at"] == firing["started_at"]
    assert _epoch_ns(resolved["ended_at"]) >= fixed_at
    # The sequential test resolves on its evidence that the scores are back, and says so.
    assert resolved["reason"].startswith("the scores are back")
    assert resolved["drop"] < firing["drop"]
    assert "; resolved: the scores are back" in resolved["summary"]
    # Transitions only here: the webhook's repeats come every 15 minutes.
    assert len(_detector_events(hooks, "firing")) == 1
    await await_condition(
        lambda: True if not am_alerts(am, DETECTOR_ALERTNAME) else None,
        within=30,
        what="Alertmanager to drop the detector's alert",
    )
    await hooks.wait_for(
        lambda h: _am_notified(h, DETECTOR_ALERTNAME, "resolved"),
        within=30,
        what="Alertmanager's resolved notification of the detector's alert",
    )
    assert _am_notified(hooks, DETECTOR_ALERTNAME, "firing")
    await await_condition(
        lambda: prom_query(prom, f'ragtrace_alert_firing{{rule="{RULE}"}} == 0') or None,
        within=30,
        what="ragtrace_alert_firing back to 0 in Prometheus",
    )
    # Prometheus' view recovers as well
    await await_condition(
        lambda: True if not am_alerts(am, PROM_ALERTNAME) else None,
        within=60,
        what="Prometheus' alert to resolve in Alertmanager",
    )
    assert traffic.count(since_ns=broken_at, fault="wrong_index") >= DETECTOR_RULE["min_samples"]


def _wait_for_rag_span(sink: OtlpSink, trace_id: str) -> Any:
    found: list[Any] = []

    def arrived() -> bool:
        span = rag_span(sink, trace_id)
        if span is not None and SCORE_ATTR in span.attributes:
            found.append(span)
            return True
        return False

    sink.wait_until(arrived, timeout=30)
    return found[0]
