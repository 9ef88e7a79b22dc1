"""Durable storage of accepted requests: a write-ahead log at receipt.

:class:`Storage` is the ``storage`` component the pipeline writes through;
:mod:`.wal` holds the file format; :mod:`.spill` writes what a shutdown could not
deliver when there is no log.
"""

from typing import TYPE_CHECKING, Any

from ragtrace_collector.storage.config import StorageConfig

if TYPE_CHECKING:
    from ragtrace_collector.storage.service import Storage
    from ragtrace_collector.storage.wal import StorageError, StorageLocked

__all__ = ["Storage", "StorageConfig", "StorageError", "StorageLocked"]


def __getattr__(name: str) -> Any:
    # The config imports StorageConfig from here; the log itself (and structlog) load
    # only when used, so check-config and --help stay fast.
    if name == "Storage":
        from ragtrace_collector.storage.service import Storage

        return Storage
    if name in ("StorageError", "StorageLocked"):
        from ragtrace_collector.storage import wal

        return getattr(wal, name)
    raise AttributeError(name)
