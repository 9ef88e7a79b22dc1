"""The feedback join and stage: either order joins, upserts replace, bounds hold,
SQLite survives a restart, Redis joins across replicas."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.feedback.config import MAX_FEEDBACK_PER_REQUEST, FeedbackConfig
from ragtrace_collector.feedback.memory import SQLITE_FILE
from ragtrace_collector.feedback.record import Feedback
from ragtrace_collector.feedback.stage import FeedbackStage
from ragtrace_collector.results import MetricResult
from ragtrace_collector.segments import SegmentKey
from ragtrace_collector.stores.session import SessionStoreConfig
from tests.fakes.redis_server import RedisServer

TRACE = "0af7651916cd43dd8448eb211c80319c"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def trace(i: int) -> str:
    return f"{i + 1:032x}"


def result(metric: str, score: float | None, threshold: float = 0.5) -> MetricResult:
    return MetricResult(metric=metric, score=score, threshold=threshold)


def fb(
    trace_id: str = TRACE, value: float = 0.0, *, user: str | None = "u1", **kw: Any
) -> Feedback:
    kw.setdefault("name", "user_feedback")
    return Feedback(
        trace_id=trace_id,
        span_id=None,
        value=value,
        value_type="boolean",
        user_id=user,
        service="shop",
        **kw,
    )


class Maker:
    """Stages on one backend, sharing a clock (and a Redis prefix or a directory)."""

    def __init__(self, kind: str, tmp: Path, server: RedisServer | None) -> None:
        self.kind = kind
        self.tmp = tmp
        self.server = server
        self.clock = Clock()
        self.prefix = f"test:{uuid.uuid4().hex}:"
        self.stages: list[FeedbackStage] = []

    async def make(
        self, telemetry: Telemetry | None = None, segments: tuple[str, ...] = (), **config: Any
    ) -> FeedbackStage:
        session = None
        if self.server is not None:
            session = SessionStoreConfig(backend="redis", url=self.server.url)
            config.setdefault("key_prefix", self.prefix)
        stage = FeedbackStage(
            FeedbackConfig.model_validate(config),
            telemetry=telemetry,
            segments=[SegmentKey(key=k) for k in segments],
            directory=self.tmp if self.kind == "sqlite" else None,
            session_store=session,
            clock=self.clock,
            refresh_interval=3600,
        )
        await stage.start()
        self.stages.append(stage)
        return stage

    async def close(self) -> None:
        for stage in self.stages:
            await stage.shutdown(1.0)


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.services)])
async def maker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Maker]:
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    m = Maker(request.param, tmp_path, server)
    yield m
    await m.close()


async def score(stage: FeedbackStage, trace_id: str, metric: str, value: float, **kw: Any) -> None:
    stage.scored("shop", metric, result(metric, value), trace_id, kw.get("labels", ()))
    await stage.drain()


def pairs(stage: FeedbackStage, metric: str, name: str = "user_feedback") -> dict[Any, Any]:
    return stage.tracker.pairs(("shop", metric, name, ()))


async def test_feedback_after_scores_joins_every_metric(maker: Maker) -> None:
    stage = await maker.make()
    await score(stage, TRACE, "faithfulness", 0.9)
    await score(stage, TRACE, "contextual_recall", 0.2)
    await stage.record(fb(value=0.0))
    assert pairs(stage, "faithfulness") == {(TRACE, "u1"): (0.9, 0.0)}
    assert pairs(stage, "contextual_recall") == {(TRACE, "u1"): (0.2, 0.0)}


async def test_feedback_before_scores_waits_for_them(maker: Maker) -> None:
    stage = await maker.make()
    await stage.record(fb(value=1.0))
    assert stage.store.held() == (0, 1)
    assert pairs(stage, "faithfulness") == {}
    await score(stage, TRACE, "faithfulness", 0.7)
    assert pairs(stage, "faithfulness") == {(TRACE, "u1"): (0.7, 1.0)}
    assert stage.store.held() == (1, 0)


async def test_a_repeat_replaces_the_pair_and_is_counted_once(maker: Maker) -> None:
    telemetry = Telemetry(CollectorRegistry())
    stage = await maker.make(telemetry)
    await score(stage, TRACE, "faithfulness", 0.4)
    await stage.record(fb(value=1.0))
    await stage.record(fb(value=0.0))
    await stage.record(fb(value=1.0, user="u2"))
    assert pairs(stage, "faithfulness") == {
        (TRACE, "u1"): (0.4, 0.0),
        (TRACE, "u2"): (0.4, 1.0),
    }
    counts = stage.report()["counts"]
    assert (counts["recorded"], counts["replaced"]) == (2, 1)
    total = telemetry.registry.get_sample_value(
        "ragtrace_feedback_total",
        {"service": "shop", "name": "user_feedback", "outcome": "positive"},
    )
    assert total == 2.0


async def test_too_many_feedback_on_one_request_are_refused_and_counted(maker: Maker) -> None:
    stage = await maker.make()
    for i in range(MAX_FEEDBACK_PER_REQUEST + 3):
        await stage.record(fb(user=f"u{i}"))
    await stage.record(fb(user="u0", value=1.0))  # a repeat still replaces
    assert stage.report()["counts"]["invalid"] == {"too many feedback for one request": 3}
    await score(stage, TRACE, "faithfulness", 0.5)
    assert len(pairs(stage, "faithfulness")) == MAX_FEEDBACK_PER_REQUEST


async def test_pending_feedback_is_bounded_oldest_first(maker: Maker) -> None:
    stage = await maker.make(max_pending=3)
    for i in range(5):
        maker.clock.now += 1
        await stage.record(fb(trace(i)))
    assert stage.store.held() == (0, 3)
    assert stage.report()["counts"]["unjoined"] == {"evicted": 2}
    for i in range(5):
        await score(stage, trace(i), "faithfulness", 0.5)
    assert {k[0] for k in pairs(stage, "faithfulness")} == {trace(2), trace(3), trace(4)}


async def test_scored_requests_are_bounded_oldest_first(maker: Maker) -> None:
    stage = await maker.make(max_requests=2)
    for i in range(4):
        maker.clock.now += 1
        await score(stage, trace(i), "faithfulness", 0.5)
    assert stage.store.held() == (2, 0)
    assert stage.report()["counts"]["evicted_requests"] == 2


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_expired_feedback_is_counted_unjoined(kind: str, tmp_path: Path) -> None:
    m = Maker(kind, tmp_path, None)
    try:
        stage = await m.make(window=60)
        await stage.record(fb())
        m.clock.now += 61
        await stage.refresh()
        assert stage.store.held() == (0, 0)
        assert stage.report()["counts"]["unjoined"] == {"expired": 1}
        await score(stage, TRACE, "faithfulness", 0.5)
        assert pairs(stage, "faithfulness") == {}
    finally:
        await m.close()


async def test_sqlite_keeps_the_join_across_a_restart(tmp_path: Path) -> None:
    m = Maker("sqlite", tmp_path, None)
    stage = await m.make()
    await score(stage, trace(0), "faithfulness", 0.3, labels=())
    await stage.record(fb(trace(1), value=1.0))
    await stage.shutdown(1.0)
    m.stages.clear()
    assert (tmp_path / SQLITE_FILE).exists()
    again = await m.make()
    try:
        assert again.store.held() == (1, 1)
        await again.record(fb(trace(0), value=0.0))
        await score(again, trace(1), "faithfulness", 0.8)
        assert pairs(again, "faithfulness") == {
            (trace(0), "u1"): (0.3, 0.0),
            (trace(1), "u1"): (0.8, 1.0),
        }
        # The repeat of a key recorded before the restart still replaces it.
        await again.record(fb(trace(1), value=0.0))
        assert again.report()["counts"]["replaced"] == 1
    finally:
        await m.close()


@pytest.mark.services
async def test_any_replica_joins_with_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    m = Maker("redis", tmp_path, redis_server)
    try:
        a = await m.make()
        b = await m.make()
        await score(a, TRACE, "faithfulness", 0.6)
        await b.record(fb(value=0.0))
        assert pairs(b, "faithfulness") == {(TRACE, "u1"): (0.6, 0.0)}
        await b.record(fb(trace(5), value=1.0))
        await score(a, trace(5), "faithfulness", 0.1)
        assert pairs(a, "faithfulness") == {(trace(5), "u1"): (0.1, 1.0)}
    finally:
        await m.close()


async def test_segments_label_the_counter_and_the_series() -> None:
    telemetry = Telemetry(CollectorRegistry())
    m = Maker("memory", Path("."), None)
    try:
        stage = await m.make(telemetry, segments=("deployment.environment",))
        await stage.record(fb(trace(0), value=0.0))  # no scores yet: unset
        stage.scored("shop", "faithfulness", result("faithfulness", 0.2), trace(1), ("prod",))
        await stage.drain()
        await stage.record(fb(trace(1), value=0.0))
        get = telemetry.registry.get_sample_value
        base = {"service": "shop", "name": "user_feedback", "outcome": "negative"}
        assert get("ragtrace_feedback_total", {**base, "deployment_environment": "unset"}) == 1
        assert get("ragtrace_feedback_total", {**base, "deployment_environment": "prod"}) == 1
        assert stage.tracker.pairs(("shop", "faithfulness", "user_feedback", ("prod",)))
    finally:
        await m.close()


async def test_report_ranks_the_metrics_and_sets_the_gauges() -> None:
    telemetry = Telemetry(CollectorRegistry())
    m = Maker("memory", Path("."), None)
    try:
        stage = await m.make(telemetry)
        for i in range(40):
            negative = i % 2 == 0
            stage.scored("shop", "good", result("good", 0.2 if negative else 0.8), trace(i), ())
            stage.scored("shop", "noise", result("noise", (i * 7 % 10) / 10), trace(i), ())
            await stage.drain()
            await stage.record(fb(trace(i), value=0.0 if negative else 1.0))
        await stage.refresh()
        series = stage.report()["series"]
        assert [s["metric"] for s in series] == ["good", "noise"]
        assert series[0]["auroc"] == 1.0
        assert series[0]["pairs"] == 40
        assert series[0]["kappa"] == 1.0
        assert series[0]["threshold"] == 0.5
        low, high = series[0]["interval"]
        assert low < 1.0 <= high
        labels = {"service": "shop", "metric": "good", "name": "user_feedback"}
        get = telemetry.registry.get_sample_value
        assert get("ragtrace_feedback_auroc", labels) == 1.0
        assert get("ragtrace_feedback_pairs", labels) == 40
    finally:
        await m.close()


async def test_observers_hear_each_key_once() -> None:
    heard: list[tuple[Any, ...]] = []
    stage = FeedbackStage(
        FeedbackConfig(), observers=[lambda *a: heard.append(a)], refresh_interval=3600
    )
    await stage.start()
    try:
        await stage.record(fb(value=0.0))
        await stage.record(fb(value=1.0))
        assert heard == [("shop", "user_feedback", 0.0, TRACE, ())]
    finally:
        await stage.shutdown(1.0)


async def test_the_counter_bounds_its_service_and_name_labels() -> None:
    telemetry = Telemetry(CollectorRegistry())
    m = Maker("memory", Path("."), None)
    try:
        stage = await m.make(telemetry, max_series=2)
        for i in range(4):
            await stage.record(fb(trace(i), value=1.0, name=f"name-{i}"))
        get = telemetry.registry.get_sample_value
        for name in ("name-0", "name-1"):
            labels = {"service": "shop", "name": name, "outcome": "positive"}
            assert get("ragtrace_feedback_total", labels) == 1
        other = {"service": "other", "name": "other", "outcome": "positive"}
        assert get("ragtrace_feedback_total", other) == 2
    finally:
        await m.close()


async def test_a_score_is_kept_while_the_join_backend_fails() -> None:
    """The worker's write fails once (Redis away): the supervisor restarts it and the
    score, still queued, reaches the join; a failed record() raises and holds nothing."""
    from ragtrace_collector.component import Supervisor
    from ragtrace_collector.feedback.join import JoinStoreError
    from ragtrace_collector.feedback.memory import MemoryJoinStore

    class Flaky(MemoryJoinStore):
        fail = 1

        async def add_score(self, *args: Any) -> Any:
            if self.fail:
                self.fail -= 1
                raise JoinStoreError("down")
            return await super().add_score(*args)

        async def add_feedback(self, *args: Any) -> Any:
            if self.fail:
                raise JoinStoreError("down")
            return await super().add_feedback(*args)

    supervisor = Supervisor(initial_backoff=0.01, max_backoff=0.05)
    store = Flaky(FeedbackConfig())
    stage = FeedbackStage(
        FeedbackConfig(), store=store, supervisor=supervisor, refresh_interval=3600
    )
    await stage.start()
    try:
        await score(stage, TRACE, "faithfulness", 0.4)
        assert supervisor.failures == {"feedback_scores": 1}
        await stage.record(fb(value=0.0))
        assert pairs(stage, "faithfulness") == {(TRACE, "u1"): (0.4, 0.0)}
        store.fail = 1
        with pytest.raises(JoinStoreError):
            await stage.record(fb(trace(9)))
        assert await store.get(trace(9)) is None
    finally:
        await stage.shutdown(1.0)
        await supervisor.stop(1.0)


async def test_a_feedback_the_file_refused_is_not_held_and_counts_on_retry(
    tmp_path: Path,
) -> None:
    import sqlite3

    from ragtrace_collector.feedback.join import JoinStoreError
    from ragtrace_collector.feedback.memory import MemoryJoinStore, _Journal

    m = Maker("sqlite", tmp_path, None)
    try:
        stage = await m.make()
        store = stage.store
        assert isinstance(store, MemoryJoinStore)
        original = _Journal.put_feedback

        def broken(self: _Journal, feedback: Feedback) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        _Journal.put_feedback = broken  # type: ignore[method-assign]
        try:
            with pytest.raises(JoinStoreError):
                await stage.record(fb(value=0.0))
        finally:
            _Journal.put_feedback = original  # type: ignore[method-assign]
        assert await store.get(TRACE) is None
        await stage.record(fb(value=0.0))  # the pipeline's retry
        assert stage.report()["counts"]["recorded"] == 1
        assert stage.report()["counts"]["replaced"] == 0
    finally:
        await m.close()


async def test_a_burst_of_scores_is_written_in_batches_the_last_one_winning(
    maker: Maker,
) -> None:
    stage = await maker.make()
    for i in range(300):  # more than one batch; each request scored twice
        for value in (0.1, 0.9):
            stage.scored("shop", "faithfulness", result("faithfulness", value), trace(i), ())
    await stage.drain()
    await stage.refresh()  # held() as counted now (Redis: as its last answer said)
    assert stage.store.held() == (300, 0)
    for i in (0, 150, 299):
        entry = await stage.store.get(trace(i))
        assert entry is not None
        assert entry.scores == {("shop", "faithfulness"): (0.9, 0.5)}
