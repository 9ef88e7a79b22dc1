"""Shared helpers for the alert tests: a settable clock, a recording notifier and a
seeded score stream driven through simulated time."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ragtrace_collector.alerts import AlertEvent, AlertsConfig, DropDetector, NotificationError
from ragtrace_collector.component.telemetry import Telemetry

#: Aligned with the fine (3s) and coarse (6.25s) buckets of the rules below.
T0 = 1_699_999_200.0

Noise = Literal["normal", "beta", "bernoulli"]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class RecordingNotifier:
    """A real in-process notifier that keeps what it is sent (and can be told to fail)."""

    name: str = "recording"
    resend_interval: float | None = None
    fail: bool = False
    events: list[AlertEvent] = field(default_factory=list)
    closed: bool = False
    delivered: asyncio.Event = field(default_factory=asyncio.Event)

    async def notify(self, event: AlertEvent) -> None:
        if self.fail:
            raise NotificationError(f"{self.name}: told to fail")
        self.events.append(event)
        self.delivered.set()

    async def aclose(self) -> None:
        self.closed = True


def rule(**overrides: Any) -> dict[str, Any]:
    """A drop rule in seconds-scale simulated time: 60s window, 600s trailing baseline."""
    base: dict[str, Any] = {
        "name": "recall",
        "metric": "contextual_recall",
        "window": "60s",
        "baseline": "600s",
        "drop": 0.1,
        "min_samples": 30,
        "for": "20s",
        "confidence": 0.95,
    }
    base.update(overrides)
    return base


def detector(
    rules: Sequence[dict[str, Any]],
    *,
    clock: Clock,
    notifiers: Sequence[Any] = (),
    telemetry: Telemetry | None = None,
    **config: Any,
) -> DropDetector:
    cfg = AlertsConfig.model_validate({"rules": list(rules), "log": {"enabled": False}, **config})
    return DropDetector(cfg, notifiers, telemetry, clock)


def draw(rng: random.Random, noise: Noise, mean: float) -> float:
    """One score in [0, 1] with the given mean."""
    if noise == "normal":
        return min(1.0, max(0.0, rng.gauss(mean, 0.15)))
    if noise == "beta":
        k = 4.0
        return rng.betavariate(mean * k, (1 - mean) * k)
    return 1.0 if rng.random() < mean else 0.0


async def simulate(
    det: DropDetector,
    clock: Clock,
    *,
    seed: int,
    noise: Noise,
    mean: float,
    seconds: float,
    rate: float = 2.0,
    step: float = 10.0,
    service: str = "shop",
    metric: str = "contextual_recall",
    skipped_ratio: float = 0.0,
) -> list[AlertEvent]:
    """Advance the clock by ``seconds`` in ``step``s: each step gets ``rate * step``
    results spread over it (a share ``skipped_ratio`` of them skipped, score None),
    then one evaluation.  Returns every transition."""
    rng = random.Random(seed)

    def emit(at: float) -> None:
        score = None if rng.random() < skipped_ratio else draw(rng, noise, mean)
        det.observe(service, metric, score, f"{seed:04d}-{at:.2f}", at=at)

    return await run_steps(det, clock, emit, seconds=seconds, rate=rate, step=step)


async def run_steps(
    det: DropDetector,
    clock: Clock,
    emit: Callable[[float], None],
    *,
    seconds: float,
    rate: float,
    step: float,
) -> list[AlertEvent]:
    """Advance the clock by ``seconds`` in ``step``s: ``emit(at)`` is called ``rate *
    step`` times spread over each step (the clock set to ``at``), then one evaluation.
    Returns every transition."""
    per_step = round(rate * step)
    events: list[AlertEvent] = []
    end = clock.t + seconds
    while clock.t < end - 1e-9:
        start = clock.t
        for i in range(per_step):
            at = start + (i + 0.5) * step / per_step
            clock.t = at
            emit(at)
        clock.t = start + step
        events.extend(await det.evaluate())
    return events


async def drive(
    det: DropDetector,
    clock: Clock,
    scores: Sequence[float | None],
    *,
    seconds: float,
    rate: float = 2.0,
    step: float = 10.0,
    service: str = "shop",
    metric: str = "contextual_recall",
) -> list[AlertEvent]:
    """Like :func:`simulate` with a fixed, cycled sequence of scores (deterministic)."""
    per_step = round(rate * step)
    events: list[AlertEvent] = []
    end = clock.t + seconds
    k = 0
    while clock.t < end - 1e-9:
        start = clock.t
        for i in range(per_step):
            at = start + (i + 0.5) * step / per_step
            clock.t = at
            det.observe(service, metric, scores[k % len(scores)], f"d-{k}", at=at)
            k += 1
        clock.t = start + step
        events.extend(await det.evaluate())
    return events


def sample_event(**overrides: Any) -> AlertEvent:
    """A plausible firing event, for notifier tests."""
    fields: dict[str, Any] = {
        "status": "firing",
        "rule": "recall-drop",
        "metric": "contextual_recall",
        "service": "shop",
        "window_seconds": 900.0,
        "window_mean": 0.612,
        "sample_count": 140,
        "baseline": 0.874,
        "baseline_kind": "trailing",
        "baseline_window_seconds": 86400.0,
        "baseline_sample_count": 9500,
        "drop": 0.874 - 0.612,
        "drop_threshold": 0.1,
        "p_value": 1.5e-9,
        "confidence": 0.95,
        "example_trace_ids": (
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00f067aa0ba902b7aaaaaaaaaaaaaaaa",
        ),
        "started_at": T0,
        "evaluated_at": T0 + 300,
        "labels": {"severity": "warning"},
    }
    fields.update(overrides)
    return AlertEvent(**fields)
