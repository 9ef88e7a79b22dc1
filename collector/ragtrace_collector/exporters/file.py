"""File exporter: OTLP/JSON lines, one ExportTraceServiceRequest per line.

The file is rotated by size: when the next line would take it past ``max_bytes``,
``path`` becomes ``path.1`` (``path.1`` becomes ``path.2`` ...) and files beyond
``keep`` are deleted.  A line is never split across files.  Encoding and writing run
in a worker thread so the event loop keeps serving; a write error (disk full,
permissions) is retried with backoff like a backend outage.

**A batch is written whole or not at all.**  Its line is appended with as many writes
as the system needs (a write may take only part of it); when one fails (``ENOSPC``,
``EIO``...) the file is truncated back to where the batch started, so the file never
holds part of a line, and the retried batch starts on a line of its own.  A file that
already ends in a partial line (a crash cut a write short, or another program wrote
it) gets a newline before the next batch, so the partial line never swallows it.

**Durability.**  With a write-ahead log (``storage.directory``), the line is synced to
disk per ``storage.fsync`` before the batch is settled, that is before its log entry
may be released: ``batch`` and ``always`` fsync every batch (one export request is
one write here), and a new or rotated file's directory too; ``never`` leaves flushing
to the OS, as the log itself does.  Without a log nothing is fsynced.  The exporter
runs one worker (``concurrency`` is 1), so batches are written one at a time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from ragtrace_collector.component import Supervisor
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters.base import Exporter, ExportError
from ragtrace_collector.exporters.config import FileExporterConfig
from ragtrace_collector.otlp.codec import SpanGroup, build_request, encode_json
from ragtrace_collector.storage.fileops import FileOps, FsyncPolicy, sync_directory, write_all

__all__ = ["FileExporter", "FsyncPolicy", "rotated_paths"]

_NEWLINE: Final = b"\n"


def rotated_paths(path: Path, keep: int) -> list[Path]:
    """``[path, path.1, ..., path.keep]``."""
    return [path] + [path.with_name(f"{path.name}.{i}") for i in range(1, keep + 1)]


class FileExporter(Exporter[bytes]):
    kind = "file"

    def __init__(
        self,
        name: str,
        config: FileExporterConfig,
        telemetry: Telemetry,
        *,
        supervisor: Supervisor | None = None,
        fsync: FsyncPolicy = "never",
        ops: FileOps | None = None,
    ) -> None:
        """``fsync`` is the storage policy when a write-ahead log is on (``never``
        without one); ``ops`` the system calls (the real ones by default; see
        :mod:`ragtrace_collector.storage.fileops`)."""
        super().__init__(name, config, telemetry, supervisor=supervisor)
        self._path = config.path
        self._max_bytes = config.max_bytes
        self._keep = config.keep
        #: The sync policy this exporter writes with.
        self.fsync: FsyncPolicy = fsync
        self._sync = fsync != "never"
        self._ops = ops if ops is not None else FileOps()

    def _encode(self, groups: Sequence[SpanGroup]) -> bytes:
        return encode_json(build_request(groups)) + _NEWLINE

    async def _send(self, payload: bytes, spans: int) -> int:
        try:
            await asyncio.to_thread(self._write, payload)
        except OSError as exc:
            raise ExportError(f"cannot write {self._path}: {exc}", retryable=True) from None
        return 0

    def _write(self, line: bytes) -> None:
        """Append ``line`` whole (or leave the file as it was), then sync per policy."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            size = self._path.stat().st_size
            created = False
        except FileNotFoundError:
            size, created = 0, True
        if size and size + len(line) > self._max_bytes:
            self._rotate()  # moves or removes the file: the next open creates it
            created = True
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            start = os.fstat(fd).st_size
            if start and os.pread(fd, 1, start - 1) != _NEWLINE:
                line = _NEWLINE + line  # never continue a partial line
            try:
                write_all(self._ops, fd, line)
                if self._sync:
                    self._ops.fsync(fd)
            except BaseException:
                self._ops.truncate(fd, start)  # no partial line; the retry starts clean
                raise
        finally:
            os.close(fd)
        if created and self._sync:
            sync_directory(self._ops, self._path.parent)

    def _rotate(self) -> None:
        paths = rotated_paths(self._path, self._keep)
        if self._keep == 0:
            self._path.unlink(missing_ok=True)
            return
        paths[-1].unlink(missing_ok=True)
        for older, newer in zip(reversed(paths[1:]), reversed(paths[:-1]), strict=True):
            if newer.exists():
                os.replace(newer, older)
