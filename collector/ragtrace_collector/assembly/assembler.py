"""Trace assembly: group spans by trace id across export requests, release when ready.

A trace is *ready* when its root span (no parent span id) has arrived and
``decision_wait`` has passed without a new span for it, or when ``max_trace_wait`` has
passed since its first span, whichever comes first.  Buffered spans are bounded by
``max_buffered_spans``: past the bound, the oldest traces are released early (reason
``pressure``), never dropped.  Released trace ids are remembered (bounded in count and
time) so that a span arriving after its trace was released is recognised as *late*:
it is released at once, on its own, with reason ``late``.

Releases are synchronous calls of the ``release`` callback, from the event loop; the
assembler never awaits.  Timing uses the event loop clock and one ``call_at`` timer
armed for the earliest deadline, so an idle collector does no work and
``decision_wait=0`` releases a rooted trace on the next loop iteration.

Bookkeeping is O(1) per trace: ``_pending`` keeps traces in order of first arrival
(for ``max_trace_wait`` and pressure), ``_rooted`` keeps traces that have their root
in order of last activity (for ``decision_wait``).

The assembler is the ``assembler`` component: ``ok`` while its timer runs.  A release
that raises inside the timer is logged with its traceback, counted
(``ragtrace_component_failures_total{component="assembler"}``), puts the status in
``recoverable_error``, and the timer is armed again, so no buffered trace is left
waiting on a timer that died; the next clean run reports ``ok``.
"""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ragtrace_collector.assembly.config import AssemblyConfig
from ragtrace_collector.component import Component, Status
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.otlp.codec import (
    InstrumentationScope,
    Resource,
    Span,
    SpanGroup,
    SplitRequest,
)

__all__ = ["AssembledTrace", "Assembler", "ReleaseReason"]


class ReleaseReason(enum.StrEnum):
    """Why the assembler let a trace go."""

    READY = "ready"  # root seen, then decision_wait without a new span
    MAX_WAIT = "max_wait"  # max_trace_wait since the first span
    PRESSURE = "pressure"  # released early: max_buffered_spans exceeded
    SHUTDOWN = "shutdown"  # the collector is stopping
    LATE = "late"  # spans of a trace that had already been released


@dataclass(slots=True, eq=False)
class AssembledTrace:
    """A released trace: what the pipeline hands to the trace processor.

    ``groups`` hold the spans, each group with its Resource and InstrumentationScope.
    Spans may be changed in place (attributes, events); Resource and scope objects
    can be shared with other traces and must be treated as read-only.  New spans go
    in with :meth:`add_span`.
    """

    trace_id: bytes
    groups: list[SpanGroup]
    reason: ReleaseReason
    first_seen: float
    released_at: float
    has_root: bool
    #: Set by the pipeline once the trace has been handed to the exporters.
    forwarded: bool = field(default=False, init=False)

    @property
    def late(self) -> bool:
        return self.reason is ReleaseReason.LATE

    @property
    def trace_id_hex(self) -> str:
        return self.trace_id.hex()

    @property
    def span_count(self) -> int:
        return sum(len(g.spans) for g in self.groups)

    def spans(self) -> Iterator[tuple[Span, SpanGroup]]:
        """Every span with the group (Resource, scope) it belongs to."""
        for group in self.groups:
            for span in group.spans:
                yield span, group

    def root_spans(self) -> list[Span]:
        return [s for g in self.groups for s in g.spans if not s.parent_span_id]

    def add_span(
        self,
        span: Span,
        *,
        resource: Resource | None,
        scope: InstrumentationScope | None,
        resource_schema_url: str = "",
        scope_schema_url: str = "",
    ) -> None:
        """Add a span (e.g. an evaluation carrier span) to this trace.

        It joins an existing group when ``resource`` and ``scope`` are the very objects
        of that group, else a new group is made.  The span's trace id must be this
        trace's.
        """
        if span.trace_id != self.trace_id:
            raise ValueError("the span belongs to another trace")
        for group in self.groups:
            if (
                group.resource is resource
                and group.scope is scope
                and group.resource_schema_url == resource_schema_url
                and group.scope_schema_url == scope_schema_url
            ):
                group.spans.append(span)
                return
        self.groups.append(
            SpanGroup(resource, resource_schema_url, scope, scope_schema_url, [span])
        )


class _Pending:
    __slots__ = ("first_seen", "groups", "has_root", "last_seen", "span_count", "trace_id")

    def __init__(self, trace_id: bytes, now: float) -> None:
        self.trace_id = trace_id
        self.groups: list[SpanGroup] = []
        self.span_count = 0
        self.first_seen = now
        self.last_seen = now
        self.has_root = False


