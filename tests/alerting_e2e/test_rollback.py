"""A canary alert resolves everywhere after a rollback, with a real Alertmanager.

The in-process collector (real OTLP/HTTP receiver, evaluation stage, detector) gets
traces of one service in two releases, ``1.0`` and ``2.0`` (``segments:
[service.version]``).  Two canary rules with 6-second windows watch it: one names
``2.0`` as its candidate, the other tests every release against the rest.  The
detector posts to a real Alertmanager (resent every 2 s) and to a webhook in the test;
Alertmanager notifies its own webhook, resolved alerts included.

Release 2.0's retrieval breaks: both rules fire.  Then 2.0 is rolled back (its traffic
stops, 1.0's goes on).  Within about a window of 2.0's last request, and in this order
of nothing:

* the webhook hears ``resolved`` for both rules, with the reason "no results in the
  last 6s" (or "only N scored results"), and the text never claims the drop held;
* ``ragtrace_alert_firing`` of both rules is 0 on the collector's ``/metrics``;
* Alertmanager no longer holds the alerts and notifies ``resolved``; and they stay
  resolved over several resend intervals (the collector no longer posts them).

Before the fix, a firing series with too few results kept firing: the metric stayed at
1, the webhook heard nothing, and the collector re-posted the frozen alert.  The test
prints the seconds from 2.0's last request to each view's resolution.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.config import parse_config
from tests.alerting_e2e._support import (
    DETECTOR_ALERTNAME,
    METRIC,
    EvalCollectorThread,
    HookReceiver,
    ReleaseSender,
    am_alerts,
    collector_data,
    hook_receiver,
    scrape,
)
from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.services import alertmanager_config, async_alertmanager, await_condition

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(180)]

HOOK, AM_HOOK = "/ragtrace", "/alertmanager"
WINDOW = 6.0
RULES = ("release-canary", "any-release-canary")
#: Each view resolves within a window and a few evaluations of 2.0's last request on an
#: idle machine (about 7 s); this allows five times that.
RESOLVE_WITHIN = 40.0


def _config(sink: OtlpSink, hook_url: str, am_url: str) -> dict[str, Any]:
    canary = {
        "kind": "canary",
        "metric": METRIC,
        "segment": "service.version",
        "window": f"{WINDOW:g}s",
        "drop": 0.2,
        "min_samples": 20,
    }
    alerts = {
        "evaluation_interval": "500ms",
        "rules": [
            {**canary, "name": RULES[0], "candidate": "2.0"},
            {**canary, "name": RULES[1]},
        ],
        "log": {"enabled": True},
        "webhook": {"url": hook_url, "max_attempts": 3, "backoff": "100ms"},
        "alertmanager": {
            "url": am_url,
            "resend_interval": "2s",
            "max_attempts": 3,
            "backoff": "100ms",
        },
    }
    data = collector_data(sink, alerts)
    data["segments"] = ["service.version"]
    return data


def _posts(hooks: HookReceiver, status: str) -> dict[str, Any]:
    """The detector's webhook posts of ``status``, the first per rule."""
    out: dict[str, Any] = {}
    for hook in hooks.received:
        if hook.path == HOOK and hook.body["status"] == status:
            out.setdefault(hook.body["rule"], (hook.body, hook.at))
    return out


def _am_notified(hooks: HookReceiver, status: str) -> set[str]:
    """Rules whose alert Alertmanager itself notified with ``status``."""
    return {
        alert["labels"]["rule"]
        for body in hooks.on(AM_HOOK)
        for alert in body["alerts"]
        if alert["labels"]["alertname"] == DETECTOR_ALERTNAME and alert["status"] == status
    }


def _am_resolved_ends(hooks: HookReceiver) -> dict[str, float]:
    """Per rule, the ``endsAt`` of the resolved alert Alertmanager notified (epoch s)."""
    return {
        alert["labels"]["rule"]: _epoch(alert["endsAt"])
        for body in hooks.on(AM_HOOK)
        for alert in body["alerts"]
        if alert["labels"]["alertname"] == DETECTOR_ALERTNAME and alert["status"] == "resolved"
    }


def _epoch(ts: str) -> float:
    """An RFC 3339 time (Alertmanager writes nanoseconds, the collector milliseconds)."""
    head, _, frac = ts.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp()
    return whole + (float("0." + frac) if frac else 0.0)


def _firing_metric(admin_url: str) -> dict[str, float | None]:
    page = scrape(admin_url)
    return {rule: page.value("ragtrace_alert_firing", rule=rule) for rule in RULES}


