"""The drop detector: statistics, state machine, skipped semantics, memory bounds.

Time is simulated (an injected clock), so an hour of traffic takes milliseconds.  The
rules use a 60s window against a 600s trailing baseline; scores arrive at 2/s.
"""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path

import pytest
import structlog

from ragtrace_collector.alerts import AlertEvent, AlertsConfig, DropDetector, LogNotifier
from ragtrace_collector.alerts.notifiers import AlertmanagerNotifier, WebhookNotifier
from ragtrace_collector.component import ComponentHost, Status
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.segments import SegmentKey
from tests.fakes.polling import eventually

from ._support import (
    Clock,
    Noise,
    RecordingNotifier,
    detector,
    drive,
    rule,
    run_steps,
    simulate,
)

GOOD = [0.85, 0.95]  # mean 0.9
BAD = [0.45, 0.55]  # mean 0.5

NOISES: list[Noise] = ["normal", "beta", "bernoulli"]


# ------------------------------------------------------------- both sides of noise
@pytest.mark.slow  # 120 seeded half-hours per noise: about 5 s each
@pytest.mark.parametrize("noise", NOISES)
async def test_noise_at_the_baseline_level_never_fires(noise: Noise) -> None:
    """120 seeded runs of 30 minutes of steady scores (120 per window, re-tested every
    10s, 21,600 tests in all): not one alert, even for 0/1-valued scores, the noisiest
    a score can be."""
    fired = []
    for seed in range(120):
        clock = Clock()
        det = detector([rule()], clock=clock)
        events = await simulate(det, clock, seed=seed, noise=noise, mean=0.8, seconds=1800)
        if events:
            fired.append((seed, events[0].describe()))
    assert fired == []


@pytest.mark.parametrize("noise", NOISES)
async def test_a_real_drop_fires_in_every_seeded_run(noise: Noise) -> None:
    """40 seeded runs: 15 minutes at 0.8, then the metric falls to 0.5.  Each run
    fires, only after the fall, within two windows, with sound figures."""
    for seed in range(40):
        clock = Clock()
        det = detector([rule()], clock=clock)
        before = await simulate(det, clock, seed=seed, noise=noise, mean=0.8, seconds=900)
        assert before == [], (seed, before)
        change = clock.t
        after = await simulate(det, clock, seed=seed + 1000, noise=noise, mean=0.5, seconds=600)
        firing = [e for e in after if e.status == "firing"]
        assert len(firing) == 1, (seed, after)
        ev = firing[0]
        assert change < ev.started_at <= ev.evaluated_at <= change + 120, (seed, ev)
        assert ev.evaluated_at - ev.started_at >= 20  # for: 20s
        assert ev.service == "shop"
        assert ev.metric == "contextual_recall"
        assert ev.rule == "recall"
        assert ev.baseline_kind == "trailing"
        assert ev.baseline == pytest.approx(0.8, abs=0.05)
        assert ev.window_mean < 0.7
        assert ev.drop == pytest.approx(ev.baseline - ev.window_mean)
        assert ev.drop >= ev.drop_threshold == pytest.approx(0.1)
        assert ev.p_value <= 0.05
        assert ev.sample_count >= 30
        assert ev.baseline_sample_count is not None
        assert ev.baseline_sample_count >= 30
        assert 1 <= len(ev.example_trace_ids) <= 5


async def test_without_the_margin_noise_does_fire_which_is_why_it_is_the_default() -> None:
    """The same 0/1 noise, tested only against "no drop": repeated testing lets some
    runs through.  This is the failure ``test_margin`` (on by default) prevents."""
    fired = []
    for seed in range(100):
        clock = Clock()
        det = detector([rule(test_margin=False, test="window")], clock=clock)
        events = await simulate(det, clock, seed=seed, noise="bernoulli", mean=0.8, seconds=1800)
        if events:
            fired.append(seed)
            if len(fired) == 3:
                break
    assert len(fired) == 3


