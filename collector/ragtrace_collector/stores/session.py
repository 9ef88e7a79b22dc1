"""The turns of each conversation, kept so that conversation metrics see earlier turns.

The collector sees one trace per turn.  When turn *k* of a sampled session is
evaluated, the turn metrics need the turns before it (the window that ends at *k*'s
unit, METRICS.md "Online form"), and the running conversation mean needs every window
score so far.  This module keeps both, behind one async protocol,
:class:`SessionStore`, with two backends:

* ``memory`` (default): one process.  At most ``max_sessions`` sessions; the least
  recently written one is evicted first, and sessions idle longer than ``ttl`` expire.
* ``redis``: shared by replicas.  A session's turns are a sorted set scored by turn
  index (``<prefix><session>:turns``) and its score sums a hash
  (``<prefix><session>:scores``); every write runs in one MULTI transaction or one
  Lua script, and re-arms the expiry of both keys to ``ttl``.

**Turn order.**  Turns are ordered by ``turn_index``, not by arrival: turns may be
evaluated out of order.  A turn appended with an index already stored replaces it
(a retried turn is not counted twice).  A session keeps the ``max_turns`` turns with
the highest indices; a late turn older than all of those is dropped at once.  The
default ``max_turns`` is twice the metric window (``window_size`` units), which
leaves room for turns that a window merges into one unit (an unanswered user turn).

**Turns without an index** (``turn_index=None``: the app recorded no
``ragtrace.turn.index``, as with OpenInference ``using_session`` or GenAI
``gen_ai.conversation.id``) are numbered by the store: 1, 2, 3, ... in the order of
their start (``timestamp``; trace id, then span id break ties), counting the turns
that ``max_turns`` already evicted from the session.  The store is the source of
truth: every replica that appends to a session sees the same numbers, and a turn that
arrives late takes its place by start time (the turns after it move up by one).  A
retried turn (same span id) replaces itself.  These turns are kept apart from the
indexed ones (``<prefix><session>:timeline`` in Redis); :meth:`SessionStore.append_turn`
returns the turns of the same kind, numbered, and :meth:`SessionStore.get_turns` the
indexed turns followed by the numbered ones.

**Running means.**  :meth:`SessionStore.add_window_score` adds a window score to the
session's per-metric running sum and count, atomically, and returns both; their
quotient is the running conversation mean.  Pass ``turn_index`` to make it
idempotent: a second score for the same turn replaces the first.

"Idle" means "not written": reads neither refresh the expiry nor the LRU order.

**Status.**  Each store is the ``session_store`` component.  The Redis store reports
``recoverable_error`` when a call fails (Redis down, hung past ``socket_timeout``,
refusing with an error reply, or answering what the store cannot read), and ``ok``
again on the next call that works.  Every call is bounded by ``socket_timeout``
as a whole, so a hung Redis cannot stall evaluation; a failed call raises
:class:`SessionStoreError`, which the evaluator turns into an ``.error`` on the
conversation metrics only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ragtrace_collector.component import Component, Status
from ragtrace_collector.units import Duration

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "MemorySessionStore",
    "RedisSessionStore",
    "SessionStore",
    "SessionStoreConfig",
    "SessionStoreError",
    "SessionTurn",
    "TurnContext",
    "create_session_store",
]


def _log() -> Any:
    # structlog (and redis, below) are imported where used: loading the config
    # (``check-config``, ``--help``) must stay fast.
    import structlog

    return structlog.get_logger(__name__)


_T = TypeVar("_T")

DEFAULT_WINDOW_SIZE: Final = 10


class SessionStoreError(Exception):
    """The session store's backend failed (e.g. Redis unreachable)."""


# ---------------------------------------------------------------------- data


class TurnContext(BaseModel):
    """One retrieved node of a turn, in rank order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str | None = None
    content: str
    score: float | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_str(cls, v: object) -> object:
        return None if v is None else str(v)


class SessionTurn(BaseModel):
    """One turn of a conversation: one ``@rag`` trace of the session."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The app's turn index; None: the store numbers the turn (1, 2, 3, ... by start).
    turn_index: int | None
    trace_id: str
    span_id: str
    user_content: str | None = None
    assistant_content: str | None = None
    retrieval_context: tuple[TurnContext, ...] = ()
    #: Unix seconds (the ``@rag`` span's start).
    timestamp: float
    expected_outcome: str | None = None


