"""The exporter for one ``exporters.<name>`` section, by its ``type``."""

from __future__ import annotations

from ragtrace_collector.component import Supervisor
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters.base import Exporter
from ragtrace_collector.exporters.config import (
    ExporterConfig,
    FileExporterConfig,
    OtlpGrpcExporterConfig,
    OtlpHttpExporterConfig,
    PhoenixExporterConfig,
)
from ragtrace_collector.storage.fileops import FsyncPolicy

__all__ = ["build_exporter"]


def build_exporter(
    name: str,
    config: ExporterConfig,
    telemetry: Telemetry,
    *,
    supervisor: Supervisor | None = None,
    fsync: FsyncPolicy = "never",
) -> Exporter[object]:
    """The exporter for one ``exporters.<name>`` config section; ``supervisor`` runs
    its workers.  ``fsync`` is ``storage.fsync`` when a write-ahead log is on (the
    file exporter syncs its lines per it before a batch is settled)."""
    if isinstance(config, PhoenixExporterConfig):
        from ragtrace_collector.exporters.phoenix import PhoenixExporter

        return PhoenixExporter(  # type: ignore[return-value]
            name, config, telemetry, supervisor=supervisor
        )
    if isinstance(config, OtlpHttpExporterConfig):
        from ragtrace_collector.exporters.otlp_http import OtlpHttpExporter

        return OtlpHttpExporter(name, config, telemetry, supervisor=supervisor)  # type: ignore[return-value]
    if isinstance(config, OtlpGrpcExporterConfig):
        from ragtrace_collector.exporters.otlp_grpc import OtlpGrpcExporter

        return OtlpGrpcExporter(name, config, telemetry, supervisor=supervisor)  # type: ignore[return-value]
    if isinstance(config, FileExporterConfig):
        from ragtrace_collector.exporters.file import FileExporter

        return FileExporter(  # type: ignore[return-value]
            name, config, telemetry, supervisor=supervisor, fsync=fsync
        )
    raise TypeError(f"unknown exporter config {type(config).__name__}")
