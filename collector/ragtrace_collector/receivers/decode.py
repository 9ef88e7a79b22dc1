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
* **parse and split**: upb (protobuf) runs in the worker thread, and so does the split
  into traces (a Python walk of every span); large OTLP/JSON is parsed in a worker
  process first (see :class:`Decoder`);
* **concurrency**: at most ``workers`` requests are decoded in threads at once, and one
  large JSON body in the process; the others wait (asynchronously, holding only their
  bytes).

The event loop itself does only the hand-off and the answer.
"""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from ragtrace_collector.otlp.codec import (
    SplitRequest,
    decode_json_request,
    decode_protobuf_request,
    split_request,
)
from ragtrace_collector.receivers.inflate import BodyError, InflateBudget, plain_body
from ragtrace_collector.receivers.jsonworker import JsonWorker

__all__ = ["BodyError", "Decoder", "InflateBudget", "decode_body"]

#: Plain bodies up to this size are decoded on the loop (cheaper than a thread hop).
_INLINE_BYTES: Final = 64 * 1024
#: Plain OTLP/JSON bodies over this are parsed in the worker process (see Decoder).
_JSON_PROCESS_BYTES: Final = 1024 * 1024


def decode_body(
    body: bytes, *, encoding: str, as_json: bool, budget: InflateBudget
) -> SplitRequest:
    """Inflate (``encoding``: identity, gzip or deflate), parse and split one request.

    Raises :class:`BodyError` (compression, size) or
    :class:`~ragtrace_collector.otlp.codec.OtlpDecodeError` (malformed request).
    """
    body = plain_body(body, encoding, budget)
    request = decode_json_request(body) if as_json else decode_protobuf_request(body)
    split = split_request(request)
    split.payload = request if as_json else body
    return split


class Decoder:
    """Decodes requests off the event loop, each kind where it costs the loop least.

    * plain bodies up to 64 KiB: inline;
    * everything else: a bounded thread pool (``workers`` threads).  zlib and upb let
      the event loop run meanwhile (they release the interpreter lock, or hold it only
      briefly);
    * large OTLP/JSON (over 1 MiB, or over 64 KiB compressed): first the JSON worker
      process (:mod:`ragtrace_collector.receivers.jsonworker`), because ``json.loads``
      holds the interpreter lock for its whole run (about 100 ms for 16 MiB), which
      would stall the loop however many threads there are.  The worker answers
      protobuf bytes, which a thread parses and splits.  A job over
      ``json_time_limit`` seconds gets the worker killed and a 413.

    One decoder serves both receivers.  ``aclose()`` stops its threads and worker.
    """

    def __init__(self, workers: int | None = None, *, json_time_limit: float = 30.0) -> None:
        count = workers if workers is not None else min(4, os.cpu_count() or 1)
        self.workers = max(1, count)
        self._threads: ThreadPoolExecutor | None = None
        self._thread_slots: asyncio.Semaphore | None = None
        self._json = JsonWorker(json_time_limit)

    async def decode(
        self, body: bytes, *, encoding: str, as_json: bool, budget: InflateBudget
    ) -> SplitRequest:
        """Decode ``body``; raises what :func:`decode_body` raises."""
        plain = encoding in ("", "identity")
        if plain and len(body) <= _INLINE_BYTES:
            return decode_body(body, encoding=encoding, as_json=as_json, budget=budget)
        if as_json and len(body) > (_JSON_PROCESS_BYTES if plain else _INLINE_BYTES):
            body = await self._json.to_protobuf(body, encoding=encoding, budget=budget)
            encoding, as_json = "identity", False
        if self._thread_slots is None:
            self._thread_slots = asyncio.Semaphore(self.workers)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="ragtrace-decode")
        threads = self._threads
        job = functools.partial(
            decode_body, body, encoding=encoding, as_json=as_json, budget=budget
        )
        async with self._thread_slots:
            return await asyncio.get_running_loop().run_in_executor(threads, job)

    async def aclose(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        await self._json.aclose()