async def test_a_handful_of_unlucky_samples_does_not_page() -> None:
    """Low traffic (40 results a window) at 0.8, then five zeros in a row."""
    for seed in range(50):
        clock = Clock()
        det = detector([rule()], clock=clock)
        assert await simulate(det, clock, seed=seed, noise="normal", mean=0.8, seconds=900) == []
        for i in range(5):
            clock.t += 1
            det.observe("shop", "contextual_recall", 0.0, f"unlucky-{i}")
        events = await simulate(
            det, clock, seed=seed + 500, noise="normal", mean=0.8, seconds=300, rate=40 / 60
        )
        assert events == [], (seed, events)


# ------------------------------------------------------------- skipped is not zero
async def test_skipped_results_are_not_samples() -> None:
    clock = Clock()
    det = detector([rule()], clock=clock)
    det.observe("shop", "contextual_recall", None, "t1")
    det.observe("shop", "contextual_recall", math.nan, "t2")
    det.observe("shop", "contextual_recall", math.inf, "t3")
    assert det.status() == []  # nothing real was seen: no series at all

    # 25 real scores and a thousand skipped ones: still below min_samples (30).
    await drive(det, clock, GOOD, seconds=600)
    for i in range(1000):
        det.observe("shop", "contextual_recall", None, f"skip-{i}")
    clock.t += 60
    for i in range(25):
        det.observe("shop", "contextual_recall", 0.1, f"bad-{i}")
    assert await det.evaluate() == []
    (status,) = det.status()
    assert status.window_count == 25
    assert status.window_mean == pytest.approx(0.1)
    assert status.p_value is None  # not tested: too few samples


async def test_a_metric_that_is_mostly_skipped_does_not_fire() -> None:
    """70% of the results are skipped (no reference): the real 30% at 0.8 do not drop.
    Had the skipped ones been counted as 0, the mean would collapse and page."""
    clock = Clock()
    det = detector([rule()], clock=clock)
    assert await simulate(det, clock, seed=1, noise="beta", mean=0.8, seconds=900) == []
    events = await simulate(
        det, clock, seed=2, noise="beta", mean=0.8, seconds=900, rate=8.0, skipped_ratio=0.7
    )
    assert events == []

    clock2 = Clock()
    wrong = detector([rule()], clock=clock2)
    await simulate(wrong, clock2, seed=1, noise="beta", mean=0.8, seconds=900)
    # the same stream with skipped results wrongly observed as 0.0
    for i in range(8 * 300):
        clock2.t += 1 / 8
        wrong.observe("shop", "contextual_recall", 0.0 if i % 10 < 7 else 0.8, f"w{i}")
        if i % 80 == 79:
            await wrong.evaluate()
    assert [e.status for e in wrong.firing()] == ["firing"]


# ------------------------------------------------------------------ state machine
async def test_min_samples_holds_back_a_drop_until_there_is_enough_data() -> None:
    clock = Clock()
    det = detector([rule(min_samples=30)], clock=clock)
    await drive(det, clock, GOOD, seconds=900, rate=1.0)
    # a collapse, but only 20 results a minute
    assert await drive(det, clock, [0.05, 0.15], seconds=300, rate=20 / 60) == []
    (status,) = det.status()
    assert 15 <= status.window_count < 30
    # the same collapse with enough traffic fires
    events = await drive(det, clock, [0.05, 0.15], seconds=120, rate=1.0)
    assert [e.status for e in events] == ["firing"]


async def test_for_delays_firing_and_a_short_dip_resets_pending() -> None:
    clock = Clock()
    det = detector([rule(**{"for": "90s"})], clock=clock)
    await drive(det, clock, GOOD, seconds=900)
    # A 10s burst of zeros: the 60s window mean drops by ~0.15 for about a minute,
    # less than `for`, so it never fires and the pending state resets.
    assert await drive(det, clock, [0.0], seconds=10, rate=4.0) == []
    assert await drive(det, clock, GOOD, seconds=300) == []
    assert {s.phase for s in det.status()} == {"inactive"}
    # A sustained drop fires once `for` has passed since the condition first held.
    start = clock.t
    events = await drive(det, clock, BAD, seconds=300)
    (ev,) = events
    assert ev.status == "firing"
    assert ev.started_at > start
    assert ev.evaluated_at - ev.started_at >= 90
    assert ev.evaluated_at - ev.started_at < 100  # the next evaluation after `for`


