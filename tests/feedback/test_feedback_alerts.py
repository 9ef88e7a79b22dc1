"""Alert rules on user feedback: ``metric: feedback:NAME`` watches the feedback's mean,
so a rise in thumbs-down fires the rule like a score drop; segment-aware."""

from __future__ import annotations

import random

from ragtrace_collector.alerts import AlertEvent, AlertsConfig, DropDetector
from ragtrace_collector.config import CollectorConfig
from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.record import Feedback
from ragtrace_collector.feedback.stage import FeedbackStage
from ragtrace_collector.results import MetricResult
from ragtrace_collector.segments import SegmentKey
from ragtrace_collector.service.preflight import alert_rule_problems


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


RULE = {
    "name": "unhappy_users",
    "metric": "feedback:user_feedback",
    "window": "60s",
    "baseline": "600s",
    "drop": 0.2,
    "min_samples": 30,
    "for": "20s",
}


async def _run(
    stage: FeedbackStage,
    det: DropDetector,
    clock: Clock,
    rng: random.Random,
    positive: dict[str, float],
    *,
    seconds: int,
    start: int,
) -> list[AlertEvent]:
    """1 feedback per second per segment value, each positive with the given rate; an
    evaluation every 10 s.  Each request is scored first, so its segment is known."""
    events: list[AlertEvent] = []
    for step in range(seconds // 10):
        for i in range(10):
            clock.t += 1.0
            for env, rate in positive.items():
                trace_id = f"{start + step * 10 + i:016x}{len(env):016x}"
                stage.scored(
                    "shop",
                    "faithfulness",
                    MetricResult(metric="faithfulness", score=0.5),
                    trace_id,
                    (env,),
                )
                await stage.drain()
                value = 1.0 if rng.random() < rate else 0.0
                await stage.record(
                    Feedback(trace_id, None, "user_feedback", value, "boolean", service="shop")
                )
        events += await det.evaluate()
    return events


async def test_a_rise_in_negative_feedback_fires_the_rule_for_its_segment() -> None:
    clock = Clock()
    keys = [SegmentKey(key="deployment.env")]
    config = AlertsConfig.model_validate(
        {"rules": [{**RULE, "group_by": ["deployment.env"]}], "log": {"enabled": False}}
    )
    det = DropDetector(config, [], None, clock, keys)
    stage = FeedbackStage(
        FeedbackConfig(),
        segments=keys,
        clock=clock,
        refresh_interval=3600,
    )
    stage.add_observer(det.observe_feedback)
    await stage.start()
    rng = random.Random(7)
    try:
        calm = await _run(
            stage, det, clock, rng, {"prod": 0.9, "canary": 0.9}, seconds=900, start=0
        )
        assert calm == []
        events = await _run(
            stage, det, clock, rng, {"prod": 0.9, "canary": 0.4}, seconds=300, start=10**6
        )
        fired = [e for e in events if e.status == "firing"]
        assert [e.rule for e in fired] == ["unhappy_users"]
        assert fired[0].metric == "feedback:user_feedback"
        assert fired[0].segments == {"deployment.env": "canary"}
    finally:
        await stage.shutdown(1.0)
        await det.aclose()


def test_check_config_accepts_a_rule_on_feedback_unless_feedback_is_off() -> None:
    config = CollectorConfig.model_validate({"alerts": {"rules": [RULE]}})
    assert alert_rule_problems(config, ["faithfulness"]) == []
    off = CollectorConfig.model_validate(
        {"alerts": {"rules": [RULE]}, "feedback": {"enabled": False}}
    )
    (problem,) = alert_rule_problems(off, ["faithfulness"])
    assert "feedback.enabled: false" in problem
    empty = CollectorConfig.model_validate({"alerts": {"rules": [{**RULE, "metric": "feedback:"}]}})
    (problem,) = alert_rule_problems(empty, ["faithfulness"])
    assert "name the feedback" in problem