class SessionStoreConfig(BaseModel):
    """The ``session_store:`` section of the collector config."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["memory", "redis"] = Field(
        "memory",
        description="`memory`: in this process; `redis`: shared by every replica.",
    )
    #: redis://, rediss:// or unix:// URL (``redis`` backend only).
    url: str = "redis://127.0.0.1:6379/0"
    #: Seconds a session may stay idle (unwritten) before it expires.  A day: long
    #: enough for a conversation resumed after a pause to keep its running mean.
    ttl: Duration = Field(default=86_400.0, gt=0.0)
    #: ``memory`` backend only: sessions kept before the least recently written goes.
    max_sessions: int = Field(default=10_000, ge=1)
    #: Turns kept per session; None: twice the metric window (``window_size``).
    max_turns: int | None = Field(default=None, ge=1)
    key_prefix: str = Field(
        "ragtrace:session:", description="`redis` backend only: prefix of every key."
    )
    #: ``redis`` backend only: bound on connecting and on each store call as a whole;
    #: a hung Redis fails the call after this (conversation metrics get an error).
    socket_timeout: Duration = Field(default=5.0, gt=0.0)

    @field_validator("url")
    @classmethod
    def _redis_url(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return v

    def redis_client(self) -> Redis:
        """A client of ``url``, each connect and call bounded by ``socket_timeout``
        (the session store's, and the feedback join's, which shares this Redis)."""
        from redis.asyncio import Redis

        return Redis.from_url(
            self.url,
            socket_timeout=self.socket_timeout,
            socket_connect_timeout=self.socket_timeout,
        )

    def effective_max_turns(self, window_size: int = DEFAULT_WINDOW_SIZE) -> int:
        """``max_turns``, or twice ``window_size`` when unset."""
        if self.max_turns is not None:
            return self.max_turns
        return max(1, 2 * window_size)


# ------------------------------------------------------------------ protocol


@runtime_checkable
class SessionStore(Protocol):
    """Turns and running window-score sums per session.  All methods are atomic."""

    @property
    def max_turns(self) -> int: ...

    async def append_turn(self, session_id: str, turn: SessionTurn) -> list[SessionTurn]:
        """Store ``turn``; return the session's kept turns of its kind, ordered by turn
        index (a turn without an index: the numbered turns without one, numbered)."""
        ...

    async def get_turns(self, session_id: str) -> list[SessionTurn]:
        """The session's kept turns, ordered by turn index, the numbered ones last
        (empty if unknown/expired)."""
        ...

    async def add_window_score(
        self, session_id: str, metric: str, score: float, *, turn_index: int | str | None = None
    ) -> tuple[float, int]:
        """Add a window score; return the new running ``(sum, count)`` for ``metric``.

        With ``turn_index`` (a turn's index, or any stable key of the turn such as its
        span id for a turn the store numbers), a later score for the same turn replaces
        the earlier one instead of adding to the count.
        """
        ...

    async def get_window_scores(self, session_id: str, metric: str) -> tuple[float, int]:
        """The running ``(sum, count)`` for ``metric``; ``(0.0, 0)`` if none."""
        ...

    async def delete_session(self, session_id: str) -> None: ...

    async def aclose(self) -> None: ...


def create_session_store(
    config: SessionStoreConfig | None = None,
    *,
    window_size: int = DEFAULT_WINDOW_SIZE,
    clock: Callable[[], float] = time.monotonic,
) -> SessionStore:
    """The backend ``config`` names.  ``window_size``: the turn metrics' window, which
    sets the default ``max_turns``.  ``clock`` (memory backend) drives expiry."""
    config = config if config is not None else SessionStoreConfig()
    if config.backend == "redis":
        return RedisSessionStore(config, window_size=window_size)
    return MemorySessionStore(config, window_size=window_size, clock=clock)


def _check_score(score: float) -> float:
    score = float(score)
    if score != score or score in (float("inf"), float("-inf")):
        raise ValueError(f"window score must be finite, got {score!r}")
    return score


# -------------------------------------------------------------------- memory


@dataclass(slots=True)
class _Sums:
    total: float = 0.0
    count: int = 0
    by_turn: dict[int | str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Session:
    touched: float
    turns: dict[int, SessionTurn] = field(default_factory=dict)
    sums: dict[str, _Sums] = field(default_factory=dict)
    #: Turns without an index, by span id, and how many of them ``max_turns`` evicted.
    timeline: dict[str, SessionTurn] = field(default_factory=dict)
    evicted: int = 0


def _start_order(turn: SessionTurn) -> tuple[float, str, str]:
    """The order of turns without an index: start time, then trace id and span id (the
    order of their Redis members, whose JSON begins with those fields, at equal start)."""
    return turn.timestamp, turn.trace_id, turn.span_id


def _numbered(turns: Sequence[SessionTurn], evicted: int) -> list[SessionTurn]:
    """Turns without an index, in start order, numbered from ``evicted + 1``."""
    return [t.model_copy(update={"turn_index": evicted + i}) for i, t in enumerate(turns, 1)]


class MemorySessionStore(Component):
    """In-process sessions: LRU-bounded by ``max_sessions``, expired after ``ttl``."""

    component_name = "session_store"

    def __init__(
        self,
        config: SessionStoreConfig | None = None,
        *,
        window_size: int = DEFAULT_WINDOW_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config = config if config is not None else SessionStoreConfig()
        self._max_turns = config.effective_max_turns(window_size)
        self._ttl = config.ttl
        self._max_sessions = config.max_sessions
        self._clock = clock
        # least recently written first
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self.report(Status.OK)

    @property
    def max_turns(self) -> int:
        return self._max_turns

    def __len__(self) -> int:
        """Sessions held (expired ones may linger until the next write)."""
        return len(self._sessions)

    def _live(self, session_id: str, now: float) -> _Session | None:
        session = self._sessions.get(session_id)
        if session is not None and now - session.touched >= self._ttl:
            del self._sessions[session_id]
            return None
        return session

    def _for_write(self, session_id: str) -> _Session:
        now = self._clock()
        session = self._live(session_id, now)
        if session is None:
            session = self._sessions[session_id] = _Session(touched=now)
        else:
            session.touched = now
            self._sessions.move_to_end(session_id)
        sessions = self._sessions
        # the front is the least recently written: expired sessions collect there
        while sessions:
            oldest_id, oldest = next(iter(sessions.items()))
            if oldest_id == session_id or now - oldest.touched < self._ttl:
                break
            del sessions[oldest_id]
        while len(sessions) > self._max_sessions:
            sessions.popitem(last=False)
        return session

    async def append_turn(self, session_id: str, turn: SessionTurn) -> list[SessionTurn]:
        session = self._for_write(session_id)
        if turn.turn_index is None:
            return self._append_unindexed(session, turn)
        turns = session.turns
        turns[turn.turn_index] = turn
        if len(turns) > self._max_turns:
            for index in sorted(turns)[: len(turns) - self._max_turns]:
                del turns[index]
        return [turns[i] for i in sorted(turns)]

    def _append_unindexed(self, session: _Session, turn: SessionTurn) -> list[SessionTurn]:
        timeline = session.timeline
        timeline[turn.span_id] = turn
        ordered = sorted(timeline.values(), key=_start_order)
        over = len(ordered) - self._max_turns
        if over > 0:
            for old in ordered[:over]:
                del timeline[old.span_id]
            session.evicted += over
            ordered = ordered[over:]
        return _numbered(ordered, session.evicted)

    async def get_turns(self, session_id: str) -> list[SessionTurn]:
        session = self._live(session_id, self._clock())
        if session is None:
            return []
        timeline = sorted(session.timeline.values(), key=_start_order)
        return [session.turns[i] for i in sorted(session.turns)] + _numbered(
            timeline, session.evicted
        )

    async def add_window_score(
        self, session_id: str, metric: str, score: float, *, turn_index: int | str | None = None
    ) -> tuple[float, int]:
        score = _check_score(score)
        session = self._for_write(session_id)
        sums = session.sums.get(metric)
        if sums is None:
            sums = session.sums[metric] = _Sums()
        if turn_index is not None and turn_index in sums.by_turn:
            sums.total += score - sums.by_turn[turn_index]
        else:
            sums.total += score
            sums.count += 1
        if turn_index is not None:
            sums.by_turn[turn_index] = score
        return sums.total, sums.count

    async def get_window_scores(self, session_id: str, metric: str) -> tuple[float, int]:
        session = self._live(session_id, self._clock())
        sums = session.sums.get(metric) if session is not None else None
        return (sums.total, sums.count) if sums is not None else (0.0, 0)

    async def delete_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    async def aclose(self) -> None:
        self._sessions.clear()


# --------------------------------------------------------------------- redis

# KEYS[1] scores hash, KEYS[2] turns zset, KEYS[3] timeline zset; ARGV: sum field,
# count field, turn field,
# score, ttl ms.  Replaces the turn's previous score when there is one.
_ADD_SCORE_FOR_TURN: Final = """
local old = redis.call('HGET', KEYS[1], ARGV[3])
local total
if old then
  total = redis.call('HINCRBYFLOAT', KEYS[1], ARGV[1], tonumber(ARGV[4]) - tonumber(old))