async def test_for_zero_fires_on_the_first_evaluation_that_sees_the_drop() -> None:
    clock = Clock()
    det = detector([rule(**{"for": 0})], clock=clock)
    await drive(det, clock, GOOD, seconds=900)
    events = await drive(det, clock, BAD, seconds=60)
    (ev,) = events
    assert ev.started_at == ev.evaluated_at


async def test_hysteresis_holds_a_firing_alert_until_the_recovery_is_clear() -> None:
    """Fixed baseline 0.9, drop 0.1, hysteresis 0.05: a recovery to 0.83 (drop 0.07,
    under the threshold but within the hysteresis) keeps firing; 0.88 resolves."""
    clock = Clock()
    rec = RecordingNotifier()
    det = detector(
        [rule(baseline=0.9, hysteresis=0.05, test="window", **{"for": 0})],
        clock=clock,
        notifiers=[rec],
    )
    events = await drive(det, clock, [0.55, 0.65], seconds=120)
    assert [e.status for e in events] == ["firing"]
    assert events[0].baseline_kind == "fixed"
    assert events[0].baseline == 0.9
    assert events[0].baseline_sample_count is None

    assert await drive(det, clock, [0.78, 0.88], seconds=600) == []  # mean 0.83
    assert len(det.firing()) == 1
    assert det.firing()[0].window_mean == pytest.approx(0.83)

    events = await drive(det, clock, [0.83, 0.93], seconds=120)  # mean 0.88
    assert [e.status for e in events] == ["resolved"]
    ev = events[0]
    assert ev.ended_at == ev.evaluated_at
    assert ev.started_at < ev.ended_at
    assert ev.window_mean > 0.85  # the drop fell below 0.1 - 0.05
    assert det.firing() == []
    assert [e.status for e in rec.events] == ["firing", "resolved"]

    # Without hysteresis, the same partial recovery resolves at once.
    clock2 = Clock()
    det2 = detector([rule(baseline=0.9, hysteresis=0, test="window", **{"for": 0})], clock=clock2)
    await drive(det2, clock2, [0.55, 0.65], seconds=120)
    events = await drive(det2, clock2, [0.78, 0.88], seconds=120)
    assert [e.status for e in events] == ["resolved"]


@pytest.mark.parametrize(("hysteresis", "transitions"), [(0.05, 1), (0.0, 10)])
async def test_a_metric_hovering_around_the_threshold_flaps_only_without_hysteresis(
    hysteresis: float, transitions: int
) -> None:
    clock = Clock()
    det = detector(
        [rule(baseline=0.9, hysteresis=hysteresis, test_margin=False, test="window", **{"for": 0})],
        clock=clock,
    )
    events = []
    for _ in range(5):  # alternate minutes clearly below and just inside the threshold
        events += await drive(det, clock, [0.70, 0.80], seconds=60)  # mean 0.75, drop 0.15
        events += await drive(det, clock, [0.79, 0.85], seconds=60)  # mean 0.82, drop 0.08
    assert len(events) == transitions
    assert events[0].status == "firing"


async def test_fixed_baseline_uses_a_one_sample_test() -> None:
    clock = Clock()
    det = detector([rule(baseline=0.8)], clock=clock)
    for seed in range(20):
        assert await simulate(det, clock, seed=seed, noise="beta", mean=0.8, seconds=300) == []
    events = await simulate(det, clock, seed=99, noise="beta", mean=0.55, seconds=300)
    assert [e.status for e in events] == ["firing"]
    assert events[0].baseline == 0.8


async def test_relative_drop_is_a_fraction_of_the_baseline() -> None:
    clock = Clock()
    det = detector([rule(drop="20%", baseline=0.5, hysteresis="5%", **{"for": 0})], clock=clock)
    # 0.42 is 16% below 0.5: not enough
    assert await drive(det, clock, [0.40, 0.44], seconds=300) == []
    events = await drive(det, clock, [0.33, 0.37], seconds=120)  # 30% below
    (ev,) = events
    assert ev.drop_threshold == pytest.approx(0.1)  # 20% of 0.5
    assert ev.drop >= 0.1


