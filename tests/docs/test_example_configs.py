"""The complete example configs the README points to (docker/collector.yaml and
docker/scale-out/collector.yaml): ``ragtrace-collector check-config`` accepts them, and
their evaluation sections are wired to what the compose files provide."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragtrace_collector.config import CollectorConfig, load_config
from ragtrace_collector.metrics import METRIC_NAMES
from ragtrace_collector.stores.reference import ReferenceStore
from tests.docker._files import (
    COMPOSE,
    SCALE_OUT_COMPOSE,
    bind_mounts,
    compose_default,
    environment,
    host_port,
    services,
)

DOCKER = Path(__file__).resolve().parents[2] / "docker"
SINGLE = DOCKER / "collector.yaml"
SCALE_OUT = DOCKER / "scale-out" / "collector.yaml"
GOLDEN = str(DOCKER.parent / "examples" / "support_bot" / "data" / "golden.jsonl")


#: The single-collector example requires a bearer token from the environment (compose
#: refuses to start without RAGTRACE_BEARER_TOKEN): these checks supply one.
_TOKEN = {"RAGTRACE_BEARER_TOKEN": "example-token-from-the-environment"}


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAGTRACE_"))}
    return {**env, **_TOKEN}


def _load(path: Path, compose: Path, service: str, **extra: str) -> CollectorConfig:
    env = {k: compose_default(v) for k, v in environment(services(compose)[service]).items()}
    required = {k: v for k, v in _TOKEN.items() if k in env and not env[k]}
    return load_config(path, env={**env, **required, **extra})


@pytest.mark.parametrize("path", [SINGLE, SCALE_OUT], ids=["single", "scale-out"])
def test_check_config_accepts_the_example(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ragtrace_collector.cli", "check-config", str(path)],
        # check-config reads the reference file, which compose mounts in the container.
        env={
            **_clean_env(),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "RAGTRACE_REFERENCE_FILE": GOLDEN,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"{path}: ok" in result.stdout


@pytest.mark.parametrize(
    ("path", "compose", "service"),
    [(SINGLE, COMPOSE, "collector"), (SCALE_OUT, SCALE_OUT_COMPOSE, "collector-1")],
    ids=["single", "scale-out"],
)
def test_evaluation_sections_are_enabled_and_consistent(
    path: Path, compose: Path, service: str
) -> None:
    config = _load(path, compose, service)
    assert config.evaluation.enabled
    # Offline by default; the environment can name an LLM instead.
    assert config.judge.is_offline
    llm = _load(path, compose, service, RAGTRACE_JUDGE_MODEL="openai/gpt-4o-mini")
    assert llm.judge.model == "openai/gpt-4o-mini"

    assert config.metrics is not None
    assert set(config.metrics) <= set(METRIC_NAMES)
    # Traces with ground truth stay evaluated at rate 1.
    first = config.sampling.rules[0]
    assert first.match.ground_truth is True
    assert first.rate == 1.0

    # A recall rule and a precision rule, each on a metric the collector computes.
    rules = config.alerts.rules
    assert any("recall" in r.metric for r in rules)
    assert any("precision" in r.metric for r in rules)
    for rule in rules:
        assert rule.metric in config.metrics, f"rule {rule.name}: {rule.metric} is not computed"

    # The reference store reads the golden file the compose file mounts there.
    assert config.reference_store is not None
    mounts = {m.container: m.host for m in bind_mounts(compose, services(compose)[service])}
    golden = mounts[str(config.reference_store.path)]
    store = ReferenceStore(config.reference_store.model_copy(update={"path": golden}))
    assert len(store) >= 10


def test_single_collector_alerts_alertmanager_and_keeps_sessions_in_memory() -> None:
    config = _load(SINGLE, COMPOSE, "collector")
    assert config.alerts.alertmanager is not None
    assert config.alerts.alertmanager.url == "http://alertmanager:9093"
    assert host_port(config.alerts.alertmanager.url) == ("alertmanager", 9093)
    assert "alertmanager" in services(COMPOSE)
    assert config.session_store.backend == "memory"


def test_scale_out_replicas_share_sessions_through_redis() -> None:
    config = _load(SCALE_OUT, SCALE_OUT_COMPOSE, "collector-1")
    assert config.session_store.backend == "redis"
    assert host_port(config.session_store.url) == ("redis", 6379)
    assert "redis" in services(SCALE_OUT_COMPOSE)
    # Without the compose variable the default still points at the compose service.
    default = load_config(SCALE_OUT, env={})
    assert host_port(default.session_store.url) == ("redis", 6379)
