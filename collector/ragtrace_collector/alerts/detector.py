"""The built-in drop detector.

Feed it every metric result with :meth:`DropDetector.observe` (skipped and errored
results carry ``score=None`` and are ignored: "nothing to score" must never look like
a drop).  :meth:`DropDetector.evaluate`, run periodically by :meth:`DropDetector.run`,
tests each rule for each service and notifies on transitions.

For each ``(rule, service)`` the detector keeps time buckets of ``(n, mean, M2)``:

* fine buckets, ``window / 20`` wide, covering the current window (these also keep
  the few lowest-scoring trace ids, for the notification's examples);
* coarse buckets, ``baseline / 96`` wide, covering the trailing baseline.  A fine
  bucket is folded into its coarse bucket only once it has left the current window,
  so the baseline never contains the window it is compared with.

Memory is therefore bounded by ``rules x services x (20 + 97)`` small buckets, whatever
the traffic; ``max_services_per_rule`` bounds the services.  The window edge is
quantised to one fine bucket (5% of the window), the far edge of the baseline to one
coarse bucket (about 1% of it).

A rule for a service fires when, at an evaluation:

1. the window holds at least ``min_samples`` scores (and a trailing baseline at least
   its minimum);
2. the window's mean is below the baseline by at least ``drop``; and
3. a one-sided test says the drop is real at ``confidence``: Welch's t-test against a
   trailing baseline, a one-sample t-test against a fixed one.  By default
   (``test_margin``) the null hypothesis is "the true drop is at most ``drop``", so the
   test asks whether the drop *of at least ``drop``* is real.  The detector re-tests
   every evaluation, and under that repetition a test against "no drop" alone lets
   ordinary noise through now and then (0/1-valued scores are the worst case); the
   margin keeps noise at the baseline level from paging while a real drop of about
   twice ``drop`` fires within a window or two;

and that has held at every evaluation for ``for``.  It resolves when the observed drop
shrinks below ``drop - hysteresis``.  With too few samples the state does not move:
pending resets, firing stays firing (absence of evidence is not a recovery).

**Restarts.** All state is in memory.  After a restart the detector knows nothing: it
stays silent until the window and the baseline have their minimum samples again
(a trailing baseline is then shorter than configured until it has filled up), and an
alert that was firing is forgotten.  Alertmanager resolves such an alert by itself
once its ``endsAt`` (a few resend intervals) passes, unless the new process fires it
again first.

**Replicas.** Each replica sees only the traces routed to it, so each detector alerts
on its own shard: consistent trace-id routing makes every shard a random sample of the
traffic, with fewer samples than the whole.  Alerts of several replicas with the same
labels merge in Alertmanager (add a ``replica`` label to the Alertmanager notifier to
keep them apart).  The Prometheus rules shipped in ``docker/`` aggregate
``ragtrace_eval_score`` over all replicas and are the global view.

**Notifier outages.** Each notifier retries a post itself (``max_attempts``).  When
every attempt failed, the failure is counted
(``ragtrace_alert_notifications{outcome="error"}``), the notifier's status goes to
``recoverable_error``, and a transition-only notifier (webhook) gets the event again,
in order, at the next evaluations (at most ``_MAX_UNSENT`` kept per notifier);
Alertmanager gets the firing alert at its next resend anyway.  Nothing else waits on a
notifier: scoring, export and the other notifiers go on.

Thread safety: ``observe`` and ``evaluate`` share a lock, so ``observe`` may be called
from any thread; notifications are sent from the event loop running ``evaluate``.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import structlog

from ragtrace_collector.alerts.config import AlertsConfig, DropRule, TrailingBaseline
from ragtrace_collector.alerts.events import AlertEvent
from ragtrace_collector.alerts.notifiers import Notifier, build_notifiers
from ragtrace_collector.alerts.stats import Summary, TestResult, one_sample_less, welch_less
from ragtrace_collector.service.component import Component, Status
from ragtrace_collector.service.telemetry import Telemetry

__all__ = ["DetectorStatus", "DropDetector", "RuleStatus"]

_log = structlog.get_logger("ragtrace.alerts")

_FINE_PER_WINDOW = 20
_COARSE_PER_BASELINE = 96
_EPS = 1e-12
#: Transitions kept per notifier while its target is down (the oldest go first).
_MAX_UNSENT = 100

Phase = Literal["inactive", "pending", "firing"]


class _Bucket:
    __slots__ = ("examples", "summary")

    def __init__(self) -> None:
        self.summary = Summary()
        #: max-heap (by score) of the lowest scores: (-score, seq, trace_id)
        self.examples: list[tuple[float, int, str]] = []


@dataclass(slots=True)
class _Series:
    """Scores and alert state of one (rule, service)."""

    fine: dict[int, _Bucket] = field(default_factory=dict)
    coarse: dict[int, Summary] = field(default_factory=dict)
    #: Fine buckets below this index have been folded into the coarse ones.
    fold_below: int = -(2**62)
    phase: Phase = "inactive"
    pending_since: float | None = None
    firing_event: AlertEvent | None = None
    #: notifier name -> time of the last successful send of the firing alert
    last_sent: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RuleStatus:
    """The detector's view of one (rule, service) at its last evaluation."""

    rule: str
    service: str
    phase: Phase
    window_count: int
    window_mean: float | None
    baseline_count: int | None
    baseline: float | None
    p_value: float | None


