"""The shipped Prometheus alert, end to end, with real Prometheus and Alertmanager.

An in-test HTTP server serves ``Telemetry().render()`` (the collector's /metrics
exposition) while the test observes ``ragtrace_eval_score`` values into it.  Prometheus
scrapes it every second and evaluates ``render_rules(SHIPPED_ALERTS)`` with the
windows shortened to seconds (same generator, same thresholds and minimum counts as
``docker/prometheus/rules/ragtrace.rules.yml``).  The scores carry the shipped
segment labels (``deployment_environment``, ``service_version``, ``app_index_version``)
and service "shop" serves index versions v1 and v2 side by side.  Recall is good, then
degrades on v2 only: the recall alert must fire for that segment and reach Alertmanager
naming it, v1 and the steady precision must stay quiet, and when v2 recovers the alert
must resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ragtrace_collector.alerts.promrules import (
    SHIPPED_ALERTS,
    SHIPPED_SEGMENTS,
    render_rules,
    with_durations,
)
from ragtrace_collector.component.telemetry import CONTENT_TYPE_LATEST, Telemetry
from ragtrace_collector.segments import prometheus_label
from tests.alerts.dashboard import load_dashboard, offered_labels
from tests.fakes.services import (
    async_alertmanager,
    async_prometheus,
    await_condition,
    get_json,
    prometheus_config,
)

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(150)]

WINDOW, BASELINE, FOR = 10, 30, 2


#: The segment values of the two index versions (no release attribute: "unset").
V1, V2 = ("production", "unset", "v1"), ("production", "unset", "v2")


class Traffic:
    """Observes scores into the telemetry histogram ~30 times a second per metric and
    index version; ``recall_mean`` is index v2's (v1 stays at 0.9)."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.recall_mean = 0.9
        telemetry.results.set_segment_labels([prometheus_label(k) for k in SHIPPED_SEGMENTS])
        self._observe = telemetry.results.observe
        self._rng = random.Random(42)

    def _score(self, mean: float) -> float:
        return min(1.0, max(0.0, self._rng.gauss(mean, 0.05)))

    async def run(self) -> None:
        while True:
            for _ in range(3):
                self._observe("shop", "contextual_recall", self._score(0.9), V1)
                self._observe("shop", "contextual_recall", self._score(self.recall_mean), V2)
                for segments in (V1, V2):
                    self._observe("shop", "contextual_precision", self._score(0.8), segments)
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def metrics_server(telemetry: Telemetry) -> AsyncIterator[str]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=telemetry.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _prom_query(url: str, query: str) -> list[dict[str, Any]]:
    data = get_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def _prom_alerts(url: str, name: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = get_json(f"{url}/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name]


def _am_alerts(url: str, name: str) -> list[dict[str, Any]]:
    return [a for a in get_json(url + "/api/v2/alerts") if a["labels"]["alertname"] == name]


async def test_the_recall_alert_fires_into_alertmanager_and_resolves(tmp_path: Path) -> None:
    rules = tmp_path / "ragtrace.rules.yml"
    fast = with_durations(SHIPPED_ALERTS, window=WINDOW, baseline=BASELINE, for_=FOR)
    rules.write_text(render_rules(fast), encoding="utf-8")
    telemetry = Telemetry()
    traffic = Traffic(telemetry)
    feeder = asyncio.create_task(traffic.run())
    try:
        async with (
            metrics_server(telemetry) as target,
            async_alertmanager(tmp_path / "am") as am,
        ):
            config = prometheus_config(
                scrape_targets=[target], rule_files=[rules], alertmanager_address=am.address
            )
            async with async_prometheus(tmp_path / "prom", config) as prom:
                await _run_scenario(prom.url, am.url, traffic)
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder


async def _run_scenario(prom: str, am: str, traffic: Traffic) -> None:
    baseline_count = (
        f"service_metric:ragtrace_eval_score_count:increase_{BASELINE}s_offset_{WINDOW}s"
    )
    # 1. Good traffic until the baseline window holds enough results for the rule.
    full = f'{baseline_count}{{metric="contextual_recall"}} >= 30'
    await await_condition(
        lambda: len(_prom_query(prom, full)) == 2 or None,  # one per index version
        within=60,
        what="a full baseline in Prometheus",
    )
    assert _prom_alerts(prom, "RagtraceRecallDrop") == []  # not even pending
    assert _am_alerts(am, "RagtraceRecallDrop") == []
    # The dashboard's "Split scores by" asks this Prometheus for label_names of the
    # score series (Grafana's /api/v1/labels with match[]): it offers the segment
    # labels, and not service, metric, job or instance.
    names = get_json(
        f"{prom}/api/v1/labels?" + urllib.parse.urlencode({"match[]": "ragtrace_eval_score_count"})
    )["data"]
    assert {"job", "instance", "__name__"} <= set(names)
    split = {v["name"]: v for v in load_dashboard()["templating"]["list"]}["split"]
    assert offered_labels(split, set(names)) == sorted(
        prometheus_label(k) for k in SHIPPED_SEGMENTS
    )

    # 2. Recall of index v2 degrades: Prometheus fires, Alertmanager has the alert.
    traffic.recall_mean = 0.5
    (alert,) = await await_condition(
        lambda: _am_alerts(am, "RagtraceRecallDrop") or None,
        within=60,
        what="RagtraceRecallDrop in Alertmanager",
    )
    labels = alert["labels"]
    assert labels["service"] == "shop"
    assert labels["metric"] == "contextual_recall"
    assert labels["app_index_version"] == "v2"
    assert labels["service_version"] == "unset"
    assert labels["deployment_environment"] == "production"
    assert labels["severity"] == "warning"
    assert labels["source"] == "ragtrace"
    assert alert["status"]["state"] == "active"
    desc = alert["annotations"]["description"]
    assert (
        "The mean contextual_recall of service shop, deployment_environment=production,"
        " service_version=unset, app_index_version=v2 over the last 10s is"
    ) in desc
    assert "below its mean over the 30s before" in desc
    drop = float(desc.split(" is ")[1].split(" ")[0])
    assert 0.1 <= drop <= 0.6
    # index v1 (same service, same metric) and the steady metric stayed quiet throughout
    recall_alerts = _prom_alerts(prom, "RagtraceRecallDrop")
    assert [a["labels"]["app_index_version"] for a in recall_alerts] == ["v2"]
    assert _prom_alerts(prom, "RagtracePrecisionDrop") == []
    assert _am_alerts(am, "RagtracePrecisionDrop") == []

    # 3. Recall of v2 recovers: Prometheus resolves, Alertmanager lets go of it.
    traffic.recall_mean = 0.9
    await await_condition(
        lambda: True if not _am_alerts(am, "RagtraceRecallDrop") else None,
        within=60,
        what="RagtraceRecallDrop to resolve in Alertmanager",
    )
