"""The join of user feedback to the scores of its request.

The collector keeps, per trace id, a :class:`JoinEntry`: the scores of the request
(service, metric -> score and the metric's pass threshold), the request's segment
values, and the feedback given on it (one per :attr:`Feedback.key`, the upsert key).
Scores and feedback may come in either order: feedback that arrives first waits for
the scores (a *pending* entry); whichever side comes second finds the other.  What to
do with a joined entry (the pairs) is the caller's: the store only keeps entries.

**Bounds.**  An entry is held ``feedback.window`` from when its side began: from its
first score for an evaluated request (a *scored* entry), from its first feedback for a
pending one.  At most ``max_requests`` scored entries and ``max_pending`` pending ones
are held; beyond either, the oldest of that side goes first (counted).  An entry holds
at most :data:`MAX_FEEDBACK_PER_REQUEST` feedback keys; a new key beyond that is refused
(:class:`Refused`).  So memory is bounded by the entry counts.

**Backends**, behind one :class:`JoinStore` protocol:

* :class:`~.memory.MemoryJoinStore`: in this process.  With storage on
  (``storage.directory``) every write also goes to a SQLite file,
  ``feedback-join.sqlite`` in that directory (WAL journal), before the call returns;
  the file is read back at start.  SQLite runs on one thread of its own; the event loop
  only waits for it.
* :class:`~.redisjoin.RedisJoinStore`: shared by every replica (``session_store.backend: redis``):
  any replica's feedback joins any replica's scores.  One hash per trace, expiring
  after ``window``, and one sorted set per side for the entry bounds; every write is
  one Lua script, so it is atomic.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.record import Feedback, UpsertKey

if TYPE_CHECKING:
    from ragtrace_collector.stores.session import SessionStoreConfig

__all__ = [
    "DropKind",
    "DropListener",
    "FeedbackJoined",
    "JoinEntry",
    "JoinStore",
    "JoinStoreError",
    "Refused",
    "Score",
    "ScoreKey",
    "create_join_store",
]

#: (service, metric)
ScoreKey = tuple[str, str]
#: (score, the metric's pass threshold)
Score = tuple[float, float | None]
#: What was dropped: ``scores`` (an evaluated request evicted), ``pending`` (feedback
#: waiting for scores, evicted), ``expired`` (feedback that waited a whole window).
DropKind = Literal["scores", "pending", "expired"]
#: Called with what was dropped and how many feedback (or requests, for ``scores``).
DropListener = Callable[[DropKind, int], None]


class JoinStoreError(Exception):
    """The join's backend failed (SQLite or Redis)."""


