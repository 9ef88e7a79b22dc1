"""The join in Redis (:class:`RedisJoinStore`), shared by every replica; see
:mod:`.join` for the semantics and the bounds."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ragtrace_collector.component import Component, Status
from ragtrace_collector.feedback.config import MAX_FEEDBACK_PER_REQUEST, FeedbackConfig
from ragtrace_collector.feedback.join import (
    DropKind,
    DropListener,
    FeedbackJoined,
    JoinEntry,
    JoinStoreError,
    Refused,
    Score,
    ScoreKey,
    feedback_from_json,
    feedback_json,
    ignore_drop,
    labels_from_json,
    labels_json,
    score_from_json,
    score_json,
)
from ragtrace_collector.feedback.record import Feedback

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from ragtrace_collector.stores.session import SessionStoreConfig

__all__ = ["RedisJoinStore"]

# One hash per trace (``<prefix>t:<trace id>``): ``~scored`` or ``~pending`` (the
# entry's ``since``), ``~labels`` (JSON), ``~nf`` (feedback keys held), ``s:<JSON
# [service, metric]>`` (JSON [score, threshold]) and ``f:<JSON [name, user]>`` (the
# feedback's JSON).  It expires ``window`` after its side began.  Two sorted sets,
# ``<prefix>scored`` and ``<prefix>pending``, index the traces by ``since`` for the
# entry bounds; the scripts drop what is past the window or over a bound from them
# (and the evicted traces' hashes).  Every script returns the counts of both indexes.

# Both writes' bound: pop the oldest traces of an index beyond ``bound`` and delete
# their hashes; how many.
_EVICT: Final = """
local function evict(index, bound, prefix)
  local evicted = 0
  local over = redis.call('ZCARD', index) - tonumber(bound)
  if over > 0 then
    local old = redis.call('ZPOPMIN', index, over)
    for i = 1, #old, 2 do
      redis.call('DEL', prefix .. old[i])
      evicted = evicted + 1
    end
  end
  return evicted
end
"""

# KEYS: hash, scored index, pending index.  ARGV: trace id, field, score JSON, labels
# JSON, now, ttl ms, max_requests, window s, hash prefix.
_ADD_SCORE: Final = (
    _EVICT
    + """
if redis.call('HEXISTS', KEYS[1], '~scored') == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[1], '~pending')
  redis.call('HSET', KEYS[1], '~scored', ARGV[5])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3], '~labels', ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[5]) - tonumber(ARGV[8]))
local evicted = evict(KEYS[2], ARGV[7], ARGV[9])
return {0, evicted, 0, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
        redis.call('HGETALL', KEYS[1])}
"""
)

# KEYS: hash, scored index, pending index.  ARGV: trace id, field, feedback JSON, now,
# ttl ms, max_pending, window s, hash prefix, max feedback per request.
_ADD_FEEDBACK: Final = (
    _EVICT
    + """
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
  evicted = evict(KEYS[3], ARGV[6], ARGV[8])
end
if exists == 0 then redis.call('HINCRBY', KEYS[1], '~nf', 1) end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return {exists, evicted, expired, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
        redis.call('HGETALL', KEYS[1])}
"""
)

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
        self._on_drop = on_drop or ignore_drop
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
                score_json(score),
                labels_json(labels),
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
                feedback_json(feedback),
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
                entry.labels = labels_from_json(value)
            elif name.startswith("s:"):
                service, metric = json.loads(name[2:])
                score = score_from_json(value)
                if isinstance(service, str) and isinstance(metric, str) and score is not None:
                    entry.scores[(service, metric)] = score
            elif name.startswith("f:"):
                feedback = feedback_from_json(value)
                if feedback is not None and feedback.trace_id == trace_id:
                    entry.feedback[feedback.key] = feedback
        except (ValueError, TypeError):
            continue
    return entry
