"""The README's quick start, run for real: its collector config on a real
``ragtrace-collector serve`` process, its app script through the SDK, its score printer
on the file the collector wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.docs._readme import marked, readme_text

pytestmark = pytest.mark.slow

_STARTUP_TIMEOUT = 60.0
_EVAL_TIMEOUT = 60.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAGTRACE_"))}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass
class _Collector:
    process: subprocess.Popen[bytes]
    log: Path
    http_endpoint: str
    admin_endpoint: str


def _log_events(log: Path) -> list[dict[str, object]]:
    events = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[_Collector]:
    config = yaml.safe_load(marked(readme_text(), "quickstart:config").body)
    # Same config, on ports the OS picks (the README's defaults may be taken here).
    config["receivers"] = {
        "grpc": {"endpoint": "127.0.0.1:0"},
        "http": {"endpoint": "127.0.0.1:0"},
    }
    config["admin"] = {"endpoint": "127.0.0.1:0"}
    (tmp_path / "quickstart.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    log = tmp_path / "collector.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ragtrace_collector.cli",
                "serve",
                "--config",
                "quickstart.yaml",
            ],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while True:
            events = _log_events(log)
            if any(e.get("event") == "collector_ready" for e in events):
                break
            assert process.poll() is None, f"collector exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"collector not ready:\n{log.read_text()}"
            time.sleep(0.1)
        http = next(
            str(e["endpoint"])
            for e in events
            if e.get("event") == "receiver_listening" and e.get("receiver") == "otlp_http"
        )
        admin = next(str(e["endpoint"]) for e in events if e.get("event") == "admin_listening")
        yield _Collector(process, log, http, admin)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _metrics(admin: str) -> str:
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _scored_results(text: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("ragtrace_eval_results_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_quick_start_scores_the_decorated_app(collector: _Collector, tmp_path: Path) -> None:
    text = readme_text()
    app = tmp_path / "app.py"
    app.write_text(marked(text, "quickstart:app").body, encoding="utf-8")
    env = {**_env(), "RAGTRACE_ENDPOINT": f"http://{collector.http_endpoint}"}
    run = subprocess.run(
        [sys.executable, str(app)], cwd=tmp_path, env=env, capture_output=True, timeout=60
    )
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode().splitlines() == [
        "Our office in Lyon is open Monday to Friday.",
        "Refunds are issued within 5 business days to the original card.",
    ]

    # Both requests are evaluated: wait until the collector has counted results for
    # the 11 default metrics on each of the two @rag spans.
    deadline = time.monotonic() + _EVAL_TIMEOUT
    while _scored_results(_metrics(collector.admin_endpoint)) < 22:
        assert time.monotonic() < deadline, "the collector did not evaluate both requests"
        time.sleep(0.2)

    collector.process.send_signal(signal.SIGTERM)
    assert collector.process.wait(60) == 0, collector.log.read_text()

    scores = tmp_path / "scores.py"
    scores.write_text(marked(text, "quickstart:scores").body, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(scores)], cwd=tmp_path, capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    lines = [line.split(None, 3) for line in out.stdout.decode().splitlines()]
    by_span: dict[str, dict[str, float]] = {}
    for span, metric, score, *_ in lines:
        by_span.setdefault(span, {})[metric] = float(score)

    # The canary carries ground truth: its id and text recall metrics score it.
    assert by_span["canary"]["id_context_recall"] == 1.0
    assert by_span["canary"]["id_context_precision"] == 1.0
    assert by_span["canary"]["contextual_recall"] == 1.0
    assert "contextual_precision" in by_span["canary"]
    # The plain request has none: what needs a reference is skipped there (no line),
    # never a 0; the reference-free contextual_relevancy scores it.
    assert set(by_span["answer"]) == {"contextual_relevancy"}
    assert "contextual_relevancy" in by_span["canary"]
