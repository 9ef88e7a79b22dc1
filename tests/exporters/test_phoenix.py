"""Through the collector into a real tracing backend: Arize Phoenix, read back over REST."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)

from ragtrace import semconv
from tests.fakes.harness import (
    collector_config,
    emit_rag_request,
    make_app,
    running_collector,
    span_key,
)
from tests.fakes.phoenix import PhoenixServer

# tests/conftest.py keeps every Phoenix test on one xdist worker: one Phoenix start.
pytestmark = [pytest.mark.services, pytest.mark.slow]

#: Phoenix keeps the OpenInference span kind in its own field, not in attributes.
_RESTRUCTURED = {semconv.OPENINFERENCE_SPAN_KIND}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize(("sdk", "exporter"), [("http", "otlp_http"), ("grpc", "otlp_grpc")])
def test_spans_reach_phoenix_through_the_collector(
    phoenix: PhoenixServer,
    sdk: str,
    exporter: str,
) -> None:
    project = f"ragtrace-collector-{sdk}-to-{exporter}"
    endpoint = phoenix.otlp_http_url if exporter == "otlp_http" else phoenix.otlp_grpc_endpoint
    config = collector_config(exporters={"phoenix": {"type": exporter, "endpoint": endpoint}})
    with running_collector(config) as collector:
        sdk_exporter: Any = (
            HttpSpanExporter(endpoint=collector.http_url)
            if sdk == "http"
            else GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
        )
        app = make_app(sdk_exporter, resource_attributes={"openinference.project.name": project})
        for n in range(12):
            emit_rag_request(app.provider, n)
        app.shutdown()
    # Leaving the block stopped the collector gracefully: everything was flushed.
    emitted = app.emitted()
    trace_ids = sorted({span_key(s)[0] for s in emitted})
    stored = phoenix.wait_for_spans(project, trace_ids, count=len(emitted))
    assert len(stored) == len(emitted)  # counted exactly: none lost, none doubled
    assert len(phoenix.spans(project)) == len(emitted)
    by_id = {s["context"]["span_id"]: s for s in stored}
    for span in emitted:
        trace_id, span_id = span_key(span)
        got = by_id[span_id]
        assert got["context"]["trace_id"] == trace_id
        assert got["name"] == span.name
        parent = f"{span.parent.span_id:016x}" if span.parent else None
        assert got["parent_id"] == parent
        attributes = dict(span.attributes or {})
        assert got["span_kind"] == attributes[semconv.OPENINFERENCE_SPAN_KIND]
        for key, value in attributes.items():
            if key not in _RESTRUCTURED:
                assert got["attributes"].get(key) == _plain(value), (span.name, key)
        assert [e["name"] for e in got["events"]] == [e.name for e in span.events]
