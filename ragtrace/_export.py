"""The export queue: finished spans leave the app's threads at once and are never lost
silently.

:class:`ExportQueue` is the span processor of the provider ``configure()`` builds.  It
replaces OpenTelemetry's ``BatchSpanProcessor``, whose queue holds 2048 spans whatever
their size: a burst of calls overflows it within milliseconds, and the only trace of the
loss is one "Queue full, dropping Span." log line.

* **Bounded by memory, not by count.**  ``on_end`` appends the span and its estimated
  size (a fixed overhead per span and per attribute, plus the characters of its string
  values) and never blocks.  Only when the estimate would pass ``max_queue_bytes`` is the
  span dropped.
* **One export thread**, woken when a batch is ready or ``schedule_delay`` has passed.
  For the OTLP/HTTP exporter it encodes batches with :mod:`ragtrace._wire` (several
  times cheaper than building protobuf objects, so the export thread keeps up with an app
  that makes calls as fast as it can) and sends them through the exporter's own HTTP
  client: its endpoint, headers, TLS, compression, retries and timeout.  Any other
  exporter is called as usual.
* **Nothing is lost silently.**  Every dropped span is counted by cause
  (``queue_full``, ``export_failed``, ``shutdown``) in :meth:`ExportQueue.stats`;
  :meth:`ExportQueue.force_flush` answers ``False`` when any span finished since the
  previous flush was dropped; and each cause is logged with its count and the setting to
  change, at most once a minute.
* **Bounded shutdown.**  :meth:`ExportQueue.shutdown` waits at most its timeout, then
  stops the exporter (which ends its retry sleep) and counts what is left as dropped;
  the thread is a daemon, so a dead collector never holds the process's exit.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ragtrace._safety import logger, report

__all__ = [
    "DEFAULT_MAX_QUEUE_BYTES",
    "DROP_EXPORT_FAILED",
    "DROP_QUEUE_FULL",
    "DROP_SHUTDOWN",
    "ExportQueue",
    "ExportStats",
]

DEFAULT_MAX_QUEUE_BYTES = 64 * 1024 * 1024
DROP_QUEUE_FULL = "queue_full"
DROP_EXPORT_FAILED = "export_failed"
DROP_SHUTDOWN = "shutdown"

#: What a queued span costs beyond its string values: the span object, its context,
#: attribute mapping and entries (calibrated with tracemalloc on ragtrace's own spans).
_SPAN_OVERHEAD = 1200
_ATTRIBUTE_OVERHEAD = 96
_BATCH_BYTES = 4 * 1024 * 1024
_WARN_INTERVAL_S = 60.0

_ADVICE = {
    DROP_QUEUE_FULL: (
        "the export queue was full ({limit}); raise max_queue_bytes= in "
        "ragtrace.configure() or RAGTRACE_MAX_QUEUE_BYTES"
    ),
    DROP_EXPORT_FAILED: (
        "the collector did not accept them after the exporter's retries; check that it "
        "runs and is reachable, or raise OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
    ),
    DROP_SHUTDOWN: (
        "they were still queued when shutdown()/flush() ran out of time; raise its "
        "timeout= or check that the collector is reachable"
    ),
}


@dataclass(frozen=True, slots=True)
class ExportStats:
    """Counts since ``configure()``: what ``ragtrace.stats()`` returns."""

    spans_exported: int = 0
    spans_dropped: Mapping[str, int] = field(default_factory=dict)
    spans_queued: int = 0
    queue_bytes: int = 0
    max_queue_bytes: int = 0

    @property
    def dropped(self) -> int:
        """Every span dropped, whatever the cause."""
        return sum(self.spans_dropped.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "spans_exported": self.spans_exported,
            "spans_dropped": dict(self.spans_dropped),
            "spans_queued": self.spans_queued,
            "queue_bytes": self.queue_bytes,
            "max_queue_bytes": self.max_queue_bytes,
        }


def _estimate(span: ReadableSpan) -> int:
    attributes = span.attributes
    if not attributes:
        return _SPAN_OVERHEAD
    size = _SPAN_OVERHEAD + _ATTRIBUTE_OVERHEAD * len(attributes)
    for value in attributes.values():
        if type(value) is str:
            size += len(value)
    return size


def _fast_sender(exporter: SpanExporter) -> Callable[[Sequence[ReadableSpan]], bool] | None:
    """Send through the OTLP/HTTP exporter's client with ragtrace's encoder, if it has one.

    Falls back (``None``) for any other exporter, or an OTel version whose HTTP exporter
    does not expose a client that takes serialised bytes.
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    if type(exporter) is not OTLPSpanExporter:
        return None
    client = getattr(exporter, "_client", None)
    send = getattr(client, "export", None)
    if not callable(send):
        return None

    from ragtrace._wire import encode_request

    max_size = getattr(exporter, "_max_request_size", None)

    def fast(batch: Sequence[ReadableSpan]) -> bool:
        try:
            data = encode_request(batch)
        except Exception as exc:  # an attribute value the fast encoder does not know
            report("encoding spans (falling back to the OTel encoder)", exc)
            return exporter.export(batch) is SpanExportResult.SUCCESS
        if isinstance(max_size, int) and 0 < max_size < len(data):
            return exporter.export(batch) is SpanExportResult.SUCCESS  # OTel logs why
        return bool(getattr(send(data), "success", False))

    return fast


