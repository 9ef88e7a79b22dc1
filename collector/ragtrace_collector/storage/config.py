"""The ``storage:`` section: where the write-ahead log lives, how big, how durable."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ragtrace_collector.storage.fileops import FsyncPolicy
from ragtrace_collector.units import ByteSize, Duration

__all__ = ["StorageConfig"]


class StorageConfig(BaseModel):
    """The write-ahead log of accepted requests (off unless ``directory`` is set)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    #: Directory of the write-ahead log.  Unset: spans are held in memory only, and a
    #: crash loses what was acknowledged but not yet exported.
    directory: Path | None = None
    #: Disk the log's segment files may use, every record counted (requests, outputs
    #: such as carriers and copies of results, delivery marks).  At this size receivers
    #: answer with back-pressure (429 / RESOURCE_EXHAUSTED) and ``/readyz`` with 503
    #: until exporters catch up.  The segments never pass it by more than one segment
    #: (1/8 of ``max_size``, 64 KiB to 64 MiB; or one request, if larger): outputs made
    #: from requests already accepted may use that margin; a copy of results that does
    #: not fit in half of it is not logged (a crash then costs a repeated judge call), a
    #: carrier waits for room.  The lock and checkpoint files (a few bytes) are not
    #: counted.  A disk that fills up first is handled like this limit, and recovers
    #: once space returns.
    max_size: ByteSize = Field(2 * 1024**3, ge=1024 * 1024)
    #: ``always``: fsync each request before acknowledging it; ``batch``: one fsync per
    #: group of requests written together (group commit), still before acknowledging;
    #: ``never``: leave flushing to the OS (survives a process crash, not a power loss).
    #: A ``file`` exporter syncs its lines by the same policy before their entry is released.
    fsync: FsyncPolicy = "batch"
    #: A request whose write has not completed within this time (a stuck disk) is
    #: answered as refused (429 / RESOURCE_EXHAUSTED; the client retries), and storage
    #: reports ``recoverable_error`` until the writer completes a write again.  A write
    #: that completes later is still delivered: at worst a duplicate, never a loss.
    append_timeout: Duration = Field(10.0, gt=0)
