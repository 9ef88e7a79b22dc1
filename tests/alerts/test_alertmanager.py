"""The Alertmanager notifier against a real ``prometheus-alertmanager`` on loopback.

Alertmanager routes every alert to a webhook receiver (an aiohttp server in the test)
with ``send_resolved``, so the test sees both what the API holds and what
Alertmanager itself notified: firing, then resolved.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.alerts import AlertmanagerConfig, AlertmanagerNotifier, AlertsConfig
from ragtrace_collector.alerts.detector import DropDetector
from ragtrace_collector.component.telemetry import Telemetry
from tests.fakes.services import alertmanager_config, async_alertmanager, await_condition, get_json

from ._support import sample_event
from .conftest import Receiver

pytestmark = [pytest.mark.services, pytest.mark.timeout(90)]


def _parse(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _alerts(url: str, **labels: str) -> list[dict[str, Any]]:
    """The alerts Alertmanager holds (active ones: resolved alerts are not listed)."""
    found = get_json(url + "/api/v2/alerts")
    return [a for a in found if all(a["labels"].get(k) == v for k, v in labels.items())]


async def test_firing_then_resolved_through_the_v2_api(tmp_path: Path, receiver: Receiver) -> None:
    config = alertmanager_config(webhook_url=receiver.url + "/am")
    async with async_alertmanager(tmp_path / "am", config) as am:
        notifier = AlertmanagerNotifier(
            AlertmanagerConfig(url=am.url, resend_interval=60, labels={"team": "search"})
        )
        try:
            now = time.time()
            await notifier.notify(sample_event(started_at=now - 120, evaluated_at=now))
            (alert,) = await await_condition(
                lambda: _alerts(am.url, rule="recall-drop") or None,
                within=10,
                what="the alert in Alertmanager",
            )
            assert alert["labels"] == {
                "alertname": "RagtraceScoreDrop",
                "rule": "recall-drop",
                "metric": "contextual_recall",
                "service": "shop",
                "severity": "warning",
                "team": "search",
            }
            assert alert["status"]["state"] == "active"
            assert alert["annotations"]["window_mean"] == "0.6120"
            assert alert["annotations"]["sample_count"] == "140"
            assert "4bf92f3577b34da6a3ce929d0e0e4736" in alert["annotations"]["example_trace_ids"]
            assert _parse(alert["startsAt"]) == pytest.approx(now - 120, abs=0.01)
            assert _parse(alert["endsAt"]) == pytest.approx(now + 240, abs=0.01)

            (note,) = await receiver.wait_for(1)
            assert note.path == "/am"
            assert note.body["status"] == "firing"
            assert note.body["alerts"][0]["labels"]["rule"] == "recall-drop"

            ended = time.time()
            await notifier.notify(
                sample_event(
                    status="resolved", started_at=now - 120, evaluated_at=ended, ended_at=ended
                )
            )
            await await_condition(
                lambda: True if not _alerts(am.url, rule="recall-drop") else None,
                within=10,
                what="the alert to be resolved",
            )
            notes = await receiver.wait_for(2)
            assert notes[1].body["status"] == "resolved"
            (resolved,) = notes[1].body["alerts"]
            assert resolved["status"] == "resolved"
            assert _parse(resolved["endsAt"]) == pytest.approx(ended, abs=0.01)
        finally:
            await notifier.aclose()


async def test_the_detector_fires_re_sends_and_resolves_in_alertmanager(tmp_path: Path) -> None:
    """Real time, a 2s window against a fixed baseline: 40 bad scores fire, the
    alert is re-sent (Alertmanager's endsAt moves on), good scores resolve it."""
    async with async_alertmanager(tmp_path / "am") as am:
        cfg = AlertsConfig.model_validate(
            {
                "rules": [
                    {
                        "name": "recall-fast",
                        "metric": "contextual_recall",
                        "window": "2s",
                        "baseline": 0.9,
                        "for": 0,
                        # The window test: this test does not wait for a step to end.
                        "test": "window",
                        "labels": {"severity": "page"},
                    }
                ],
                "alertmanager": {"url": am.url, "resend_interval": "1s"},
                "log": {"enabled": False},
            }
        )
        telemetry = Telemetry()
        det = DropDetector.from_config(cfg, telemetry)
        try:
            for i in range(40):
                det.observe("shop", "contextual_recall", 0.4 + (i % 2) / 10, f"trace-{i}")
            events = await det.evaluate()
            assert [e.status for e in events] == ["firing"]
            (alert,) = await await_condition(
                lambda: _alerts(am.url, rule="recall-fast") or None, within=10, what="firing"
            )
            assert alert["labels"]["severity"] == "page"
            assert alert["labels"]["service"] == "shop"
            assert "trace-0" in alert["annotations"]["example_trace_ids"]
            first_end = _parse(alert["endsAt"])

            await asyncio.sleep(1.1)  # let the resend interval pass
            for i in range(40):
                det.observe("shop", "contextual_recall", 0.4 + (i % 2) / 10, f"later-{i}")
            assert await det.evaluate() == []  # still firing: a re-send, not a transition
            (alert,) = _alerts(am.url, rule="recall-fast")
            assert _parse(alert["endsAt"]) > first_end

            await asyncio.sleep(2.2)  # the bad scores leave the 2s window
            for i in range(40):
                det.observe("shop", "contextual_recall", 0.85 + (i % 2) / 10, f"good-{i}")
            events = await det.evaluate()
            assert [e.status for e in events] == ["resolved"]
            await await_condition(
                lambda: True if not _alerts(am.url, rule="recall-fast") else None,
                within=10,
                what="resolved",
            )
            ok = telemetry.registry.get_sample_value(
                "ragtrace_alert_notifications_total", {"notifier": "alertmanager", "outcome": "ok"}
            )
            assert ok == 3
        finally:
            await det.aclose()
