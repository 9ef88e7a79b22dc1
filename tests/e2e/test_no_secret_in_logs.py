"""Credentials in every kind of URL the config accepts, and in headers, never reach the
logs: a real ``ragtrace-collector serve`` at debug level whose every outbound
connection fails (so each error message quotes its URL), grepped whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import ragtrace
from tests.e2e import _app
from tests.fakes.harness import COLLECTOR
from tests.fakes.services import free_port

#: One distinct secret per place, so a leak names its source.
SECRETS = {
    "exporter_http_password": "Pw4xHttpExporterZZ",
    "exporter_http_query": "QkeyHttpExporterZZ",
    "exporter_http_header": "HdrHttpExporterZZ",
    "exporter_grpc_password": "Pw4xGrpcExporterZZ",
    "exporter_grpc_header": "HdrGrpcExporterZZ",
    "webhook_password": "Pw4xWebhookZZ",
    "webhook_query": "TokWebhookZZ",
    "webhook_header": "HdrWebhookZZ",
    "alertmanager_password": "Pw4xAlertmanagerZZ",
    "alertmanager_query": "SigAlertmanagerZZ",
    "redis_password": "Pw4xRedisZZ",
    "judge_password": "Pw4xJudgeBaseZZ",
    "judge_query": "KeyJudgeBaseZZ",
    "judge_api_key": "sk-judgeApiKeyFromEnvZZ",
    "bearer_token": "BearerReceiverTokenZZ",
}
S = SECRETS


def _config(dead: dict[str, int]) -> dict[str, Any]:
    host = "127.0.0.1"
    return {
        "receivers": {
            "grpc": {"endpoint": f"{host}:0"},
            "http": {"endpoint": f"{host}:0"},
            "auth": {"bearer_tokens": [S["bearer_token"]]},
        },
        "admin": {"endpoint": f"{host}:0"},
        "assembly": {"decision_wait": "50ms", "max_trace_wait": "5s"},
        "exporters": {
            "http": {
                "type": "otlp_http",
                "endpoint": f"http://ingest:{S['exporter_http_password']}@{host}:{dead['http']}"
                f"/v1/traces?api_key={S['exporter_http_query']}&region=eu",
                "headers": {"x-api-key": S["exporter_http_header"]},
                "retry": {"initial_interval": "100ms", "max_interval": "300ms"},
            },
            "grpc": {
                "type": "otlp_grpc",
                "endpoint": f"http://ingest:{S['exporter_grpc_password']}@{host}:{dead['grpc']}",
                "headers": {"authorization": f"Bearer {S['exporter_grpc_header']}"},
                "retry": {"initial_interval": "100ms", "max_interval": "300ms"},
            },
        },
        "judge": {
            "model": "openai/gpt-4o-mini",
            "api_base": f"http://judge:{S['judge_password']}@{host}:{dead['judge']}/v1"
            f"?key={S['judge_query']}",
            "api_key_env": "RAGTRACE_TEST_JUDGE_KEY",
            "max_retries": 0,
            "timeout_s": 3,
        },
        "metrics": {
            "id_context_recall": {},
            "contextual_relevancy": {},
            "turn_contextual_relevancy": {},
        },
        "sampling": {"rate": 1.0},
        "evaluation": {"metric_timeout": "5s", "trace_timeout": "8s"},
        "session_store": {
            "backend": "redis",
            "url": f"redis://:{S['redis_password']}@{host}:{dead['redis']}/0",
            "socket_timeout": "500ms",
        },
        "alerts": {
            "evaluation_interval": "300ms",
            "rules": [
                {
                    "name": "recall",
                    "metric": "id_context_recall",
                    "window": "60s",
                    "baseline": 1.0,
                    "drop": 0.2,
                    "min_samples": 6,
                    "for": 0,
                    # The window test fires on these few results (the sequential
                    # default needs more evidence): the notifiers must be exercised.
                    "test": "window",
                    "test_margin": False,
                    "confidence": 0.9,
                }
            ],
            "webhook": {
                "url": f"http://hook:{S['webhook_password']}@{host}:{dead['webhook']}/hook"
                f"?token={S['webhook_query']}",
                "headers": {"X-Webhook-Token": S["webhook_header"]},
                "max_attempts": 2,
                "backoff": "50ms",
                "timeout": "1s",
            },
            "alertmanager": {
                "url": f"http://am:{S['alertmanager_password']}@{host}:{dead['alertmanager']}"
                f"/?signature={S['alertmanager_query']}",
                "max_attempts": 2,
                "backoff": "50ms",
                "timeout": "1s",
            },
            "log": {"enabled": True},
        },
        "logging": {"level": "debug", "format": "json"},
        "shutdown": {"receiver_grace": 1, "processor_timeout": 2, "flush_timeout": 1},
    }


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            event = {"event": "raw", "line": line}
        out.append(event if isinstance(event, dict) else {"event": "raw", "line": line})
    return out


def _wait(log: Path, proc: subprocess.Popen[bytes], predicate: Any, what: str) -> None:
    # Generous: importing litellm takes tens of seconds on a loaded machine.
    deadline = time.monotonic() + 180
    while not predicate(_events(log)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen; log tail: {log.read_text()[-3000:]}")
        time.sleep(0.1)


@pytest.mark.slow
def test_no_credential_in_any_log_line(tmp_path: Path) -> None:
    dead = {k: free_port() for k in ("http", "grpc", "judge", "redis", "webhook", "alertmanager")}
    config_path = tmp_path / "collector.yaml"
    config_path.write_text(yaml.safe_dump(_config(dead)))
    log = tmp_path / "collector.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(COLLECTOR), "serve", "--config", str(config_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RAGTRACE_TEST_JUDGE_KEY": S["judge_api_key"]},
        )
    try:
        _wait(log, proc, lambda ev: any(e.get("event") == "collector_ready" for e in ev), "ready")
        [http] = [e["endpoint"] for e in _events(log) if e.get("receiver") == "otlp_http"]
        ragtrace.configure(
            service_name="secret-bot",
            endpoint=f"http://{http}",
            headers={"Authorization": f"Bearer {S['bearer_token']}"},
        )
        with ragtrace.session("s-1", user_id="u-1"):
            for i in range(10):
                question = f"question {i}?"
                _app.route(question, ["kb_reset"] if i % 2 else ["kb_invoice"])
                _app.answer(question, reference={"reference_context_ids": ["kb_reset"]})
        assert ragtrace.flush(30)

        def exercised(events: list[dict[str, Any]]) -> bool:
            names = {e.get("event") for e in events}
            return {"export_retrying", "alert_notification_retry"} <= names and any(
                "session store" in json.dumps(e) for e in events
            )

        _wait(log, proc, exercised, "export, notifier and session-store failures")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    text = log.read_text(errors="replace")
    leaks = {name: text.count(secret) for name, secret in SECRETS.items() if secret in text}
    assert leaks == {}, f"secrets in the log: {leaks}"
    # The failures were logged with their URLs (redacted), so the check had teeth.
    assert f"127.0.0.1:{dead['http']}/v1/traces?api_key=[REDACTED]" in text
    assert "[REDACTED]@127.0.0.1" in text
    assert f"{dead['webhook']}/hook?token=[REDACTED]" in text
    # The loggers that print request bodies stayed at WARNING at debug level.
    for event in _events(log):
        if event.get("logger") in ("openai", "httpx", "httpcore", "LiteLLM"):
            assert event.get("level") not in ("debug", "info"), event