@dataclass(frozen=True, slots=True)
class _Comparison:
    """The window against its baseline, when both have enough samples."""

    baseline: float
    test: TestResult
    #: observed drop, baseline - window mean (score points)
    drop: float
    #: the rule's drop and hysteresis, in score points
    threshold: float
    hysteresis: float


@dataclass(frozen=True, slots=True)
class _Measurement:
    window: Summary
    baseline_value: float | None
    baseline_count: int | None
    comparison: _Comparison | None
    examples: tuple[str, ...]


class _RuleRuntime:
    __slots__ = ("coarse_width", "fine_width", "rule", "series", "warned_cap")

    def __init__(self, rule: DropRule) -> None:
        self.rule = rule
        self.fine_width = rule.window / _FINE_PER_WINDOW
        if isinstance(rule.baseline, TrailingBaseline):
            self.coarse_width = max(rule.baseline.window / _COARSE_PER_BASELINE, self.fine_width)
        else:
            self.coarse_width = 0.0
        self.series: dict[str, _Series] = {}
        self.warned_cap = False

    @property
    def trailing(self) -> TrailingBaseline | None:
        b = self.rule.baseline
        return b if isinstance(b, TrailingBaseline) else None


class DetectorStatus(Component):
    """The detector's component, ``alerts:detector``: ``ok`` after an evaluation,
    ``recoverable_error`` after one that raised (logged with its traceback by
    :meth:`DropDetector.run`, counted here in ``ragtrace_component_failures_total``;
    the loop goes on and the next good evaluation reports ``ok``), ``stopped`` once
    the detector is closed."""

    component_name = "alerts:detector"

    def __init__(self) -> None:
        #: Evaluations that raised.
        self.failures = 0

    def failed(self, exc: Exception) -> None:
        self.failures += 1
        if self._host is not None:
            self._host.failed(self)
        self.report(Status.RECOVERABLE_ERROR, exc)


