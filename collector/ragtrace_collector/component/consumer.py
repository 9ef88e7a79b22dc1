"""What a receiver hands its requests to, and how it is told to come back later.

A receiver knows no pipeline: it is given a :class:`TraceConsumer` (the service's
pipeline, or a test's stand-in) and calls :meth:`TraceConsumer.accept` once per
decoded request.  The consumer either takes the request (it is then as durable as the
configuration makes it, and the receiver may acknowledge it) or raises
:class:`Refused`, which the receiver turns into its protocol's retryable answer with
the delay the consumer asks for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from ragtrace_collector.otlp.codec import SplitRequest

__all__ = ["Refused", "TraceConsumer"]


class TraceConsumer(Protocol):
    """The next stage after a receiver."""

    async def accept(self, split: SplitRequest, receiver: str, payload: bytes | Message) -> None:
        """Take one request (``payload``: its bytes as received, or the decoded message)
        from ``receiver``; return once it may be acknowledged, or raise
        :class:`Refused`."""


class Refused(Exception):
    """The pipeline cannot take a request now; the client should retry later."""

    def __init__(
        self, reason: str, message: str, retry_after: float, *, detail: str | None = None
    ) -> None:
        super().__init__(message)
        #: ``queue_full``, ``processor_busy``, ``storage_full``, ``storage_error`` or
        #: ``shutting_down``.
        self.reason = reason
        #: What the client is told: never a server path or an OS error.
        self.message = message
        #: The operator's version (logs, ``/readyz``); may name paths and OS errors.
        self.detail = detail if detail is not None else message
        self.retry_after = retry_after
