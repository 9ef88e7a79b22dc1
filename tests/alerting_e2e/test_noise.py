"""Noise at the baseline level does not page.

The same collector config and drop rule as the firing test (``test_alert_paths.py``),
in-process this time so the detector's view can be read.  The support bot's golden
traffic goes through the SDK; one request in five (seeded, at random) is answered with
broken retrieval.  ID recall is 0/1-valued, the noisiest kind of score: the window's
mean wanders well below 1.0, but it stays at the baseline's level.

Halfway through, half of the requests stop carrying ground truth (ordinary production
traffic): their ID recall is *skipped*, which must not count as a low score.  Were it
counted as 0, the window would drop by about half and page.

Armed (window and baseline over their minimum counts) for several windows in each
phase, the detector never goes pending, never fires, and the webhook hears nothing.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ragtrace_collector.alerts import DropDetector, RuleStatus
from ragtrace_collector.alerts.config import parse_duration
from ragtrace_collector.config import parse_config
from tests.alerting_e2e._support import (
    DETECTOR_RULE,
    METRIC,
    SERVICE,
    EvalCollectorThread,
    Traffic,
    alerts_section,
    collector_data,
    configure_sdk,
    hook_receiver,
    scrape,
)
from tests.fakes.harness import wait_for
from tests.fakes.otlp_sink import OtlpSink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RULE = DETECTOR_RULE["name"]
WINDOW_S = parse_duration(DETECTOR_RULE["window"])
BAD_RATIO = 0.2
#: Detector polls, 0.5 s apart, with a full comparison of window and baseline, in
#: each phase: 8 s, more than a window.
ARMED_POLLS = 16


async def test_noisy_scores_at_the_baseline_level_do_not_fire(sink: OtlpSink) -> None:
    async with hook_receiver() as hooks:
        alerts = alerts_section(webhook_url=hooks.url + "/ragtrace")
        collector = EvalCollectorThread(parse_config(collector_data(sink, alerts), env={}))
        collector.start()
        try:
            assert collector.svc.stage is not None
            detector = collector.svc.stage.detector
            assert detector is not None
            configure_sdk(collector.http_base_url)
            traffic = Traffic(rate=10.0, seed=1234)
            traffic.set(bad_ratio=BAD_RATIO)
            traffic.start()
            try:
                noisy = await _watch(detector, ARMED_POLLS)
                mixed_at = traffic.set(bad_ratio=BAD_RATIO, unscored_ratio=0.5)
                await asyncio.sleep(WINDOW_S)  # a whole window of the new mix
                mixed = await _watch(detector, ARMED_POLLS)
            finally:
                await asyncio.to_thread(traffic.stop)
            scored = {"service": SERVICE, "metric": METRIC}
            skipped = {**scored, "outcome": "skipped"}
            await asyncio.to_thread(
                wait_for,
                lambda: (
                    collector.metric("ragtrace_eval_score_count", scored)
                    + collector.metric("ragtrace_eval_results_total", skipped)
                    == len(traffic.requests)
                ),
                30,
                "every request evaluated",
            )
            live = await asyncio.to_thread(scrape, collector.admin_url)
        finally:
            await asyncio.to_thread(collector.stop)

    assert hooks.received == [], "noise paged"
    armed = noisy + mixed
    assert {s.phase for s in armed} == {"inactive"}
    # the detector really compared noisy windows with the baseline
    assert min(s.window_mean for s in armed if s.window_mean is not None) < 0.95
    assert min(s.window_count for s in armed) >= DETECTOR_RULE["min_samples"]
    requests = traffic.requests
    assert 0.1 <= traffic.count(fault="wrong_index") / len(requests) <= 0.3, "not noisy"
    unscored = traffic.count(since_ns=mixed_at, scored=False)
    assert unscored >= 0.3 * traffic.count(since_ns=mixed_at), "the mix did not change"
    # skipped results were counted as skipped, never as scores
    assert live.value("ragtrace_eval_results_total", **skipped) == traffic.count(scored=False)
    assert live.value("ragtrace_eval_score_count", **scored) == traffic.count(scored=True)
    oracle = sum(r.recall for r in requests if r.scored)  # the bot's own ID recall
    assert live.value("ragtrace_eval_score_sum", **scored) == pytest.approx(oracle)
    assert live.value("ragtrace_alert_firing", rule=RULE, metric=METRIC) == 0
    assert live.value("ragtrace_alert_notifications_total") is None  # nothing was sent


async def _watch(detector: DropDetector, polls: int) -> list[RuleStatus]:
    """Poll the detector until it has compared window and baseline ``polls`` times;
    those statuses are returned (a phase other than inactive ends the watch early)."""
    armed: list[RuleStatus] = []
    deadline = time.monotonic() + 60
    while len(armed) < polls:
        assert time.monotonic() < deadline, f"the detector armed only {len(armed)} times"
        await asyncio.sleep(0.5)
        for status in detector.status():
            assert (status.rule, status.service) == (RULE, SERVICE)
            if status.phase != "inactive":
                return [*armed, status]
            if status.p_value is not None:
                armed.append(status)
    return armed
