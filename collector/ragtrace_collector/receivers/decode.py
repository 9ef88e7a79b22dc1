"""Request decoding off the event loop: inflate with a budget, parse, split by trace.

Both receivers hand the raw request bytes to one :class:`Decoder`.  Small plain bodies
are decoded inline (a few hundred microseconds); anything larger, and every compressed
body, is decoded in a small, bounded thread pool so the event loop keeps serving other
connections, ``/healthz`` and the exporters meanwhile.  The work done for one request
is bounded:

* **inflate**: at most ``max_output`` bytes come out (else 413), at most
  ``max_members`` gzip members are read (else 413: a body of thousands of empty
  members is the classic way to make an inflater spin), and at most ``max_seconds`` of
  CPU are spent (else 413).  Input is fed in fixed chunks, so each member costs time
  in proportion to its own size, never to what is left of the body;
* **parse and split**: upb (protobuf) and the JSON mapping run in the worker thread;
  the split into traces too (a Python walk of every span);
* **concurrency**: at most ``workers`` requests are decoded at once; the others wait
  (asynchronously, holding only their bytes).

The event loop itself does only the hand-off and the answer.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from ragtrace_collector.otlp import (
    SplitRequest,
    decode_json_request,
    decode_protobuf_request,
    split_request,
)

__all__ = ["BodyError", "Decoder", "InflateBudget", "decode_body", "inflate"]

#: Plain bodies up to this size are decoded on the loop (cheaper than a thread hop).
_INLINE_BYTES: Final = 64 * 1024
#: Input fed to the inflater per step.
_CHUNK: Final = 64 * 1024
#: Legitimate clients send one gzip member; a few concatenated ones are tolerated.
DEFAULT_MAX_MEMBERS: Final = 16
#: CPU budget of one decompression (16 MiB inflate in well under 0.1 s on one core).
DEFAULT_MAX_SECONDS: Final = 2.0


class BodyError(Exception):
    """The body cannot be taken; ``http_status`` is 400, 413 or 415."""

    def __init__(self, http_status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class InflateBudget:
    """How much one decompression may produce and cost."""

    max_output: int
    max_members: int = DEFAULT_MAX_MEMBERS
    max_seconds: float = DEFAULT_MAX_SECONDS


def inflate(data: bytes, encoding: str, budget: InflateBudget) -> bytes:
    """Decompress a gzip (possibly multi-member) or zlib body within ``budget``.

    Raises :class:`BodyError`: 400 for bad or truncated data, 413 once the output, the
    member count or the time budget is exceeded.
    """
    gzip = encoding == "gzip"
    wbits = 31 if gzip else 15
    view = memoryview(data)
    size = len(view)
    limit = budget.max_output
    deadline = time.thread_time() + budget.max_seconds
    out = bytearray()
    pos = 0
    members = 0
    while True:
        members += 1
        if members > budget.max_members:
            raise BodyError(
                413,
                "decompression_budget",
                f"{encoding} body has more than {budget.max_members} members",
            )
        inflater = zlib.decompressobj(wbits)
        while not inflater.eof:
            if pos >= size:
                raise BodyError(400, "bad_compression", f"truncated {encoding} body")
            chunk = view[pos : pos + _CHUNK]
            pos += len(chunk)
            try:
                out += inflater.decompress(chunk, limit + 1 - len(out))
            except zlib.error as exc:
                raise BodyError(400, "bad_compression", f"invalid {encoding} body: {exc}") from None
            if len(out) > limit:
                raise BodyError(
                    413, "too_large", f"decompressed body exceeds the limit of {limit} bytes"
                )
            if time.thread_time() > deadline:
                raise BodyError(
                    413,
                    "decompression_budget",
                    f"decompressing the {encoding} body took more than {budget.max_seconds}s",
                )
        # What the member did not use of the last chunk belongs to the next member.
        pos -= len(inflater.unused_data)
        if pos >= size:
            return bytes(out)
        if not gzip:
            raise BodyError(400, "bad_compression", f"trailing bytes after the {encoding} stream")


def decode_body(
    body: bytes, *, encoding: str, as_json: bool, budget: InflateBudget
) -> SplitRequest:
    """Inflate (``encoding``: identity, gzip or deflate), parse and split one request.

    Raises :class:`BodyError` (compression, size) or
    :class:`~ragtrace_collector.otlp.OtlpDecodeError` (malformed request).
    """
    if encoding in ("gzip", "deflate"):
        body = inflate(body, encoding, budget)
    elif encoding not in ("", "identity"):
        raise BodyError(
            415, "content_encoding", f"unsupported Content-Encoding {encoding!r}: use gzip"
        )
    request = decode_json_request(body) if as_json else decode_protobuf_request(body)
    return split_request(request)


class Decoder:
    """Runs :func:`decode_body` on a bounded thread pool (inline for small plain bodies).

    One decoder serves both receivers.  ``close()`` shuts its threads down.
    """

    def __init__(self, workers: int | None = None) -> None:
        count = workers if workers is not None else min(4, os.cpu_count() or 1)
        self.workers = max(1, count)
        self._pool: ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None

    async def decode(
        self, body: bytes, *, encoding: str, as_json: bool, budget: InflateBudget
    ) -> SplitRequest:
        """Decode ``body``; raises what :func:`decode_body` raises."""
        plain = encoding in ("", "identity")
        if plain and len(body) <= _INLINE_BYTES:
            return decode_body(body, encoding=encoding, as_json=as_json, budget=budget)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ragtrace-decode")
        pool = self._pool
        async with self._slots:
            loop = asyncio.get_running_loop()
            job = functools.partial(
                decode_body, body, encoding=encoding, as_json=as_json, budget=budget
            )
            return await loop.run_in_executor(pool, job)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
