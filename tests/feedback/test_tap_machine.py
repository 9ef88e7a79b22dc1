"""The feedback tap against a model, on generated sequences (Hypothesis).

Traces with feedback spans (and sometimes other spans) are taken; the join answers
each ``record`` call when the machine says, with success or a failure (retried); the
tap may be closed at any point (a crash or a cut shutdown).  Whatever the order:

* a trace's log hold is released only once every feedback of it is recorded, and
  exactly once;
* once every feedback of a trace is recorded, its hold is released (unless the tap
  was closed first: then the log keeps the entry for the next start);
* ``in_flight`` counts the feedback handed to the join and not yet recorded, and
  ``busy`` says when it reaches the bound.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ragtrace import semconv
from ragtrace_collector.feedback import tap as tap_module
from ragtrace_collector.feedback.record import Feedback, to_span
from ragtrace_collector.feedback.tap import FeedbackTap
from ragtrace_collector.otlp.codec import Span, SpanGroup
from tests.fakes.spans import make_span

LIMIT = 3


@dataclass
class _Trace:
    """What the tap reads of an assembled trace."""

    groups: list[SpanGroup]

    def spans(self) -> Iterator[tuple[Span, SpanGroup]]:
        for group in self.groups:
            for span in group.spans:
                yield span, group


@dataclass
class _Hold:
    releases: int = 0

    def release(self) -> None:
        self.releases += 1


@dataclass
class _Ledger:
    holds: list[_Hold] = field(default_factory=list)

    def hold(self, trace: Any) -> _Hold:
        self.holds.append(_Hold())
        return self.holds[-1]


class _Join:
    """Each ``record`` waits for the machine to answer it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Feedback, asyncio.Future[None]]] = []
        self.recorded: list[str] = []
        self.invalid: list[str] = []

    async def record(self, feedback: Feedback) -> None:
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.calls.append((feedback, answer))
        await answer
        self.recorded.append(feedback.trace_id)

    def waiting(self) -> list[tuple[Feedback, asyncio.Future[None]]]:
        return [(f, a) for f, a in self.calls if not a.done()]

    def invalid_reason(self, reason: str) -> None:
        self.invalid.append(reason)


class TapMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.saved_retry = tap_module._FIRST_RETRY
        tap_module._FIRST_RETRY = 0.0  # type: ignore[misc]
        self.join = _Join()
        self.ledger = _Ledger()
        self.tap = FeedbackTap(self._sink(), limit=LIMIT)
        #: per taken trace: (its hold index or None, the trace id of its feedback, count)
        self.traces: list[tuple[int | None, str, int]] = []
        self.closed_holds: set[int] = set()
        self.recorded: dict[str, int] = {}

    def _sink(self) -> Any:
        join = self.join

        class _Sink:
            async def record(self, feedback: Feedback) -> None:
                await join.record(feedback)

            def invalid(self, reason: str) -> None:
                join.invalid_reason(reason)

        return _Sink()

    def _settle(self) -> None:
        for _ in range(5):
            self.loop.run_until_complete(asyncio.sleep(0))

    @initialize()
    def start(self) -> None:
        self._settle()

    @rule(feedback=st.integers(min_value=0, max_value=3), other=st.booleans())
    def take(self, feedback: int, other: bool) -> None:
        if feedback == 0 and not other:
            other = True
        trace_id = os.urandom(16)
        spans = [
            to_span(
                Feedback(
                    trace_id.hex(), None, f"n{i}", 0.0, semconv.FEEDBACK_TYPE_BOOLEAN, user_id="u"
                )
            )
            for i in range(feedback)
        ]
        if other:
            spans.append(make_span(trace_id, semconv.KIND_RAG))
        holds_before = len(self.ledger.holds)

        async def take() -> bool:
            return self.tap.take(_Trace([SpanGroup(None, "", None, "", spans)]), self.ledger)  # type: ignore[arg-type]

        only_feedback = self.loop.run_until_complete(take())
        assert only_feedback == (not other)
        hold = holds_before if feedback else None
        assert len(self.ledger.holds) == holds_before + (1 if feedback else 0)
        self.traces.append((hold, trace_id.hex(), feedback))
        self._settle()

    @precondition(lambda self: bool(self.join.waiting()))
    @rule(pick=st.integers(min_value=0), ok=st.booleans())
    def answer(self, pick: int, ok: bool) -> None:
        waiting = self.join.waiting()
        feedback, future = waiting[pick % len(waiting)]
        if ok:
            future.set_result(None)
            self.recorded[feedback.trace_id] = self.recorded.get(feedback.trace_id, 0) + 1
        else:
            future.set_exception(OSError("join backend down"))  # retried by the tap
        self._settle()

    @rule()
    def close(self) -> None:
        """A crash or a cut shutdown: what is in flight is cancelled; a new tap goes on."""
        self.loop.run_until_complete(self.tap.aclose())
        for hold, _, _ in self.traces:
            if hold is not None and self.ledger.holds[hold].releases == 0:
                self.closed_holds.add(hold)
        self.tap = FeedbackTap(self._sink(), limit=LIMIT)

    @invariant()
    def holds_follow_the_join(self) -> None:
        live_unrecorded = 0
        for hold, trace_id, count in self.traces:
            if hold is None:
                continue
            releases = self.ledger.holds[hold].releases
            done = self.recorded.get(trace_id, 0) >= count
            assert releases <= 1
            if releases:
                assert done, "a hold released before the join had every feedback"
            elif hold not in self.closed_holds:
                assert not done, "every feedback recorded, yet the hold is kept"
                live_unrecorded += count - self.recorded.get(trace_id, 0)
        assert self.tap.in_flight == live_unrecorded
        assert self.tap.busy == (live_unrecorded >= LIMIT)

    def teardown(self) -> None:
        self.loop.run_until_complete(self.tap.aclose())
        self.loop.close()
        tap_module._FIRST_RETRY = self.saved_retry  # type: ignore[misc]


TapMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_tap = TapMachine.TestCase
