"""Where the detector's alerts go: a generic webhook, the Alertmanager v2 API, a log line.

Each notifier is optional (see :class:`~ragtrace_collector.alerts.config.AlertsConfig`).
A notifier's :meth:`Notifier.notify` either delivers or raises
:class:`NotificationError` after its bounded retries; the detector counts both
outcomes and never lets a failing notifier stop the others.

A notifier with a ``resend_interval`` (Alertmanager's ``resend_interval``, the
webhook's ``repeat_interval``) is sent the still-firing alert, with its current
figures, again at that period (``repeat: true``); the log hears of each alert only
when it fires and when it resolves.  The detector sends a transition (firing or
resolved) again at its next evaluations when every retry failed (see
:class:`~ragtrace_collector.alerts.detector.DropDetector`).

Each notifier is a component (``notifier:<name>``): ``recoverable_error`` while its
target cannot be reached, ``ok`` after the next delivery.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

import aiohttp
import structlog

from ragtrace_collector.alerts.config import (
    AlertmanagerConfig,
    AlertsConfig,
    WebhookConfig,
)
from ragtrace_collector.alerts.events import AlertEvent, iso8601, segment_text
from ragtrace_collector.component import Component, Status
from ragtrace_collector.segments import prometheus_label

__all__ = [
    "AlertmanagerNotifier",
    "LogNotifier",
    "NotificationError",
    "Notifier",
    "WebhookNotifier",
    "build_notifiers",
]

_log = structlog.get_logger("ragtrace.alerts")

#: Alertmanager keeps a firing alert alive until ``endsAt``; each post pushes it this
#: many resend intervals ahead (Prometheus uses the same factor).
_ENDS_AT_RESENDS = 4
_MAX_ERROR_BODY = 300


class NotificationError(Exception):
    """A notification could not be delivered (after the notifier's retries)."""


@runtime_checkable
class Notifier(Protocol):
    """Something that delivers :class:`AlertEvent` s."""

    @property
    def name(self) -> str:
        """Short name, used as the ``notifier`` label of ``ragtrace_alert_notifications``."""
        ...

    @property
    def resend_interval(self) -> float | None:
        """Re-send period for still-firing alerts, or None for transitions only."""
        ...

    async def notify(self, event: AlertEvent) -> None:
        """Deliver one event, or raise :class:`NotificationError`."""
        ...

    async def aclose(self) -> None:
        """Release connections.  Idempotent."""
        ...


class _JsonPoster:
    """POST JSON with bounded retries and exponential backoff."""

    def __init__(
        self,
        name: str,
        config: WebhookConfig | AlertmanagerConfig,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._name = name
        self._config = config
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"User-Agent": "ragtrace-collector", **self._config.headers},
                json_serialize=json.dumps,
            )
        return self._session

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = self._config.backoff * 2.0 ** (attempt - 1)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self._config.max_backoff)

    async def post(self, url: str, payload: Any) -> None:
        cfg = self._config
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=cfg.timeout)
        last_error = "no attempt made"
        for attempt in range(1, cfg.max_attempts + 1):
            retry_after: float | None = None
            try:
                async with session.post(url, json=payload, timeout=timeout) as resp:
                    if 200 <= resp.status < 300:
                        await resp.read()
                        return
                    body = (await resp.text(errors="replace"))[:_MAX_ERROR_BODY]
                    last_error = f"HTTP {resp.status} from {url}: {body.strip()}"
                    if resp.status != 429 and resp.status < 500:
                        raise NotificationError(f"{self._name}: {last_error} (not retried)")
                    retry_after = _retry_after(resp.headers.get("Retry-After"))
            except (aiohttp.ClientError, TimeoutError) as exc:
                last_error = f"{type(exc).__name__} posting to {url}: {exc}"
            if attempt < cfg.max_attempts:
                delay = self._backoff(attempt, retry_after)
                _log.info(
                    "alert_notification_retry",
                    notifier=self._name,
                    attempt=attempt,
                    delay_s=delay,
                    error=last_error,
                )
                await self._sleep(delay)
        raise NotificationError(
            f"{self._name}: gave up after {cfg.max_attempts} attempts: {last_error}"
        )

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
    return seconds if seconds >= 0 else None


