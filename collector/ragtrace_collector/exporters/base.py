"""The exporter machinery shared by every backend: queue, batching, workers, retries.

Each exporter owns a bounded queue and its own worker tasks, so a slow or failing
backend never blocks another exporter.  ``enqueue`` never blocks and never fails:

* ``on_full: backpressure`` (default): the queue may pass its bound only by what was
  already inside the collector when it filled; :meth:`Exporter.full` tells the
  pipeline to refuse new spans (receivers answer 429/RESOURCE_EXHAUSTED with a retry
  delay), so nothing accepted is ever dropped;
* ``on_full: drop_oldest``: the oldest queued spans are dropped, counted in
  ``ragtrace_spans_dropped{reason="queue_full"}``.

A worker takes traces from the queue up to ``max_batch_spans``, encodes them once,
and sends with retries.  A trace larger than ``max_batch_spans`` is cut, at enqueue,
into pieces of at most that many spans (in span order, each piece one request), so
no request and no encoding grows with the size of one trace; the trace counts as
settled (``on_settled``, with its original groups) only once every piece is, so a
crash or a shutdown deadline between pieces replays or spills the whole trace
(at-least-once: the pieces already delivered come again).  Retries: exponential
backoff with jitter on retryable failures, or the delay the backend asked for (HTTP
Retry-After, gRPC RetryInfo).  By default it retries until the batch is delivered,
so spans wait while the backend is down and go out when it returns.  At shutdown,
:meth:`Exporter.close` delivers what it can before the deadline and counts the rest
as dropped (``reason="shutdown_deadline"``).

``ragtrace_spans_dropped{reason}``: ``queue_full`` (drop_oldest), ``rejected`` (a
non-retryable answer, or spans the backend refused in a partial success),
``retry_timeout`` (``retry.max_elapsed_time``), ``shutdown_deadline``,
``encode_error`` and ``closed`` (both bugs, never expected).  A batch that cannot be
encoded is never settled: the write-ahead log keeps it, or without a log a shutdown
spills it (``shutdown.spill_path``), and :meth:`Exporter.close` counts it as not
delivered.

**Status and supervision.**  Each exporter is a component (``exporter:<name>``): ``ok``
after a delivery, ``recoverable_error`` while the backend fails (retryable or not), and
back to ``ok`` on the next delivery.  Its workers run under the service's
:class:`~ragtrace_collector.component.Supervisor`.  The backend's answers are untrusted:
a ``partial_success`` whose ``rejected_spans`` is negative or larger than the batch is
clamped (and logged), an answer that does not decode is logged, and an unexpected
exception in a worker puts the batch it held back at the front of the queue before the
supervisor logs it, counts it and restarts the worker: no answer can stop delivery and
no batch is lost.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from ragtrace_collector.component import Component, Status, Supervisor
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters.config import ExporterConfig, RetryConfig
from ragtrace_collector.otlp.codec import ExportTraceServiceResponse, SpanGroup

__all__ = ["ExportError", "Exporter", "UndecodableAnswer", "backoff_delays", "rejected_in_answer"]

_Payload = TypeVar("_Payload")

#: A server may ask for a long pause; never sleep longer than this in one go.
_MAX_SERVER_DELAY = 300.0
#: One kind of odd backend answer is logged at most once per this many seconds.
_ODD_ANSWER_LOG_INTERVAL = 10.0


class ExportError(Exception):
    """One failed export call; ``retryable`` says whether to try the batch again."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class UndecodableAnswer(ValueError):
    """A backend's answer body is not what the protocol says it should be."""


def rejected_in_answer(answer: bytes) -> int:
    """``partial_success.rejected_spans`` of an encoded ``ExportTraceServiceResponse``
    (0 for an empty answer).  Raises :class:`UndecodableAnswer`.  The value is the
    backend's word, not checked here: the exporter clamps it to the batch."""
    if not answer:
        return 0
    response = ExportTraceServiceResponse()
    try:
        response.ParseFromString(answer)
    except Exception as exc:  # DecodeError, or anything the parser raises on garbage
        raise UndecodableAnswer(
            f"not an ExportTraceServiceResponse ({len(answer)} bytes: {exc})"
        ) from None
    return int(response.partial_success.rejected_spans)


