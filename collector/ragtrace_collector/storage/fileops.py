"""The system calls that write and sync durable files, behind one seam.

The write-ahead log and the file exporter write through :class:`FileOps`; tests pass a
subclass that fails a write half-way (a short write, then ``ENOSPC``), takes fewer
bytes than asked, or records every sync.  :func:`write_all` goes on after short
writes, as ``os.write`` may legally take only part of the data.
"""

from __future__ import annotations

import errno
import os

__all__ = ["FileOps", "write_all"]


class FileOps:
    """``os.write``, ``os.fdatasync``, ``os.fsync`` and ``os.ftruncate``."""

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)


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