# --------------------------------------------------------------- windows and keys
async def test_trailing_baseline_excludes_the_current_window() -> None:
    clock = Clock()
    # drop 0.45: the bad minute (a 0.4 dip) never alerts, so the baseline learns it.
    det = detector([rule(drop=0.45)], clock=clock)
    # very old data, outside window + baseline: must not count
    await drive(det, clock, [0.05, 0.15], seconds=300)
    await drive(det, clock, GOOD, seconds=900)  # 1800 good scores, 1200 within the baseline
    # 114 bad scores: exactly the window (60s quantised to 19 whole 3s buckets here)
    await drive(det, clock, BAD, seconds=57, step=3)
    (status,) = det.status()
    assert status.window_count == 114
    assert status.window_mean == pytest.approx(0.5)
    # not pulled down by the window, nor by the old data
    assert status.baseline == pytest.approx(0.9, abs=1e-3)
    assert status.baseline_count == pytest.approx(1200, abs=30)  # 600s at 2/s, +- a bucket

    # Once the bad minute has left the window, it is part of the baseline.
    await drive(det, clock, GOOD, seconds=120)
    (status,) = det.status()
    assert status.window_mean == pytest.approx(0.9)
    assert status.baseline is not None
    assert status.baseline < 0.9
    n = status.baseline_count
    assert n is not None
    assert status.baseline == pytest.approx((0.9 * (n - 114) + 0.5 * 114) / n, abs=1e-3)


async def test_late_scores_land_in_the_baseline_and_future_ones_are_clamped() -> None:
    clock = Clock()
    det = detector([rule()], clock=clock)
    await drive(det, clock, GOOD, seconds=900)
    (before,) = det.status()
    assert before.baseline_count is not None
    det.observe("shop", "contextual_recall", 0.9, "late", at=clock.t - 300)  # in the baseline
    det.observe("shop", "contextual_recall", 0.9, "ancient", at=clock.t - 5000)  # too old
    det.observe("shop", "contextual_recall", 0.9, "future", at=clock.t + 5000)  # clamped to now
    (after,) = det.status()
    assert after.baseline_count == before.baseline_count + 1
    assert after.window_count == before.window_count + 1


async def test_each_service_is_judged_on_its_own() -> None:
    clock = Clock()
    det = detector([rule()], clock=clock)
    events = []
    for step in range(90 + 12):  # 15 minutes both steady, then 2 minutes with b down
        for i in range(20):
            clock.t += 0.5
            det.observe("a", "contextual_recall", GOOD[i % 2], f"a{step}-{i}")
            for j in range(10):  # a has 10x the volume of b
                det.observe("a", "contextual_recall", GOOD[j % 2], f"a{step}-{i}-{j}")
            scores = GOOD if step < 90 else BAD
            det.observe("b", "contextual_recall", scores[i % 2], f"b{step}-{i}")
        events += await det.evaluate()
    # pooled, b's drop would be diluted to ~0.04 and missed
    assert [(e.status, e.service) for e in events] == [("firing", "b")]
    phases = {s.service: s.phase for s in det.status()}
    assert phases == {"a": "inactive", "b": "firing"}


async def test_service_filter_and_metric_routing() -> None:
    clock = Clock()
    det = detector(
        [
            rule(name="shop-recall", service="shop"),
            rule(name="precision", metric="contextual_precision"),
        ],
        clock=clock,
    )
    await drive(det, clock, GOOD, seconds=300, service="other")
    await drive(det, clock, GOOD, seconds=300, service="shop", metric="faithfulness")
    assert det.status() == []  # neither reached a rule
    await drive(det, clock, GOOD, seconds=900, service="shop")
    assert [(s.rule, s.service) for s in det.status()] == [("shop-recall", "shop")]
    assert await drive(det, clock, BAD, seconds=120, service="other") == []
    assert [(s.rule, s.service) for s in det.status()] == [("shop-recall", "shop")]
    await drive(det, clock, GOOD, seconds=10, service="other", metric="contextual_precision")
    assert sorted((s.rule, s.service) for s in det.status()) == [
        ("precision", "other"),
        ("shop-recall", "shop"),
    ]
    events = await drive(det, clock, BAD, seconds=120, service="shop")
    assert [(e.rule, e.service, e.status) for e in events] == [("shop-recall", "shop", "firing")]


