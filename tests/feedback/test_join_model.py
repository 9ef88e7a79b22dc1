"""The join against a model, on generated sequences (Hypothesis state machine).

Rules: a score of a request, a feedback (repeats of a key included), a restart
(the stage re-opened from its SQLite file), and time passing.  The model keeps, per
side, the entries in the order the store must evict them, and the pairs the join
must have produced.  Invariants, after every step:

* nothing recorded within the window and the bounds is lost, across restarts: the
  store holds every such feedback with its latest value, and every such score;
* each key joins at most once, with the latest values: the tracker holds exactly the
  model's pairs (one per request, user and metric);
* the bounds hold: at most ``max_requests`` scored and ``max_pending`` pending entries.

Checked to fail on broken code (issue 30's report): an upsert that keeps the first
feedback (``entry.feedback.setdefault``), the window trim done after the lookup (an
expired entry written to, then dropped), the journal's delete of an expired trace run
after its new rows (both found as real bugs by this machine), no SQLite write of
feedback, and, on Redis, ``HSETNX`` for the feedback field (no upsert).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.record import Feedback
from ragtrace_collector.feedback.stage import FeedbackStage
from ragtrace_collector.results import MetricResult
from ragtrace_collector.stores.session import SessionStoreConfig
from tests.fakes.redis_server import RedisServer

WINDOW = 100.0
MAX_REQUESTS = 3
MAX_PENDING = 2
TRACES = [f"{i + 1:032x}" for i in range(5)]
USERS = ["a", "b"]
METRICS = ["m1", "m2"]


@dataclass
class _Entry:
    since: float
    scores: dict[str, float] = field(default_factory=dict)
    feedback: dict[str, float] = field(default_factory=dict)


class _Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class JoinMachine(RuleBasedStateMachine):
    """On the memory backend kept in SQLite; :class:`RedisJoinMachine` on Redis."""

    #: Redis URL (the Redis variant), else None.
    redis_url: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"model:{uuid.uuid4().hex}:"
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="feedback-join-"))
        self.clock = _Clock()
        self.config = FeedbackConfig(
            window=WINDOW,
            max_requests=MAX_REQUESTS,
            max_pending=MAX_PENDING,
            agreement_window=10 * WINDOW,
        )
        self.scored: OrderedDict[str, _Entry] = OrderedDict()
        self.pending: OrderedDict[str, _Entry] = OrderedDict()
        #: (metric, trace, user) -> (score, value)
        self.pairs: dict[tuple[str, str, str], tuple[float, float]] = {}
        self.stage = self._open()

    def _open(self) -> FeedbackStage:
        redis = self.redis_url is not None
        stage = FeedbackStage(
            self.config.model_copy(update={"key_prefix": self.prefix}),
            directory=None if redis else self.dir,
            session_store=(
                SessionStoreConfig(backend="redis", url=self.redis_url) if redis else None
            ),
            synchronous="NORMAL",  # no fsync per commit: the file is still re-read
            clock=self.clock,
            refresh_interval=3600,
        )
        self.loop.run_until_complete(stage.start())
        return stage

    def teardown(self) -> None:
        self.loop.run_until_complete(self.stage.shutdown(1.0))
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ model
    def _trim(self) -> None:
        cutoff = self.clock.now - WINDOW
        for side, bound in ((self.scored, MAX_REQUESTS), (self.pending, MAX_PENDING)):
            while side:
                trace_id, oldest = next(iter(side.items()))
                if oldest.since > cutoff and len(side) <= bound:
                    break
                del side[trace_id]

    # ------------------------------------------------------------------ rules
    @rule(trace=st.sampled_from(TRACES), metric=st.sampled_from(METRICS), score=st.integers(0, 9))
    def score(self, trace: str, metric: str, score: int) -> None:
        self.clock.now += 0.001  # distinct times: "oldest" is well defined
        value = score / 10
        result = MetricResult(metric=metric, score=value)
        self.stage.scored("svc", metric, result, trace, ())
        self.loop.run_until_complete(self.stage.drain())
        self._trim()
        entry = self.scored.get(trace)
        if entry is None:
            entry = self.pending.pop(trace, None) or _Entry(self.clock.now)
            entry.since = self.clock.now
            self.scored[trace] = entry
        entry.scores[metric] = value
        self._trim()
        for user, given in entry.feedback.items():
            self.pairs[(metric, trace, user)] = (value, given)

    @rule(trace=st.sampled_from(TRACES), user=st.sampled_from(USERS), value=st.booleans())
    def record(self, trace: str, user: str, value: bool) -> None:
        self.clock.now += 0.001
        given = 1.0 if value else 0.0
        feedback = Feedback(
            trace_id=trace, span_id=None, name="f", value=given, value_type="boolean", user_id=user
        )
        self.loop.run_until_complete(self.stage.record(feedback))
        self._trim()
        entry = self.scored.get(trace) or self.pending.get(trace)
        if entry is None:
            entry = self.pending[trace] = _Entry(self.clock.now)
        entry.feedback[user] = given
        self._trim()
        for metric, score in entry.scores.items():
            self.pairs[(metric, trace, user)] = (score, given)

    @rule()
    def restart(self) -> None:
        self.loop.run_until_complete(self.stage.shutdown(1.0))
        self.stage = self._open()
        if self.redis_url is not None:  # a replica's tracker starts empty
            self.pairs = {}
            self._trim()
            return
        # The tracker is rebuilt from the join: the pairs of the entries still held.
        self.pairs = {
            (metric, trace, user): (score, given)
            for trace, entry in self.scored.items()
            if entry.since > self.clock.now - WINDOW
            for metric, score in entry.scores.items()
            for user, given in entry.feedback.items()
        }
        self._trim()

    # Redis expires a trace's hash by its own (real) clock: the fake one cannot move it.
    @precondition(lambda self: self.redis_url is None)
    @rule(seconds=st.sampled_from([1.0, 30.0, 60.0, WINDOW]))
    def wait(self, seconds: float) -> None:
        self.clock.now += seconds

    # ------------------------------------------------------------- invariants
    @invariant()
    def nothing_held_is_lost(self) -> None:
        store = self.stage.store
        cutoff = self.clock.now - WINDOW
        for side in (self.scored, self.pending):
            for trace, entry in side.items():
                if entry.since <= cutoff:
                    continue  # expired: may linger until the next write
                held = self.loop.run_until_complete(store.get(trace))
                assert held is not None, f"{trace} lost"
                assert {m: s for (_, m), (s, _) in held.scores.items()} == entry.scores
                assert {k[2]: f.value for k, f in held.feedback.items()} == entry.feedback

    @invariant()
    def each_key_joins_once_with_the_latest_values(self) -> None:
        tracker = self.stage.tracker
        found = {
            (metric, trace, user): pair
            for metric in METRICS
            for (trace, user), pair in tracker.pairs(("svc", metric, "f", ())).items()
        }
        assert found == self.pairs

    @invariant()
    def bounds_hold(self) -> None:
        scored, pending = self.stage.store.held()
        assert scored <= MAX_REQUESTS
        assert pending <= MAX_PENDING


_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
JoinMachine.TestCase.settings = _SETTINGS
TestJoin = JoinMachine.TestCase


class RedisJoinMachine(JoinMachine):
    pass


RedisJoinMachine.TestCase.settings = _SETTINGS


@pytest.fixture
def _redis_machine(redis_server: RedisServer) -> Iterator[None]:
    RedisJoinMachine.redis_url = redis_server.url
    yield
    RedisJoinMachine.redis_url = None


@pytest.mark.services
@pytest.mark.usefixtures("_redis_machine")
class TestRedisJoin(RedisJoinMachine.TestCase):  # type: ignore[misc,valid-type]
    pass
