"""Durable storage of accepted requests: a write-ahead log at receipt.

:class:`Storage` is the ``storage`` component the pipeline writes through;
:mod:`.wal` holds the file format; :mod:`.spill` writes what a shutdown could not
deliver when there is no log; :mod:`.replay` sends such a file (or the file exporter's
output) to a collector again.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragtrace_collector.storage.config import StorageConfig
    from ragtrace_collector.storage.service import Storage
    from ragtrace_collector.storage.wal import StorageError, StorageLocked

__all__ = ["Storage", "StorageConfig", "StorageError", "StorageLocked"]


def __getattr__(name: str) -> Any:
    # Each name loads its module on first use: the log itself (and structlog) only
    # when used, and `ragtrace-collector replay` (storage.replay) loads none of them.
    if name == "StorageConfig":
        from ragtrace_collector.storage.config import StorageConfig

        return StorageConfig
    if name == "Storage":
        from ragtrace_collector.storage.service import Storage

        return Storage
    if name in ("StorageError", "StorageLocked"):
        from ragtrace_collector.storage import wal

        return getattr(wal, name)
    raise AttributeError(name)
