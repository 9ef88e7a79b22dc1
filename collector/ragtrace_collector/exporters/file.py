"""File exporter: OTLP/JSON lines, one ExportTraceServiceRequest per line.

The file is rotated by size: when the next line would take it past ``max_bytes``,
``path`` becomes ``path.1`` (``path.1`` becomes ``path.2`` ...) and files beyond
``keep`` are deleted.  A line is never split across files.  Encoding and writing run
in a worker thread so the event loop keeps serving; a write error (disk full,
permissions) is retried with backoff like a backend outage.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from ragtrace_collector.exporters.base import Exporter, ExportError
from ragtrace_collector.exporters.config import FileExporterConfig
from ragtrace_collector.otlp.codec import (
    ExportTraceServiceRequest,
    SpanGroup,
    build_request,
    encode_json,
)
from ragtrace_collector.service.component import Supervisor
from ragtrace_collector.service.telemetry import Telemetry

__all__ = ["FileExporter", "rotated_paths"]


def rotated_paths(path: Path, keep: int) -> list[Path]:
    """``[path, path.1, ..., path.keep]``."""
    return [path] + [path.with_name(f"{path.name}.{i}") for i in range(1, keep + 1)]


class FileExporter(Exporter[ExportTraceServiceRequest]):
    kind = "file"

    def __init__(
        self,
        name: str,
        config: FileExporterConfig,
        telemetry: Telemetry,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        super().__init__(name, config, telemetry, supervisor=supervisor)
        self._path = config.path
        self._max_bytes = config.max_bytes
        self._keep = config.keep

    def _encode(self, groups: Sequence[SpanGroup]) -> ExportTraceServiceRequest:
        return build_request(groups)

    async def _send(self, payload: ExportTraceServiceRequest, spans: int) -> int:
        try:
            await asyncio.to_thread(self._write, payload)
        except OSError as exc:
            raise ExportError(f"cannot write {self._path}: {exc}", retryable=True) from None
        return 0

    def _write(self, request: ExportTraceServiceRequest) -> None:
        line = encode_json(request) + b"\n"
        self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            size = self._path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(line) > self._max_bytes:
            self._rotate()
        with open(self._path, "ab") as fh:
            fh.write(line)
            fh.flush()

    def _rotate(self) -> None:
        paths = rotated_paths(self._path, self._keep)
        if self._keep == 0:
            self._path.unlink(missing_ok=True)
            return
        paths[-1].unlink(missing_ok=True)
        for older, newer in zip(reversed(paths[1:]), reversed(paths[:-1]), strict=True):
            if newer.exists():
                os.replace(newer, older)