class DropDetector:
    """Statistically tested score-drop alerts, per rule and service.

    ``telemetry`` (optional) gets ``ragtrace_alert_firing{rule,metric}`` (the number
    of services the rule is firing for) and ``ragtrace_alert_notifications``.
    ``clock`` returns Unix seconds; tests inject a fake one.  :attr:`component` is its
    status for the service's health (see :class:`DetectorStatus`).
    """

    def __init__(
        self,
        config: AlertsConfig,
        notifiers: Sequence[Notifier] = (),
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._notifiers = list(notifiers)
        self._telemetry = telemetry
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self.component = DetectorStatus()
        #: notifier name -> transitions it failed to deliver, sent again in order.
        self._unsent: dict[str, deque[AlertEvent]] = {}
        self._rules = [_RuleRuntime(rule) for rule in (config.rules if config.enabled else [])]
        self._by_metric: dict[str, list[_RuleRuntime]] = {}
        for runtime in self._rules:
            self._by_metric.setdefault(runtime.rule.metric, []).append(runtime)
        if telemetry is not None:
            for runtime in self._rules:
                telemetry.alert_firing.labels(
                    rule=runtime.rule.name, metric=runtime.rule.metric
                ).set(0)

    @classmethod
    def from_config(
        cls,
        config: AlertsConfig,
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> DropDetector:
        """A detector with the notifiers the config enables."""
        return cls(config, build_notifiers(config), telemetry, clock)

    @property
    def config(self) -> AlertsConfig:
        return self._config

    @property
    def notifiers(self) -> list[Notifier]:
        return list(self._notifiers)

    # ------------------------------------------------------------------ input
    def observe(
        self,
        service: str,
        metric: str,
        score: float | None,
        trace_id: str | None = None,
        at: float | None = None,
    ) -> None:
        """Record one metric result.  ``score=None`` (skipped or errored) is ignored,
        as are non-finite scores.  ``at`` defaults to now and is clamped to now."""
        if score is None:
            return
        runtimes = self._by_metric.get(metric)
        if not runtimes:
            return
        value = float(score)
        if not math.isfinite(value):
            return
        now = self._clock()
        t = now if at is None or at > now else at
        with self._lock:
            self._seq += 1
            for runtime in runtimes:
                rule = runtime.rule
                if rule.service is not None and rule.service != service:
                    continue
                series = runtime.series.get(service)
                if series is None:
                    if len(runtime.series) >= self._config.max_services_per_rule:
                        if not runtime.warned_cap:
                            runtime.warned_cap = True
                            _log.warning(
                                "alert_series_cap",
                                rule=rule.name,
                                max_services=self._config.max_services_per_rule,
                                ignored_service=service,
                            )
                        continue
                    series = runtime.series[service] = _Series()
                self._add(runtime, series, value, trace_id, t, now)

    def _add(
        self,
        runtime: _RuleRuntime,
        series: _Series,
        value: float,
        trace_id: str | None,
        t: float,
        now: float,
    ) -> None:
        idx = math.floor(t / runtime.fine_width)
        if idx < series.fold_below:
            trailing = runtime.trailing
            if trailing is None:
                return  # before the window of a fixed-baseline rule: irrelevant
            if t < now - runtime.rule.window - trailing.window:
                return  # older than the baseline
            cidx = math.floor(t / runtime.coarse_width)
            series.coarse.setdefault(cidx, Summary()).add(value)
            return
        bucket = series.fine.get(idx)
        if bucket is None:
            bucket = series.fine[idx] = _Bucket()
            if len(series.fine) > _FINE_PER_WINDOW + 2:
                self._compact(runtime, series, now)
        bucket.summary.add(value)
        keep = self._config.example_trace_ids
        if trace_id and keep:
            item = (-value, self._seq, trace_id)
            if len(bucket.examples) < keep:
                heapq.heappush(bucket.examples, item)
            elif value < -bucket.examples[0][0]:
                heapq.heapreplace(bucket.examples, item)

    def _compact(self, runtime: _RuleRuntime, series: _Series, now: float) -> None:
        """Fold fine buckets that left the window into the baseline; drop old data."""
        cur = math.floor(now / runtime.fine_width)
        start = cur - _FINE_PER_WINDOW + 1
        trailing = runtime.trailing
        for idx in [i for i in series.fine if i < start]:
            bucket = series.fine.pop(idx)
            if trailing is not None and bucket.summary.n:
                cidx = math.floor(idx * runtime.fine_width / runtime.coarse_width)
                series.coarse.setdefault(cidx, Summary()).merge(bucket.summary)
        series.fold_below = max(series.fold_below, start)
        if trailing is not None:
            horizon = start * runtime.fine_width - trailing.window
            for cidx in [c for c in series.coarse if (c + 1) * runtime.coarse_width <= horizon]:
                del series.coarse[cidx]

    # ------------------------------------------------------------- evaluation
    def _measure(self, runtime: _RuleRuntime, series: _Series, now: float) -> _Measurement:
        rule = runtime.rule
        self._compact(runtime, series, now)
        cur = math.floor(now / runtime.fine_width)
        in_window = [b for i, b in series.fine.items() if i <= cur]
        window = Summary.merged(b.summary for b in in_window)
        worst = heapq.nsmallest(
            self._config.example_trace_ids,
            ((-neg, seq, tid) for b in in_window for neg, seq, tid in b.examples),
        )
        examples = tuple(dict.fromkeys(tid for _, _, tid in worst))
        base: Summary | None = None
        if isinstance(rule.baseline, TrailingBaseline):
            base = Summary.merged(series.coarse.values())
            baseline_value: float | None = base.mean if base.n else None
            baseline_count: int | None = base.n
            baseline_ok = base.n >= max(rule.baseline_min_samples, 2)
        else:
            baseline_value = rule.baseline.value
            baseline_count = None
            baseline_ok = True
        if window.n < rule.min_samples or not baseline_ok or baseline_value is None:
            return _Measurement(window, baseline_value, baseline_count, None, examples)
        threshold = rule.drop.amount(baseline_value)
        margin = threshold if rule.test_margin else 0.0
        test = (
            one_sample_less(window, baseline_value, margin)
            if base is None
            else welch_less(window, base, margin)
        )
        hysteresis = rule.hysteresis_value
        if rule.drop.kind == "relative":
            hysteresis *= abs(baseline_value)
        comparison = _Comparison(
            baseline=baseline_value,
            test=test,
            drop=baseline_value - window.mean,
            threshold=threshold,
            hysteresis=hysteresis,
        )
        return _Measurement(window, baseline_value, baseline_count, comparison, examples)

    def _event(
        self,
        runtime: _RuleRuntime,
        service: str,
        m: _Measurement,
        c: _Comparison,
        status: Literal["firing", "resolved"],
        started_at: float,
        now: float,
        *,
        repeat: bool = False,
    ) -> AlertEvent:
        rule = runtime.rule
        trailing = runtime.trailing
        return AlertEvent(
            status=status,
            rule=rule.name,
            metric=rule.metric,
            service=service,
            window_seconds=rule.window,
            window_mean=m.window.mean,
            sample_count=m.window.n,
            baseline=c.baseline,
            baseline_kind="trailing" if trailing is not None else "fixed",
            baseline_window_seconds=trailing.window if trailing is not None else None,
            baseline_sample_count=m.baseline_count,
            drop=c.drop,
            drop_threshold=c.threshold,
            p_value=c.test.p_value,
            confidence=rule.confidence,
            example_trace_ids=m.examples,
            started_at=started_at,
            evaluated_at=now,
            ended_at=now if status == "resolved" else None,
            labels={"severity": rule.severity, **rule.labels},
            repeat=repeat,
        )

    def _step(
        self, runtime: _RuleRuntime, service: str, series: _Series, now: float
    ) -> tuple[AlertEvent | None, _Measurement]:
        """Advance one series' state machine; return its transition, if any."""
        rule = runtime.rule
        m = self._measure(runtime, series, now)
        c = m.comparison
        if c is None:  # too few samples: pending resets, firing holds
            if series.phase == "pending":
                series.phase, series.pending_since = "inactive", None
            return None, m
        firing = series.firing_event
        if series.phase == "firing" and firing is not None:
            if c.drop < c.threshold - c.hysteresis - _EPS:
                event = self._event(runtime, service, m, c, "resolved", firing.started_at, now)
                series.phase, series.pending_since, series.firing_event = "inactive", None, None
                return event, m
            series.firing_event = self._event(
                runtime, service, m, c, "firing", firing.started_at, now, repeat=True
            )
            return None, m
        dropped = c.drop >= c.threshold - _EPS and c.test.p_value <= 1.0 - rule.confidence
        if not dropped:
            series.phase, series.pending_since = "inactive", None
            return None, m
        since = series.pending_since if series.phase == "pending" else None
        if since is None:
            since = now
        series.phase, series.pending_since = "pending", since
        if now - since >= rule.for_ - _EPS:
            series.phase = "firing"
            series.last_sent = {}
            series.firing_event = self._event(runtime, service, m, c, "firing", since, now)
            return series.firing_event, m
        return None, m

    async def evaluate(self, now: float | None = None) -> list[AlertEvent]:
        """Test every rule for every service; send notifications; return the
        transitions (firing and resolved events) of this evaluation."""
        when = self._clock() if now is None else now
        transitions: list[AlertEvent] = []
        sends: list[tuple[Notifier, AlertEvent, _Series | None]] = []
        with self._lock:
            for runtime in self._rules:
                firing_count = 0
                for service, series in list(runtime.series.items()):
                    event, _ = self._step(runtime, service, series, when)
                    if event is not None:
                        transitions.append(event)
                        for notifier in self._notifiers:
                            sends.append(
                                (notifier, event, series if event.status == "firing" else None)
                            )
                    if series.phase == "firing":
                        firing_count += 1
                        if event is None and series.firing_event is not None:
                            for notifier in self._notifiers:
                                interval = notifier.resend_interval
                                last = series.last_sent.get(notifier.name)
                                if interval is not None and (
                                    last is None or when - last >= interval - _EPS
                                ):
                                    sends.append((notifier, series.firing_event, series))
                    elif series.phase == "inactive" and not series.fine and not series.coarse:
                        del runtime.series[service]  # idle: free it
                if self._telemetry is not None:
                    self._telemetry.alert_firing.labels(
                        rule=runtime.rule.name, metric=runtime.rule.metric
                    ).set(firing_count)
        await self._send_unsent(when)
        # Behind a notifier's unsent backlog, new transitions wait their turn (in order).
        ready: list[tuple[Notifier, AlertEvent, _Series | None]] = []
        for send in sends:
            backlog = self._unsent.get(send[0].name)
            if backlog and send[0].resend_interval is None:
                self._queue_unsent(send[0], send[1])
            else:
                ready.append(send)
        sends = ready
        if sends:
            await asyncio.gather(*(self._send(n, e, s, when) for n, e, s in sends))
        return transitions

    def _queue_unsent(self, notifier: Notifier, event: AlertEvent) -> None:
        queue = self._unsent.setdefault(notifier.name, deque(maxlen=_MAX_UNSENT))
        if len(queue) == queue.maxlen:
            lost = queue[0]
            _log.error(
                "alert_notification_dropped",
                notifier=notifier.name,
                rule=lost.rule,
                service=lost.service,
                status=lost.status,
                detail=f"more than {_MAX_UNSENT} notifications waiting for a target that is down",
            )
        queue.append(event)

    async def _send_unsent(self, when: float) -> None:
        """Send again, in order, the transitions a notifier failed to deliver."""
        for notifier in self._notifiers:
            queue = self._unsent.get(notifier.name)
            if queue and notifier.resend_interval is not None:
                queue.clear()  # it now re-sends firing alerts by itself
            while queue:
                event = queue.popleft()
                before = len(queue)
                await self._send(notifier, event, None, when)
                if len(queue) > before:  # failed again (re-queued at the back): stop
                    queue.rotate(1)  # keep the order: the event goes back to the front
                    break

    async def _send(
        self,
        notifier: Notifier,
        event: AlertEvent,
        series: _Series | None,
        when: float,
    ) -> None:
        try:
            await notifier.notify(event)
        except Exception as exc:
            will_retry = notifier.resend_interval is None
            _log.warning(
                "alert_notification_failed",
                notifier=notifier.name,
                rule=event.rule,
                service=event.service,
                status=event.status,
                error=str(exc),
                retry_at_next_evaluation=will_retry,
            )
            outcome = "error"
            if isinstance(notifier, Component):
                notifier.report(Status.RECOVERABLE_ERROR, str(exc))
            if will_retry:
                # A transition-only notifier would never hear of this alert again.
                self._queue_unsent(notifier, event)
        else:
            outcome = "ok"
            if isinstance(notifier, Component):
                notifier.report_ok()
            if series is not None:
                with self._lock:
                    if series.phase == "firing":
                        series.last_sent[notifier.name] = when
        if self._telemetry is not None:
            self._telemetry.alert_notifications.labels(
                notifier=notifier.name, outcome=outcome
            ).inc()

    # ---------------------------------------------------------------- queries
    def firing(self) -> list[AlertEvent]:
        """The currently firing alerts, with the figures of their last evaluation."""
        with self._lock:
            return [
                s.firing_event
                for r in self._rules
                for s in r.series.values()
                if s.phase == "firing" and s.firing_event is not None
            ]

    def status(self, now: float | None = None) -> list[RuleStatus]:
        """A read-only measurement of every (rule, service), without state changes."""
        when = self._clock() if now is None else now
        out: list[RuleStatus] = []
        with self._lock:
            for runtime in self._rules:
                for service, series in runtime.series.items():
                    m = self._measure(runtime, series, when)
                    out.append(
                        RuleStatus(
                            rule=runtime.rule.name,
                            service=service,
                            phase=series.phase,
                            window_count=m.window.n,
                            window_mean=m.window.mean if m.window.n else None,
                            baseline_count=m.baseline_count,
                            baseline=m.baseline_value,
                            p_value=m.comparison.test.p_value if m.comparison else None,
                        )
                    )
        return out

    # -------------------------------------------------------------- lifecycle
    async def run(self, interval: float | None = None) -> None:
        """Evaluate every ``interval`` seconds (default: the config's
        ``evaluation_interval``) until cancelled.  An evaluation that raises is
        logged, counted and reported on :attr:`component`, and the loop goes on."""
        period = self._config.evaluation_interval if interval is None else interval
        loop = asyncio.get_running_loop()
        while not self._closed:
            started = loop.time()
            try:
                await self.evaluate()
            except Exception as exc:
                _log.exception("alert_evaluation_failed")
                self.component.failed(exc)
            else:
                self.component.report_ok()
            await asyncio.sleep(max(0.0, period - (loop.time() - started)))

    async def aclose(self) -> None:
        """Close the notifiers (idempotent).  State is not persisted."""
        if self._closed:
            return
        self._closed = True
        self.component.report(Status.STOPPED)
        for notifier in self._notifiers:
            try:
                await notifier.aclose()
            except Exception as exc:
                _log.warning("alert_notifier_close_failed", notifier=notifier.name, error=str(exc))
