"""How ``alerts:`` is wired into the collector: no default rules, and rules that could
never fire are refused at start-up."""

from __future__ import annotations

import subprocess
from pathlib import Path

import structlog
import yaml

from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.config import parse_config
from ragtrace_collector.service.stages import build_stage
from tests.alerting_e2e._support import COLLECTOR_BIN, DETECTOR_RULE, collector_data
from tests.fakes.otlp_sink import OtlpSink


def test_there_are_no_default_rules_so_no_detector_runs(sink: OtlpSink) -> None:
    assert parse_config({}, env={}).alerts.rules == []
    data = collector_data(sink, {"webhook": {"url": "http://127.0.0.1:9/hook"}})
    with structlog.testing.capture_logs() as logs:
        stage = build_stage(parse_config(data, env={}), Telemetry())
    assert stage.detector is None
    (warning,) = [e for e in logs if e["event"] == "alerts_without_rules"]
    assert warning["log_level"] == "warning"
    assert "alerts.rules is empty" in warning["detail"]


def test_configured_rules_build_a_detector_with_their_notifiers(sink: OtlpSink) -> None:
    alerts = {
        "rules": [DETECTOR_RULE],
        "webhook": {"url": "http://127.0.0.1:9/hook"},
        "alertmanager": {"url": "http://127.0.0.1:9"},
    }
    telemetry = Telemetry()
    with structlog.testing.capture_logs() as logs:
        stage = build_stage(parse_config(collector_data(sink, alerts), env={}), telemetry)
    assert stage.detector is not None
    assert [n.name for n in stage.detector.notifiers] == ["log", "webhook", "alertmanager"]
    assert not [e for e in logs if e["event"] == "alerts_without_rules"]
    labels = {"rule": DETECTOR_RULE["name"], "metric": DETECTOR_RULE["metric"]}
    assert telemetry.registry.get_sample_value("ragtrace_alert_firing", labels) == 0


def test_serve_refuses_a_rule_on_a_metric_it_does_not_evaluate(
    tmp_path: Path, sink: OtlpSink
) -> None:
    typo = {**DETECTOR_RULE, "name": "typo", "metric": "id_context_recal"}
    data = collector_data(sink, {"rules": [DETECTOR_RULE, typo]})
    path = tmp_path / "collector.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = subprocess.run(
        [str(COLLECTOR_BIN), "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "alerts.rules.1.metric: rule 'typo' watches 'id_context_recal'" in result.stderr
    assert "did you mean 'id_context_recall'?" in result.stderr
    assert "could never fire" in result.stderr
