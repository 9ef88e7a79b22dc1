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

Memory is therefore bounded by ``rules x series x (20 + 97)`` small buckets, whatever
the traffic; ``max_services_per_rule`` bounds the services.

**Segments.**  A rule's ``group_by`` (keys of the ``segments:`` config) splits each
service's series by those segment values, passed to :meth:`DropDetector.observe` by the
evaluator (already bounded: each key has at most ``max_values + 2`` values, with
``other`` and ``unset``), so a rule holds at most ``max_services_per_rule x
prod(max_values + 2)`` series; past that bound, new series are ignored and logged once.
An alert names its segment and carries its siblings' figures (the same rule and
service, other values, measured at the same evaluation).  A ``kind: canary`` rule keeps
one window-only series per value of its ``segment`` and tests, in each service, the
candidate value's window against the other side's (one value, or all the others
together) with Welch's one-sided test; the firing state lives in the candidate's
series, with the same ``for`` and hysteresis as a drop rule.  The window edge is
quantised to one fine bucket (5% of the window), the far edge of the baseline to one
coarse bucket (about 1% of it).

A rule for a service fires when, at an evaluation:

1. the window holds at least ``min_samples`` scores (and a trailing baseline at least
   its minimum; a canary rule: each side);
2. the window's mean is below the reference (the baseline, or the canary's other side)
   by at least ``drop``; and
