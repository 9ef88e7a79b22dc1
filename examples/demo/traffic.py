"""The support bot's traffic, paced in real time: golden questions (which carry their
ground truth through ``ragtrace.set_reference``) and scripted conversations.

In a rollout phase one golden request in ``rollout_every`` is served by the candidate
index (with the phase's fault) and the others by the stable one (healthy); every
request says which index served it on its ``@rag`` span (``app.index_version``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import trace

import ragtrace
from examples.demo.feedback import SimulatedUsers, found_answer
from examples.demo.plan import CANDIDATE_INDEX, INDEX_VERSION_KEY, STABLE_INDEX
from examples.support_bot import (
    FaultMode,
    Hit,
    SupportBot,
    load_conversations,
    load_golden,
    run_conversations,
    run_golden,
)

__all__ = ["DemoBot", "IndexedBot", "Phase", "TrafficDriver"]


class DemoBot(SupportBot):
    """The support bot, remembering the last request's handle for its user's feedback."""

    last_request: ragtrace.RequestHandle | None = None

    def retrieve(self, query: str) -> list[Hit]:
        # Still in the request's @rag span: the handle a front end would be given.
        self.last_request = ragtrace.current_request()
        return super().retrieve(query)


class IndexedBot(DemoBot):
    """The support bot, naming the index version that serves each request."""

    index_version: str = STABLE_INDEX

    def retrieve(self, query: str) -> list[Hit]:
        # Still in the request's @rag span (the case span): the app's own attribute,
        # which the collector's segments: turns into a label of the scores.
        trace.get_current_span().set_attribute(INDEX_VERSION_KEY, self.index_version)
        return super().retrieve(query)


@dataclass(slots=True)
class Phase:
    """One stretch of traffic with one fault mode."""

    name: str
    fault: FaultMode
    #: wall clock (``time.time_ns()``) when the phase began: spans started at or after
    #: it belong to this phase
    started_ns: int = 0
    started: float = 0.0  # time.monotonic()
    ended: float | None = None
    golden: int = 0
    conversations: int = 0
    turns: int = 0
    #: ID recall of the golden answers as the app itself saw it (ground truth known)
    app_id_recall_total: float = 0.0
    #: a rollout: one golden request in this many goes to the candidate index, which
    #: has the phase's fault; the others (and the conversations) to the healthy stable
    #: one.  0: every request has the phase's fault.
    rollout_every: int = 0
    #: golden requests the candidate index served
    candidate_golden: int = 0

    @property
    def requests(self) -> int:
        return self.golden + self.turns

    def elapsed(self) -> float:
        end = self.ended if self.ended is not None else time.monotonic()
        return max(0.0, end - self.started) if self.started else 0.0

    @property
    def app_id_recall(self) -> float | None:
        return self.app_id_recall_total / self.golden if self.golden else None

    def to_dict(self) -> dict[str, object]:
        return {
            "fault": self.fault.value,
            "started_unix_nano": self.started_ns,
            "seconds": round(self.elapsed(), 3),
            "golden_requests": self.golden,
            "conversations": self.conversations,
            "conversation_turns": self.turns,
            "app_id_recall": self.app_id_recall,
            "rollout_every": self.rollout_every,
            "candidate_golden_requests": self.candidate_golden,
        }


class TrafficDriver:
    """Sends the support bot's requests, one golden question per tick, and one
    scripted conversation every ``conversation_every`` ticks."""

    def __init__(
        self,
        bot: SupportBot,
        *,
        interval: float,
        conversation_every: int,
        users: SimulatedUsers | None = None,
    ) -> None:
        if interval <= 0 or conversation_every < 1:
            raise ValueError("interval must be > 0 and conversation_every >= 1")
        self.bot = bot
        #: The users who leave feedback on the golden answers (a thumbs-down more often
        #: when the right article was not retrieved).
        self.users = users
        self.interval = interval
        self.conversation_every = conversation_every
        self._golden = load_golden()
        self._conversations = load_conversations()
        self._ticks = 0

    def begin(self, phase: Phase) -> None:
        """Switch the bot to the phase's fault mode and stamp the phase's start."""
        self.bot.fault = phase.fault
        phase.started_ns = time.time_ns()
        phase.started = time.monotonic()

    def _serve_with(self, phase: Phase, *, candidate: bool) -> None:
        """Point the bot at the candidate or the stable index for the next request."""
        if not phase.rollout_every:
            return
        self.bot.fault = phase.fault if candidate else FaultMode.NONE
        if isinstance(self.bot, IndexedBot):
            self.bot.index_version = CANDIDATE_INDEX if candidate else STABLE_INDEX

    def tick(self, phase: Phase) -> None:
        """One golden request, and a conversation when it is its turn."""
        item = self._golden[self._ticks % len(self._golden)]
        every = phase.rollout_every
        candidate = bool(every) and phase.golden % every == every - 1
        self._serve_with(phase, candidate=candidate)
        phase.candidate_golden += candidate
        run = run_golden(self.bot, items=[item], set_reference=True)
        phase.golden += 1
        phase.app_id_recall_total += run.id_recall
        if self.users is not None and run.results:
            (answered,) = run.results
            handle = self.bot.last_request if isinstance(self.bot, DemoBot) else None
            found = found_answer(answered.answer.context_ids, item.reference_context_ids)
            self.users.after(handle, found)
        if self._ticks % self.conversation_every == self.conversation_every - 1:
            script = self._conversations[phase.conversations % len(self._conversations)]
            self._serve_with(phase, candidate=False)
            (played,) = run_conversations(self.bot, conversations=[script])
            phase.conversations += 1
            phase.turns += len(played.answers)
        self._ticks += 1

    async def run(
        self,
        phase: Phase,
        *,
        min_seconds: float,
        max_seconds: float,
        done: Callable[[], bool] = lambda: True,
        on_tick: Callable[[], None] = lambda: None,
    ) -> None:
        """Tick at the driver's pace for at least ``min_seconds``, then until ``done()``,
        at most ``max_seconds``."""
        self.begin(phase)
        next_at = phase.started
        try:
            while True:
                elapsed = time.monotonic() - phase.started
                if elapsed >= max_seconds or (elapsed >= min_seconds and done()):
                    return
                self.tick(phase)
                on_tick()
                next_at += self.interval
                # A slow tick (a busy machine) does not cause a burst afterwards.
                next_at = max(next_at, time.monotonic() - self.interval)
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            phase.ended = time.monotonic()