else
  total = redis.call('HINCRBYFLOAT', KEYS[1], ARGV[1], ARGV[4])
  redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return {total, redis.call('HGET', KEYS[1], ARGV[2])}
"""


# KEYS[1] timeline zset, KEYS[2] scores hash (field "evicted"), KEYS[3] turns zset;
# ARGV: member, start (score), '"span_id":"<id>"', max_turns, ttl ms.  A turn without an
# index: replaces an earlier copy of itself (same start, same span id), keeps the
# max_turns latest and counts the evicted; returns {evicted, members in start order}.
_APPEND_UNINDEXED: Final = """
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[2], ARGV[2])) do
  if string.find(m, ARGV[3], 1, true) then redis.call('ZREM', KEYS[1], m) end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4])
if over > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
  redis.call('HINCRBY', KEYS[2], 'evicted', over)
end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return {redis.call('HGET', KEYS[2], 'evicted') or '0', redis.call('ZRANGE', KEYS[1], 0, -1)}
"""


class RedisSessionStore(Component):
    """Sessions in Redis, shared by every replica (redis-py asyncio)."""

    component_name = "session_store"

    def __init__(
        self,
        config: SessionStoreConfig,
        *,
        window_size: int = DEFAULT_WINDOW_SIZE,
        client: Redis | None = None,
    ) -> None:
        self._max_turns = config.effective_max_turns(window_size)
        self._ttl_ms = max(1, round(config.ttl * 1000))
        self._prefix = config.key_prefix
        self._url = config.url
        self._timeout = config.socket_timeout
        from redis.exceptions import RedisError

        #: redis-py's base error, caught around every call.
        self._redis_error: type[Exception] = RedisError
        self._redis: Redis = client if client is not None else config.redis_client()
        self._add_for_turn = self._redis.register_script(_ADD_SCORE_FOR_TURN)
        self._append_unindexed = self._redis.register_script(_APPEND_UNINDEXED)
        self.report(Status.OK)

    @property
    def max_turns(self) -> int:
        return self._max_turns

    def _keys(self, session_id: str) -> tuple[str, str, str]:
        """The session's turns zset, scores hash and timeline zset (turns without an index)."""
        base = f"{self._prefix}{session_id}"
        return f"{base}:turns", f"{base}:scores", f"{base}:timeline"

    def _error(self, action: str, exc: BaseException) -> SessionStoreError:
        if isinstance(exc, TimeoutError):
            detail = f"no answer within {self._timeout:g}s"
        else:
            detail = f"{type(exc).__name__}: {exc}"
        error = SessionStoreError(f"session store (redis {self._url}): {action} failed: {detail}")
        self.report(Status.RECOVERABLE_ERROR, str(error))
        return error

    async def _call(self, action: str, make: Callable[[], Awaitable[_T]]) -> _T:
        """Run one store operation, bounded by ``socket_timeout`` as a whole; any
        failure (Redis error, timeout, an answer of the wrong shape) becomes
        :class:`SessionStoreError` and a ``recoverable_error`` status."""
        try:
            async with asyncio.timeout(self._timeout):
                result = await make()
        except (self._redis_error, TimeoutError, OSError, ValueError, TypeError) as exc:
            raise self._error(action, exc) from None
        self.report_ok()
        return result

    def _decode(self, members: Sequence[Any]) -> list[SessionTurn]:
        turns: list[SessionTurn] = []
        for raw in members:
            try:
                turns.append(SessionTurn.model_validate_json(raw))
            except ValidationError as exc:
                _log().warning("session_store.bad_turn", error=str(exc), member=str(raw)[:200])
        return turns

    async def append_turn(self, session_id: str, turn: SessionTurn) -> list[SessionTurn]:
        index = turn.turn_index
        if index is None:
            return await self._append_turn_unindexed(session_id, turn)
        turns_key, scores_key, timeline_key = self._keys(session_id)

        async def run() -> list[Any]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.zremrangebyscore(turns_key, index, index)
                pipe.zadd(turns_key, {turn.model_dump_json(): index})
                pipe.zremrangebyrank(turns_key, 0, -(self._max_turns + 1))
                pipe.pexpire(turns_key, self._ttl_ms)
                pipe.pexpire(scores_key, self._ttl_ms)
                pipe.pexpire(timeline_key, self._ttl_ms)
                pipe.zrange(turns_key, 0, -1)
                results: list[Any] = await pipe.execute()
            return _members(results[-1])

        return self._decode(await self._call("append_turn", run))

    async def _append_turn_unindexed(self, session_id: str, turn: SessionTurn) -> list[SessionTurn]:
        turns_key, scores_key, timeline_key = self._keys(session_id)
        # As in the member's compact JSON: the script finds an earlier copy of this turn.
        marker = '"span_id":' + json.dumps(turn.span_id, ensure_ascii=False)

        async def run() -> tuple[int, list[Any]]:
            evicted, members = await self._append_unindexed(
                keys=[timeline_key, scores_key, turns_key],
                args=[
                    turn.model_dump_json(),
                    repr(turn.timestamp),
                    marker,
                    self._max_turns,
                    self._ttl_ms,
                ],
            )
            return _evicted_count(evicted), _members(members)

        evicted, members = await self._call("append_turn", run)
        return _numbered(self._decode(members), evicted)

    async def get_turns(self, session_id: str) -> list[SessionTurn]:
        turns_key, scores_key, timeline_key = self._keys(session_id)

        async def run() -> tuple[list[Any], list[Any], int]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.zrange(turns_key, 0, -1)
                pipe.zrange(timeline_key, 0, -1)
                pipe.hget(scores_key, "evicted")
                indexed, timeline, evicted = await pipe.execute()
            return _members(indexed), _members(timeline), _evicted_count(evicted or 0)

        indexed, timeline, evicted = await self._call("get_turns", run)
        return self._decode(indexed) + _numbered(self._decode(timeline), evicted)

    async def add_window_score(
        self, session_id: str, metric: str, score: float, *, turn_index: int | str | None = None
    ) -> tuple[float, int]:
        score = _check_score(score)
        turns_key, scores_key, timeline_key = self._keys(session_id)
        sum_field, count_field = f"s:{metric}", f"n:{metric}"

        async def run() -> tuple[float, int]:
            if turn_index is not None:
                total, count = await self._add_for_turn(
                    keys=[scores_key, turns_key, timeline_key],
                    args=[
                        sum_field,
                        count_field,
                        f"t:{metric}:{turn_index}",
                        repr(score),
                        self._ttl_ms,
                    ],
                )
            else:
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.hincrbyfloat(scores_key, sum_field, score)
                    pipe.hincrby(scores_key, count_field, 1)
                    pipe.pexpire(scores_key, self._ttl_ms)
                    pipe.pexpire(turns_key, self._ttl_ms)
                    pipe.pexpire(timeline_key, self._ttl_ms)
                    total, count, _, _, _ = await pipe.execute()
            return _finite_sums(total, count)

        return await self._call("add_window_score", run)

    async def get_window_scores(self, session_id: str, metric: str) -> tuple[float, int]:
        _, scores_key, _ = self._keys(session_id)

        async def run() -> tuple[float, int]:
            total, count = await self._redis.hmget(scores_key, [f"s:{metric}", f"n:{metric}"])
            if total is None or count is None:
                return 0.0, 0
            return _finite_sums(total, count)

        return await self._call("get_window_scores", run)

    async def delete_session(self, session_id: str) -> None:
        keys = self._keys(session_id)
        await self._call("delete_session", lambda: self._redis.delete(*keys))

    async def aclose(self) -> None:
        await self._redis.aclose()
        self.report(Status.STOPPED)


def _evicted_count(raw: Any) -> int:
    """The ``evicted`` field of a session's scores hash, as Redis returned it."""
    count = int(raw)
    if count < 0:
        raise ValueError(f"unreadable evicted-turn count from Redis: {raw!r}")
    return count


def _members(value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected a list of turns, Redis answered {type(value).__name__}")
    return list(value)


def _finite_sums(total: Any, count: Any) -> tuple[float, int]:
    """A running (sum, count) read back from Redis, checked: never NaN, never negative."""
    value, n = float(total), int(count)
    if value != value or value in (float("inf"), float("-inf")) or n < 0:
        raise ValueError(f"unreadable window sums from Redis: {total!r}, {count!r}")
    return value, n