3. with ``test: sequential`` (the default), the series' *evidence* has reached its
   level.  The evidence is a CUSUM: every quarter of a window (a *step*), the step's
   scores add the log likelihood ratio of "the mean is ``drop`` below the reference"
   against "it is not" (Gaussian, with the window's variance), and the sum is never
   let below zero.  Lorden's bound makes the mean time between false alarms of such a
   sum at least ``e**level`` steps, so ``level = ln(false_alarm_interval / step) +
   ln(series compared in the service)`` keeps the rule, in one service, to one false
   page per ``false_alarm_interval`` on unchanged traffic, however often it is
   evaluated and however many segment values it compares.  With ``test: window``, the
   one-sided test of the window (Welch's t against a trailing baseline, one-sample t
   against a fixed one; with ``test_margin`` the null hypothesis is "the drop is at
   most ``drop``") at ``confidence``, re-run at every evaluation (which is what makes
   it page on noise now and then);

and that has held at every evaluation for ``for``.

A firing series resolves when its window (or the canary's other side) has fewer than
``min_samples`` results (the cause went away: a rollback, an evicted segment value, a
quiet service; the event says so: ``no results in the last 900s``), or when the
evidence says the drop is gone: ``test: sequential``, the same CUSUM the other way
round reaches ``ln 100``; ``test: window``, the observed drop is below ``drop -
hysteresis``.  While a series is pending or firing, its trailing baseline is frozen:
the scores leaving the window are not taken in and its oldest buckets are kept, so the
baseline never learns the incident.

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
``recoverable_error``, and a transition (firing or resolved) gets sent again, in
order, at the next evaluations (at most ``_MAX_UNSENT`` kept per notifier); a failed
repeat waits for the next one.  Nothing else waits on a notifier: scoring, export and
the other notifiers go on.

**Notifiers.** Every notifier gets each transition; a notifier with a
``resend_interval`` (Alertmanager, the webhook's ``repeat_interval``) also gets the
firing alert with its current figures at that period.

Thread safety: ``observe`` and ``evaluate`` share a lock, so ``observe`` may be called
from any thread; notifications are sent from the event loop running ``evaluate``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import structlog

from ragtrace_collector.alerts.config import (
    AlertsConfig,
    CanaryRule,
    DropRule,
    Rule,
    TrailingBaseline,
    feedback_series,
)
from ragtrace_collector.alerts.events import AlertEvent, SegmentMean
from ragtrace_collector.alerts.notifiers import Notifier, build_notifiers
from ragtrace_collector.alerts.stats import Summary, TestResult, one_sample_less, welch_less
from ragtrace_collector.component import Component, Status
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.segments import UNSET, SegmentKey

__all__ = ["DetectorStatus", "DropDetector", "RuleStatus"]

_log = structlog.get_logger("ragtrace.alerts")

_FINE_PER_WINDOW = 20
#: Fine buckets per step of the sequential test (a step is a quarter of the window).
_FINE_PER_STEP = 5
#: ``test: sequential``: a firing alert resolves once the evidence for "no drop"
#: against "a drop of ``drop``" reaches this (a likelihood ratio of 100).
_RECOVERY_LEVEL = math.log(100.0)
#: Variance floor of one score, so constant scores give a finite likelihood ratio.
_MIN_VARIANCE = 1e-6
_COARSE_PER_BASELINE = 96
_EPS = 1e-12
#: Transitions kept per notifier while its target is down (the oldest go first).
_MAX_UNSENT = 100
#: Siblings listed in an alert (the most scored first).
_MAX_SIBLINGS = 10

#: A series of a rule: (service, the values of the rule's segment keys).
SeriesKey = tuple[str, tuple[str, ...]]

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
    #: ``test: sequential``: the CUSUM of log likelihood ratios ("the mean is ``drop``
    #: below the reference" against "it is not"), its level to fire, and the last step
    #: taken into it.
    evidence: float = 0.0
    evidence_level: float = math.inf
    evidence_step: int = -(2**62)
    #: While firing: the same CUSUM the other way round ("no drop" against "a drop").
    recovery: float = 0.0


@dataclass(frozen=True, slots=True)
class RuleStatus:
    """The detector's view of one (rule, service, segments) at its last evaluation."""

    rule: str
    service: str
    segments: dict[str, str]
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
class _Window:
    summary: Summary
    #: The window's buckets: their examples are read only for a notification.
    buckets: list[_Bucket]


@dataclass(frozen=True, slots=True)
class _Measurement:
    window: Summary
    baseline_value: float | None
    baseline_count: int | None
    comparison: _Comparison | None
    buckets: list[_Bucket]
    #: The scores compared with: the trailing baseline, the canary's other side (None:
    #: a fixed baseline).
    reference: Summary | None = None
    #: Why there is no comparison (too few results), for a resolved alert.
    shortfall: str | None = None


def _too_few(n: int, window: float) -> str:
    if not n:
        return f"no results in the last {window:g}s"
    return f"only {n} scored results in the last {window:g}s"


class _RuleRuntime:
    __slots__ = (
        "coarse_width",
        "fine_width",
        "keys",
        "max_series",
        "positions",
        "rule",
        "series",
        "services",
        "step_level",
        "trailing",
        "warned_cap",
    )

    def __init__(self, rule: Rule, segments: Sequence[SegmentKey], max_services: int) -> None:
        self.rule = rule
        self.fine_width = rule.window / _FINE_PER_WINDOW
        #: The sequential test's level for one series: Lorden's bound makes the mean
        #: time between false alarms of a CUSUM at least e**level steps.
        step = self.fine_width * _FINE_PER_STEP
        self.step_level = math.log(max(rule.false_alarm_interval / step, 1.0))
        #: The rule's trailing baseline (None: a fixed baseline or a canary rule).
        self.trailing: TrailingBaseline | None = None
        if isinstance(rule, DropRule) and isinstance(rule.baseline, TrailingBaseline):
            self.trailing = rule.baseline
        if self.trailing is not None:
            self.coarse_width = max(self.trailing.window / _COARSE_PER_BASELINE, self.fine_width)
        else:
            self.coarse_width = 0.0
        index = {k.key: i for i, k in enumerate(segments)}
        #: The rule's segment keys, and their positions in an observed values tuple.
        self.keys: tuple[str, ...] = rule.segment_keys
        self.positions = tuple(index.get(key, -1) for key in self.keys)
        limits = {k.key: k.max_values for k in segments}
        #: Series bound: each key has its kept values plus ``other`` and ``unset``.
        self.max_series = max_services * math.prod(limits.get(k, 1) + 2 for k in self.keys)
        self.series: dict[SeriesKey, _Series] = {}
        #: Series per service (the services bound is max_services_per_rule).
        self.services: dict[str, int] = {}
        self.warned_cap = False

    def key_of(self, service: str, segments: tuple[str, ...]) -> SeriesKey:
        n = len(segments)
        return (service, tuple(segments[i] if 0 <= i < n else UNSET for i in self.positions))

    def named(self, values: tuple[str, ...]) -> dict[str, str]:
        return dict(zip(self.keys, values, strict=True))


class DetectorStatus(Component):
    """The detector's component, ``alerts:detector``: ``ok`` once the evaluation stage
    has started it and after an evaluation, ``recoverable_error`` after one that raised
    (logged with its traceback by :meth:`DropDetector.run`, counted here in
    ``ragtrace_component_failures_total``; the loop goes on and the next good
    evaluation reports ``ok``), ``stopped`` once the detector is closed."""

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
    of series, services or service and segment values, the rule is firing for) and
    ``ragtrace_alert_notifications``.
    ``clock`` returns Unix seconds; tests inject a fake one.  :attr:`component` is its
    status for the service's health (see :class:`DetectorStatus`).
    """

    def __init__(
        self,
        config: AlertsConfig,
        notifiers: Sequence[Notifier] = (),
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] = time.time,
        segments: Sequence[SegmentKey] = (),
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
        self._segment_keys = tuple(k.key for k in segments)
        self._rules = [
            _RuleRuntime(rule, segments, config.max_services_per_rule)
            for rule in (config.rules if config.enabled else [])
        ]
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
        segments: Sequence[SegmentKey] = (),
    ) -> DropDetector:
        """A detector with the notifiers the config enables.  ``segments``: the
        ``segments:`` keys, in the order :meth:`observe` gets their values."""
        return cls(config, build_notifiers(config), telemetry, clock, segments)

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
        *,
        segments: tuple[str, ...] = (),
    ) -> None:
        """Record one metric result.  ``score=None`` (skipped or errored) is ignored,
        as are non-finite scores.  ``at`` defaults to now and is clamped to now.
        ``segments``: the case's segment values, in the order of the ``segments`` keys
        the detector was built with (missing ones count as ``unset``)."""
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
        plain: SeriesKey = (service, ())
        with self._lock:
            self._seq += 1
            for runtime in runtimes:
                rule = runtime.rule
                if rule.service is not None and rule.service != service:
                    continue
                key = runtime.key_of(service, segments) if runtime.positions else plain
                series = runtime.series.get(key)
                if series is None:
                    series = self._new_series(runtime, key)
                    if series is None:
                        continue
                self._add(runtime, series, value, trace_id, t, now)

    def observe_feedback(
        self,
        service: str,
        name: str,
        value: float,
        trace_id: str | None = None,
        segments: tuple[str, ...] = (),
    ) -> None:
        """Record one user feedback (a value in [0, 1]) for the rules on
        ``feedback:<name>``; a feedback observer of the feedback stage."""
        self.observe(service, feedback_series(name), value, trace_id, segments=segments)

    def _new_series(self, runtime: _RuleRuntime, key: SeriesKey) -> _Series | None:
        """A new series, unless the rule is at its services or series bound."""
        service = key[0]
        known = service in runtime.services
        if (not known and len(runtime.services) >= self._config.max_services_per_rule) or len(
            runtime.series
        ) >= runtime.max_series:
            if not runtime.warned_cap:
                runtime.warned_cap = True
                _log.warning(
                    "alert_series_cap",
                    rule=runtime.rule.name,
                    max_services=self._config.max_services_per_rule,
                    max_series=runtime.max_series,
                    ignored_service=service,
                    ignored_segments=runtime.named(key[1]),
                )
            return None
        runtime.services[service] = runtime.services.get(service, 0) + 1
        series = runtime.series[key] = _Series()
        return series

    def _free_series(self, runtime: _RuleRuntime, key: SeriesKey) -> None:
        del runtime.series[key]
        left = runtime.services[key[0]] - 1
        if left:
            runtime.services[key[0]] = left
        else:
            del runtime.services[key[0]]

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
        # While the series is pending or firing, the scores leaving the window are not
        # taken into the baseline: it must not learn the incident.
        learn = series.phase == "inactive"
        for idx in [i for i in series.fine if i < start]:
            bucket = series.fine.pop(idx)
            if learn and trailing is not None and bucket.summary.n:
                cidx = math.floor(idx * runtime.fine_width / runtime.coarse_width)
                series.coarse.setdefault(cidx, Summary()).merge(bucket.summary)
        series.fold_below = max(series.fold_below, start)
        if trailing is not None and learn:  # frozen while pending or firing
            horizon = start * runtime.fine_width - trailing.window
            for cidx in [c for c in series.coarse if (c + 1) * runtime.coarse_width <= horizon]:
                del series.coarse[cidx]

    # ------------------------------------------------------------- evaluation
    def _window(self, runtime: _RuleRuntime, series: _Series, now: float) -> _Window:
        """The current window's summary and buckets."""
        self._compact(runtime, series, now)
        cur = math.floor(now / runtime.fine_width)
        in_window = [b for i, b in series.fine.items() if i <= cur]
        return _Window(Summary.merged(b.summary for b in in_window), in_window)

    def _examples(self, buckets: list[_Bucket]) -> tuple[str, ...]:
        """The lowest-scoring trace ids of a window's buckets."""
        worst = heapq.nsmallest(
            self._config.example_trace_ids,
            ((-neg, seq, tid) for b in buckets for neg, seq, tid in b.examples),
        )
        return tuple(dict.fromkeys(tid for _, _, tid in worst))

    @staticmethod
    def _compare(rule: Rule, window: Summary, baseline: float, base: Summary | None) -> _Comparison:
        """The one-sided test of ``window`` against a fixed ``baseline`` (``base`` None)
        or against the scores ``base`` (Welch)."""
        threshold = rule.drop.amount(baseline)
        margin = threshold if rule.test_margin and rule.test == "window" else 0.0
        test = (
            one_sample_less(window, baseline, margin)
            if base is None
            else welch_less(window, base, margin)
        )
        hysteresis = rule.hysteresis_value
        if rule.drop.kind == "relative":
            hysteresis *= abs(baseline)
        return _Comparison(
            baseline=baseline,
            test=test,
            drop=baseline - window.mean,
            threshold=threshold,
            hysteresis=hysteresis,
        )

    def _measure(self, runtime: _RuleRuntime, series: _Series, now: float) -> _Measurement:
        """A drop rule's series: its window against its own baseline."""
        rule = runtime.rule
        assert isinstance(rule, DropRule)
        w = self._window(runtime, series, now)
        window = w.summary
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
            if window.n < rule.min_samples:
                shortfall = _too_few(window.n, rule.window)
            else:
                shortfall = f"the baseline has only {baseline_count} scored results"
            return _Measurement(
                window, baseline_value, baseline_count, None, w.buckets, base, shortfall
            )
        comparison = self._compare(rule, window, baseline_value, base)
        return _Measurement(window, baseline_value, baseline_count, comparison, w.buckets, base)

    def _measure_all(self, runtime: _RuleRuntime, now: float) -> dict[SeriesKey, _Measurement]:
        """Every series of a rule, measured at ``now``."""
        rule = runtime.rule
        if not isinstance(rule, CanaryRule):
            return {key: self._measure(runtime, s, now) for key, s in runtime.series.items()}
        windows = {key: self._window(runtime, s, now) for key, s in runtime.series.items()}
        by_service: dict[str, list[SeriesKey]] = {}
        for key in windows:
            by_service.setdefault(key[0], []).append(key)
        out: dict[SeriesKey, _Measurement] = {}
        for keys in by_service.values():
            for key in keys:
                w = windows[key]
                value = key[1][0]
                other: Summary | None = None
                if rule.candidate is None or value == rule.candidate:
                    other = Summary.merged(
                        windows[k].summary
                        for k in keys
                        if k != key and (rule.against is None or k[1][0] == rule.against)
                    )
                shortfall: str | None
                if other is None or not other.n:
                    shortfall = _too_few(w.summary.n, rule.window)
                    if w.summary.n >= rule.min_samples:
                        shortfall = f"no results on the other side in the last {rule.window:g}s"
                    out[key] = _Measurement(w.summary, None, None, None, w.buckets, None, shortfall)
                    continue
                shortfall = None
                if w.summary.n < rule.min_samples:
                    shortfall = _too_few(w.summary.n, rule.window)
                elif other.n < rule.min_samples:
                    shortfall = (
                        f"only {other.n} scored results on the other side in the last"
                        f" {rule.window:g}s"
                    )
                comparison = (
                    None if shortfall else self._compare(rule, w.summary, other.mean, other)
                )
                out[key] = _Measurement(
                    w.summary, other.mean, other.n, comparison, w.buckets, other, shortfall
                )
        return out

    # ------------------------------------------------------- sequential test
    def _accumulate(
        self, runtime: _RuleRuntime, measured: dict[SeriesKey, _Measurement], now: float
    ) -> None:
        """``test: sequential``: add every step completed since the last evaluation to
        each series' evidence (a CUSUM of Gaussian log likelihood ratios, the drop
        ``drop`` against none), and set its level to fire."""
        rule = runtime.rule
        done = math.floor(now / runtime.fine_width + _EPS) // _FINE_PER_STEP - 1
        first = done - _FINE_PER_WINDOW // _FINE_PER_STEP + 1  # the oldest still in the window
        steps: dict[tuple[SeriesKey, int], Summary] = {}

        def step_of(key: SeriesKey, k: int) -> Summary:
            found = steps.get((key, k))
            if found is None:
                lo = k * _FINE_PER_STEP
                fine = runtime.series[key].fine
                found = steps[(key, k)] = Summary.merged(
                    fine[i].summary for i in range(lo, lo + _FINE_PER_STEP) if i in fine
                )
            return found

        compared: dict[str, int] = {}
        for key, m in measured.items():
            if m.comparison is not None:
                compared[key[0]] = compared.get(key[0], 0) + 1
        canary = rule if isinstance(rule, CanaryRule) else None
        for key, series in runtime.series.items():
            m = measured[key]
            start = max(series.evidence_step + 1, first)
            series.evidence_step = max(series.evidence_step, done)
            c = m.comparison
            if c is None:
                continue
            # Bonferroni over the series compared in this service: the rule's budget.
            series.evidence_level = runtime.step_level + math.log(compared.get(key[0], 1))
            mine_var = max(m.window.variance, _MIN_VARIANCE)
            ref = m.reference
            ref_var = max(ref.variance, _MIN_VARIANCE) if ref is not None and ref.n > 1 else 0.0
            others = (
                [
                    k
                    for k in measured
                    if k != key
                    and k[0] == key[0]
                    and (canary.against is None or k[1][0] == canary.against)
                ]
                if canary is not None
                else []
            )
            delta = c.threshold
            for k in range(start, done + 1):
                mine = step_of(key, k)
                if not mine.n:
                    continue
                if canary is not None:
                    side = Summary.merged(step_of(o, k) for o in others)
                    if not side.n:
                        continue
                    diff = side.mean - mine.mean
                    var = mine_var / mine.n + ref_var / side.n
                else:
                    assert ref is None or ref.n
                    ref_n = ref.n if ref is not None else 1
                    diff = c.baseline - mine.mean
                    var = mine_var / mine.n + ref_var / ref_n
                llr = delta * (diff - delta / 2.0) / var
                series.evidence = max(0.0, series.evidence + llr)
                if series.phase == "firing":
                    series.recovery = max(0.0, series.recovery - llr)

    def _siblings(
        self,
        runtime: _RuleRuntime,
        key: SeriesKey,
        measured: dict[SeriesKey, _Measurement],
    ) -> tuple[SegmentMean, ...]:
        """The other series of the same rule and service, the most scored first."""
        if not runtime.keys:
            return ()
        found: list[SegmentMean] = []
        canary = isinstance(runtime.rule, CanaryRule)
        for other, m in measured.items():
            if other == key or other[0] != key[0] or not m.window.n:
                continue
            c = m.comparison
            found.append(
                SegmentMean(
                    segments=runtime.named(other[1]),
                    window_mean=m.window.mean,
                    sample_count=m.window.n,
                    baseline=None if canary else m.baseline_value,
                    dropped=not canary and c is not None and c.drop >= c.threshold - _EPS,
                )
            )
        found.sort(key=lambda s: (-s.sample_count, tuple(s.segments.values())))
        return tuple(found[:_MAX_SIBLINGS])

    def _event(
        self,
        runtime: _RuleRuntime,
        key: SeriesKey,
        m: _Measurement,
        c: _Comparison,
        status: Literal["firing", "resolved"],
        started_at: float,
        now: float,
        measured: dict[SeriesKey, _Measurement],
        *,
        repeat: bool = False,
    ) -> AlertEvent:
        rule = runtime.rule
        trailing = runtime.trailing
        against: str | None = None
        baseline_kind: Literal["fixed", "trailing", "segment"]
        if isinstance(rule, CanaryRule):
            baseline_kind = "segment"
            if rule.against is not None:
                against = f"{rule.segment}={rule.against}"
            else:
                against = f"{rule.segment}!={key[1][0]}"
        else:
            baseline_kind = "trailing" if trailing is not None else "fixed"
        return AlertEvent(
            status=status,
            rule=rule.name,
            metric=rule.metric,
            service=key[0],
            window_seconds=rule.window,
            window_mean=m.window.mean,
            sample_count=m.window.n,
            baseline=c.baseline,
            baseline_kind=baseline_kind,
            baseline_window_seconds=trailing.window if trailing is not None else None,
            baseline_sample_count=m.baseline_count,
            drop=c.drop,
            drop_threshold=c.threshold,
            p_value=c.test.p_value,
            confidence=rule.confidence,
            example_trace_ids=self._examples(m.buckets),
            started_at=started_at,
            evaluated_at=now,
            ended_at=now if status == "resolved" else None,
            labels={"severity": rule.severity, **rule.labels},
            repeat=repeat,
            kind=rule.kind,
            segments=runtime.named(key[1]),
            siblings=self._siblings(runtime, key, measured),
            against=against,
        )

    def _step(
        self,
        runtime: _RuleRuntime,
        key: SeriesKey,
        series: _Series,
        now: float,
        measured: dict[SeriesKey, _Measurement],
    ) -> AlertEvent | None:
        """Advance one series' state machine; return its transition, if any."""
        rule = runtime.rule
        m = measured[key]
        c = m.comparison
        firing = series.firing_event
        if series.phase == "firing" and firing is not None:
            if c is None:
                # Too few results to hold the alert on: its cause went away (a rollback,
                # an evicted segment value, a quiet service).  The last figures, and why.
                event = dataclasses.replace(
                    firing,
                    status="resolved",
                    repeat=False,
                    sample_count=m.window.n,
                    evaluated_at=now,
                    ended_at=now,
                    reason=m.shortfall or _too_few(m.window.n, rule.window),
                )
                self._reset(series)
                return event
            reason: str | None = None
            if rule.test == "sequential":
                if series.recovery >= _RECOVERY_LEVEL:
                    reason = f"the scores are back: the drop is down to {c.drop:.3f}"
            elif c.drop < c.threshold - c.hysteresis - _EPS:
                reason = f"the drop {c.drop:.3f} is below {c.threshold - c.hysteresis:.3f}"
            if reason is not None:
                event = self._event(
                    runtime, key, m, c, "resolved", firing.started_at, now, measured
                )
                event = dataclasses.replace(event, reason=reason)
                self._reset(series)
                return event
            series.firing_event = self._event(
                runtime, key, m, c, "firing", firing.started_at, now, measured, repeat=True
            )
            return None
        if c is None:  # too few samples: pending resets
            if series.phase == "pending":
                series.phase, series.pending_since = "inactive", None
            return None
        dropped = c.drop >= c.threshold - _EPS
        if rule.test == "sequential":
            dropped = dropped and series.evidence >= series.evidence_level
        else:
            dropped = dropped and c.test.p_value <= 1.0 - rule.confidence
        if not dropped:
            series.phase, series.pending_since = "inactive", None
            return None
        since = series.pending_since if series.phase == "pending" else None
        if since is None:
            since = now
        series.phase, series.pending_since = "pending", since
        if now - since >= rule.for_ - _EPS:
            series.phase = "firing"
            series.last_sent = {}
            series.recovery = 0.0
            series.firing_event = self._event(runtime, key, m, c, "firing", since, now, measured)
            return series.firing_event
        return None

    @staticmethod
    def _reset(series: _Series) -> None:
        series.phase, series.pending_since, series.firing_event = "inactive", None, None
        series.evidence = series.recovery = 0.0

    async def evaluate(self, now: float | None = None) -> list[AlertEvent]:
        """Test every rule for every series; send notifications; return the
        transitions (firing and resolved events) of this evaluation."""
        when = self._clock() if now is None else now
        transitions: list[AlertEvent] = []
        sends: list[tuple[Notifier, AlertEvent, _Series | None]] = []
        with self._lock:
            for runtime in self._rules:
                firing_count = 0
                measured = self._measure_all(runtime, when)
                if runtime.rule.test == "sequential":
                    self._accumulate(runtime, measured, when)
                for key, series in list(runtime.series.items()):
                    event = self._step(runtime, key, series, when, measured)
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
                        self._free_series(runtime, key)  # idle: free it
                if self._telemetry is not None:
                    self._telemetry.alert_firing.labels(
                        rule=runtime.rule.name, metric=runtime.rule.metric
                    ).set(firing_count)
        await self._send_unsent(when)
        # Behind a notifier's unsent backlog, new transitions wait their turn (in order);
        # a repeat waits for the next interval.
        ready: list[tuple[Notifier, AlertEvent, _Series | None]] = []
        for send in sends:
            backlog = self._unsent.get(send[0].name)
            if not backlog:
                ready.append(send)
            elif not send[1].repeat:
                self._queue_unsent(send[0], send[1])
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
            # A transition is sent again until delivered (a resolved one above all: the
            # target would otherwise keep the alert); a repeat waits for the next one.
            will_retry = not event.repeat
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
                measured = self._measure_all(runtime, when)
                for key, series in runtime.series.items():
                    m = measured[key]
                    out.append(
                        RuleStatus(
                            rule=runtime.rule.name,
                            service=key[0],
                            segments=runtime.named(key[1]),
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
