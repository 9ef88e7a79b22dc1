"""docker/scale-out/otelcol.yaml: a well-formed OpenTelemetry Collector config whose
load_balancing exporter routes by trace id to exactly the ragtrace replicas."""

from __future__ import annotations

import re
from typing import Any

from ragtrace_collector.config import load_config
from ragtrace_collector.configbase import split_host_port
from ragtrace_collector.exporters.config import OtlpGrpcExporterConfig
from tests.docker._files import (
    SCALE_OUT,
    SCALE_OUT_COMPOSE,
    compose_default,
    environment,
    load_yaml,
    services,
)

OTELCOL = SCALE_OUT / "otelcol.yaml"


def _config() -> dict[str, Any]:
    data = load_yaml(OTELCOL)
    assert isinstance(data, dict)
    return data


def test_pipelines_reference_only_defined_components() -> None:
    config = _config()
    service = config["service"]
    pipelines = service["pipelines"]
    assert "traces" in pipelines
    for name, pipeline in pipelines.items():
        assert pipeline["receivers"], f"{name}: no receivers"
        assert pipeline["exporters"], f"{name}: no exporters"
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section) or []:
                assert component in (config.get(section) or {}), (
                    f"pipeline {name} uses {section[:-1]} {component!r}, which is not defined"
                )
    for extension in service.get("extensions") or []:
        assert extension in config["extensions"]
    # Nothing defined and left unused (a common copy-paste slip).
    used = {c for p in pipelines.values() for s in ("receivers", "processors", "exporters")
            for c in p.get(s) or []}  # fmt: skip
    for section in ("receivers", "processors", "exporters"):
        for component in config.get(section) or {}:
            assert component in used, f"{section[:-1]} {component!r} is defined but unused"


def test_receivers_listen_on_all_interfaces() -> None:
    protocols = _config()["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"
    otelcol = services(SCALE_OUT_COMPOSE)["otelcol"]
    assert "/etc/otelcol/config.yaml" in " ".join(otelcol["command"])


def test_load_balancing_routes_by_trace_id_to_every_replica() -> None:
    exporter = _config()["exporters"]["load_balancing"]
    assert exporter["routing_key"] == "traceID"
    otlp = exporter["protocol"]["otlp"]
    assert "endpoint" not in otlp, "the load balancer sets each backend's endpoint itself"
    assert otlp["tls"]["insecure"] is True
    resolver = exporter["resolver"]
    assert list(resolver) == ["static"]
    hostnames = resolver["static"]["hostnames"]

    svc = services(SCALE_OUT_COMPOSE)
    replicas = sorted(name for name in svc if re.fullmatch(r"collector-\d+", name))
    assert sorted(h.rsplit(":", 1)[0] for h in hostnames) == replicas
    for name in replicas:
        env = {k: compose_default(v) for k, v in environment(svc[name]).items()}
        config = load_config(SCALE_OUT / "collector.yaml", env=env)
        grpc_port = split_host_port(config.receivers.grpc.endpoint)[1]
        assert f"{name}:{grpc_port}" in hostnames
        [exporter_cfg] = config.exporters.values()
        assert isinstance(exporter_cfg, OtlpGrpcExporterConfig)
        assert split_host_port(exporter_cfg.target())[0] in svc

    prom = load_yaml(SCALE_OUT / "prometheus.yml")
    [job] = [j for j in prom["scrape_configs"] if j["job_name"] == "ragtrace-collector"]
    targets = sorted(t for sc in job["static_configs"] for t in sc["targets"])
    assert targets == [f"{name}:8888" for name in replicas]


def test_scale_out_readme_says_when_to_use_it() -> None:
    text = (SCALE_OUT / "README.md").read_text(encoding="utf-8")
    for phrase in ("one machine", "load_balancing", "traceID", "Redis", "consistent"):
        assert phrase in text, phrase
