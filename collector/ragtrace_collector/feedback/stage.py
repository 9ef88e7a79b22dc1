"""The feedback stage: feedback in, joined to the scores, agreement figures out.

* :meth:`FeedbackStage.scored` is an evaluator result listener: every score of an
  evaluated request goes to the join (:mod:`.join`).
* :meth:`FeedbackStage.record` takes one feedback (read from a ``ragtrace.feedback``
  span, whichever way it came in) and returns once the join holds it durably.
* Each joined (score, feedback) pair goes to the tracker (:mod:`.tracker`), whose
  figures are refreshed on a worker thread every ``refresh_interval`` and exported
  as ``ragtrace_feedback_auroc`` and ``ragtrace_feedback_pairs``, and in
  :meth:`FeedbackStage.report` (``GET /feedback``).

**Counting.**  ``ragtrace_feedback_total{service, name, <segments>, outcome}`` counts
each upsert key (request, name, user) once: a user who changes their mind replaces
the pair behind the agreement figures, but is not counted again (the counter keeps
the first outcome).  The segment values are those of the request's scores when they
are held, else ``unset``.  The drop detector's observers hear each key once too.
Feedback with no scores in the window (the request was not sampled, or its scores
expired or were evicted) is counted in ``ragtrace_feedback_unjoined_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from ragtrace_collector.component import Component, Status, Supervisor
from ragtrace_collector.component.lazylog import LazyLogger
from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.join import (
    DropKind,
    JoinEntry,
    JoinStore,
    JoinStoreError,
    Refused,
    create_join_store,
)
from ragtrace_collector.feedback.record import Feedback
from ragtrace_collector.feedback.tracker import AgreementTracker, SeriesFigures, SeriesKey
from ragtrace_collector.segments import OTHER as _OTHER
from ragtrace_collector.segments import UNSET, SegmentKey

if TYPE_CHECKING:
    from ragtrace_collector.component.telemetry import FeedbackMetrics, Telemetry
    from ragtrace_collector.results import MetricResult
    from ragtrace_collector.stores.session import SessionStoreConfig

__all__ = ["FeedbackObserver", "FeedbackStage"]

#: Hears each feedback once per upsert key: (service, feedback name, value in [0, 1],
#: trace id, segment values).  The drop detector's ``observe`` behind a small adapter.
FeedbackObserver = Callable[[str, str, float, str, tuple[str, ...]], None]

#: Scores waiting for the join's worker at most; beyond it the oldest are dropped
#: (counted as evicted requests): the join's backend is far behind.
_MAX_QUEUED_SCORES: Final = 10_000
#: Scores the join's worker writes at once (SQLite commits them together).
_SCORE_BATCH: Final = 32
#: The service label of feedback whose span named none and whose scores are not held.
_NO_SERVICE: Final = "unknown"


class _StageStatus(Component):
    """The ``feedback`` component: ok while the join takes feedback."""

    component_name = "feedback"


class FeedbackStage:
    """Joins feedback to scores and measures their agreement; see the module doc.

    Its status is :attr:`component` (``feedback``); :attr:`components` lists it with
    the join's (``feedback_join``) for the service's host.  (Not a :class:`Component`
    itself: its :meth:`report` is the ``GET /feedback`` JSON.)"""

    def __init__(
        self,
        config: FeedbackConfig,
        *,
        telemetry: Telemetry | None = None,
        segments: Sequence[SegmentKey] = (),
        store: JoinStore | None = None,
        directory: Path | None = None,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        session_store: SessionStoreConfig | None = None,
        supervisor: Supervisor | None = None,
        observers: Sequence[FeedbackObserver] = (),
        clock: Callable[[], float] = time.time,
        refresh_interval: float = 10.0,
    ) -> None:
        self._config = config
        self._clock = clock
        self.component = _StageStatus()
        self._labels = tuple(k.label for k in segments)
        self._unset = (UNSET,) * len(self._labels)
        self._metrics: FeedbackMetrics | None = (
            telemetry.feedback_metrics(self._labels) if telemetry is not None else None
        )
        self._store: JoinStore = (
            store
            if store is not None
            else create_join_store(
                config,
                directory=directory,
                synchronous=synchronous,
                session_store=session_store,
                on_drop=self._dropped,
                clock=clock,
            )
        )
        self._tracker = AgreementTracker(config, clock=clock)
        self._observers = list(observers)
        self._supervisor = supervisor or Supervisor()
        self._tasks: list[asyncio.Task[None]] = []
        self._refresh_interval = refresh_interval
        self._scores: deque[tuple[str, str, str, float, float | None, tuple[str, ...]]] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._gauged: set[SeriesKey] = set()
        self._label_pairs: set[tuple[str, str]] = set()
        self._log = LazyLogger("feedback")
        #: counts for report(): recorded (new keys), replaced, pairs joined, and the
        #: refusals and unjoined feedback by reason.
        self._counts: dict[str, int] = {"recorded": 0, "replaced": 0, "pairs": 0}
        self._invalid: dict[str, int] = {}
        self._unjoined: dict[str, int] = {}
        self._evicted = 0

    # ----------------------------------------------------------------- lifecycle
    @property
    def components(self) -> list[Component]:
        """Every component of the stage, for the service's host."""
        store = self._store
        return [self.component, *([store] if isinstance(store, Component) else [])]

    @property
    def tracker(self) -> AgreementTracker:
        return self._tracker

    @property
    def store(self) -> JoinStore:
        return self._store

    async def start(self) -> None:
        """Open the join (reading back what a previous run held, whose joined pairs go
        back to the tracker) and start the workers.  The tracker itself is not kept:
        after a restart it holds the pairs of requests still in the join's window."""
        now = self._clock()
        for entry in await self._store.start():
            for (service, metric), (score, threshold) in entry.scores.items():
                for feedback in entry.feedback.values():
                    self._pair(service, metric, feedback, entry, score, threshold, now)
        self._tasks = [
            self._supervisor.spawn(self.component, self._score_worker, name="feedback_scores"),
            self._supervisor.spawn(self.component, self._refresh_loop, name="feedback_refresh"),
        ]
        self.component.report(Status.OK)

    async def shutdown(self, grace: float = 5.0) -> None:
        """Let queued scores reach the join (within ``grace`` seconds), then stop."""
        self.component.report(Status.STOPPING)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.drain(), grace)
        # The stage's own tasks stop before the store closes (whoever's supervisor runs them).
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._store.close()
        self.component.report(Status.STOPPED)

    async def drain(self) -> None:
        """Returns once every score handed to :meth:`scored` is in the join."""
        while self._scores or not self._idle.is_set():
            await self._idle.wait()
            await asyncio.sleep(0)

    def add_observer(self, observer: FeedbackObserver) -> None:
        """Hear each new feedback from now on (e.g. the drop detector's
        ``observe_feedback``, built after this stage)."""
        self._observers.append(observer)

    # --------------------------------------------------------------------- input
    def scored(
        self,
        service: str,
        metric: str,
        result: MetricResult,
        trace_id_hex: str,
        labels: tuple[str, ...],
    ) -> None:
        """An evaluator result listener: hold the score for the join.  Skipped and
        errored results (no score) are ignored."""
        score = result.score
        if score is None or not math.isfinite(score):
            return
        if len(self._scores) >= _MAX_QUEUED_SCORES:
            self._scores.popleft()
            self._dropped("scores", 1)
        self._scores.append((trace_id_hex, service, metric, score, result.threshold, labels))
        self._idle.clear()
        self._wake.set()

    async def record(self, feedback: Feedback) -> None:
        """Hold ``feedback`` in the join; returns once it is durable there (with
        storage on; at once otherwise).  Raises :class:`JoinStoreError` when the join's
        backend failed: the feedback is then not held (the caller keeps its log entry).
        A refusal (too many feedback on one request) is counted, not raised."""
        now = self._clock()
        try:
            joined = await self._store.add_feedback(feedback, now)
        except Refused as refused:
            self.invalid(refused.reason)
            return
        except JoinStoreError:
            self.component.report(Status.RECOVERABLE_ERROR, "the feedback join's backend failed")
            raise
        self.component.report_ok()
        entry = joined.entry
        if joined.replaced:
            self._counts["replaced"] += 1
        else:
            self._count_new(feedback, entry)
        for (service, metric), (score, threshold) in entry.scores.items():
            self._pair(service, metric, feedback, entry, score, threshold, now)

    def invalid(self, reason: str) -> None:
        """Count one feedback refused before it reached the join (a bad field, a flood)."""
        self._invalid[reason] = self._invalid.get(reason, 0) + 1
        if self._metrics is not None:
            self._metrics.invalid.labels(reason).inc()

    # -------------------------------------------------------------------- output
    def report(self) -> dict[str, Any]:
        """The JSON of ``GET /feedback``: the series ranked by AUROC (highest first;
        those without one last), the windows, the bounds and the counts."""
        series = sorted(self._tracker.figures(), key=_rank)
        scored, pending = self._store.held()
        config = self._config
        return {
            "window_s": config.window,
            "agreement_window_s": config.agreement_window,
            "held": {"scores": scored, "pending": pending},
            "bounds": {
                "max_requests": config.max_requests,
                "max_pending": config.max_pending,
                "max_pairs": config.max_pairs,
                "max_series": config.max_series,
            },
            "counts": {
                **self._counts,
                "evicted_requests": self._evicted,
                "series_refused": self._tracker.refused,
                "invalid": dict(self._invalid),
                "unjoined": dict(self._unjoined),
            },
            "series": [s.as_dict(self._labels) for s in series],
        }

    async def refresh(self) -> list[SeriesFigures]:
        """Expire the join, recompute the changed series on a worker thread, and set
        the gauges; the figures."""
        await self._store.expire(self._clock())
        figures = await asyncio.to_thread(self._tracker.refresh)
        self._gauge(figures)
        return figures

    # ------------------------------------------------------------------ internal
    def _pair(
        self,
        service: str,
        metric: str,
        feedback: Feedback,
        entry: JoinEntry,
        score: float,
        threshold: float | None,
        now: float,
    ) -> None:
        key: SeriesKey = (service, metric, feedback.name, entry.labels)
        pair = (feedback.trace_id, feedback.user_id or "")
        if self._tracker.add(key, pair, score, feedback.value, threshold, now):
            self._counts["pairs"] += 1
        elif self._metrics is not None:
            self._metrics.series_refused.inc()

    def _count_new(self, feedback: Feedback, entry: JoinEntry) -> None:
        self._counts["recorded"] += 1
        labels = entry.labels if entry.scored and len(entry.labels) == len(self._labels) else None
        values = labels if labels is not None else self._unset
        service = feedback.service or next(iter(entry.scores), (_NO_SERVICE, ""))[0]
        if self._metrics is not None:
            shown_service, shown_name = self._counted_as(service, feedback.name)
            self._metrics.total.labels(shown_service, shown_name, *values, feedback.outcome).inc()
        for observe in self._observers:
            try:
                observe(service, feedback.name, feedback.value, feedback.trace_id, values)
            except Exception as exc:
                self._log.error("feedback_observer_failed", error=repr(exc))

    def _counted_as(self, service: str, name: str) -> tuple[str, str]:
        """The labels of ``ragtrace_feedback_total`` for (service, name): as they are for
        the first ``max_series`` pairs seen, ``other`` beyond (both come from clients,
        so their number is bounded like the tracker's series)."""
        key = (service, name)
        if key in self._label_pairs:
            return key
        if len(self._label_pairs) < self._config.max_series:
            self._label_pairs.add(key)
            return key
        return _OTHER, _OTHER

    async def _score_worker(self) -> None:
        queue = self._scores
        while True:
            if not queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            # A batch written concurrently: with SQLite, its writes share one commit.
            batch = list(itertools.islice(queue, _SCORE_BATCH))
            # The last score of a (request, service, metric) in the batch wins, whatever
            # order concurrent writes land in.
            latest = list({(b[0], b[1], b[2]): b for b in batch}.values())
            now = self._clock()
            entries = await asyncio.gather(
                *(
                    self._store.add_score(trace_id, (service, metric), (score, limit), labels, now)
                    for trace_id, service, metric, score, limit, labels in latest
                )
            )
            # Only once held (a restarted worker writes the batch again: an upsert).  The
            # queue's head may have lost some of them to its bound meanwhile.
            written = {id(item) for item in batch}
            while queue and id(queue[0]) in written:
                queue.popleft()
            for (_, service, metric, score, limit, _), entry in zip(latest, entries, strict=True):
                for feedback in entry.feedback.values():
                    self._pair(service, metric, feedback, entry, score, limit, now)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval)
            await self.refresh()

    def _gauge(self, figures: list[SeriesFigures]) -> None:
        metrics = self._metrics
        if metrics is not None:
            scored, pending = self._store.held()
            metrics.held.labels("scores").set(scored)
            metrics.held.labels("pending").set(pending)
        live: set[SeriesKey] = set()
        for item in figures:
            service, metric, name, values = item.key
            if len(values) != len(self._labels):
                continue
            live.add(item.key)
            if metrics is None:
                continue
            labels = (service, metric, name, *values)
            metrics.pairs.labels(*labels).set(item.figures.pairs)
            if item.figures.auroc is not None:
                metrics.auroc.labels(*labels).set(item.figures.auroc)
            else:
                with contextlib.suppress(KeyError):
                    metrics.auroc.remove(*labels)
        if metrics is not None:
            for key in self._gauged - live:
                service, metric, name, values = key
                for gauge in (metrics.auroc, metrics.pairs):
                    with contextlib.suppress(KeyError):
                        gauge.remove(service, metric, name, *values)
        self._gauged = live

    def _dropped(self, kind: DropKind, count: int) -> None:
        if kind == "scores":
            self._evicted += count
            if self._metrics is not None:
                self._metrics.evicted.inc(count)
            return
        reason = "expired" if kind == "expired" else "evicted"
        self._unjoined[reason] = self._unjoined.get(reason, 0) + count
        if self._metrics is not None:
            self._metrics.unjoined.labels(reason).inc(count)


def _rank(item: SeriesFigures) -> tuple[int, float, str, str, str]:
    auroc = item.figures.auroc
    service, metric, name, _ = item.key
    return (auroc is None, -(auroc or 0.0), service, metric, name)
