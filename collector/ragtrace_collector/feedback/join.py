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

* :class:`MemoryJoinStore`: in this process.  With storage on
  (``storage.directory``) every write also goes to a SQLite file,
  ``feedback-join.sqlite`` in that directory (WAL journal), before the call returns;
  the file is read back at start.  SQLite runs on one thread of its own; the event loop
  only waits for it.
* :class:`RedisJoinStore`: shared by every replica (``session_store.backend: redis``):
  any replica's feedback joins any replica's scores.  One hash per trace, expiring
  after ``window``, and one sorted set per side for the entry bounds; every write is
  one Lua script, so it is atomic.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from ragtrace_collector.component import Component, Status
from ragtrace_collector.feedback.config import MAX_FEEDBACK_PER_REQUEST, FeedbackConfig
from ragtrace_collector.feedback.record import Feedback, UpsertKey

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from ragtrace_collector.stores.session import SessionStoreConfig

__all__ = [
    "SQLITE_FILE",
    "DropListener",
    "FeedbackJoined",
    "JoinEntry",
    "JoinStore",
    "JoinStoreError",
    "MemoryJoinStore",
    "RedisJoinStore",
    "Refused",
    "ScoreKey",
    "create_join_store",
]

#: The join's file in ``storage.directory``.
SQLITE_FILE: Final = "feedback-join.sqlite"

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
) -> MemoryJoinStore | RedisJoinStore:
    """The backend for this configuration: Redis when the session store is in Redis
    (replicas share it), else in memory, kept in SQLite under ``directory`` if set."""
    if session_store is not None and session_store.backend == "redis":
        return RedisJoinStore(config, session_store, on_drop=on_drop, clock=clock)
    return MemoryJoinStore(
        config, directory=directory, synchronous=synchronous, on_drop=on_drop, clock=clock
    )


def _ignore_drop(kind: DropKind, count: int) -> None:
    return None


# ------------------------------------------------------------------- encoding
# One encoding of a feedback for both durable backends (SQLite rows, Redis fields).


def _feedback_json(feedback: Feedback) -> str:
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


def _feedback_from_json(text: str | bytes) -> Feedback | None:
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


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _score_from_json(text: str | bytes) -> Score | None:
    try:
        score, threshold = json.loads(text)
        value = float(score)
        limit = None if threshold is None else float(threshold)
    except (ValueError, TypeError):
        return None
    if not math.isfinite(value) or (limit is not None and not math.isfinite(limit)):
        return None
    return value, limit


def _labels_from_json(text: str | bytes) -> tuple[str, ...]:
    try:
        labels = json.loads(text)
    except ValueError:
        return ()
    if isinstance(labels, list) and all(isinstance(v, str) for v in labels):
        return tuple(labels)
    return ()


# --------------------------------------------------------------------- memory


