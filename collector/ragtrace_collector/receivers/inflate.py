"""Inflating request bodies within a budget of output size, gzip members and CPU.

A body of thousands of empty gzip members is the classic way to make an inflater
spin: each member is tiny, and a naive loop copies what is left of the body for every
member.  :func:`inflate` feeds input in fixed chunks (each member costs time in
proportion to its own size), stops at ``max_members`` members, at ``max_output``
bytes of output and at ``max_seconds`` of CPU, whichever comes first, with a 413.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_MAX_MEMBERS", "BodyError", "InflateBudget", "inflate", "plain_body"]

#: Input fed to the inflater per step.
_CHUNK: Final = 64 * 1024
#: Legitimate clients send one gzip member; a few concatenated ones are tolerated.
DEFAULT_MAX_MEMBERS: Final = 16
#: CPU budget of one decompression (16 MiB inflate in well under 0.1 s on one core).
DEFAULT_MAX_SECONDS: Final = 2.0


class BodyError(Exception):
    """The body cannot be taken; ``http_status`` is 400, 408, 413 or 415."""

    def __init__(self, http_status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[type[BodyError], tuple[int, str, str]]:
        # Raised in the JSON worker process too: it must survive pickling.
        return (BodyError, (self.http_status, self.reason, self.message))


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


def plain_body(body: bytes, encoding: str, budget: InflateBudget) -> bytes:
    """``body`` decompressed per ``encoding`` (identity, gzip or deflate), else 415."""
    if encoding in ("gzip", "deflate"):
        return inflate(body, encoding, budget)
    if encoding not in ("", "identity"):
        raise BodyError(
            415, "content_encoding", "unsupported Content-Encoding: use gzip or deflate"
        )
    return body
