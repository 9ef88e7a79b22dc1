"""docker/docker-compose.yml and docker/scale-out/docker-compose.yml: they parse, every
file they reference exists, images are pinned, and the ports line up across files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.config import ConfigError, load_config
from ragtrace_collector.configbase import split_host_port
from tests.docker._files import (
    COMPOSE,
    COMPOSE_FILES,
    DOCKER,
    ROOT,
    SCALE_OUT_COMPOSE,
    bind_mounts,
    compose_default,
    dockerfile_instructions,
    environment,
    host_port,
    load_yaml,
    port_bindings,
    published_ports,
    services,
)

_PINNED = re.compile(r"^[a-z0-9./_-]+:v?\d+\.\d+\.\d+[a-z0-9.-]*(@sha256:[0-9a-f]{64})?$")


def _mount_cases() -> list[Any]:
    cases = []
    for compose in COMPOSE_FILES:
        for name, service in services(compose).items():
            for mount in bind_mounts(compose, service):
                rel = mount.host.relative_to(ROOT)
                cases.append(
                    pytest.param(mount.host, id=f"{compose.relative_to(DOCKER)}:{name}:{rel}")
                )
    return cases


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: str(p.relative_to(DOCKER)))
def test_compose_file_parses_and_pins_every_image(compose: Path) -> None:
    data = load_yaml(compose)
    assert "version" not in data, "the compose 'version' key is obsolete"
    for name, service in services(compose).items():
        assert ("image" in service) != ("build" in service), f"{name}: image xor build"
        if "image" in service:
            assert _PINNED.match(service["image"]), f"{name}: {service['image']} is not pinned"
        for dep in service.get("depends_on") or []:
            assert dep in services(compose), f"{name} depends on unknown service {dep}"


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: str(p.relative_to(DOCKER)))
def test_build_contexts_and_dockerfiles_exist(compose: Path) -> None:
    built = 0
    for name, service in services(compose).items():
        build = service.get("build")
        if build is None:
            continue
        context = (compose.parent / build["context"]).resolve()
        assert context == ROOT, f"{name}: build context should be the repository root"
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
        built += 1
    assert built >= 2


@pytest.mark.parametrize("host_path", _mount_cases())
def test_bind_mounted_host_paths_exist(host_path: Path) -> None:
    assert host_path.exists(), f"{host_path} is mounted but does not exist"


def test_main_stack_ports_line_up() -> None:
    svc = services(COMPOSE)
    for expected in ("app", "collector", "jaeger", "prometheus", "alertmanager", "grafana"):
        assert expected in svc

    # The collector reads docker/collector.yaml, mounted where its command points.
    collector = svc["collector"]
    mounts = {m.container: m for m in bind_mounts(COMPOSE, collector)}
    config_path = collector["command"][collector["command"].index("--config") + 1]
    assert mounts[config_path].host == DOCKER / "collector.yaml"
    env = {k: compose_default(v) for k, v in environment(collector).items()}
    env["RAGTRACE_BEARER_TOKEN"] = "a-token-from-the-environment"
    config = load_config(DOCKER / "collector.yaml", env=env)
    grpc_port = split_host_port(config.receivers.grpc.endpoint)[1]
    http_port = split_host_port(config.receivers.http.endpoint)[1]
    admin_port = split_host_port(config.admin.endpoint)[1]
    for endpoint in (config.receivers.grpc.endpoint, config.receivers.http.endpoint):
        assert endpoint.startswith("0.0.0.0:"), "a container must listen on all interfaces"
    assert (grpc_port, http_port, admin_port) == (4317, 4318, 8888)
    assert set(published_ports(collector)) >= {grpc_port, http_port, admin_port}

    # The app exports to the collector's OTLP/HTTP receiver.
    app_env = environment(svc["app"])
    assert host_port(app_env["OTEL_EXPORTER_OTLP_ENDPOINT"]) == ("collector", http_port)
    assert app_env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"

    # The collector exports to Jaeger's OTLP/gRPC port.
    [exporter] = config.exporters.values()
    assert exporter.type == "otlp_grpc"
    assert split_host_port(exporter.target()) == ("jaeger", 4317)
    assert environment(svc["jaeger"])["COLLECTOR_OTLP_ENABLED"] == "true"

    # Prometheus scrapes the admin port and alerts to Alertmanager.
    prom = load_yaml(DOCKER / "prometheus" / "prometheus.yml")
    [job] = [j for j in prom["scrape_configs"] if j["job_name"] == "ragtrace-collector"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"collector:{admin_port}"]
    [am_target] = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert host_port(am_target) == ("alertmanager", 9093)
    assert 9093 in published_ports(svc["alertmanager"])

    # Prometheus loads the rules from the mounted rules directory.
    prom_mounts = {m.container: m.host for m in bind_mounts(COMPOSE, svc["prometheus"])}
    assert prom_mounts["/etc/prometheus/prometheus.yml"] == DOCKER / "prometheus/prometheus.yml"
    assert prom_mounts["/etc/prometheus/rules"] == DOCKER / "prometheus/rules"
    assert prom["rule_files"] == ["rules/*.yml"]  # relative to /etc/prometheus

    # Grafana gets the provisioning and dashboards directories.
    graf_mounts = {m.container: m.host for m in bind_mounts(COMPOSE, svc["grafana"])}
    assert graf_mounts["/etc/grafana/provisioning"] == DOCKER / "grafana/provisioning"
    assert DOCKER / "grafana/dashboards" in graf_mounts.values()

    # Alertmanager reads docker/alertmanager/alertmanager.yml.
    am_mounts = {m.container: m.host for m in bind_mounts(COMPOSE, svc["alertmanager"])}
    assert am_mounts["/etc/alertmanager/alertmanager.yml"] == (
        DOCKER / "alertmanager/alertmanager.yml"
    )


def test_app_port_matches_its_healthcheck() -> None:
    app = services(COMPOSE)["app"]
    command = app["command"]
    port = int(command[command.index("--port") + 1])
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert published_ports(app) == {port: port}
    [health] = [
        i for i in dockerfile_instructions(DOCKER / "app.Dockerfile") if i.keyword == "HEALTHCHECK"
    ]
    assert f"127.0.0.1:{port}/healthz" in health.args


def test_scale_out_compose_wires_load_balancer_replicas_and_redis() -> None:
    svc = services(SCALE_OUT_COMPOSE)
    replicas = sorted(name for name in svc if re.fullmatch(r"collector-\d+", name))
    assert len(replicas) >= 2
    configs = set()
    for name in replicas:
        replica = svc[name]
        env = environment(replica)
        assert host_port(env["RAGTRACE_REDIS_URL"]) == ("redis", 6379)
        assert "published" not in str(replica.get("ports", "")), "replicas are internal"
        [config] = [
            m for m in bind_mounts(SCALE_OUT_COMPOSE, replica) if m.container.endswith(".yaml")
        ]
        configs.add(config.host)
    assert configs == {SCALE_OUT_COMPOSE.parent / "collector.yaml"}, "one config for all"
    assert "healthcheck" in svc["redis"]
    app_env = environment(svc["app"])
    assert host_port(app_env["OTEL_EXPORTER_OTLP_ENDPOINT"]) == ("otelcol", 4318)


def test_grafana_provisioning_points_at_the_mounted_dashboards_and_prometheus() -> None:
    svc = services(COMPOSE)
    mounts = {m.host: m.container for m in bind_mounts(COMPOSE, svc["grafana"])}
    dashboards_in_container = mounts[DOCKER / "grafana/dashboards"]
    provisioning = DOCKER / "grafana/provisioning"

    providers = [
        p
        for f in sorted((provisioning / "dashboards").glob("*.y*ml"))
        for p in (load_yaml(f) or {}).get("providers") or []
    ]
    assert providers, "no dashboard provider under docker/grafana/provisioning/dashboards"
    for provider in providers:
        path = str(provider["options"]["path"]).rstrip("/")
        assert path == dashboards_in_container or path.startswith(dashboards_in_container + "/")
    assert any((DOCKER / "grafana/dashboards").glob("*.json")), "no dashboard JSON"

    datasources = [
        d
        for f in sorted((provisioning / "datasources").glob("*.y*ml"))
        for d in (load_yaml(f) or {}).get("datasources") or []
    ]
    prometheus = [d for d in datasources if d.get("type") == "prometheus"]
    assert prometheus, "no Prometheus datasource provisioned"
    for datasource in prometheus:
        assert host_port(datasource["url"]) == ("prometheus", 9090)
    assert 9090 in published_ports(svc["prometheus"])


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: str(p.relative_to(DOCKER)))
def test_every_stack_publishes_on_loopback_only(compose: Path) -> None:
    bindings = [
        (name, binding)
        for name, service in services(compose).items()
        for binding in port_bindings(service)
    ]
    assert bindings, "the stack publishes no port at all"
    for name, (ip, host, container) in bindings:
        assert ip == "127.0.0.1", f"{name}: port {host}:{container} is published on {ip}"


def test_main_stack_requires_a_bearer_token() -> None:
    svc = services(COMPOSE)
    collector = svc["collector"]
    token_ref = environment(collector)["RAGTRACE_BEARER_TOKEN"]
    assert token_ref.startswith("${RAGTRACE_BEARER_TOKEN:?"), "the token must be required"
    # Without the variable the collector refuses to start (no silent open receivers).
    with pytest.raises(ConfigError, match="RAGTRACE_BEARER_TOKEN"):
        load_config(DOCKER / "collector.yaml", env={})
    config = load_config(DOCKER / "collector.yaml", env={"RAGTRACE_BEARER_TOKEN": "s3cret-t0ken"})
    tokens = [t.get_secret_value() for t in config.receivers.auth.bearer_tokens]
    assert tokens == ["s3cret-t0ken"]
    # The app sends the same token.
    headers = environment(svc["app"])["OTEL_EXPORTER_OTLP_HEADERS"]
    assert headers.startswith("Authorization=Bearer%20${RAGTRACE_BEARER_TOKEN:?")