class ExportQueue(SpanProcessor):
    """A memory-bounded span queue with one export thread (see the module docstring)."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        max_batch_spans: int = 512,
        schedule_delay: float = 0.5,
    ) -> None:
        self._exporter = exporter
        self._send = _fast_sender(exporter) or self._send_via_exporter
        self._max_bytes = max_queue_bytes
        self._max_batch = max_batch_spans
        self._delay = schedule_delay
        self._queue: deque[tuple[ReadableSpan, int]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._progress = threading.Condition(threading.Lock())
        #: spans accepted into the queue, and spans the worker has finished with
        self._accepted = 0
        self._settled = 0
        #: spans in the export call under way; counted as dropped if shutdown gives up
        self._inflight = 0
        self._abandoned = False
        self._exported = 0
        self._dropped: Counter[str] = Counter()
        self._drops_at_last_flush = 0
        self._warned: dict[str, tuple[float, int]] = {}
        self._warn_lock = threading.Lock()
        self._stopping = False
        self._shut = False
        self._thread: threading.Thread | None = None
        self._start_thread()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(ref))

    # ------------------------------------------------------------ span processor
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None or not ctx.trace_flags.sampled:
            return
        size = _estimate(span)
        with self._lock:
            if self._shut:
                self._dropped[DROP_SHUTDOWN] += 1
                return
            if self._bytes + size > self._max_bytes:
                self._dropped[DROP_QUEUE_FULL] += 1
                return
            self._queue.append((span, size))
            self._bytes += size
            self._accepted += 1
            ready = len(self._queue) >= self._max_batch
        if ready and not self._wake.is_set():
            self._wake.set()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export everything queued now; True only if it all went out in time and no
        span finished since the previous flush was dropped."""
        deadline = time.monotonic() + max(0, timeout_millis) / 1000.0
        with self._lock:
            target = self._accepted
        self._wake.set()
        done = self._wait_settled(target, deadline)
        with self._lock:
            dropped = sum(self._dropped.values())
            clean = dropped == self._drops_at_last_flush
            self._drops_at_last_flush = dropped
        self._warn_drops()
        return done and clean

    def shutdown(self, timeout_millis: int = 5_000) -> None:
        """Export what is queued within the timeout, then stop; the rest counts as
        dropped (``shutdown``).  Never blocks longer than the timeout."""
        deadline = time.monotonic() + max(0, timeout_millis) / 1000.0
        with self._lock:
            if self._shut:
                return
            self._shut = True
            target = self._accepted
            self._stopping = True
        self._wake.set()
        self._wait_settled(target, deadline)
        try:
            self._exporter.shutdown()  # ends a retry sleep in progress
        except Exception as exc:
            report("exporter shutdown", exc)
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, min(0.2, deadline - time.monotonic())))
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
            self._bytes = 0
            if thread is not None and thread.is_alive() and self._inflight:
                # Still inside the exporter: give up on that batch, and count it now,
                # not whenever the exporter's last attempt ends.
                left += self._inflight
                self._abandoned = True
            if left:
                self._dropped[DROP_SHUTDOWN] += left
            self._settled += left
        self._warn_drops(final=True)

    # --------------------------------------------------------------------- stats
    def stats(self) -> ExportStats:
        with self._lock:
            return ExportStats(
                spans_exported=self._exported,
                spans_dropped=dict(self._dropped),
                spans_queued=len(self._queue),
                queue_bytes=self._bytes,
                max_queue_bytes=self._max_bytes,
            )

    # -------------------------------------------------------------------- worker
    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ragtrace-export", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            while True:
                batch = self._take()
                if not batch:
                    break
                self._export(batch)
            self._warn_drops()
            with self._lock:
                if self._stopping and not self._queue:
                    return

    def _take(self) -> list[ReadableSpan]:
        with self._lock:
            queue = self._queue
            batch: list[ReadableSpan] = []
            taken = 0
            while queue and len(batch) < self._max_batch and taken < _BATCH_BYTES:
                span, size = queue.popleft()
                batch.append(span)
                taken += size
            self._bytes -= taken
            self._inflight = len(batch)
            return batch

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            ok = self._send(batch)
        except Exception as exc:
            report("span export", exc)
            ok = False
        with self._lock:
            self._inflight = 0
            if self._abandoned:  # shutdown already counted this batch
                return
            if ok:
                self._exported += len(batch)
            else:
                self._dropped[DROP_EXPORT_FAILED] += len(batch)
            self._settled += len(batch)
        with self._progress:
            self._progress.notify_all()

    def _send_via_exporter(self, batch: Sequence[ReadableSpan]) -> bool:
        return self._exporter.export(batch) is SpanExportResult.SUCCESS

    def _wait_settled(self, target: int, deadline: float) -> bool:
        with self._progress:
            while True:
                with self._lock:
                    if self._settled >= target:
                        return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._wake.set()
                self._progress.wait(min(remaining, 0.05))

    def _warn_drops(self, *, final: bool = False) -> None:
        """One warning per cause, at most once a minute, with the count since the last."""
        now = time.monotonic()
        with self._lock:
            dropped = dict(self._dropped)
        due: list[tuple[str, int, int]] = []
        with self._warn_lock:
            for cause, total in dropped.items():
                last_at, last_total = self._warned.get(cause, (-_WARN_INTERVAL_S, 0))
                if total <= last_total or (now - last_at < _WARN_INTERVAL_S and not final):
                    continue
                self._warned[cause] = (now, total)
                due.append((cause, total, last_total))
        for cause, total, last_total in due:
            advice = _ADVICE.get(cause, "").format(limit=f"max_queue_bytes={self._max_bytes}")
            logger.warning(
                "ragtrace: dropped %d span(s) (%d in all): %s. ragtrace.stats() counts "
                "every dropped span; this warning repeats at most once a minute.",
                total - last_total,
                total,
                advice,
            )

    def _reinit_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._progress = threading.Condition(threading.Lock())
        self._wake = threading.Event()
        self._queue.clear()
        self._bytes = 0
        self._settled = self._accepted
        if not self._shut:
            self._start_thread()


def _after_fork(ref: weakref.ReferenceType[ExportQueue]) -> None:
    queue = ref()
    if queue is not None:
        queue._reinit_after_fork()