class Assembler(Component):
    """Buffers spans per trace and releases whole traces through ``release``."""

    component_name = "assembler"

    def __init__(
        self,
        config: AssemblyConfig,
        release: Callable[[AssembledTrace], None],
        telemetry: Telemetry,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._config = config
        self._release_cb = release
        self._telemetry = telemetry
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._pending: OrderedDict[bytes, _Pending] = OrderedDict()
        self._rooted: OrderedDict[bytes, _Pending] = OrderedDict()
        self._released: OrderedDict[bytes, float] = OrderedDict()
        self._spans = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = 0.0
        self._closed = False
        #: Highest number of spans buffered at once (for tests and benchmarks).
        self.peak_buffered_spans = 0
        self.late_spans = 0
        self.pressure_releases = 0
        self._log = get_logger("assembler")
        self.report(Status.OK)

    # ------------------------------------------------------------------ state
    @property
    def buffered_spans(self) -> int:
        return self._spans

    @property
    def buffered_traces(self) -> int:
        return len(self._pending)

    # -------------------------------------------------------------------- add
    def add(self, split: SplitRequest) -> None:
        """Take the spans of one export request (already split by trace)."""
        now = self._loop.time()
        ttl = self._config.late_trace_ttl
        for trace_id, chunk in split.traces.items():
            pending = self._pending.get(trace_id)
            if pending is None:
                released_at = self._released.get(trace_id)
                if released_at is not None:
                    if now - released_at <= ttl:
                        self._release_late(trace_id, chunk.groups, chunk.has_root, now)
                        continue
                    del self._released[trace_id]
                pending = self._pending[trace_id] = _Pending(trace_id, now)
            pending.groups.extend(chunk.groups)
            pending.span_count += chunk.span_count
            pending.last_seen = now
            self._spans += chunk.span_count
            if chunk.has_root:
                pending.has_root = True
            if pending.has_root:
                if trace_id in self._rooted:
                    self._rooted.move_to_end(trace_id)
                else:
                    self._rooted[trace_id] = pending
        if self._spans > self.peak_buffered_spans:
            self.peak_buffered_spans = self._spans
        limit = self._config.max_buffered_spans
        while self._spans > limit and self._pending:
            oldest = next(iter(self._pending.values()))
            self.pressure_releases += 1
            self._release(oldest, ReleaseReason.PRESSURE, now)
        self._update_gauges()
        self._arm(now)

    def release_all(self, reason: ReleaseReason = ReleaseReason.SHUTDOWN) -> int:
        """Release every buffered trace now (shutdown); returns how many."""
        now = self._loop.time()
        count = 0
        while self._pending:
            self._release(next(iter(self._pending.values())), reason, now)
            count += 1
        self._update_gauges()
        return count

    def close(self) -> None:
        """Stop the timer; buffered traces stay (call :meth:`release_all` first)."""
        self._closed = True
        self.report(Status.STOPPED)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---------------------------------------------------------------- release
    def _release(self, pending: _Pending, reason: ReleaseReason, now: float) -> None:
        trace_id = pending.trace_id
        del self._pending[trace_id]
        self._rooted.pop(trace_id, None)
        self._spans -= pending.span_count
        self._remember(trace_id, now)
        self._telemetry.traces_released.labels(reason.value).inc()
        trace = AssembledTrace(
            trace_id, pending.groups, reason, pending.first_seen, now, pending.has_root
        )
        self._release_cb(trace)

    def _release_late(
        self, trace_id: bytes, groups: list[SpanGroup], has_root: bool, now: float
    ) -> None:
        self._released[trace_id] = now
        self._released.move_to_end(trace_id)
        count = sum(len(g.spans) for g in groups)
        self.late_spans += count
        self._telemetry.spans_late.inc(count)
        self._telemetry.traces_released.labels(ReleaseReason.LATE.value).inc()
        self._release_cb(AssembledTrace(trace_id, groups, ReleaseReason.LATE, now, now, has_root))

    def _remember(self, trace_id: bytes, now: float) -> None:
        cap = self._config.late_trace_ids
        if cap <= 0:
            return
        self._released[trace_id] = now
        self._released.move_to_end(trace_id)
        while len(self._released) > cap:
            self._released.popitem(last=False)

    # ------------------------------------------------------------------ timer
    def _next_due(self) -> float | None:
        due: float | None = None
        if self._rooted:
            due = next(iter(self._rooted.values())).last_seen + self._config.decision_wait
        if self._pending:
            by_age = next(iter(self._pending.values())).first_seen + self._config.max_trace_wait
            due = by_age if due is None else min(due, by_age)
        return due

    def _arm(self, now: float) -> None:
        if self._closed:
            return
        due = self._next_due()
        if due is None:
            return
        if self._timer is not None:
            if self._timer_when <= due:
                return
            self._timer.cancel()
        self._timer_when = due
        self._timer = self._loop.call_at(max(due, now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self._loop.time()
        try:
            self._release_due(now)
        except Exception as exc:  # a release callback bug: never leave the timer dead
            self._log.exception("assembler_timer_failed")
            if self._host is not None:
                self._host.failed(self)
            self.report(Status.RECOVERABLE_ERROR, exc)
        else:
            self.report_ok()
        finally:
            self._update_gauges()
            self._arm(self._loop.time())

    def _release_due(self, now: float) -> None:
        wait = self._config.decision_wait
        max_wait = self._config.max_trace_wait
        while self._rooted:
            pending = next(iter(self._rooted.values()))
            if pending.last_seen + wait > now:
                break
            self._release(pending, ReleaseReason.READY, now)
        while self._pending:
            pending = next(iter(self._pending.values()))
            if pending.first_seen + max_wait > now:
                break
            self._release(pending, ReleaseReason.MAX_WAIT, now)
        self._expire_released(now)

    def _expire_released(self, now: float) -> None:
        ttl = self._config.late_trace_ttl
        while self._released:
            trace_id, when = next(iter(self._released.items()))
            if now - when <= ttl:
                break
            del self._released[trace_id]

    def _update_gauges(self) -> None:
        self._telemetry.spans_buffered.set(self._spans)
        self._telemetry.traces_buffered.set(len(self._pending))