def backoff_delays(config: RetryConfig, rng: random.Random | None = None) -> Iterator[float]:
    """Endless generator of jittered exponential delays per ``config``."""
    rand = rng or random.Random()
    delay = config.initial_interval
    while True:
        jitter = 1.0 + config.jitter * (2.0 * rand.random() - 1.0)
        yield min(delay, config.max_interval) * jitter
        delay = min(delay * config.multiplier, config.max_interval)


class _Whole:
    """A trace cut into pieces: its original groups, settled once no piece is left."""

    __slots__ = ("groups", "pending")

    def __init__(self, groups: list[SpanGroup], pending: int) -> None:
        self.groups = groups
        self.pending = pending


class _Batch:
    __slots__ = ("groups", "spans", "whole")

    def __init__(self, groups: list[SpanGroup], spans: int, whole: _Whole | None = None) -> None:
        self.groups = groups
        self.spans = spans
        #: Set on a piece of a trace larger than ``max_batch_spans``.
        self.whole = whole


def _pieces(groups: list[SpanGroup], limit: int) -> list[list[SpanGroup]]:
    """``groups`` cut into consecutive pieces of at most ``limit`` spans each, in
    order; a group that straddles a cut is sliced (resource and scope shared)."""
    pieces: list[list[SpanGroup]] = []
    current: list[SpanGroup] = []
    room = limit
    for group in groups:
        start = 0
        while start < len(group.spans):
            take = min(room, len(group.spans) - start)
            if start == 0 and take == len(group.spans):
                current.append(group)
            else:
                current.append(dataclasses.replace(group, spans=group.spans[start : start + take]))
            start += take
            room -= take
            if room == 0:
                pieces.append(current)
                current, room = [], limit
    if current:
        pieces.append(current)
    return pieces


