"""The collector's own Prometheus metrics: one place that names them all.

Every series the collector exports on ``/metrics`` is declared here, on a
per-instance :class:`~prometheus_client.CollectorRegistry`, so that several
collectors can run in one process (tests do) without clashing.  The Grafana
dashboard and the Prometheus rules in ``docker/`` are checked against these names.

prometheus-client appends ``_total`` to counters and ``_bucket``/``_sum``/``_count``
to histograms on exposition; the names below are the base names.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

__all__ = ["CONTENT_TYPE_LATEST", "SCORE_BUCKETS", "FeedbackMetrics", "ResultBook", "Telemetry"]

#: Score histogram buckets: fine enough to compute a windowed mean exactly (from
#: _sum/_count) and a rough distribution.
SCORE_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_JUDGE_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class Telemetry:
    """All self metrics of one collector instance."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()

        # ------------------------------------------------------------ pipeline
        self.spans_received = Counter(
            "ragtrace_spans_received", "Spans accepted by a receiver.", ["receiver"], registry=r
        )
        self.spans_refused = Counter(
            "ragtrace_spans_refused",
            "Spans a receiver refused (the client was told and may retry).",
            ["receiver", "reason"],
            registry=r,
        )
        self.requests_rejected = Counter(
            "ragtrace_requests_rejected",
            "Export requests rejected before decoding (auth, content type, size, malformed).",
            ["receiver", "reason"],
            registry=r,
        )
        self.spans_forwarded = Counter(
            "ragtrace_spans_forwarded", "Spans delivered by an exporter.", ["exporter"], registry=r
        )
        self.spans_dropped = Counter(
            "ragtrace_spans_dropped",
            "Spans an exporter gave up on (non-retryable answer or deadline at shutdown).",
            ["exporter", "reason"],
            registry=r,
        )
        self.spans_retried = Counter(
            "ragtrace_spans_retried",
            "Spans an exporter had to send again after a retryable failure.",
            ["exporter"],
            registry=r,
        )
        self.annotations = Counter(
            "ragtrace_annotations",
            "Results an exporter posted as backend annotations (Phoenix), by kind (span, "
            "document, session) and outcome (posted, rejected, gave_up).",
            ["exporter", "kind", "outcome"],
            registry=r,
        )
        self.traces_buffered = Gauge(
            "ragtrace_traces_buffered", "Traces held by the assembler.", registry=r
        )
        self.spans_buffered = Gauge(
            "ragtrace_spans_buffered", "Spans held by the assembler.", registry=r
        )
        self.traces_released = Counter(
            "ragtrace_traces_released",
            "Traces released by the assembler, by why (ready, max_wait, pressure, shutdown, late).",
            ["reason"],
            registry=r,
        )
        self.spans_late = Counter(
            "ragtrace_spans_late",
            "Spans that arrived after their trace was released (forwarded on their own).",
            registry=r,
        )
        self.queue_depth = Gauge(
            "ragtrace_queue_depth", "Items waiting in an internal queue.", ["queue"], registry=r
        )
        self.export_latency = Histogram(
            "ragtrace_export_latency_seconds",
            "Time of one export call to a backend.",
            ["exporter"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pipeline_latency = Histogram(
            "ragtrace_pipeline_latency_seconds",
            "Time from a trace's release by the assembler to its hand-off to the exporters.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

        # ---------------------------------------------------------- evaluation
        #: ragtrace_eval_score and ragtrace_eval_results: written for every result.
        self.results = ResultBook(registry=r)
        self.eval_traces = Counter(
            "ragtrace_eval_traces",
            "Ready traces with a @rag span, by sampling decision: sampled, unsampled, budget.",
            ["decision"],
            registry=r,
        )
        self.eval_skipped = Counter(
            "ragtrace_eval_skipped",
            "Traces forwarded unevaluated although chosen for evaluation, by reason: "
            "overload (queue full), budget, shutdown.",
            ["reason"],
            registry=r,
        )
        self.reference_id_overlap = Gauge(
            "ragtrace_reference_id_overlap",
            "Share of a service's last cases with reference ids (cases.id_overlap_window) "
            "that retrieved at least one reference id; 0 means the retrieved ids and the "
            "reference ids never met: ids of different kinds, or a failing retriever.",
            ["service"],
            registry=r,
        )
        self.eval_timeouts = Counter(
            "ragtrace_eval_timeouts", "Metric evaluations that timed out.", ["metric"], registry=r
        )
        self.eval_latency = Histogram(
            "ragtrace_eval_latency_seconds",
            "Time to evaluate one sampled trace.",
            buckets=_JUDGE_LATENCY_BUCKETS,
            registry=r,
        )
        self.judge_calls = Counter(
            "ragtrace_judge_calls",
            "Judge calls by outcome: ok, cached, error, timeout, cancelled (every caller gave up).",
            ["model", "outcome"],
            registry=r,
        )
        self.judge_tokens = Counter(
            "ragtrace_judge_tokens", "Judge tokens, by kind.", ["model", "kind"], registry=r
        )
        self.judge_cost = Counter(
            "ragtrace_judge_cost_usd",
            "Judge spend in USD (known prices only).",
            ["model"],
            registry=r,
        )
        self.judge_latency = Histogram(
            "ragtrace_judge_latency_seconds",
            "Latency of one judge call.",
            ["model"],
            buckets=_JUDGE_LATENCY_BUCKETS,
            registry=r,
        )

        # ------------------------------------------------------------ segments
        self.segment_overflow = Counter(
            "ragtrace_segment_overflow",
            "Cases whose segment value was counted as `other` (beyond the key's max_values), "
            "by segment key.",
            ["key"],
            registry=r,
        )
        self.segment_evictions = Counter(
            "ragtrace_segment_evictions",
            "Segment values that lost their label to a more frequent one (their series left "
            "/metrics), by segment key.",
            ["key"],
            registry=r,
        )

        # -------------------------------------------------------------- alerts
        self.alert_firing = Gauge(
            "ragtrace_alert_firing",
            "1 while a drop rule is firing.",
            ["rule", "metric"],
            registry=r,
        )
        self.alert_notifications = Counter(
            "ragtrace_alert_notifications",
            "Alert notifications sent, by notifier and outcome.",
            ["notifier", "outcome"],
            registry=r,
        )

        # ---------------------------------------------------------- components
        self.component_status = Gauge(
            "ragtrace_component_status",
            "1 for each component's current status (starting, ok, recoverable_error, "
            "permanent_error, stopping, stopped), 0 for the others.",
            ["component", "status"],
            registry=r,
        )
        self.component_failures = Counter(
            "ragtrace_component_failures",
            "Unexpected exceptions in a component's background task (each was logged and the "
            "task restarted).",
            ["component"],
            registry=r,
        )
        self.wal_records_skipped = Counter(
            "ragtrace_wal_records_skipped",
            "Write-ahead log records skipped while reading it back: corrupt (damaged, "
            "the records after it are still read) or torn_tail (the last write of the newest "
            "segment, cut short by a crash and never acknowledged).",
            ["reason"],
            registry=r,
        )
        self.event_loop_lag = Histogram(
            "ragtrace_event_loop_lag_seconds",
            "How late the event loop ran a timer it was asked to run: work that blocked it.",
            buckets=_LOOP_LAG_BUCKETS,
            registry=r,
        )

        self._feedback: FeedbackMetrics | None = None

    def feedback_metrics(self, segment_labels: Sequence[str] = ()) -> FeedbackMetrics:
        """The ``ragtrace_feedback_*`` series, declared on first use: their labels end
        with the ``segments:`` labels, known only once the config is read.  Later calls
        return the same series (and must give the same labels)."""
        labels = tuple(segment_labels)
        if self._feedback is None:
            self._feedback = FeedbackMetrics(self.registry, labels)
        elif self._feedback.segment_labels != labels:
            raise ValueError("the feedback series were declared with other segment labels")
        return self._feedback

    def render(self) -> bytes:
        """The Prometheus text exposition of this instance's registry."""
        return generate_latest(self.registry)


class FeedbackMetrics:
    """The ``ragtrace_feedback_*`` series (see :mod:`ragtrace_collector.feedback`)."""

    def __init__(self, registry: CollectorRegistry, segment_labels: tuple[str, ...]) -> None:
        r = registry
        segs = list(segment_labels)
        self.segment_labels = segment_labels
        self.total = Counter(
            "ragtrace_feedback",
            "User feedback recorded, once per request, name and user (a replacement is "
            "not counted again), by outcome: positive, or negative (below 0.5).",
            ["service", "name", *segs, "outcome"],
            registry=r,
        )
        self.invalid = Counter(
            "ragtrace_feedback_invalid",
            "Feedback refused, by reason (a bad field, too many for one request, a flood).",
            ["reason"],
            registry=r,
        )
        self.unjoined = Counter(
            "ragtrace_feedback_unjoined",
            "Feedback whose request's scores never came within feedback.window (the "
            "request was not sampled, or its scores had expired), or dropped while "
            "waiting, by reason: expired, evicted.",
            ["reason"],
            registry=r,
        )
        self.evicted = Counter(
            "ragtrace_feedback_evicted",
            "Evaluated requests evicted from the join before feedback.window ended "
            "(feedback.max_requests reached).",
            registry=r,
        )
        self.held = Gauge(
            "ragtrace_feedback_held",
            "Entries the join holds: scores (evaluated requests) and pending (feedback "
            "waiting for scores).",
            ["side"],
            registry=r,
        )
        self.auroc = Gauge(
            "ragtrace_feedback_auroc",
            "AUROC of the metric's score against the feedback over feedback.agreement_window: "
            "the probability that a request with negative feedback scored lower than one "
            "with positive feedback (ties half).  0.5 is chance.",
            ["service", "metric", "name", *segs],
            registry=r,
        )
        self.pairs = Gauge(
            "ragtrace_feedback_pairs",
            "Joined requests (a score and a feedback) behind ragtrace_feedback_auroc.",
            ["service", "metric", "name", *segs],
            registry=r,
        )
        self.series_refused = Counter(
            "ragtrace_feedback_series_refused",
            "Joined pairs not kept because the tracker holds feedback.max_series series.",
            registry=r,
        )


class ResultBook:
    """``ragtrace_eval_score`` (a histogram by service, metric and the segment labels)
    and ``ragtrace_eval_results`` (a counter by service, metric, the segment labels and
    outcome), kept in plain dicts and read at scrape time.

    Every metric result of every case is counted here, several per case: through
    prometheus-client's metric objects that cost a lock and a few calls per increment,
    a noticeable share of the collector's CPU per case.  The counts are written by one
    thread (the event loop's; :meth:`record` is not safe to call from two threads at
    once) and read by a scrape from any thread, which snapshots them first; the series
    exposed are the ones prometheus-client's Counter and Histogram expose (``_total``,
    ``_bucket``, ``_count``, ``_sum``, ``_created``).

    The segment labels (``segments:`` in the config, see
    :mod:`ragtrace_collector.segments`) are set once with
    :meth:`set_segment_labels`, before the first result; every result then carries one
    value per label, in that order.  Without segments the labels are service and metric
    (and outcome).
    """

    _SCORE = "ragtrace_eval_score"
    _SCORE_HELP = "Evaluation scores (skipped and errored results are not observed)."
    _RESULTS = "ragtrace_eval_results"
    _RESULTS_HELP = "Metric results by outcome: passed, failed, skipped, error."

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        #: (service, metric, outcome, segment values) -> [count, created]
        self._results: dict[tuple[str, str, str, tuple[str, ...]], list[float]] = {}
        #: (service, metric, segment values) -> [per-bucket counts (not cumulative; +Inf
        #: last)..., sum, created]
        self._scores: dict[tuple[str, str, tuple[str, ...]], list[float]] = {}
        self._segment_labels: tuple[str, ...] = ()
        # As prometheus-client writes them (the tests compare): these bounds print as repr.
        self._les = [repr(float(b)) for b in SCORE_BUCKETS] + ["+Inf"]
        if registry is not None:
            registry.register(self)

    @property
    def segment_labels(self) -> tuple[str, ...]:
        return self._segment_labels

    def set_segment_labels(self, labels: Sequence[str]) -> None:
        """The segment labels, in the order :meth:`record` gets their values.  Only
        before the first result (the series already written would lack them)."""
        if self._results or self._scores:
            raise RuntimeError("segment labels must be set before the first result")
        self._segment_labels = tuple(labels)

    def record(
        self,
        service: str,
        metric: str,
        outcome: str,
        score: float | None,
        segments: tuple[str, ...] = (),
    ) -> None:
        """One result; ``score`` is observed when it is a finite number (None skips it).
        ``segments``: one value per segment label."""
        key = (service, metric, outcome, segments)
        counted = self._results.get(key)
        if counted is None:
            self._check_width(segments)
            counted = self._results[key] = [0.0, time.time()]
        counted[0] += 1.0
        if score is not None and score - score == 0.0:  # finite (NaN and inf are not)
            self.observe(service, metric, score, segments)

    def observe(
        self, service: str, metric: str, score: float, segments: tuple[str, ...] = ()
    ) -> None:
        """One score into the histogram of (service, metric, segments)."""
        key = (service, metric, segments)
        row = self._scores.get(key)
        if row is None:
            self._check_width(segments)
            row = self._scores[key] = [0.0] * (len(self._les) + 1) + [time.time()]
        row[bisect.bisect_left(SCORE_BUCKETS, score)] += 1.0
        row[-2] += score

    def _check_width(self, segments: tuple[str, ...]) -> None:
        """A new series must carry one value per segment label."""
        if len(segments) != len(self._segment_labels):
            raise ValueError(
                f"{len(segments)} segment values for {len(self._segment_labels)} labels"
            )

    def forget(self, index: int, value: str) -> None:
        """Drop the series whose ``index``-th segment value is ``value`` (a value that
        is no longer among its key's top values: its results now count as ``other``)."""
        for key in [k for k in self._results if k[3][index] == value]:
            del self._results[key]
        for skey in [k for k in self._scores if k[2][index] == value]:
            del self._scores[skey]

    def describe(self) -> list[Metric]:
        return list(self._families())

    def _families(self) -> tuple[HistogramMetricFamily, CounterMetricFamily]:
        segs = list(self._segment_labels)
        return (
            HistogramMetricFamily(
                self._SCORE, self._SCORE_HELP, labels=["service", "metric", *segs]
            ),
            CounterMetricFamily(
                self._RESULTS, self._RESULTS_HELP, labels=["service", "metric", *segs, "outcome"]
            ),
        )

    def collect(self) -> Iterator[Metric]:
        # The dicts are snapshotted with dict.copy(), which takes the entries in one C
        # step with no allocation a cyclic GC run could start from.  Iterating them
        # directly (list(d.items()) included: a tuple per item) is not safe: a GC run
        # that an allocation starts may call finalizers, i.e. Python code, and so let
        # the loop thread add a series mid-iteration ("dictionary changed size").
        scores = [(key, list(row)) for key, row in self._scores.copy().items()]
        results = [(key, list(row)) for key, row in self._results.copy().items()]
        histogram, counter = self._families()
        names = self._segment_labels
        created: list[Sample] = []
        for (service, metric, segments), row in scores:
            total = 0.0
            buckets: list[tuple[str, float]] = []
            for le, count in zip(self._les, row, strict=False):
                total += count
                buckets.append((le, total))
            histogram.add_metric([service, metric, *segments], buckets, row[-2])
            labels = {
                "service": service,
                "metric": metric,
                **dict(zip(names, segments, strict=True)),
            }
            created.append(Sample(self._SCORE + "_created", labels, row[-1]))
        histogram.samples.extend(created)
        yield histogram
        for (service, metric, outcome, segments), (count, since) in results:
            counter.add_metric([service, metric, *segments, outcome], count, created=since)
        yield counter