class Refused(Exception):
    """The feedback cannot be held; ``reason`` is a short label for the counter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class JoinEntry:
    """What the join holds for one trace."""

    trace_id: str
    #: Unix seconds when the entry's side began (first score, else first feedback).
    since: float
    #: Whether scores came (the entry counts against ``max_requests``).
    scored: bool = False
    labels: tuple[str, ...] = ()
    scores: dict[ScoreKey, Score] = field(default_factory=dict)
    feedback: dict[UpsertKey, Feedback] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FeedbackJoined:
    """The answer to :meth:`JoinStore.add_feedback`."""

    #: The entry after the write (its scores are those the feedback joins).
    entry: JoinEntry
    #: Whether a feedback with the same key was already held (this one replaced it).
    replaced: bool


class JoinStore(Protocol):
    """Per-trace scores and feedback; every method is atomic against the others."""

    async def start(self) -> list[JoinEntry]:
        """Open the backend and read back what was held before a restart; the entries
        read back that hold both scores and feedback (their pairs, for the tracker)."""
        ...

    async def add_score(
        self,
        trace_id: str,
        key: ScoreKey,
        score: Score,
        labels: tuple[str, ...],
        at: float,
    ) -> JoinEntry:
        """Hold one score of an evaluated request (a repeat replaces it); return the
        entry, with the feedback it joins."""
        ...

    async def add_feedback(self, feedback: Feedback, at: float) -> FeedbackJoined:
        """Hold ``feedback`` (a repeat of its key replaces the earlier one); return the
        entry, with the scores it joins.  Raises :class:`Refused` when the entry holds
        too many feedback keys already; returns only once the write is as durable as
        the backend makes it."""
        ...

    async def get(self, trace_id: str) -> JoinEntry | None:
        """The entry held for ``trace_id`` (one past the window may linger until it
        is dropped), or None."""
        ...

    def held(self) -> tuple[int, int]:
        """(scored entries, pending entries) held, as last known."""
        ...

    async def expire(self, now: float) -> None:
        """Drop what is older than the window (reported to the drop listener)."""
        ...

    async def close(self) -> None: ...


def create_join_store(
    config: FeedbackConfig,
    *,
    directory: Path | None = None,
    synchronous: Literal["FULL", "NORMAL"] = "FULL",
    session_store: SessionStoreConfig | None = None,
    on_drop: DropListener | None = None,
    clock: Callable[[], float] = time.time,
) -> JoinStore:
    """The backend for this configuration: Redis when the session store is in Redis
    (replicas share it), else in memory, kept in SQLite under ``directory`` if set."""
    # The backends import this module: imported here, not at its top.
    if session_store is not None and session_store.backend == "redis":
        from ragtrace_collector.feedback.redisjoin import RedisJoinStore

        return RedisJoinStore(config, session_store, on_drop=on_drop, clock=clock)
    from ragtrace_collector.feedback.memory import MemoryJoinStore

    return MemoryJoinStore(
        config, directory=directory, synchronous=synchronous, on_drop=on_drop, clock=clock
    )


def ignore_drop(kind: DropKind, count: int) -> None:
    return None


# ------------------------------------------------------------------- encoding
# One encoding of a feedback for both durable backends (SQLite rows, Redis fields).


def feedback_json(feedback: Feedback) -> str:
    return json.dumps(
        [
            feedback.trace_id,
            feedback.span_id,
            feedback.name,
            feedback.value,
            feedback.value_type,
            feedback.comment,
            feedback.user_id,
            feedback.correction,
            feedback.service,
            feedback.time_unix_nano,
        ],
        separators=(",", ":"),
    )


def feedback_from_json(text: str | bytes) -> Feedback | None:
    """A feedback read back from a backend (untrusted: a bad one is None)."""
    try:
        row = json.loads(text)
        trace_id, span_id, name, value, value_type, comment, user_id, correction, svc, at = row
        number = float(value)
        if not (
            isinstance(trace_id, str)
            and isinstance(name, str)
            and math.isfinite(number)
            and 0.0 <= number <= 1.0
            and isinstance(value_type, str)
            and isinstance(svc, str)
            and isinstance(at, int)
            and all(
                v is None or isinstance(v, str) for v in (span_id, comment, user_id, correction)
            )
        ):
            return None
    except (ValueError, TypeError):
        return None
    return Feedback(
        trace_id=trace_id,
        span_id=span_id,
        name=name,
        value=number,
        value_type=value_type,
        comment=comment,
        user_id=user_id,
        correction=correction,
        service=svc,
        time_unix_nano=at,
    )


def score_json(score: Score) -> str:
    """A score as the durable backends keep it (:func:`score_from_json` reads it)."""
    return json.dumps(list(score))


def labels_json(labels: tuple[str, ...]) -> str:
    """Segment labels as the durable backends keep them (:func:`labels_from_json`)."""
    return json.dumps(list(labels))


def score_from_json(text: str | bytes) -> Score | None:
    try:
        score, threshold = json.loads(text)
        value = float(score)
        limit = None if threshold is None else float(threshold)
    except (ValueError, TypeError):
        return None
    if not math.isfinite(value) or (limit is not None and not math.isfinite(limit)):
        return None
    return value, limit


def labels_from_json(text: str | bytes) -> tuple[str, ...]:
    try:
        labels = json.loads(text)
    except ValueError:
        return ()
    if isinstance(labels, list) and all(isinstance(v, str) for v in labels):
        return tuple(labels)
    return ()


def copy_entry(entry: JoinEntry) -> JoinEntry:
    """A snapshot the caller may read after the next write changed the entry."""
    return replace(entry, scores=dict(entry.scores), feedback=dict(entry.feedback))