async def test_example_trace_ids_are_the_lowest_scores_in_the_window() -> None:
    clock = Clock()
    det = detector([rule(**{"for": 0})], clock=clock, example_trace_ids=3)
    await drive(det, clock, GOOD, seconds=900)
    for i in range(60):
        clock.t += 0.5
        det.observe("shop", "contextual_recall", 0.5, f"meh-{i}")
    clock.t += 0.5
    det.observe("shop", "contextual_recall", 0.2, "worst-2")
    det.observe("shop", "contextual_recall", 0.1, "worst-1")
    det.observe("shop", "contextual_recall", 0.3, "worst-3")
    det.observe("shop", "contextual_recall", 0.0, None)  # no trace id: counted, not an example
    events = await det.evaluate()
    (ev,) = events
    assert ev.example_trace_ids == ("worst-1", "worst-2", "worst-3")


# ---------------------------------------------------------------- notifications
async def test_notifications_resends_failures_and_telemetry() -> None:
    clock = Clock()
    telemetry = Telemetry()
    once = RecordingNotifier(name="once")
    resend = RecordingNotifier(name="resend", resend_interval=30)
    broken = RecordingNotifier(name="broken", fail=True)
    det = detector(
        [rule(baseline=0.9, **{"for": 0})],
        clock=clock,
        notifiers=[once, resend, broken],
        telemetry=telemetry,
    )

    def firing_gauge() -> float | None:
        return telemetry.registry.get_sample_value(
            "ragtrace_alert_firing", {"rule": "recall", "metric": "contextual_recall"}
        )

    def sent(name: str, outcome: str) -> float:
        value = telemetry.registry.get_sample_value(
            "ragtrace_alert_notifications_total", {"notifier": name, "outcome": outcome}
        )
        return value or 0.0

    assert firing_gauge() == 0
    await drive(det, clock, BAD, seconds=20)  # fires at the 2nd evaluation (>= 30 samples)
    assert firing_gauge() == 1
    await drive(det, clock, BAD, seconds=120)  # 12 more evaluations, 10s apart
    assert [e.repeat for e in once.events] == [False]
    # the resend notifier got the alert again every 30s, with fresh figures
    assert [e.repeat for e in resend.events] == [False, True, True, True, True]
    assert [e.evaluated_at - resend.events[0].evaluated_at for e in resend.events] == [
        0,
        30,
        60,
        90,
        120,
    ]
    assert all(e.status == "firing" for e in resend.events)
    assert sent("once", "ok") == 1
    assert sent("resend", "ok") == 5
    # a failure did not stop the others; the transition-only notifier that failed got
    # the firing event again at every later evaluation, each failure counted
    assert sent("broken", "error") >= 12
    assert broken.events == []

    broken.fail = False
    broken.resend_interval = 30
    await drive(det, clock, BAD, seconds=10)
    # The transition it never got, then (it now re-sends) the current figures.
    assert [e.repeat for e in broken.events] == [False, True]

    events = await drive(det, clock, GOOD, seconds=120)
    assert [e.status for e in events] == ["resolved"]
    assert firing_gauge() == 0
    assert once.events[-1].status == "resolved"
    assert resend.events[-1].status == "resolved"
    assert broken.events[-1].status == "resolved"

    await det.aclose()
    assert once.closed
    assert resend.closed
    assert broken.closed


async def test_run_evaluates_periodically_until_cancelled() -> None:
    clock = Clock()
    rec = RecordingNotifier()
    # The window test: the clock stands still here, so no step of the sequential test ends.
    det = detector([rule(baseline=0.9, test="window", **{"for": 0})], clock=clock, notifiers=[rec])
    for i in range(40):
        det.observe("shop", "contextual_recall", 0.4 + (i % 2) / 10, f"t{i}")
    task = asyncio.create_task(det.run(interval=0.01))
    try:
        async with asyncio.timeout(10):
            await rec.delivered.wait()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert rec.events[0].status == "firing"
    await det.aclose()
    await det.aclose()  # idempotent
    assert rec.closed


class _BreakableClock(Clock):
    """A clock that raises while ``broken``: an evaluation then fails unexpectedly."""

    broken = False

    def __call__(self) -> float:
        if self.broken:
            raise RuntimeError("clock went away")
        return self.t


