"""The join in this process (:class:`MemoryJoinStore`), kept in a SQLite file with
storage on (:class:`_Journal`); see :mod:`.join` for the semantics and the bounds."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from ragtrace_collector.component import Component, Status
from ragtrace_collector.feedback.config import MAX_FEEDBACK_PER_REQUEST, FeedbackConfig
from ragtrace_collector.feedback.join import (
    DropListener,
    FeedbackJoined,
    JoinEntry,
    JoinStoreError,
    Refused,
    Score,
    ScoreKey,
    copy_entry,
    feedback_from_json,
    feedback_json,
    ignore_drop,
    labels_from_json,
    labels_json,
    score_from_json,
    score_json,
)
from ragtrace_collector.feedback.record import Feedback

__all__ = ["SQLITE_FILE", "MemoryJoinStore"]

#: The join's file in ``storage.directory``.
SQLITE_FILE: Final = "feedback-join.sqlite"


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
        self._on_drop = on_drop or ignore_drop
        self._clock = clock
        #: trace id -> entry, oldest ``since`` first (an entry moves here from pending
        #: when its first score comes, with a new ``since``).
        self._scored: OrderedDict[str, JoinEntry] = OrderedDict()
        self._pending: OrderedDict[str, JoinEntry] = OrderedDict()
        self._journal = (
            _Journal(directory / SQLITE_FILE, synchronous) if directory is not None else None
        )

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
        return [copy_entry(e) for e in self._scored.values() if e.feedback]

    def _restore(self, rows: _Rows) -> list[str]:
        """The entries of a previous run, oldest first, then the bounds applied; the
        trace ids those dropped."""
        entries: dict[str, JoinEntry] = {}
        for trace_id, since, scored, labels in rows.entries:
            entries[trace_id] = JoinEntry(trace_id, since, bool(scored), labels_from_json(labels))
        for trace_id, service, metric, score_text in rows.scores:
            entry = entries.get(trace_id)
            score = score_from_json(score_text)
            if entry is not None and score is not None:
                entry.scores[(service, metric)] = score
        for trace_id, body in rows.feedback:
            entry = entries.get(trace_id)
            feedback = feedback_from_json(body)
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
        return copy_entry(entry) if entry is not None else None

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
        return copy_entry(entry)

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
        return FeedbackJoined(copy_entry(entry), replaced)

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
            (entry.trace_id, entry.since, int(entry.scored), labels_json(entry.labels)),
        )

    def put_labels(self, trace_id: str, labels: tuple[str, ...]) -> None:
        self._conn().execute(
            "UPDATE entries SET labels = ? WHERE trace_id = ?", (labels_json(labels), trace_id)
        )

    def put_score(self, trace_id: str, key: ScoreKey, score: Score) -> None:
        self._conn().execute(
            "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?)",
            (trace_id, key[0], key[1], score_json(score)),
        )

    def put_feedback(self, feedback: Feedback) -> None:
        name, user = feedback.key[1], feedback.key[2]
        self._conn().execute(
            "INSERT OR REPLACE INTO feedback VALUES (?, ?, ?, ?)",
            (feedback.trace_id, name, user, feedback_json(feedback)),
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
