"""Notifiers against a real aiohttp server on loopback: payloads, retries, bounds."""

from __future__ import annotations

import pytest
import structlog

from ragtrace_collector.alerts import (
    AlertmanagerConfig,
    AlertmanagerNotifier,
    LogNotifier,
    NotificationError,
    WebhookConfig,
    WebhookNotifier,
)
from ragtrace_collector.alerts.events import AlertEvent, SegmentMean, iso8601
from ragtrace_collector.component.telemetry import Telemetry

from ._support import T0, Clock, detector, drive, rule, sample_event
from .conftest import Receiver


class Sleeps:
    """Records the backoff delays instead of waiting them out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def webhook(receiver: Receiver, sleeps: Sleeps | None = None, **cfg: object) -> WebhookNotifier:
    config = WebhookConfig.model_validate({"url": receiver.url + "/hook", **cfg})
    if sleeps is None:
        return WebhookNotifier(config)
    return WebhookNotifier(config, sleep=sleeps)


async def test_webhook_posts_the_alert_as_json(receiver: Receiver) -> None:
    notifier = webhook(receiver, headers={"Authorization": "Bearer s3cret"})
    try:
        await notifier.notify(sample_event())
    finally:
        await notifier.aclose()
    (req,) = receiver.received
    assert req.path == "/hook"
    assert req.headers["Authorization"] == "Bearer s3cret"
    assert req.headers["Content-Type"].startswith("application/json")
    body = req.body
    assert body["version"] == "1"
    assert body["source"] == "ragtrace-collector"
    assert body["status"] == "firing"
    assert body["rule"] == "recall-drop"
    assert body["metric"] == "contextual_recall"
    assert body["service"] == "shop"
    assert body["window_mean"] == 0.612
    assert body["baseline"] == 0.874
    assert body["sample_count"] == 140
    assert body["baseline_sample_count"] == 9500
    assert body["window_seconds"] == 900.0
    assert body["p_value"] == 1.5e-9
    assert body["example_trace_ids"] == [
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "00f067aa0ba902b7aaaaaaaaaaaaaaaa",
    ]
    assert body["started_at"] == iso8601(T0) == "2023-11-14T22:00:00.000Z"
    assert body["ended_at"] is None
    assert "contextual_recall for service shop is 0.612" in body["summary"]


async def test_webhook_retries_after_500_with_backoff(receiver: Receiver) -> None:
    receiver.script(500, 503)
    sleeps = Sleeps()
    notifier = webhook(receiver, sleeps, backoff=0.1, max_attempts=4)
    try:
        await notifier.notify(sample_event())
    finally:
        await notifier.aclose()
    assert len(receiver.received) == 3
    assert receiver.received[0].body == receiver.received[2].body  # the same alert again
    assert sleeps.delays == [0.1, 0.2]


async def test_webhook_gives_up_after_max_attempts(receiver: Receiver) -> None:
    receiver.script(500, 500, 500, 500, 500)
    sleeps = Sleeps()
    notifier = webhook(receiver, sleeps, backoff=1, max_backoff=3, max_attempts=4)
    try:
        with pytest.raises(NotificationError, match=r"gave up after 4 attempts: HTTP 500"):
            await notifier.notify(sample_event())
    finally:
        await notifier.aclose()
    assert len(receiver.received) == 4
    assert sleeps.delays == [1, 2, 3]  # doubling, capped at max_backoff


async def test_webhook_does_not_retry_a_client_error(receiver: Receiver) -> None:
    receiver.script(400)
    sleeps = Sleeps()
    notifier = webhook(receiver, sleeps)
    try:
        with pytest.raises(NotificationError, match=r"HTTP 400 .*status 400 \(not retried\)"):
            await notifier.notify(sample_event())
    finally:
        await notifier.aclose()
    assert len(receiver.received) == 1
    assert sleeps.delays == []


async def test_webhook_honours_retry_after_on_429(receiver: Receiver) -> None:
    receiver.script(429, headers={"Retry-After": "2"})
    sleeps = Sleeps()
    notifier = webhook(receiver, sleeps, backoff=0.1)
    try:
        await notifier.notify(sample_event())
    finally:
        await notifier.aclose()
    assert len(receiver.received) == 2
    assert sleeps.delays == [2.0]


async def test_webhook_times_out_slow_answers_and_retries(receiver: Receiver) -> None:
    receiver.script(200, delay=5.0)  # the first answer comes too late
    notifier = webhook(receiver, timeout=0.3, backoff=0.01)
    try:
        await notifier.notify(sample_event())
    finally:
        await notifier.aclose()
    assert len(receiver.received) == 2


async def test_webhook_to_a_closed_port_fails_cleanly() -> None:
    from tests.fakes.services import free_port

    sleeps = Sleeps()
    config = WebhookConfig(url=f"http://127.0.0.1:{free_port()}/hook", max_attempts=3)
    notifier = WebhookNotifier(config, sleep=sleeps)
    try:
        with pytest.raises(
            NotificationError, match="gave up after 3 attempts: ClientConnectorError"
        ):
            await notifier.notify(sample_event())
    finally:
        await notifier.aclose()
    assert len(sleeps.delays) == 2


async def test_detector_to_webhook_fires_resolves_and_counts(receiver: Receiver) -> None:
    receiver.script(500)  # the first delivery is retried
    telemetry = Telemetry()
    clock = Clock()
    notifier = webhook(receiver, backoff=0.01)
    det = detector(
        [rule(baseline=0.9, **{"for": 0})], clock=clock, notifiers=[notifier], telemetry=telemetry
    )
    try:
        events = await drive(det, clock, [0.45, 0.55], seconds=30)
        assert [e.status for e in events] == ["firing"]
        events = await drive(det, clock, [0.85, 0.95], seconds=120)
        assert [e.status for e in events] == ["resolved"]
    finally:
        await det.aclose()
    bodies = [r.body for r in receiver.received]
    assert [b["status"] for b in bodies] == ["firing", "firing", "resolved"]
    assert bodies[2]["ended_at"] is not None
    assert bodies[2]["started_at"] == bodies[0]["started_at"]
    ok = telemetry.registry.get_sample_value(
        "ragtrace_alert_notifications_total", {"notifier": "webhook", "outcome": "ok"}
    )
    assert ok == 2


async def test_log_notifier_writes_structured_lines() -> None:
    notifier = LogNotifier()
    with structlog.testing.capture_logs() as logs:
        await notifier.notify(sample_event())
        await notifier.notify(sample_event(status="resolved", ended_at=T0 + 900))
    firing, resolved = logs
    assert firing["event"] == "alert_firing"
    assert firing["log_level"] == "warning"
    assert firing["rule"] == "recall-drop"
    assert firing["service"] == "shop"
    assert firing["window_mean"] == 0.612
    assert firing["example_trace_ids"][0] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert resolved["event"] == "alert_resolved"
    assert resolved["log_level"] == "info"
    assert resolved["ended_at"] == iso8601(T0 + 900)


def test_alertmanager_payload() -> None:
    notifier = AlertmanagerNotifier(
        AlertmanagerConfig(
            url="http://127.0.0.1:9093/",
            resend_interval=60,
            labels={"team": "search", "service": "cannot-override"},
            generator_url="http://grafana/d/ragtrace",
        )
    )
    firing = notifier.alert(sample_event(labels={"severity": "page"}))
    assert firing["labels"] == {
        "alertname": "RagtraceScoreDrop",
        "rule": "recall-drop",
        "metric": "contextual_recall",
        "service": "shop",
        "severity": "page",
        "team": "search",
    }
    assert firing["startsAt"] == iso8601(T0)
    assert firing["endsAt"] == iso8601(T0 + 300 + 4 * 60)  # kept alive for 4 resends
    assert firing["generatorURL"] == "http://grafana/d/ragtrace"
    ann = firing["annotations"]
    assert ann["window_mean"] == "0.6120"
    assert ann["baseline"] == "0.8740"
    assert ann["sample_count"] == "140"
    assert ann["example_trace_ids"].startswith("4bf92f3577b34da6a3ce929d0e0e4736,")
    resolved = notifier.alert(sample_event(status="resolved", ended_at=T0 + 900))
    assert resolved["endsAt"] == iso8601(T0 + 900)
    assert notifier.resend_interval == 60


def _segment_event(**overrides: object) -> AlertEvent:
    fields: dict[str, object] = {
        "window_mean": 0.41,
        "baseline": 0.83,
        "drop": 0.42,
        "segments": {"app.index_version": "v2"},
        "siblings": (
            SegmentMean({"app.index_version": "v1"}, 0.82, 400, baseline=0.83),
            SegmentMean({"app.index_version": "v3"}, 0.50, 30, baseline=0.84, dropped=True),
        ),
    }
    fields.update(overrides)
    return sample_event(**fields)


def _alertmanager() -> AlertmanagerNotifier:
    return AlertmanagerNotifier(AlertmanagerConfig(url="http://127.0.0.1:9093"))


def test_alertmanager_names_the_segment_and_its_siblings() -> None:
    alert = _alertmanager().alert(_segment_event())
    assert alert["labels"]["app_index_version"] == "v2"
    assert alert["labels"]["service"] == "shop"
    ann = alert["annotations"]
    assert ann["summary"] == "contextual_recall dropped for service shop, app.index_version=v2"
    assert ann["segments"] == "app.index_version=v2"
    assert ann["siblings"] == (
        "app.index_version=v1 holds at 0.82; app.index_version=v3 is at 0.50 against its "
        "0.84 baseline"
    )
    assert ann["description"].startswith(
        "contextual_recall for service shop, app.index_version=v2 is 0.41 against its 0.83 "
        "baseline; app.index_version=v1 holds at 0.82; "
    )
    assert ann["example_trace_ids"].startswith("4bf92f3577b34da6a3ce929d0e0e4736,")
    assert "against" not in ann


def test_alertmanager_canary_annotations() -> None:
    event = sample_event(
        kind="canary",
        baseline_kind="segment",
        baseline_window_seconds=None,
        baseline_sample_count=900,
        segments={"deployment.environment": "canary"},
        against="deployment.environment=production",
        window_mean=0.61,
        baseline=0.83,
        drop=0.22,
        p_value=3e-6,
    )
    alert = _alertmanager().alert(event)
    assert alert["labels"]["deployment_environment"] == "canary"
    ann = alert["annotations"]
    assert ann["against"] == "deployment.environment=production"
    assert ann["baseline_sample_count"] == "900"
    assert ann["description"] == (
        "contextual_recall for service shop: deployment.environment=canary is 0.61 (140 scored "
        "results) against deployment.environment=production at 0.83 (900 scored results) over "
        "the last 900s, 0.220 lower (rule recall-drop: drop >= 0.100, p=3e-06)"
    )


async def test_webhook_payload_carries_segments_and_siblings(receiver: Receiver) -> None:
    notifier = webhook(receiver)
    try:
        await notifier.notify(_segment_event())
    finally:
        await notifier.aclose()
    (req,) = receiver.received
    body = req.body
    assert body["kind"] == "drop"
    assert body["segments"] == {"app.index_version": "v2"}
    assert body["siblings"][0] == {
        "segments": {"app.index_version": "v1"},
        "window_mean": 0.82,
        "sample_count": 400,
        "baseline": 0.83,
        "dropped": False,
    }
    assert "app.index_version=v1 holds at 0.82" in body["summary"]
