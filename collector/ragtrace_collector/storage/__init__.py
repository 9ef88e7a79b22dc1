"""Durable storage of accepted requests: a write-ahead log at receipt.

:class:`Storage` is the ``storage`` component the pipeline writes through;
:mod:`.wal` holds the file format; :mod:`.spill` writes what a shutdown could not
deliver when there is no log.
"""

from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.storage.service import Storage
from ragtrace_collector.storage.wal import StorageError, StorageLocked

__all__ = ["Storage", "StorageConfig", "StorageError", "StorageLocked"]