async def test_a_failing_evaluation_is_logged_counted_reported_and_survived() -> None:
    clock = _BreakableClock()
    telemetry = Telemetry()
    host = ComponentHost(telemetry)
    det = detector([rule(baseline=0.9, **{"for": 0})], clock=clock)
    status = det.component
    host.register(status)
    assert status.component_name == "alerts:detector"
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(det.run(interval=0.01))
        try:
            await eventually(lambda: status.status is Status.OK)  # a first good evaluation
            clock.broken = True
            await eventually(lambda: status.failures >= 2)
            assert not task.done()  # the loop survived
            assert status.status is Status.RECOVERABLE_ERROR
            assert "clock went away" in (status.last_error or "")
            report = host.health(recoverable_grace=0.0, now=status.status_event.since + 1)
            assert not report.ok
            assert "alerts:detector" in report.reason
            failures = telemetry.registry.get_sample_value(
                "ragtrace_component_failures_total", {"component": "alerts:detector"}
            )
            assert failures is not None
            assert failures >= 2
            clock.broken = False
            await eventually(lambda: status.status is Status.OK)  # recovered
            assert host.health(recoverable_grace=0.0).ok
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    failed = [e for e in logs if e["event"] == "alert_evaluation_failed"]
    assert len(failed) >= 2
    await det.aclose()
    assert status.status is Status.STOPPED


def test_the_service_registers_the_detector_as_a_component(tmp_path: Path) -> None:
    from ragtrace_collector.config import parse_config
    from ragtrace_collector.service.server import CollectorService

    data = {
        "exporters": {"f": {"type": "file", "path": str(tmp_path / "s.jsonl")}},
        "judge": {"model": "offline"},
        "metrics": {"id_context_recall": {}},
        "alerts": {"rules": [rule(metric="id_context_recall")]},
    }
    service = CollectorService(parse_config(data, env={}))
    assert service.stage is not None
    assert service.stage.detector is not None
    assert service.host.components["alerts:detector"] is service.stage.detector.component


# ---------------------------------------------------------------------- memory
async def test_the_services_per_rule_are_capped_and_idle_ones_freed() -> None:
    clock = Clock()
    det = detector([rule()], clock=clock, max_services_per_rule=3)
    for name in ("s1", "s2", "s3", "s4", "s5"):
        det.observe(name, "contextual_recall", 0.9, "x")
    assert sorted(s.service for s in det.status()) == ["s1", "s2", "s3"]
    clock.t += 700  # window + baseline later, with no traffic
    await det.evaluate()
    assert det.status() == []
    det.observe("s5", "contextual_recall", 0.9, "x")
    assert [s.service for s in det.status()] == ["s5"]


async def test_memory_is_bounded_by_buckets_not_by_traffic() -> None:
    """Six hours at 20 results a second: a series keeps ~20 fine and ~97 coarse
    buckets, and the window and baseline still count every score in them."""
    clock = Clock()
    det = detector([rule()], clock=clock)
    await drive(det, clock, GOOD, seconds=6 * 3600, rate=20.0, step=30.0)
    busy = det._rules[0].series[("shop", ())]
    assert len(busy.fine) <= 21
    assert len(busy.coarse) <= 98
    (status,) = det.status()
    assert status.window_count == pytest.approx(1170, abs=40)
    assert status.baseline_count == pytest.approx(12000, abs=200)


# --------------------------------------------------------------------- wiring
def test_from_config_builds_the_enabled_notifiers() -> None:
    cfg = AlertsConfig.model_validate(
        {
            "rules": [rule()],
            "webhook": {"url": "http://127.0.0.1:9/hook"},
            "alertmanager": {"url": "http://127.0.0.1:9"},
        }
    )
    det = DropDetector.from_config(cfg, Telemetry())
    kinds = [type(n) for n in det.notifiers]
    assert kinds == [LogNotifier, WebhookNotifier, AlertmanagerNotifier]
    quiet = DropDetector.from_config(AlertsConfig.model_validate({"log": {"enabled": False}}))
    assert quiet.notifiers == []


async def test_a_disabled_config_watches_nothing() -> None:
    clock = Clock()
    det = detector([rule(**{"for": 0})], clock=clock, enabled=False)
    assert await drive(det, clock, BAD, seconds=120) == []
    assert det.status() == []


