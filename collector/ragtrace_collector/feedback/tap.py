"""The pipeline's side of feedback: read the feedback spans of every released trace
and hand them to the join, keeping the trace's log entries until the join has them.

Feedback reaches the collector only as ``ragtrace.feedback`` spans (from the SDK, or
made by ``POST /v1/feedback``), so it is in the write-ahead log like any acknowledged
span.  For each released trace (late ones included) :meth:`FeedbackTap.take`:

* reads every span named ``ragtrace.feedback`` whose ``ragtrace.span.kind`` is
  ``feedback`` (:func:`~ragtrace_collector.feedback.record.from_span`); one that
  carries no valid feedback is counted by reason (``invalid``) and goes on like any
  span;
* takes a hold on the trace's log entries (:meth:`OutputLedger.hold`), hands the
  feedback to the join (``record``) in a task, and releases the hold once ``record``
  returned for each: an entry is never removed before the join holds its feedback
  durably, so a crash in between replays the entry and the feedback is recorded again
  (an upsert: the same key replaces itself).  A failing ``record`` is retried (0.1 s,
  doubling to 5 s) while the hold keeps the entries; a shutdown leaves the entries in
  the log for the next start;
* says whether the trace holds nothing but feedback spans: the pipeline then forwards
  it to the exporters without handing it to the evaluator (feedback is never a case).

Feedback handed to the join and not yet recorded is bounded: at ``limit``
(``feedback.max_pending``) the tap is :attr:`~FeedbackTap.busy`, and the pipeline
refuses new requests (429 / RESOURCE_EXHAUSTED, ``processor_busy``) until the join
catches up, so a join backend that hangs costs back-pressure, not memory.

The spans themselves are untouched: every exporter shows them, linked to the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final, Protocol

from ..component.logs import get_logger
from .record import Feedback, from_span, is_feedback_span

if TYPE_CHECKING:
    from ..assembly.assembler import AssembledTrace
    from ..storage.outputs import Hold, OutputLedger

__all__ = ["FeedbackSink", "FeedbackTap"]

_FIRST_RETRY: Final = 0.1
_MAX_RETRY: Final = 5.0


class FeedbackSink(Protocol):
    """Where feedback goes (the feedback stage)."""

    async def record(self, feedback: Feedback) -> None:
        """Return once ``feedback`` is durably joined or pending."""
        ...

    def invalid(self, reason: str) -> None:
        """Count one feedback refused, by reason."""
        ...


class FeedbackTap:
    """Reads feedback out of released traces (see the module docstring)."""

    def __init__(self, sink: FeedbackSink, *, limit: int) -> None:
        self._sink = sink
        self._limit = limit
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = get_logger("feedback")
        #: Feedback handed to the join and not yet recorded.
        self.in_flight = 0

    @property
    def busy(self) -> bool:
        """Whether as much feedback as the bound allows waits for the join."""
        return self.in_flight >= self._limit

    def take(self, trace: AssembledTrace, ledger: OutputLedger | None) -> bool:
        """Hand the feedback spans of ``trace`` to the join, holding its log entries
        (``ledger``: the pipeline's, None without a log) until the join has them; True
        when the trace holds feedback spans only (nothing to evaluate)."""
        found: list[Feedback] = []
        others = False
        for span, group in trace.spans():
            if not is_feedback_span(span):
                others = True
                continue
            read = from_span(span, group.resource)
            if isinstance(read, str):
                self._sink.invalid(read)
            else:
                found.append(read)
        if found:
            hold = ledger.hold(trace) if ledger is not None else None
            self.in_flight += len(found)
            task = asyncio.get_running_loop().create_task(self._record(found, hold))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return not others

    async def _record(self, found: list[Feedback], hold: Hold | None) -> None:
        left = len(found)
        try:
            for feedback in found:
                await self._record_one(feedback)
                left -= 1
                self.in_flight -= 1
        finally:
            self.in_flight -= left  # cut short: the hold keeps the entries
        if hold is not None:
            hold.release()

    async def _record_one(self, feedback: Feedback) -> None:
        delay = _FIRST_RETRY
        while True:
            try:
                await self._sink.record(feedback)
                return
            except Exception as exc:  # the join's backend failed: the hold keeps the entry
                self._log.warning(
                    "feedback_record_retrying",
                    trace_id=feedback.trace_id,
                    error=type(exc).__name__,
                    retry_in=delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_RETRY)

    async def drain(self) -> None:
        """Returns once every feedback handed to the join so far is recorded."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def aclose(self) -> None:
        """Cancel what is still being recorded: those log entries stay, and are
        replayed at the next start."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