class Exporter(Component, abc.ABC, Generic[_Payload]):
    """Queue + workers + retry loop; subclasses encode and send one batch."""

    #: The ``type`` of the config section, e.g. ``"otlp_http"``.
    kind: str = ""

    def __init__(
        self,
        name: str,
        config: ExporterConfig,
        telemetry: Telemetry,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        """``config`` is the exporter's ``exporters.<name>`` section: its queue, retry,
        ``max_batch_spans`` and ``concurrency`` settings drive this machinery.
        ``supervisor`` runs the workers (a private one when None)."""
        self.name = name
        self.component_name = f"exporter:{name}"
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._odd_answers: dict[str, tuple[float, int]] = {}
        self._max_spans = config.queue.max_spans
        self._drop_oldest = config.queue.on_full == "drop_oldest"
        self._max_batch = config.max_batch_spans
        self._concurrency = config.concurrency
        self._retry = config.retry
        self._telemetry = telemetry
        self._log = get_logger("exporter").bind(exporter=name, type=self.kind)
        self._queue: deque[_Batch] = deque()
        self._queued_spans = 0
        self._inflight: set[_Batch] = set()
        self._inflight_spans = 0
        self._abandoned_spans = 0
        #: Spans of batches that could not be encoded (never settled).
        self._unencoded_spans = 0
        #: Worker task -> work its current batch is settled after (see settle_after).
        self._follow_ups: dict[asyncio.Task[Any] | None, list[asyncio.Future[Any]]] = {}
        self._nonempty = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task[None]] = []
        self._closing = False
        self._closed = False
        self._deadline: float | None = None
        self._depth_gauge = telemetry.queue_depth.labels(f"exporter:{name}")
        self._forwarded = telemetry.spans_forwarded.labels(name)
        self._retried = telemetry.spans_retried.labels(name)
        self._latency = telemetry.export_latency.labels(name)
        #: Whether the backend's last answer was a failure (for logs and readiness).
        self.failing = False
        #: Highest queue depth seen (spans queued plus in flight), for tests and benchmarks.
        self.peak_depth = 0
        #: Called with the span groups this exporter is done with: delivered, or given up
        #: for good (rejected, retry limit, drop_oldest); never for what a shutdown cuts
        #: off.  The pipeline settles write-ahead log entries with it.
        self.on_settled: Callable[[list[SpanGroup]], None] | None = None

    # ------------------------------------------------------------------ state
    @property
    def backpressure(self) -> bool:
        """True when a full queue must stop the receivers (on_full: backpressure)."""
        return not self._drop_oldest

    @property
    def depth(self) -> int:
        """Spans queued plus spans in flight."""
        return self._queued_spans + self._inflight_spans

    def full(self) -> bool:
        return self.depth >= self._max_spans

    # ------------------------------------------------------------------ input
    def enqueue(self, groups: list[SpanGroup], spans: int) -> None:
        """Queue the spans of one trace.  Never blocks, never raises."""
        if spans <= 0:
            return
        if self._closed:
            # Only a processor that forwards after its drain deadline gets here.
            self._drop(spans, "closed")
            self._log.error("export_after_close", spans=spans)
            return
        if spans <= self._max_batch:
            self._queue.append(_Batch(groups, spans))
        else:
            pieces = _pieces(groups, self._max_batch)
            whole = _Whole(groups, len(pieces))
            for piece in pieces:
                self._queue.append(_Batch(piece, sum(len(g.spans) for g in piece), whole))
        self._queued_spans += spans
        if self._drop_oldest:
            while self.depth > self._max_spans and len(self._queue) > 1:
                old = self._queue.popleft()
                self._queued_spans -= old.spans
                self._drop(old.spans, "queue_full")
                self._settled([old])
        depth = self.depth
        if depth > self.peak_depth:
            self.peak_depth = depth
        self._idle.clear()
        self._nonempty.set()
        self._depth_gauge.set(depth)

    # -------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self.report(Status.STARTING)
        try:
            await self._open()
        except Exception as exc:
            self.report(Status.PERMANENT_ERROR, exc)
            raise
        self._workers = [
            self._supervisor.spawn(self, self._work, name=f"exporter-{self.name}-{i}")
            for i in range(self._concurrency)
        ]
        self.report(Status.OK)

    async def close(self, deadline: float) -> int:
        """Deliver what is queued until ``deadline`` (loop time); drop and count the rest.

        Returns the number of spans not delivered: those the deadline cut off, and
        those that could not be encoded (already counted as ``encode_error``).
        """
        loop = asyncio.get_running_loop()
        self._closing = True
        self._deadline = deadline
        self.report(Status.STOPPING)
        self._nonempty.set()  # wake idle workers so they can notice the end
        dropped = 0
        if self.depth:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - loop.time()))
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        leftover = self.depth + self._abandoned_spans
        if leftover:
            dropped = leftover
            self._drop(leftover, "shutdown_deadline")
            self._log.error(
                "export_deadline_passed",
                spans_dropped=leftover,
                detail="the backend did not take every span before the shutdown deadline",
            )
            self._queue.clear()
            self._queued_spans = 0
            self._inflight.clear()
            self._inflight_spans = 0
        self._depth_gauge.set(0)
        self._closed = True
        await self._close_client()
        self.report(Status.STOPPED)
        return dropped + self._unencoded_spans

    # ---------------------------------------------------------------- workers
    def _take(self) -> list[_Batch]:
        taken: list[_Batch] = []
        total = 0
        while self._queue:
            nxt = self._queue[0]
            if taken and total + nxt.spans > self._max_batch:
                break
            self._queue.popleft()
            taken.append(nxt)
            total += nxt.spans
        return taken

    async def _work(self) -> None:
        while True:
            if not self._queue:
                if self._closing and not self._inflight:
                    self._idle.set()
                self._nonempty.clear()
                await self._nonempty.wait()
                continue
            taken = self._take()
            count = sum(b.spans for b in taken)
            self._queued_spans -= count
            for b in taken:
                self._inflight.add(b)
            self._inflight_spans += count
            try:
                delivered = await self._deliver([g for b in taken for g in b.groups], count)
                if delivered:  # else unencodable: never settled
                    follow = self._follow_ups.pop(asyncio.current_task(), None)
                    if follow is None:
                        self._settled(taken)
                    else:
                        self._settle_after(follow, taken)
            except asyncio.CancelledError:
                self._abandoned_spans += count
                raise
            except Exception:
                # A bug or an answer nothing expected: the batch goes back to the front
                # of the queue, and the supervisor logs, counts and restarts this worker.
                self._requeue(taken, count)
                raise
            finally:
                self._follow_ups.pop(asyncio.current_task(), None)
                for b in taken:
                    self._inflight.discard(b)
                self._inflight_spans -= count
                self._depth_gauge.set(self.depth)
                if not self._queue and not self._inflight:
                    self._idle.set()

    def _requeue(self, taken: list[_Batch], count: int) -> None:
        for b in reversed(taken):
            self._queue.appendleft(b)
        self._queued_spans += count
        self._nonempty.set()

    async def _deliver(self, groups: Sequence[SpanGroup], count: int) -> bool:
        """Send one batch with retries.  True when this exporter is done with it
        (delivered, or given up for good); False when it could not be encoded: such a
        batch is never settled (see :meth:`_unencodable`)."""
        loop = asyncio.get_running_loop()
        try:
            payload = await self._prepare(groups)
        except Exception as exc:  # a bug, not a backend problem: never lose silently
            self._unencodable(count, exc)
            return False
        delays = backoff_delays(self._retry)
        started = loop.time()
        attempt = 0
        while True:
            attempt += 1
            t0 = loop.time()
            try:
                rejected = await self._send(payload, count)
            except ExportError as exc:
                self._latency.observe(loop.time() - t0)
                if not exc.retryable:
                    self.failing = True
                    self.report(Status.RECOVERABLE_ERROR, f"backend rejected a batch: {exc}")
                    self._drop(count, "rejected")
                    self._log.error(
                        "export_rejected", spans=count, error=str(exc), detail="not retryable"
                    )
                    return True
                wait = next(delays)
                if exc.retry_after is not None:
                    wait = min(max(exc.retry_after, 0.0), _MAX_SERVER_DELAY)
                limit = self._retry.max_elapsed_time
                if limit is not None and loop.time() + wait - started > limit:
                    self._drop(count, "retry_timeout")
                    self._log.error("export_gave_up", spans=count, attempts=attempt, error=str(exc))
                    return True
                if self._deadline is not None:
                    # Shutting down: keep trying until the deadline, when close() cancels
                    # this worker and counts the batch as dropped.
                    wait = min(wait, max(0.0, self._deadline - loop.time()))
                if not self.failing or attempt == 2:
                    self._log.warning(
                        "export_retrying",
                        spans=count,
                        attempt=attempt,
                        retry_in=round(wait, 3),
                        error=str(exc),
                    )
                self.failing = True
                if not self._closing:  # at shutdown the status stays "stopping"
                    self.report(Status.RECOVERABLE_ERROR, str(exc))
                self._retried.inc(count)
                await asyncio.sleep(wait)
                continue
            self._latency.observe(loop.time() - t0)
            if self.failing:
                self._log.info("export_recovered", attempts=attempt)
            self.failing = False
            self.report_ok()
            rejected = self._clamp_rejected(rejected, count)
            if rejected:
                self._drop(rejected, "rejected")
                self._log.warning("export_partially_rejected", spans=count, rejected=rejected)
            self._forwarded.inc(count - rejected)
            return True

    def _unencodable(self, count: int, exc: Exception) -> None:
        """A batch that could not be encoded (a bug): counted as dropped
        (``encode_error``) and logged, but never settled, so it is not taken for
        delivered: the write-ahead log keeps its entries (replayed at the next start),
        and without a log a shutdown spills it to ``shutdown.spill_path``."""
        self._unencoded_spans += count
        self._drop(count, "encode_error")
        self._log.error(
            "export_encode_failed",
            spans=count,
            error=repr(exc),
            detail="not delivered and not settled: kept in the write-ahead log, "
            "or spilled at shutdown (shutdown.spill_path)",
        )

    def settle_after(self, work: asyncio.Future[Any]) -> None:
        """Called from :meth:`_send`: the batch being sent is settled only once ``work``
        (made from it, e.g. Phoenix annotations) has finished without an error and not
        with the result ``False``; otherwise (a failure, a cancellation, work cut short
        by a shutdown) the batch stays unsettled: kept in the write-ahead log and
        replayed at the next start."""
        self._follow_ups.setdefault(asyncio.current_task(), []).append(work)

    def _settle_after(self, follow: list[asyncio.Future[Any]], batches: list[_Batch]) -> None:
        left = len(follow)
        failed = False

        def done(fut: asyncio.Future[Any]) -> None:
            nonlocal left, failed
            left -= 1
            failed = (
                failed or fut.cancelled() or fut.exception() is not None or fut.result() is False
            )
            if left == 0 and not failed:
                self._settled(batches)

        for fut in follow:
            fut.add_done_callback(done)

    def _settled(self, batches: list[_Batch]) -> None:
        done: list[SpanGroup] = []
        for b in batches:
            if b.whole is None:
                done.extend(b.groups)
                continue
            b.whole.pending -= 1
            if b.whole.pending == 0:  # the last piece of a cut trace
                done.extend(b.whole.groups)
        if self.on_settled is not None and done:
            try:
                self.on_settled(done)
            except Exception:  # a bug in the hook must not stop delivery
                self._log.exception("settle_hook_failed")

    def _clamp_rejected(self, rejected: Any, count: int) -> int:
        """The backend's ``rejected_spans`` as a count within the batch."""
        try:
            value = int(rejected)
        except (TypeError, ValueError, OverflowError):
            value = -1
        if 0 <= value <= count:
            return value
        clamped = count if value > count else 0
        self.odd_answer(
            "export_partial_success_out_of_range",
            rejected_spans=repr(rejected)[:40],
            batch_spans=count,
            counted_as_rejected=clamped,
        )
        return clamped

    def odd_answer(self, event: str, **fields: Any) -> None:
        """Log an answer the protocol does not allow, at most once per kind every
        few seconds (with how many were not logged)."""
        now = time.monotonic()
        last, suppressed = self._odd_answers.get(event, (float("-inf"), 0))
        if now - last < _ODD_ANSWER_LOG_INTERVAL:
            self._odd_answers[event] = (last, suppressed + 1)
            return
        self._odd_answers[event] = (now, 0)
        self._log.warning(event, suppressed_since_last=suppressed, **fields)

    def _drop(self, count: int, reason: str) -> None:
        self._telemetry.spans_dropped.labels(self.name, reason).inc(count)

    # ------------------------------------------------------------ subclasses
    async def _open(self) -> None:
        """Create clients (runs in the event loop)."""

    async def _close_client(self) -> None:
        """Release clients."""

    async def _prepare(self, groups: Sequence[SpanGroup]) -> _Payload:
        """What :meth:`_send` sends for a batch (made once per batch, retries
        included): :meth:`_encode` in a thread, since copying and serialising a batch
        (megabytes with large attributes) would hold the event loop, then
        :meth:`_encoded` on the loop."""
        return self._encoded(await asyncio.to_thread(self._encode, groups))

    @abc.abstractmethod
    def _encode(self, groups: Sequence[SpanGroup]) -> _Payload:
        """Turn a batch into what :meth:`_send` sends.  Runs in a worker thread: it
        must not touch state that the event loop changes."""

    def _encoded(self, payload: _Payload) -> _Payload:
        """Finish an encoded payload on the event loop (reading this exporter's
        state); by default, nothing to do."""
        return payload

    @abc.abstractmethod
    async def _send(self, payload: _Payload, spans: int) -> int:
        """Send once.  Return how many spans the backend rejected (partial success),
        or raise :class:`ExportError`."""