async def test_a_transition_a_webhook_missed_is_sent_again_in_order() -> None:
    clock = Clock()
    telemetry = Telemetry()
    down = RecordingNotifier(name="webhook", fail=True)
    det = detector(
        [rule(baseline=0.9, **{"for": 0})], clock=clock, notifiers=[down], telemetry=telemetry
    )
    await drive(det, clock, BAD, seconds=30)  # fires; the target is down
    assert down.events == []
    failures = telemetry.registry.get_sample_value(
        "ragtrace_alert_notifications_total", {"notifier": "webhook", "outcome": "error"}
    )
    assert failures is not None
    assert failures >= 2  # retried at each evaluation, counted
    await drive(det, clock, GOOD, seconds=120)  # resolves while the target is still down
    assert down.events == []
    down.fail = False
    await drive(det, clock, GOOD, seconds=10)
    # Both transitions arrive, once each, in the order they happened.
    assert [e.status for e in down.events] == ["firing", "resolved"]
    await drive(det, clock, GOOD, seconds=30)
    assert len(down.events) == 2
    await det.aclose()


# ------------------------------------------------------------------ segments
def _segmented(rules: list[dict[str, object]], clock: Clock, **config: object) -> DropDetector:
    cfg = AlertsConfig.model_validate({"rules": rules, "log": {"enabled": False}, **config})
    keys = [SegmentKey(key="app.index_version", max_values=3), SegmentKey(key="deployment.env")]
    return DropDetector(cfg, [], None, clock, keys)


def _canary(**overrides: object) -> dict[str, object]:
    """A canary rule in seconds-scale simulated time (60s window)."""
    return {
        "kind": "canary",
        "metric": "contextual_recall",
        "segment": "deployment.env",
        "window": "60s",
        "min_samples": 30,
        **overrides,
    }


async def _feed(
    det: DropDetector,
    clock: Clock,
    means: dict[tuple[str, ...], float],
    *,
    seconds: float,
    seed: int,
    rate: float = 2.0,
    step: float = 10.0,
) -> list[AlertEvent]:
    """``rate`` results a second for each segment tuple, around its mean."""
    rng = random.Random(seed)

    def emit(at: float) -> None:
        for segs, mean in means.items():
            score = min(1.0, max(0.0, rng.gauss(mean, 0.1)))
            trace = f"{'-'.join(segs)}-{at:.2f}"
            det.observe("shop", "contextual_recall", score, trace, segments=segs)

    return await run_steps(det, clock, emit, seconds=seconds, rate=rate, step=step)


async def test_group_by_reports_the_segment_that_dropped_and_its_healthy_siblings() -> None:
    clock = Clock()
    det = _segmented([rule(group_by=["app.index_version"])], clock)
    healthy = {("v1", "prod"): 0.83, ("v2", "prod"): 0.83}
    assert await _feed(det, clock, healthy, seconds=900, seed=1) == []
    events = await _feed(
        det, clock, {("v1", "prod"): 0.83, ("v2", "prod"): 0.41}, seconds=300, seed=2
    )
    (ev,) = events
    assert ev.status == "firing"
    assert ev.segments == {"app.index_version": "v2"}
    assert ev.key == ("recall", "shop", "app.index_version=v2")
    assert ev.window_mean < ev.baseline - 0.1
    assert ev.baseline == pytest.approx(0.83, abs=0.05)
    # Once the window is all after the fault, the figures are the segment's own.
    (now,) = det.firing()
    assert now.window_mean == pytest.approx(0.41, abs=0.05)
    (sibling,) = ev.siblings
    assert sibling.segments == {"app.index_version": "v1"}
    assert sibling.window_mean == pytest.approx(0.83, abs=0.05)
    assert not sibling.dropped
    text = ev.describe()
    assert (
        f"app.index_version=v2 is {ev.window_mean:.2f} against its {ev.baseline:.2f} baseline"
        in text
    )
    assert f"app.index_version=v1 holds at {sibling.window_mean:.2f}" in text
    assert all(t.startswith("v2-") for t in ev.example_trace_ids)
    assert ev.example_trace_ids
    by_segment = {tuple(s.segments.values()): s.phase for s in det.status()}
    assert by_segment == {("v1",): "inactive", ("v2",): "firing"}


