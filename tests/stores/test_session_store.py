"""Session store: one behavioural suite, run against the memory and a real Redis backend."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from ragtrace_collector.stores.session import (
    MemorySessionStore,
    RedisSessionStore,
    SessionStore,
    SessionStoreConfig,
    SessionStoreError,
    SessionTurn,
    TurnContext,
    create_session_store,
)
from tests.fakes.ports import free_port
from tests.fakes.redis_server import RedisServer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def turn(index: int, *, user: str | None = None, contexts: int = 1) -> SessionTurn:
    return SessionTurn(
        turn_index=index,
        trace_id=f"{index:032x}",
        span_id=f"{index:016x}",
        user_content=user if user is not None else f"question {index}",
        assistant_content=f"answer {index}",
        retrieval_context=tuple(
            TurnContext(
                id=f"d{index}-{k}", content=f"node {k} of turn {index}", score=1.0 / (k + 1)
            )
            for k in range(contexts)
        ),
        timestamp=1_700_000_000.0 + index,
        expected_outcome="the user gets help",
    )


def r9(sums: tuple[float, int]) -> tuple[float, int]:
    """Running sums with float noise rounded off (Redis adds in long double)."""
    return round(sums[0], 9), sums[1]


def indices(turns: list[SessionTurn]) -> list[int]:
    return [t.turn_index for t in turns]


class Backend:
    """Makes stores of one backend and lets their sessions expire."""

    def __init__(self, kind: str, server: RedisServer | None) -> None:
        self.kind = kind
        self.server = server
        self.clock = FakeClock()
        self.prefix = f"test:{uuid.uuid4().hex}:"
        self._stores: list[SessionStore] = []

    def make(self, window_size: int = 10, **config: Any) -> SessionStore:
        if self.server is not None:
            config.setdefault("url", self.server.url)
        config.setdefault("key_prefix", self.prefix)
        cfg = SessionStoreConfig.model_validate({"backend": self.kind, **config})
        store = create_session_store(cfg, window_size=window_size, clock=self.clock)
        self._stores.append(store)
        return store

    async def let_expire(self, store: SessionStore, session_id: str, ttl: float) -> None:
        """Until the session has expired: fake time for memory, real time for Redis."""
        if self.kind == "memory":
            self.clock.now += ttl
            return
        for _ in range(400):  # Redis drops the keys once ttl has passed; up to 20 s
            if not await store.get_turns(session_id):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("session did not expire within 20 s")

    async def close(self) -> None:
        for store in self._stores:
            await store.aclose()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.services)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    b = Backend(request.param, server)
    yield b
    await b.close()


# ------------------------------------------------------------------- turns


async def test_turns_round_trip_with_their_contexts(backend: Backend) -> None:
    store = backend.make()
    t = turn(0, user="What is  ünïcode? «quotes»", contexts=3)
    kept = await store.append_turn("s1", t)
    assert kept == [t]
    assert await store.get_turns("s1") == [t]
    assert (await store.get_turns("s1"))[0].retrieval_context[2].score == pytest.approx(1 / 3)
    assert await store.get_turns("unknown") == []


async def test_turns_ordered_by_index_not_arrival(backend: Backend) -> None:
    store = backend.make()
    assert indices(await store.append_turn("s", turn(2))) == [2]
    assert indices(await store.append_turn("s", turn(0))) == [0, 2]
    assert indices(await store.append_turn("s", turn(3))) == [0, 2, 3]
    assert indices(await store.append_turn("s", turn(1))) == [0, 1, 2, 3]
    assert indices(await store.get_turns("s")) == [0, 1, 2, 3]


async def test_same_index_replaces_the_turn(backend: Backend) -> None:
    store = backend.make()
    await store.append_turn("s", turn(0))
    await store.append_turn("s", turn(1, user="first try"))
    kept = await store.append_turn("s", turn(1, user="retried"))
    assert indices(kept) == [0, 1]
    assert kept[1].user_content == "retried"


async def test_keeps_the_highest_max_turns_indices(backend: Backend) -> None:
    store = backend.make(max_turns=3)
    assert store.max_turns == 3
    for i in range(6):
        kept = await store.append_turn("s", turn(i))
    assert indices(kept) == [3, 4, 5]
    # a late turn older than every kept one is dropped at once
    assert indices(await store.append_turn("s", turn(1))) == [3, 4, 5]
    # a late turn inside the kept range replaces its twin
    kept = await store.append_turn("s", turn(4, user="late retry"))
    assert indices(kept) == [3, 4, 5]
    assert kept[1].user_content == "late retry"
    assert indices(await store.get_turns("s")) == [3, 4, 5]


def unindexed(
    start: float, *, trace: str = "t", span: str | None = None, user: str = "q"
) -> SessionTurn:
    """A turn without an index (no ragtrace.turn.index), starting at ``start``."""
    return SessionTurn(
        turn_index=None,
        trace_id=trace,
        span_id=span if span is not None else f"span-{start:g}",
        user_content=user,
        assistant_content="a",
        timestamp=1_700_000_000.0 + start,
    )


def numbered(turns: list[SessionTurn]) -> list[tuple[int | None, str]]:
    return [(t.turn_index, t.span_id) for t in turns]


async def test_turns_without_an_index_are_numbered_by_start(backend: Backend) -> None:
    """1, 2, 3 in start order whatever the arrival order; a late turn takes its place."""
    store = backend.make()
    assert numbered(await store.append_turn("s", unindexed(3))) == [(1, "span-3")]
    assert numbered(await store.append_turn("s", unindexed(1))) == [(1, "span-1"), (2, "span-3")]
    kept = await store.append_turn("s", unindexed(2, user="first try"))
    assert numbered(kept) == [(1, "span-1"), (2, "span-2"), (3, "span-3")]
    # A retried turn (same span) replaces itself: no fourth turn.
    kept = await store.append_turn("s", unindexed(2, user="retried"))
    assert numbered(kept) == [(1, "span-1"), (2, "span-2"), (3, "span-3")]
    assert kept[1].user_content == "retried"
    assert numbered(await store.get_turns("s")) == numbered(kept)
    # Equal starts: the trace id breaks the tie, the same way on every backend.
    kept = await store.append_turn("s", unindexed(4, trace="b", span="x"))
    kept = await store.append_turn("s", unindexed(4, trace="a", span="y"))
    assert numbered(kept)[3:] == [(4, "y"), (5, "x")]


async def test_numbering_counts_the_evicted_turns(backend: Backend) -> None:
    store = backend.make(max_turns=3)
    for start in range(1, 6):
        kept = await store.append_turn("s", unindexed(start))
    assert [t.turn_index for t in kept] == [3, 4, 5]
    assert [t.turn_index for t in await store.get_turns("s")] == [3, 4, 5]
    # A late turn older than every kept one is one more turn before them.
    kept = await store.append_turn("s", unindexed(0.5))
    assert numbered(kept) == [(4, "span-3"), (5, "span-4"), (6, "span-5")]
    # Indexed turns of the same session are kept apart, and keep their own indices.
    assert [t.turn_index for t in await store.append_turn("s", turn(0))] == [0]
    assert [t.turn_index for t in await store.get_turns("s")] == [0, 4, 5, 6]


async def test_default_max_turns_from_window_size(backend: Backend) -> None:
    store = backend.make(window_size=2)
    assert store.max_turns == 4
    for i in range(10):
        await store.append_turn("s", turn(i))
    assert indices(await store.get_turns("s")) == [6, 7, 8, 9]
    assert backend.make().max_turns == 20


async def test_sessions_are_separate(backend: Backend) -> None:
    store = backend.make()
    await store.append_turn("a", turn(0))
    await store.append_turn("b", turn(5))
    await store.add_window_score("a", "turn_contextual_precision", 0.5)
    assert indices(await store.get_turns("a")) == [0]
    assert indices(await store.get_turns("b")) == [5]
    assert await store.get_window_scores("b", "turn_contextual_precision") == (0.0, 0)
    await store.delete_session("a")
    assert await store.get_turns("a") == []
    assert await store.get_window_scores("a", "turn_contextual_precision") == (0.0, 0)
    assert indices(await store.get_turns("b")) == [5]


# ------------------------------------------------------------ running sums


async def test_running_sums_per_metric(backend: Backend) -> None:
    store = backend.make()
    assert await store.get_window_scores("s", "m") == (0.0, 0)
    got = [await store.add_window_score("s", "m", x) for x in (1.0, 0.5, 0.0, 0.25)]
    assert [n for _, n in got] == [1, 2, 3, 4]
    assert [s for s, _ in got] == pytest.approx([1.0, 1.5, 1.5, 1.75])
    total, count = await store.get_window_scores("s", "m")
    assert r9((total, count)) == (1.75, 4)
    assert r9(await store.add_window_score("s", "other", 0.125)) == (0.125, 1)
    assert r9(await store.get_window_scores("s", "m")) == (1.75, 4)


async def test_running_mean_matches_the_offline_mean(backend: Backend) -> None:
    # METRICS.md worked example, w=10: window scores 1, 1, 0.75 -> 0.91667
    store = backend.make()
    for k, score in enumerate([1.0, 1.0, 0.75]):
        total, count = await store.add_window_score("conv", "turn_contextual_precision", score)
        assert count == k + 1
    assert total / count == pytest.approx(0.91667, abs=1e-5)


async def test_score_for_the_same_turn_replaces(backend: Backend) -> None:
    store = backend.make()
    assert r9(await store.add_window_score("s", "m", 0.2, turn_index=0)) == (0.2, 1)
    assert r9(await store.add_window_score("s", "m", 0.6, turn_index=1)) == (0.8, 2)
    # re-evaluated turn 0: replaced, not counted twice
    assert r9(await store.add_window_score("s", "m", 1.0, turn_index=0)) == (1.6, 2)
    # without a turn index a score always adds
    assert r9(await store.add_window_score("s", "m", 0.4)) == (2.0, 3)
    # turn indices are per metric
    assert r9(await store.add_window_score("s", "n", 0.3, turn_index=0)) == (0.3, 1)


async def test_non_finite_scores_are_refused(backend: Backend) -> None:
    store = backend.make()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            await store.add_window_score("s", "m", bad)
    assert await store.get_window_scores("s", "m") == (0.0, 0)


# ------------------------------------------------------------- concurrency


async def test_concurrent_score_adds_are_atomic(backend: Backend) -> None:
    store = backend.make()
    results = await asyncio.gather(
        *(store.add_window_score("s", "m", 0.5) for _ in range(100)),
    )
    # each add saw a distinct count: no two read the same state
    assert sorted(n for _, n in results) == list(range(1, 101))
    assert r9(await store.get_window_scores("s", "m")) == (50.0, 100)


async def test_concurrent_per_turn_adds_count_each_turn_once(backend: Backend) -> None:
    store = backend.make()
    jobs = [t for t in range(10) for _ in range(5)]  # every turn scored 5 times at once
    random.Random(3).shuffle(jobs)
    await asyncio.gather(*(store.add_window_score("s", "m", t / 10, turn_index=t) for t in jobs))
    assert r9(await store.get_window_scores("s", "m")) == (4.5, 10)


async def test_concurrent_appends_from_many_tasks(backend: Backend) -> None:
    store = backend.make(max_turns=30)
    order = list(range(60))
    random.Random(5).shuffle(order)
    results = await asyncio.gather(*(store.append_turn("s", turn(i)) for i in order))
    for kept in results:
        assert indices(kept) == sorted(indices(kept))
        assert len(kept) <= 30
    assert indices(await store.get_turns("s")) == list(range(30, 60))


async def test_concurrent_appends_to_many_sessions(backend: Backend) -> None:
    store = backend.make(max_turns=5)

    async def conversation(sid: str) -> None:
        for i in range(8):
            await store.append_turn(sid, turn(i))
            await store.add_window_score(sid, "m", 1.0, turn_index=i)

    await asyncio.gather(*(conversation(f"c{k}") for k in range(20)))
    for k in range(20):
        assert indices(await store.get_turns(f"c{k}")) == [3, 4, 5, 6, 7]
        assert r9(await store.get_window_scores(f"c{k}", "m")) == (8.0, 8)


# --------------------------------------------------------------------- TTL


async def test_idle_sessions_expire(backend: Backend) -> None:
    store = backend.make(ttl=1.0)
    kept = await store.append_turn("s", turn(0))
    assert indices(kept) == [0]
    await store.add_window_score("s", "m", 1.0)
    await backend.let_expire(store, "s", 1.0)
    assert await store.get_turns("s") == []
    assert await store.get_window_scores("s", "m") == (0.0, 0)
    # a new turn starts a fresh session
    assert indices(await store.append_turn("s", turn(3))) == [3]
    assert r9(await store.add_window_score("s", "m", 0.5)) == (0.5, 1)


async def test_memory_write_refreshes_ttl_and_read_does_not() -> None:
    clock = FakeClock()
    store = MemorySessionStore(SessionStoreConfig(ttl=10.0), clock=clock)
    await store.append_turn("s", turn(0))
    clock.now += 6
    await store.add_window_score("s", "m", 1.0)  # a write: idle time restarts
    clock.now += 6
    assert indices(await store.get_turns("s")) == [0]  # 6 s idle
    clock.now += 3.9
    assert await store.get_window_scores("s", "m") == (1.0, 1)  # a read does not refresh
    clock.now += 0.1
    assert await store.get_turns("s") == []


async def test_memory_lru_eviction_and_expired_sweep() -> None:
    clock = FakeClock()
    store = MemorySessionStore(SessionStoreConfig(max_sessions=3, ttl=100.0), clock=clock)
    for sid in ("s1", "s2", "s3"):
        await store.append_turn(sid, turn(0))
        clock.now += 1
    await store.append_turn("s1", turn(1))  # s1 is now the most recently written
    await store.get_turns("s2")  # reads do not count as use
    await store.append_turn("s4", turn(0))
    assert len(store) == 3
    assert await store.get_turns("s2") == []
    assert indices(await store.get_turns("s1")) == [0, 1]
    assert indices(await store.get_turns("s3")) == [0]
    # expired sessions are swept on the next write, before the capacity is reached
    clock.now += 100
    await store.append_turn("s5", turn(0))
    assert len(store) == 1


@pytest.mark.services
async def test_redis_keys_are_namespaced_and_carry_the_ttl(redis_server: RedisServer) -> None:
    prefix = f"ns-{uuid.uuid4().hex}:"
    config = SessionStoreConfig(backend="redis", url=redis_server.url, key_prefix=prefix, ttl=2)
    store = RedisSessionStore(config)
    raw = Redis.from_url(redis_server.url)
    try:
        await store.append_turn("chat:42", turn(0))
        await store.add_window_score("chat:42", "m", 1.0, turn_index=0)
        keys = sorted(
            k.decode() if isinstance(k, bytes) else k for k in await raw.keys(f"{prefix}*")
        )
        assert keys == [f"{prefix}chat:42:scores", f"{prefix}chat:42:turns"]
        for key in keys:
            assert 0 < await raw.pttl(key) <= 2000
        assert await raw.type(f"{prefix}chat:42:turns") == b"zset"
        await raw.pexpire(f"{prefix}chat:42:turns", 100_000)
        await store.add_window_score("chat:42", "m", 0.5)  # a write re-arms both keys
        assert 0 < await raw.pttl(f"{prefix}chat:42:turns") <= 2000
    finally:
        await store.aclose()
        await raw.aclose()


@pytest.mark.services
async def test_replicas_number_a_session_the_same(redis_server: RedisServer) -> None:
    """Two collectors on one Redis, each getting some turns of a session, out of order:
    every answer numbers the turns alike, the Redis store being the source of truth."""
    config = SessionStoreConfig(
        backend="redis", url=redis_server.url, key_prefix=f"rep-{uuid.uuid4().hex}:"
    )
    one, two = RedisSessionStore(config), RedisSessionStore(config)
    try:
        await one.append_turn("s", unindexed(2))
        await two.append_turn("s", unindexed(4))
        await one.append_turn("s", unindexed(1))
        kept = await two.append_turn("s", unindexed(3))
        expected = [(1, "span-1"), (2, "span-2"), (3, "span-3"), (4, "span-4")]
        assert numbered(kept) == expected
        assert numbered(await one.get_turns("s")) == expected
        # A score per turn keyed by span id: a retry replaces, another turn adds.
        await one.add_window_score("s", "m", 1.0, turn_index="span-3")
        await two.add_window_score("s", "m", 0.5, turn_index="span-3")
        assert await one.add_window_score("s", "m", 0.25, turn_index="span-4") == (0.75, 2)
    finally:
        await one.aclose()
        await two.aclose()


@pytest.mark.services
async def test_redis_skips_a_corrupt_member(redis_server: RedisServer) -> None:
    prefix = f"bad-{uuid.uuid4().hex}:"
    store = RedisSessionStore(
        SessionStoreConfig(backend="redis", url=redis_server.url, key_prefix=prefix)
    )
    raw = Redis.from_url(redis_server.url)
    try:
        await raw.zadd(f"{prefix}s:turns", {b"{not a turn": 0})
        assert indices(await store.append_turn("s", turn(1))) == [1]
    finally:
        await store.aclose()
        await raw.aclose()


def _closed_port() -> int:
    return free_port()  # nothing listens there


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.append_turn("s", turn(0)),
        lambda s: s.get_turns("s"),
        lambda s: s.add_window_score("s", "m", 1.0),
        lambda s: s.add_window_score("s", "m", 1.0, turn_index=0),
        lambda s: s.get_window_scores("s", "m"),
        lambda s: s.delete_session("s"),
    ],
)
async def test_redis_unreachable_raises_session_store_error(call: Callable[[Any], Any]) -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    store = RedisSessionStore(SessionStoreConfig(backend="redis", url=url, socket_timeout=2))
    try:
        with pytest.raises(SessionStoreError, match=r"session store \(redis redis://127\.0\.0\.1"):
            await call(store)
    finally:
        await store.aclose()


# ------------------------------------------------------------------ config


async def test_config_validation_and_protocol() -> None:
    with pytest.raises(ValidationError, match="URL"):
        SessionStoreConfig(backend="redis", url="http://localhost:6379")
    with pytest.raises(ValidationError):
        SessionStoreConfig.model_validate({"backend": "memcached"})
    with pytest.raises(ValidationError):
        SessionStoreConfig.model_validate({"ttl": 0})
    with pytest.raises(ValidationError, match="extra"):
        SessionStoreConfig.model_validate({"max_turn": 3})
    assert SessionStoreConfig(max_turns=7).effective_max_turns(10) == 7
    assert SessionStoreConfig().effective_max_turns(3) == 6
    assert isinstance(create_session_store(), MemorySessionStore)
    assert isinstance(create_session_store(), SessionStore)
    redis_store = create_session_store(SessionStoreConfig(backend="redis"))
    assert isinstance(redis_store, RedisSessionStore)
    assert isinstance(redis_store, SessionStore)
    await redis_store.aclose()


def test_turn_model_is_strict() -> None:
    with pytest.raises(ValidationError):
        SessionTurn.model_validate({"turn_index": 0, "trace_id": "t", "span_id": "s"})
    with pytest.raises(ValidationError):
        TurnContext.model_validate({"content": "x", "extra": 1})
    assert TurnContext.model_validate({"id": 7, "content": "x"}).id == "7"
