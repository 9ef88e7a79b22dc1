"""The system calls that write and sync durable files, behind one seam.

The write-ahead log and the file exporter write through :class:`FileOps`; tests pass a
subclass that fails a write half-way (a short write, then ``ENOSPC``), takes fewer
bytes than asked, or records every sync.  :func:`write_all` goes on after short
writes, as ``os.write`` may legally take only part of the data.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

__all__ = ["FileOps", "FsyncPolicy", "sync_directory", "write_all", "writev_all"]

#: ``storage.fsync``: when the write-ahead log (and a file exporter) syncs what it wrote.
FsyncPolicy = Literal["never", "batch", "always"]

#: Buffers per ``writev`` call (Linux's IOV_MAX).
_IOV_MAX = 1024


class FileOps:
    """``os.write``, ``os.writev``, ``os.fdatasync``, ``os.fsync`` and ``os.ftruncate``."""

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        return os.writev(fd, buffers)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)


def sync_directory(ops: FileOps, directory: Path) -> None:
    """Make a created or renamed file's entry in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        ops.fsync(fd)
    finally:
        os.close(fd)


def write_all(ops: FileOps, fd: int, data: bytes) -> int:
    """Write all of ``data`` to ``fd`` through ``ops``, going on after short writes;
    returns its length.  Raises ``OSError`` (a write that makes no progress too)."""
    view = memoryview(data)
    while view:
        written = ops.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write returned no progress")
        view = view[written:]
    return len(data)


def writev_all(ops: FileOps, fd: int, buffers: Sequence[bytes]) -> int:
    """Write ``buffers`` one after the other with ``writev`` (no joined copy: a large
    joined buffer costs fresh pages on every call), going on after short writes;
    returns the bytes written.  Raises ``OSError`` like :func:`write_all`."""
    pending: list[bytes | memoryview] = [b for b in buffers if b]
    total = sum(len(b) for b in pending)
    at = 0  # pending[at:] is still to write
    while at < len(pending):
        written = ops.writev(fd, pending[at : at + _IOV_MAX])
        if written <= 0:
            raise OSError(errno.EIO, "write returned no progress")
        while written:
            size = len(pending[at])
            if written < size:
                pending[at] = memoryview(pending[at])[written:]
                break
            written -= size
            at += 1
    return total