class MemoryJoinStore(Component):
    """The join in this process: two insertion-ordered maps (scored, pending), each
    bounded, oldest first; optionally kept in SQLite (see :class:`_Journal`)."""

    component_name = "feedback_join"

    def __init__(
        self,
        config: FeedbackConfig,
        *,
        directory: Path | None = None,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        on_drop: DropListener | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._window = config.window
        self._max_requests = config.max_requests
        self._max_pending = config.max_pending
        self._on_drop = on_drop or _ignore_drop
        self._clock = clock
        #: trace id -> entry, oldest ``since`` first (an entry moves here from pending
        #: when its first score comes, with a new ``since``).
        self._scored: OrderedDict[str, JoinEntry] = OrderedDict()
        self._pending: OrderedDict[str, JoinEntry] = OrderedDict()
        self._journal = (
            _Journal(directory / SQLITE_FILE, synchronous) if directory is not None else None
        )

    @property
    def path(self) -> Path | None:
        return self._journal.path if self._journal is not None else None

    async def start(self) -> list[JoinEntry]:
        if self._journal is not None:
            try:
                rows = await self._journal.run(_Journal.load, self._clock() - self._window)
            except (sqlite3.Error, OSError) as exc:
                self.report(Status.PERMANENT_ERROR, f"cannot open the join's file: {exc}")
                raise JoinStoreError(f"feedback join ({self._journal.path}): {exc}") from exc
            dropped = self._restore(rows)
            if dropped:  # over the bounds (lowered since): gone from the file too
                await self._write([(_Journal.delete, (dropped,))])
        self.report(Status.OK)
        return [_copy(e) for e in self._scored.values() if e.feedback]

    def _restore(self, rows: _Rows) -> list[str]:
        """The entries of a previous run, oldest first, then the bounds applied; the
        trace ids those dropped."""
        entries: dict[str, JoinEntry] = {}
        for trace_id, since, scored, labels in rows.entries:
            entries[trace_id] = JoinEntry(trace_id, since, bool(scored), _labels_from_json(labels))
        for trace_id, service, metric, score_json in rows.scores:
            entry = entries.get(trace_id)
            score = _score_from_json(score_json)
            if entry is not None and score is not None:
                entry.scores[(service, metric)] = score
        for trace_id, body in rows.feedback:
            entry = entries.get(trace_id)
            feedback = _feedback_from_json(body)
            if entry is not None and feedback is not None and feedback.trace_id == trace_id:
                entry.feedback[feedback.key] = feedback
        for entry in sorted(entries.values(), key=lambda e: e.since):
            if entry.scored:
                self._scored[entry.trace_id] = entry
            elif entry.feedback:
                self._pending[entry.trace_id] = entry
        return self._trim(self._clock())

    def held(self) -> tuple[int, int]:
        return len(self._scored), len(self._pending)

    async def get(self, trace_id: str) -> JoinEntry | None:
        entry = self._scored.get(trace_id) or self._pending.get(trace_id)
        return _copy(entry) if entry is not None else None

    async def add_score(
        self,
        trace_id: str,
        key: ScoreKey,
        score: Score,
        labels: tuple[str, ...],
        at: float,
    ) -> JoinEntry:
        dropped = self._trim(at)  # first: an expired entry is not written to
        entry = self._scored.get(trace_id)
        first = entry is None
        if entry is None:
            entry = self._pending.pop(trace_id, None)
            if entry is None:
                entry = JoinEntry(trace_id, at)
            entry.since, entry.scored = at, True
            self._scored[trace_id] = entry
        entry.scores[key] = score
        entry.labels = labels
        dropped += self._trim(at)
        if self._journal is not None:
            # The deletes first: a trace dropped (expired) may be the one written now.
            ops: list[_Op] = [(_Journal.delete, (dropped,))] if dropped else []
            if first:
                ops.append((_Journal.put_entry, (entry,)))
            elif labels:
                ops.append((_Journal.put_labels, (trace_id, labels)))
            ops.append((_Journal.put_score, (trace_id, key, score)))
            await self._write(ops)
        return _copy(entry)

    async def add_feedback(self, feedback: Feedback, at: float) -> FeedbackJoined:
        trace_id = feedback.trace_id
        dropped = self._trim(at)  # first: an expired entry is not written to
        entry = self._scored.get(trace_id) or self._pending.get(trace_id)
        replaced = entry is not None and feedback.key in entry.feedback
        if entry is not None and not replaced and len(entry.feedback) >= MAX_FEEDBACK_PER_REQUEST:
            if dropped and self._journal is not None:
                await self._write([(_Journal.delete, (dropped,))])
            raise Refused("too many feedback for one request")
        first = entry is None
        if entry is None:
            entry = self._pending[trace_id] = JoinEntry(trace_id, at)
        earlier = entry.feedback.get(feedback.key)
        entry.feedback[feedback.key] = feedback
        dropped += self._trim(at)
        if self._journal is not None:
            # The deletes first: a trace dropped (expired) may be the one written now.
            ops: list[_Op] = [(_Journal.delete, (dropped,))] if dropped else []
            if first:
                ops.append((_Journal.put_entry, (entry,)))
            ops.append((_Journal.put_feedback, (feedback,)))
            try:
                await self._write(ops)
            except JoinStoreError:
                # Not held, as the caller is told: its retry is then a new feedback.
                if earlier is not None:
                    entry.feedback[feedback.key] = earlier
                else:
                    entry.feedback.pop(feedback.key, None)
                    if first:
                        self._pending.pop(trace_id, None)
                raise
        return FeedbackJoined(_copy(entry), replaced)

    async def expire(self, now: float) -> None:
        dropped = self._trim(now)
        if dropped and self._journal is not None:
            await self._write([(_Journal.delete, (dropped,))])

    def _trim(self, now: float) -> list[str]:
        """Drop the expired entries and those over the bounds; the trace ids dropped."""
        dropped: list[str] = []
        cutoff = now - self._window
        for side, bound in ((self._scored, self._max_requests), (self._pending, self._max_pending)):
            expired = evicted = 0
            while side:
                trace_id, oldest = next(iter(side.items()))
                if oldest.since > cutoff and len(side) <= bound:
                    break
                del side[trace_id]
                dropped.append(trace_id)
                if oldest.since <= cutoff:
                    expired += len(oldest.feedback)
                else:
                    evicted += len(oldest.feedback) if side is self._pending else 1
            if side is self._pending:
                if expired:
                    self._on_drop("expired", expired)
                if evicted:
                    self._on_drop("pending", evicted)
            elif evicted:
                self._on_drop("scores", evicted)
        return dropped

    async def _write(self, ops: list[_Op]) -> None:
        assert self._journal is not None
        try:
            await self._journal.write(ops)
        except (sqlite3.Error, OSError) as exc:
            self.report(Status.RECOVERABLE_ERROR, f"cannot write the join's file: {exc}")
            raise JoinStoreError(f"feedback join ({self._journal.path}): {exc}") from exc
        self.report_ok()

    async def close(self) -> None:
        if self._journal is not None:
            await self._journal.close()
        self.report(Status.STOPPED)


def _copy(entry: JoinEntry) -> JoinEntry:
    """A snapshot the caller may read after the next write changed the entry."""
    return replace(entry, scores=dict(entry.scores), feedback=dict(entry.feedback))


# ----------------------------------------------------------------- sqlite


@dataclass(frozen=True, slots=True)
class _Rows:
    entries: list[tuple[str, float, int, str]]
    scores: list[tuple[str, str, str, str]]
    feedback: list[tuple[str, str]]


#: One write: a method of :class:`_Journal` and its arguments, run on its thread.
_Op = tuple[Callable[..., None], tuple[Any, ...]]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS entries (
  trace_id TEXT PRIMARY KEY, since REAL NOT NULL, scored INTEGER NOT NULL, labels TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS scores (
  trace_id TEXT NOT NULL, service TEXT NOT NULL, metric TEXT NOT NULL, score TEXT NOT NULL,
  PRIMARY KEY (trace_id, service, metric)
);
CREATE TABLE IF NOT EXISTS feedback (
  trace_id TEXT NOT NULL, name TEXT NOT NULL, user_id TEXT NOT NULL, body TEXT NOT NULL,
  PRIMARY KEY (trace_id, name, user_id)
);
CREATE INDEX IF NOT EXISTS entries_since ON entries (since);
"""


class _Journal:
    """The SQLite copy of a :class:`MemoryJoinStore`.

    One connection, used only by one worker thread.  Writes queued while a commit runs
    go together in the next transaction (group commit), so the event loop never waits
    on SQLite and a burst of feedback costs one fsync per group, not per feedback.
    """

    def __init__(self, path: Path, synchronous: Literal["FULL", "NORMAL"]) -> None:
        self.path = path
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="feedback-join")
        self._db: sqlite3.Connection | None = None
        self._queue: list[tuple[list[_Op], asyncio.Future[None]]] = []
        self._flushing = False
        self._flush_task: asyncio.Task[None] | None = None
        self._flushed = asyncio.Event()
        self._flushed.set()
        self._thread_lock = threading.Lock()

    async def run(self, method: Callable[..., _Rows], *args: Any) -> _Rows:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, method, self, *args)

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    def load(self, cutoff: float) -> _Rows:
        db = self._open()
        with self._thread_lock:
            db.execute("BEGIN")
            old = "SELECT trace_id FROM entries WHERE since <= ?"
            db.execute(f"DELETE FROM scores WHERE trace_id IN ({old})", (cutoff,))
            db.execute(f"DELETE FROM feedback WHERE trace_id IN ({old})", (cutoff,))
            db.execute("DELETE FROM entries WHERE since <= ?", (cutoff,))
            db.execute("COMMIT")
            return _Rows(
                db.execute("SELECT trace_id, since, scored, labels FROM entries").fetchall(),
                db.execute("SELECT trace_id, service, metric, score FROM scores").fetchall(),
                db.execute("SELECT trace_id, body FROM feedback").fetchall(),
            )

    async def write(self, ops: list[_Op]) -> None:
        """Apply ``ops`` in a transaction; returns once it is committed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((ops, future))
        if not self._flushing:
            self._flushing = True
            self._flushed.clear()
            # Kept: the loop holds only a weak reference to a task.
            self._flush_task = asyncio.get_running_loop().create_task(self._flush())
        await asyncio.shield(future)

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    await loop.run_in_executor(
                        self._executor, self._commit, [op for ops, _ in batch for op in ops]
                    )
                except Exception as exc:  # every waiter hears of it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)
        finally:
            self._flushing = False
            self._flushed.set()

    def _commit(self, ops: list[_Op]) -> None:
        db = self._open()
        with self._thread_lock:
            db.execute("BEGIN")
            try:
                for method, args in ops:
                    method(self, *args)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # The writes, run inside _commit's transaction.
    def _conn(self) -> sqlite3.Connection:
        assert self._db is not None
        return self._db

    def put_entry(self, entry: JoinEntry) -> None:
        self._conn().execute(
            "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)",
            (entry.trace_id, entry.since, int(entry.scored), json.dumps(list(entry.labels))),
        )

    def put_labels(self, trace_id: str, labels: tuple[str, ...]) -> None:
        self._conn().execute(
            "UPDATE entries SET labels = ? WHERE trace_id = ?", (json.dumps(list(labels)), trace_id)
        )

    def put_score(self, trace_id: str, key: ScoreKey, score: Score) -> None:
        self._conn().execute(
            "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?)",
            (trace_id, key[0], key[1], json.dumps(list(score))),
        )

    def put_feedback(self, feedback: Feedback) -> None:
        name, user = feedback.key[1], feedback.key[2]
        self._conn().execute(
            "INSERT OR REPLACE INTO feedback VALUES (?, ?, ?, ?)",
            (feedback.trace_id, name, user, _feedback_json(feedback)),
        )

    def delete(self, trace_ids: Iterable[str]) -> None:
        rows = [(t,) for t in trace_ids]
        db = self._conn()
        for table in ("entries", "scores", "feedback"):
            db.executemany(f"DELETE FROM {table} WHERE trace_id = ?", rows)

    async def close(self) -> None:
        await self._flushed.wait()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=False)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


# ---------------------------------------------------------------------- redis
# One hash per trace (``<prefix>t:<trace id>``): ``~scored`` or ``~pending`` (the
# entry's ``since``), ``~labels`` (JSON), ``~nf`` (feedback keys held), ``s:<JSON
# [service, metric]>`` (JSON [score, threshold]) and ``f:<JSON [name, user]>`` (the
# feedback's JSON).  It expires ``window`` after its side began.  Two sorted sets,
# ``<prefix>scored`` and ``<prefix>pending``, index the traces by ``since`` for the
# entry bounds; the scripts drop what is past the window or over a bound from them
# (and the evicted traces' hashes).  Every script returns the counts of both indexes.

# KEYS: hash, scored index, pending index.  ARGV: trace id, field, score JSON, labels
# JSON, now, ttl ms, max_requests, window s, hash prefix.
_ADD_SCORE: Final = """
if redis.call('HEXISTS', KEYS[1], '~scored') == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[1], '~pending')
  redis.call('HSET', KEYS[1], '~scored', ARGV[5])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3], '~labels', ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[5]) - tonumber(ARGV[8]))
local evicted = 0
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[7])
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do
    redis.call('DEL', ARGV[9] .. old[i])
    evicted = evicted + 1
  end
end
return {0, evicted, 0, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
        redis.call('HGETALL', KEYS[1])}
"""

# KEYS: hash, scored index, pending index.  ARGV: trace id, field, feedback JSON, now,
# ttl ms, max_pending, window s, hash prefix, max feedback per request.
_ADD_FEEDBACK: Final = """
local exists = redis.call('HEXISTS', KEYS[1], ARGV[2])
if exists == 0 and tonumber(redis.call('HGET', KEYS[1], '~nf') or '0') >= tonumber(ARGV[9]) then
  return {-1}
end
local evicted, expired = 0, 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], '~pending', ARGV[4])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  expired = redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', tonumber(ARGV[4]) - tonumber(ARGV[7]))
  local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[6])
  if over > 0 then
    local old = redis.call('ZPOPMIN', KEYS[3], over)
    for i = 1, #old, 2 do
      redis.call('DEL', ARGV[8] .. old[i])
      evicted = evicted + 1
    end
  end
end
if exists == 0 then redis.call('HINCRBY', KEYS[1], '~nf', 1) end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return {exists, evicted, expired, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
        redis.call('HGETALL', KEYS[1])}
"""

# KEYS: scored index, pending index.  ARGV: cutoff.
_EXPIRE: Final = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local expired = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
return {expired, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])}
"""


#: Redis calls of one join store in flight at once (redis-py's pool refuses beyond its
#: connection limit).
_REDIS_CALLS: Final = 32


class RedisJoinStore(Component):
    """The join in Redis, shared by every replica (redis-py asyncio).

    It uses the session store's URL and ``socket_timeout`` (each call is bounded by it
    as a whole) and ``feedback.key_prefix``.  Feedback counted ``expired`` here is
    pending *requests* found past the window (Redis drops their hashes itself)."""

    component_name = "feedback_join"

    def __init__(
        self,
        config: FeedbackConfig,
        session_store: SessionStoreConfig,
        *,
        on_drop: DropListener | None = None,
        clock: Callable[[], float] = time.time,
        client: Redis | None = None,
    ) -> None:
        from redis.exceptions import RedisError

        self._config = config
        self._prefix = config.key_prefix
        self._ttl_ms = max(1, round(config.window * 1000))
        self._timeout = session_store.socket_timeout
        self._url = session_store.url
        self._on_drop = on_drop or _ignore_drop
        self._clock = clock
        self._redis_error: type[Exception] = RedisError
        self._redis: Redis = client if client is not None else session_store.redis_client()
        self._add_score = self._redis.register_script(_ADD_SCORE)
        self._add_feedback = self._redis.register_script(_ADD_FEEDBACK)
        self._expire = self._redis.register_script(_EXPIRE)
        self._held = (0, 0)
        self._calls = asyncio.Semaphore(_REDIS_CALLS)

    async def get(self, trace_id: str) -> JoinEntry | None:
        key = f"{self._prefix}t:{trace_id}"
        try:
            async with asyncio.timeout(self._timeout):
                fields = await self._redis.hgetall(key)
        except (self._redis_error, TimeoutError, OSError) as exc:
            raise JoinStoreError(f"feedback join (redis {self._url}): get failed: {exc}") from None
        if not fields:
            return None
        flat = [part for pair in dict(fields).items() for part in pair]
        return _entry_from_hash(trace_id, flat)

    def _indexes(self) -> list[str]:
        return [f"{self._prefix}scored", f"{self._prefix}pending"]

    async def _call(self, action: str, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            # Calls beyond _REDIS_CALLS wait their turn here rather than exhaust the
            # client's connection pool; the timeout bounds the call itself.
            async with self._calls, asyncio.timeout(self._timeout):
                answer = await script(keys=keys, args=args)
        except (self._redis_error, TimeoutError, OSError) as exc:
            detail = (
                f"no answer within {self._timeout:g}s"
                if isinstance(exc, TimeoutError)
                else f"{type(exc).__name__}: {exc}"
            )
            error = JoinStoreError(f"feedback join (redis {self._url}): {action} failed: {detail}")
            self.report(Status.RECOVERABLE_ERROR, str(error))
            raise error from None
        self.report_ok()
        return answer

    async def start(self) -> list[JoinEntry]:
        """Nothing to read back: Redis holds the join (this replica's tracker starts
        empty, and fills as feedback and scores join again)."""
        self.report(Status.OK)
        return []

    def held(self) -> tuple[int, int]:
        return self._held

    async def add_score(
        self,
        trace_id: str,
        key: ScoreKey,
        score: Score,
        labels: tuple[str, ...],
        at: float,
    ) -> JoinEntry:
        answer = await self._call(
            "add_score",
            self._add_score,
            [f"{self._prefix}t:{trace_id}", *self._indexes()],
            [
                trace_id,
                "s:" + json.dumps(list(key)),
                json.dumps(list(score)),
                json.dumps(list(labels)),
                repr(at),
                self._ttl_ms,
                self._config.max_requests,
                repr(self._config.window),
                f"{self._prefix}t:",
            ],
        )
        return self._answered(trace_id, answer, "scores")[0]

    async def add_feedback(self, feedback: Feedback, at: float) -> FeedbackJoined:
        trace_id = feedback.trace_id
        answer = await self._call(
            "add_feedback",
            self._add_feedback,
            [f"{self._prefix}t:{trace_id}", *self._indexes()],
            [
                trace_id,
                "f:" + json.dumps([feedback.key[1], feedback.key[2]]),
                _feedback_json(feedback),
                repr(at),
                self._ttl_ms,
                self._config.max_pending,
                repr(self._config.window),
                f"{self._prefix}t:",
                MAX_FEEDBACK_PER_REQUEST,
            ],
        )
        if isinstance(answer, list) and answer[:1] == [-1]:
            raise Refused("too many feedback for one request")
        entry, existed = self._answered(trace_id, answer, "pending")
        return FeedbackJoined(entry, existed)

    def _answered(self, trace_id: str, answer: Any, side: DropKind) -> tuple[JoinEntry, bool]:
        """The entry a script returned, counting what it dropped."""
        try:
            existed, evicted, expired, scored, pending, fields = answer
            self._held = (int(scored), int(pending))
        except (TypeError, ValueError) as exc:
            error = JoinStoreError(f"feedback join (redis {self._url}): unreadable answer")
            self.report(Status.RECOVERABLE_ERROR, str(error))
            raise error from exc
        if evicted:
            self._on_drop(side, int(evicted))
        if expired:
            self._on_drop("expired", int(expired))
        return _entry_from_hash(trace_id, fields), bool(existed)

    async def expire(self, now: float) -> None:
        answer = await self._call(
            "expire", self._expire, self._indexes(), [repr(now - self._config.window)]
        )
        try:
            expired, scored, pending = (int(v) for v in answer)
        except (TypeError, ValueError):
            return
        self._held = (scored, pending)
        if expired:
            self._on_drop("expired", expired)

    async def close(self) -> None:
        await self._redis.aclose()
        self.report(Status.STOPPED)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _entry_from_hash(trace_id: str, fields: Any) -> JoinEntry:
    """A trace's hash, as HGETALL returned it (flat, name then value), as an entry;
    fields that cannot be read are left out."""
    entry = JoinEntry(trace_id, 0.0)
    flat = list(fields) if isinstance(fields, list | tuple) else []
    for name_raw, value in zip(flat[::2], flat[1::2], strict=False):
        name = _text(name_raw)
        try:
            if name in ("~scored", "~pending"):
                entry.since = float(_text(value))
                entry.scored = name == "~scored"
            elif name == "~labels":
                entry.labels = _labels_from_json(value)
            elif name.startswith("s:"):
                service, metric = json.loads(name[2:])
                score = _score_from_json(value)
                if isinstance(service, str) and isinstance(metric, str) and score is not None:
                    entry.scores[(service, metric)] = score
            elif name.startswith("f:"):
                feedback = _feedback_from_json(value)
                if feedback is not None and feedback.trace_id == trace_id:
                    entry.feedback[feedback.key] = feedback
        except (ValueError, TypeError):
            continue
    return entry