async def test_without_group_by_the_segments_are_one_series_and_the_drop_is_diluted() -> None:
    """The same fault without group_by: one series per service, the half-size drop of
    the mixed series (0.21) is still a drop, but the alert cannot say where."""
    clock = Clock()
    det = _segmented([rule()], clock)
    await _feed(det, clock, {("v1", "prod"): 0.83, ("v2", "prod"): 0.83}, seconds=900, seed=3)
    events = await _feed(
        det, clock, {("v1", "prod"): 0.83, ("v2", "prod"): 0.41}, seconds=300, seed=4
    )
    (ev,) = events
    assert ev.segments == {}
    assert ev.siblings == ()
    assert [s.segments for s in det.status()] == [{}]


async def test_group_by_series_are_bounded_whatever_the_values() -> None:
    """3 kept values + other + unset per key: however many distinct values arrive, a
    rule keeps at most max_services x 5 series."""
    clock = Clock()
    det = _segmented([rule(group_by=["app.index_version"])], clock, max_services_per_rule=2)
    for i in range(1000):
        for service in ("a", "b", "c"):
            det.observe(service, "contextual_recall", 0.8, None, segments=(f"v{i}", "prod"))
    runtime = det._rules[0]
    assert runtime.max_series == 2 * 5
    assert len(runtime.series) == 10
    assert set(runtime.services) == {"a", "b"}


async def test_canary_fires_when_the_candidate_is_worse_than_the_stable_side() -> None:
    clock = Clock()
    det = _segmented([_canary(name="canary", candidate="canary", against="production")], clock)
    same = {("v1", "canary"): 0.83, ("v1", "production"): 0.83, ("v1", "staging"): 0.2}
    assert await _feed(det, clock, same, seconds=600, seed=5) == []
    worse = {("v1", "canary"): 0.55, ("v1", "production"): 0.83, ("v1", "staging"): 0.2}
    (ev,) = await _feed(det, clock, worse, seconds=120, seed=6)
    assert ev.kind == "canary"
    assert ev.baseline_kind == "segment"
    assert ev.segments == {"deployment.env": "canary"}
    assert ev.against == "deployment.env=production"
    assert ev.window_mean < ev.baseline - 0.1
    assert ev.baseline == pytest.approx(0.83, abs=0.05)  # staging is not on the other side
    assert det.firing()[0].window_mean == pytest.approx(0.55, abs=0.05)
    assert ev.sample_count >= 30
    assert ev.baseline_sample_count is not None
    assert ev.baseline_sample_count >= 30
    assert ev.p_value <= 0.05
    text = ev.describe()
    assert f"deployment.env=canary is {ev.window_mean:.2f} ({ev.sample_count} scored" in text
    assert f"against deployment.env=production at {ev.baseline:.2f}" in text
    assert f"p={ev.p_value:.2g}" in text
    resolved = await _feed(det, clock, same, seconds=120, seed=7)
    assert [e.status for e in resolved] == ["resolved"]


async def test_canary_without_a_candidate_tests_every_value_against_the_rest() -> None:
    clock = Clock()
    det = _segmented([_canary(segment="app.index_version")], clock)
    events = await _feed(
        det, clock, {("v1", "p"): 0.8, ("v2", "p"): 0.8, ("v3", "p"): 0.5}, seconds=120, seed=8
    )
    (ev,) = events
    assert ev.rule == "contextual_recall_canary"
    assert ev.segments == {"app.index_version": "v3"}
    assert ev.against == "app.index_version!=v3"
    assert ev.baseline_sample_count == 2 * ev.sample_count
    assert {tuple(s.segments.values()) for s in ev.siblings} == {("v1",), ("v2",)}


async def test_canary_needs_min_samples_on_both_sides() -> None:
    clock = Clock()
    det = _segmented([_canary(candidate="canary")], clock)
    # production gets 0.2/s: 12 per window, below min_samples.
    det_events = await _feed(det, clock, {("v1", "canary"): 0.3}, seconds=60, seed=9)
    for i in range(12):
        det.observe(
            "shop", "contextual_recall", 0.9, None, at=clock.t - i, segments=("v1", "production")
        )
    det_events += await det.evaluate()
    assert det_events == []
    (status,) = [s for s in det.status() if s.segments == {"deployment.env": "canary"}]
    assert status.p_value is None
    assert status.baseline_count == 12
