"""The ``alerts:`` configuration: durations, baselines, drops, validation errors."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from ragtrace_collector.alerts.config import (
    AlertsConfig,
    CanaryRule,
    Drop,
    DropRule,
    FixedBaseline,
    TrailingBaseline,
    format_duration,
    parse_duration,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15m", 900.0),
        ("24h", 86400.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("90", 90.0),
        (" 30s ", 30.0),
        (45, 45.0),
        (1.5, 1.5),
        ("2w", 1209600.0),
    ],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "15 minutes", "m15", "1h-5m", "-5s", True, None, "1h 30m"])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(900, "15m"), (86400, "24h"), (3 * 86400, "3d"), (5400, "90m"), (10, "10s"), (7200, "2h")],
)
def test_format_duration_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_a_full_config_from_yaml() -> None:
    raw = yaml.safe_load(
        """
        evaluation_interval: 15s
        rules:
          - name: recall-drop
            metric: contextual_recall
            service: shop
            window: 15m
            baseline: 24h
            drop: 0.1
            min_samples: 40
            for: 5m
            hysteresis: 0.03
            confidence: 0.99
            labels: {severity: page, team: search}
          - metric: contextual_precision
            baseline: 0.8
            drop: 15%
        webhook:
          url: https://hooks.example.com/ragtrace
          headers: {Authorization: Bearer x}
          max_attempts: 3
          backoff: 200ms
        alertmanager:
          url: http://alertmanager:9093/
          resend_interval: 2m
          labels: {replica: a}
        log: {enabled: false}
        """
    )
    cfg = AlertsConfig.model_validate(raw)
    assert cfg.evaluation_interval == 15
    first, second = cfg.rules
    assert first.name == "recall-drop"
    assert first.window == 900
    assert first.baseline == TrailingBaseline(window=86400)
    assert first.drop == Drop(kind="absolute", value=0.1)
    assert first.for_ == 300
    assert first.hysteresis_value == 0.03
    assert first.baseline_min_samples == 40
    assert first.severity == "page"
    assert second.name == "contextual_precision_drop"
    assert second.baseline == FixedBaseline(value=0.8)
    assert second.drop == Drop(kind="relative", value=0.15)
    assert second.drop.amount(0.8) == pytest.approx(0.12)
    assert second.hysteresis_value == pytest.approx(0.075)  # default: half the drop
    assert second.window == 900  # defaults
    assert second.min_samples == 30
    assert second.for_ == 300
    assert second.test_margin is True
    assert cfg.webhook is not None
    assert cfg.webhook.backoff == 0.2
    assert cfg.alertmanager is not None
    assert cfg.alertmanager.resend_interval == 120
    assert not cfg.log.enabled


def test_alerts_may_be_a_bare_list_of_rules() -> None:
    cfg = AlertsConfig.model_validate([{"metric": "contextual_recall", "service": "shop"}])
    assert [r.name for r in cfg.rules] == ["contextual_recall_drop_shop"]
    assert cfg.webhook is None
    assert cfg.log.enabled


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("24h", TrailingBaseline(window=86400)),
        ({"window": "1h", "min_samples": 100}, TrailingBaseline(window=3600, min_samples=100)),
        (0.75, FixedBaseline(value=0.75)),
        ("0.75", FixedBaseline(value=0.75)),
        ({"value": 1}, FixedBaseline(value=1.0)),
    ],
)
def test_baseline_forms(value: object, expected: object) -> None:
    assert DropRule.model_validate({"metric": "m", "baseline": value}).baseline == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.1, Drop(kind="absolute", value=0.1)),
        ("0.1", Drop(kind="absolute", value=0.1)),
        ("10%", Drop(kind="relative", value=0.1)),
        ({"relative": 0.25}, Drop(kind="relative", value=0.25)),
        ({"absolute": 0.05}, Drop(kind="absolute", value=0.05)),
    ],
)
def test_drop_forms(value: object, expected: Drop) -> None:
    assert DropRule.model_validate({"metric": "m", "drop": value}).drop == expected


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"metric": "m", "windw": "15m"}, "windw"),
        ({"metric": "m", "window": "soon"}, "not a duration"),
        ({"metric": "m", "window": 0}, "greater than 0"),
        ({"metric": "m", "baseline": "later"}, "not a duration"),
        ({"metric": "m", "window": "1h", "baseline": "30m"}, "at least as long as the window"),
        ({"metric": "m", "drop": "lots"}, "not a drop"),
        ({"metric": "m", "drop": "120%"}, "below 100%"),
        ({"metric": "m", "drop": -0.1}, "greater than or equal to 0"),
        ({"metric": "m", "drop": 0.1, "hysteresis": 0.2}, "cannot exceed the drop"),
        ({"metric": "m", "hysteresis": -0.01}, "hysteresis must be >= 0"),
        ({"metric": "m", "min_samples": 1}, "greater than or equal to 2"),
        ({"metric": "m", "confidence": 1.0}, "less than 1"),
        ({"metric": ""}, "at least 1 character"),
    ],
)
def test_bad_rules_get_clear_errors(rule: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DropRule.model_validate(rule)


def test_duplicate_rule_names_and_bad_notifiers_are_errors() -> None:
    with pytest.raises(ValidationError, match="duplicate alert rule name 'contextual_recall_drop'"):
        AlertsConfig.model_validate({"rules": [{"metric": "contextual_recall"}] * 2})
    with pytest.raises(ValidationError, match="not an http"):
        AlertsConfig.model_validate({"webhook": {"url": "ftp://x"}})
    with pytest.raises(ValidationError, match="resend_interval"):
        AlertsConfig.model_validate({"alertmanager": {"url": "http://a", "resend_interval": 0}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        AlertsConfig.model_validate({"webhooks": {"url": "http://a"}})


def test_rule_kinds_default_to_drop_and_canary_keys_are_checked() -> None:
    cfg = AlertsConfig.model_validate(
        [
            {"metric": "recall", "group_by": ["app.index_version"]},
            {"metric": "recall", "kind": "canary", "segment": "env", "candidate": "canary"},
        ]
    )
    drop, canary = cfg.rules
    assert isinstance(drop, DropRule)
    assert drop.group_by == ("app.index_version",)
    assert drop.segment_keys == ("app.index_version",)
    assert isinstance(canary, CanaryRule)
    assert canary.name == "recall_canary_canary"
    assert canary.for_ == 0.0
    assert canary.segment_keys == ("env",)
    bad = [
        ({"segment": "env", "against": "prod"}, "`against` needs a `candidate`"),
        ({"segment": "env", "candidate": "a", "against": "a"}, "are the same"),
        ({"segment": "env", "baseline": "1h"}, "baseline"),
        ({"candidate": "x"}, "segment"),
    ]
    for extra, message in bad:
        with pytest.raises(ValidationError, match=message):
            AlertsConfig.model_validate([{"metric": "recall", "kind": "canary", **extra}])
    with pytest.raises(ValidationError, match="listed twice"):
        AlertsConfig.model_validate([{"metric": "recall", "group_by": ["a", "a"]}])
    with pytest.raises(ValidationError, match="group_by"):
        AlertsConfig.model_validate([{"metric": "recall", "kind": "canary", "group_by": ["a"]}])