async def test_a_rollback_resolves_the_canary_alert_everywhere(
    tmp_path: Path, sink: OtlpSink
) -> None:
    async with (
        hook_receiver() as hooks,
        async_alertmanager(tmp_path / "am", alertmanager_config(hooks.url + AM_HOOK)) as am,
    ):
        config = parse_config(_config(sink, hooks.url + HOOK, am.url), env={})
        collector = EvalCollectorThread(config).start()
        sender = ReleaseSender(collector.http_url)
        try:
            sender.start()
            await asyncio.sleep(WINDOW + 2)  # a window of healthy traffic on both sides
            assert hooks.received == [], "healthy traffic paged"
            sender.broken = True
            await hooks.wait_for(
                lambda h: len(_posts(h, "firing")) == len(RULES),
                within=60,
                what="both canary rules firing at the webhook",
            )
            firing = _posts(hooks, "firing")
            await await_condition(
                lambda: len(am_alerts(am.url, DETECTOR_ALERTNAME)) == len(RULES) or None,
                within=30,
                what="both alerts in Alertmanager",
            )
            assert _firing_metric(collector.admin_url) == dict.fromkeys(RULES, 1.0)

            sender.rolled_back = True  # 2.0's traffic stops; 1.0's goes on
            await hooks.wait_for(
                lambda h: len(_posts(h, "resolved")) == len(RULES),
                within=RESOLVE_WITHIN,
                what="both rules resolved at the webhook",
            )
            metric_at = await await_condition(
                lambda: (
                    time.time()
                    if _firing_metric(collector.admin_url) == dict.fromkeys(RULES, 0.0)
                    else None
                ),
                within=RESOLVE_WITHIN,
                what="ragtrace_alert_firing back to 0",
            )
            am_at = await await_condition(
                lambda: time.time() if not am_alerts(am.url, DETECTOR_ALERTNAME) else None,
                within=RESOLVE_WITHIN,
                what="Alertmanager to drop both alerts",
            )
            await hooks.wait_for(
                lambda h: _am_notified(h, "resolved") == set(RULES),
                within=RESOLVE_WITHIN,
                what="Alertmanager's resolved notifications",
            )
            am_notified_at = max(
                h.at
                for h in hooks.received
                if h.path == AM_HOOK and any(a["status"] == "resolved" for a in h.body["alerts"])
            )
            # they stay resolved: the collector no longer posts them (resent every 2 s)
            await asyncio.sleep(5)
            assert am_alerts(am.url, DETECTOR_ALERTNAME) == []
            assert _firing_metric(collector.admin_url) == dict.fromkeys(RULES, 0.0)
        finally:
            await asyncio.to_thread(sender.stop)
            await asyncio.to_thread(collector.stop)

    last_v2 = sender.last_sent["v2"]
    resolved = _posts(hooks, "resolved")
    for rule in RULES:
        body, _ = resolved[rule]
        first, _ = firing[rule]
        assert body["segments"] == {"service.version": "2.0"}
        assert body["started_at"] == first["started_at"]
        assert body["reason"] == f"no results in the last {WINDOW:g}s" or (
            body["reason"].startswith("only ")
            and body["reason"].endswith(f"scored results in the last {WINDOW:g}s")
        ), body["reason"]
        assert f"resolved: {body['reason']}" in body["summary"]
        assert ">=" not in body["summary"]  # the drop no longer holds, and it does not say so
    # Alertmanager resolved them on the collector's resolved post, not on the timeout of
    # the last firing post's endsAt (four resend intervals, 8 s, ahead): its endsAt is
    # the resolution time the webhook heard.
    ends = _am_resolved_ends(hooks)
    for rule in RULES:
        body, _ = resolved[rule]
        assert ends[rule] == pytest.approx(_epoch(body["ended_at"]), abs=0.002), rule
    assert [h.body["status"] for h in hooks.received if h.path == HOOK][-len(RULES) :] == [
        "resolved"
    ] * len(RULES)
    figures = {
        "webhook": max(at for _, at in resolved.values()) - last_v2,
        "ragtrace_alert_firing": metric_at - last_v2,
        "alertmanager": am_at - last_v2,
        "alertmanager notified": am_notified_at - last_v2,
    }
    print(
        "seconds from 2.0's last request to resolved: "
        + ", ".join(f"{name} {s:.1f}" for name, s in figures.items())
    )
    for name, seconds in figures.items():
        assert seconds <= RESOLVE_WITHIN, (name, seconds)
