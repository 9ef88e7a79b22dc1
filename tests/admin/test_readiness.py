"""/readyz agrees with the component statuses it prints: a collector with a component
still starting is not ready, and neither probe calls a component healthy that is not
``ok``.  Errors are /healthz's business: a reference file not there yet or a backend
down leaves the collector ready (it still takes data)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.component import Status
from tests.fakes.harness import (
    ServeProcess,
    admin_json,
    collector_config,
    passthrough_sections,
    running_collector,
)
from tests.fakes.otlp_sink import OtlpSink

EXPORTER = "exporter:backend"


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


def _not_ok(body: dict[str, Any]) -> dict[str, str]:
    return {
        name: part["status"] for name, part in body["components"].items() if part["status"] != "ok"
    }


def test_a_started_collector_with_evaluation_has_no_component_still_starting(
    tmp_path: Path,
) -> None:
    """The newcomer's collector: evaluation workers, the drop detector, and a reference
    file that is not there yet.  Once it says ready, no component is ``starting``; the
    reference store waits for its file in ``recoverable_error``, which does not keep
    the collector from taking data."""
    config = {
        "receivers": {"grpc": {"enabled": False}, "http": {"endpoint": "127.0.0.1:0"}},
        "admin": {"endpoint": "127.0.0.1:0"},
        "judge": {"model": "offline"},
        "metrics": {"id_context_recall": {}, "contextual_recall": {}},
        "evaluation": {"processes": 1},
        "reference_store": {"path": str(tmp_path / "not-yet.jsonl")},
        "exporters": {"file": {"type": "file", "path": str(tmp_path / "spans.jsonl")}},
        "alerts": {"rules": [{"name": "recall_drop", "metric": "id_context_recall"}]},
        "logging": {"format": "json"},
    }
    serve = ServeProcess(config, tmp_path, passthrough=False)
    try:
        status, body = admin_json(f"http://{serve.endpoints['admin']}/readyz")
        components = body["components"]
        assert {"evaluation:workers", "alerts:detector", "reference_store"} <= set(components)
        assert _not_ok(body) == {"reference_store": "recoverable_error"}, body
        assert status == 200, body
        assert "healthy" not in body["reason"]
        health_status, health = admin_json(f"http://{serve.endpoints['admin']}/healthz")
        assert health_status == 200  # within admin.unhealthy_after
        assert "reference_store" in health["reason"]
        assert "every component" not in health["reason"]
    finally:
        serve.kill()


def test_readyz_names_a_component_still_starting_and_liveness_does_not_change(
    sink: OtlpSink,
) -> None:
    config = collector_config(sink=sink, admin={"unhealthy_after": "1h"}, **passthrough_sections())
    with running_collector(config) as collector:
        url = collector.admin_url
        exporter = collector.svc.exporters[0]
        assert admin_json(url + "/readyz")[0] == 200

        collector.call(lambda: exporter.report(Status.STARTING))
        status, body = admin_json(url + "/readyz")
        assert status == 503, body
        assert body["status"] == "unavailable"
        assert f"{EXPORTER}: starting" in body["reason"]
        assert body["components"][EXPORTER]["status"] == "starting"
        # Liveness is unchanged (starting is not a failure), and its text does not
        # call every component healthy while one is starting.
        status, health = admin_json(url + "/healthz")
        assert status == 200
        assert "healthy" not in health["reason"]
        assert f"{EXPORTER}: starting" in health["reason"]

        collector.call(exporter.report_ok)
        status, body = admin_json(url + "/readyz")
        assert status == 200, body
        assert admin_json(url + "/healthz")[1]["reason"] == "every component is ok"

        # An error (a backend down) does not block readiness: the process still takes
        # data; refusing it is what makes /readyz 503 (the queue full, the log full).
        collector.call(lambda: exporter.report(Status.RECOVERABLE_ERROR, "backend down"))
        status, body = admin_json(url + "/readyz")
        assert status == 200, body
        assert f"{EXPORTER}: recoverable_error" in body["reason"]
        assert "healthy" not in body["reason"]
        status, health = admin_json(url + "/healthz")
        assert status == 200
        assert "backend down" in health["reason"]

        # Stopped: not running, so not ready.
        collector.call(lambda: exporter.report(Status.STOPPED))
        status, body = admin_json(url + "/readyz")
        assert status == 503, body
        assert f"{EXPORTER}: stopped" in body["reason"]
        collector.call(exporter.report_ok)