class WebhookNotifier(Component):
    """A JSON POST per firing and per resolved alert, and one with the current figures
    (``"repeat": true``) every ``repeat_interval`` while an alert fires.

    Body: ``{"version": "1", "source": "ragtrace-collector", **AlertEvent.to_dict()}``
    (rule, metric, service, window mean, baseline, sample counts, p-value, example
    trace ids, times).
    """

    def __init__(
        self,
        config: WebhookConfig,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._config = config
        self._poster = _JsonPoster("webhook", config, sleep)
        self.component_name = "notifier:webhook"
        self.report(Status.OK)

    @property
    def name(self) -> str:
        return "webhook"

    @property
    def resend_interval(self) -> float | None:
        return self._config.repeat_interval

    @staticmethod
    def payload(event: AlertEvent) -> dict[str, Any]:
        return {"version": "1", "source": "ragtrace-collector", **event.to_dict()}

    async def notify(self, event: AlertEvent) -> None:
        await self._poster.post(self._config.url, self.payload(event))

    async def aclose(self) -> None:
        await self._poster.aclose()


class AlertmanagerNotifier(Component):
    """Posts to the Alertmanager v2 API (``POST /api/v2/alerts``).

    Labels: ``alertname``, ``rule``, ``metric``, ``service``, ``severity``, the
    segments of the series that dropped (under their Prometheus labels,
    ``app_index_version="v2"``), plus the rule's and this notifier's static labels.
    Annotations: ``summary``, ``description`` (the segment, its mean and baseline, and
    its siblings' means), the figures, ``segments``, ``siblings``, ``against`` (canary
    rules) and ``example_trace_ids``.  A firing post sets ``endsAt`` a few
    resend intervals ahead; a resolved post sets ``endsAt`` to the resolution time.
    """

    def __init__(
        self,
        config: AlertmanagerConfig,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._config = config
        self._poster = _JsonPoster("alertmanager", config, sleep)
        self._url = config.url.rstrip("/") + "/api/v2/alerts"
        self.component_name = "notifier:alertmanager"
        self.report(Status.OK)

    @property
    def name(self) -> str:
        return "alertmanager"

    @property
    def resend_interval(self) -> float | None:
        return self._config.resend_interval

    def labels(self, event: AlertEvent) -> dict[str, str]:
        return {
            "severity": "warning",
            **event.labels,
            **self._config.labels,
            "alertname": self._config.alertname,
            "rule": event.rule,
            "metric": event.metric,
            "service": event.service,
            **{prometheus_label(key): value for key, value in event.segments.items()},
        }

    def alert(self, event: AlertEvent) -> dict[str, Any]:
        """The postable alert for ``event`` (one element of the API's list body)."""
        if event.status == "firing":
            ends = event.evaluated_at + _ENDS_AT_RESENDS * self._config.resend_interval
        else:
            ends = event.ended_at if event.ended_at is not None else event.evaluated_at
        where = f"service {event.service}"
        if event.segments:
            where += f", {segment_text(event.segments)}"
        annotations = {
            "summary": f"{event.metric} dropped for {where}",
            "description": event.describe(),
            "window_mean": f"{event.window_mean:.4f}",
            "baseline": f"{event.baseline:.4f}",
            "drop": f"{event.drop:.4f}",
            "sample_count": str(event.sample_count),
            "p_value": f"{event.p_value:.3g}",
            "example_trace_ids": ",".join(event.example_trace_ids),
        }
        if event.baseline_sample_count is not None:
            annotations["baseline_sample_count"] = str(event.baseline_sample_count)
        if event.segments:
            annotations["segments"] = segment_text(event.segments)
        if event.siblings:
            annotations["siblings"] = event.siblings_text()
        if event.against is not None:
            annotations["against"] = event.against
        alert: dict[str, Any] = {
            "labels": self.labels(event),
            "annotations": annotations,
            "startsAt": iso8601(event.started_at),
            "endsAt": iso8601(ends),
        }
        if self._config.generator_url:
            alert["generatorURL"] = self._config.generator_url
        return alert

    async def notify(self, event: AlertEvent) -> None:
        await self._poster.post(self._url, [self.alert(event)])

    async def aclose(self) -> None:
        await self._poster.aclose()


class LogNotifier(Component):
    """One structlog line per firing (warning) and resolved (info) alert."""

    def __init__(self, logger: Any = None) -> None:
        self._logger = logger if logger is not None else _log
        self.component_name = "notifier:log"
        self.report(Status.OK)

    @property
    def name(self) -> str:
        return "log"

    @property
    def resend_interval(self) -> float | None:
        return None

    async def notify(self, event: AlertEvent) -> None:
        fields = event.to_dict()
        fields.pop("status")
        if event.status == "firing":
            self._logger.warning("alert_firing", **fields)
        else:
            self._logger.info("alert_resolved", **fields)

    async def aclose(self) -> None:
        return None


def build_notifiers(config: AlertsConfig) -> list[Notifier]:
    """The notifiers the config enables, in a fixed order (log, webhook, alertmanager)."""
    notifiers: list[Notifier] = []
    if config.log.enabled:
        notifiers.append(LogNotifier())
    if config.webhook is not None and config.webhook.enabled:
        notifiers.append(WebhookNotifier(config.webhook))
    if config.alertmanager is not None and config.alertmanager.enabled:
        notifiers.append(AlertmanagerNotifier(config.alertmanager))
    return notifiers
