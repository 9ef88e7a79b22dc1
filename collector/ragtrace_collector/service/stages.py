"""Builds the evaluation stage from the composed configuration: judge, metrics,
sampler, stores, segments, worker pool, evaluator and drop detector
(:class:`~ragtrace_collector.evaluation.stage.EvaluationStage`), and the feedback
stage (:class:`~ragtrace_collector.feedback.stage.FeedbackStage`), which hears every
score and feeds the drop detector each feedback (a rule may watch a feedback name).

The service assembles the stages; the stages themselves never read the composed
configuration.  The checks ``check-config`` runs (:mod:`.preflight`) run here too, so
``serve`` refuses to start on exactly the problems ``check-config`` reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ragtrace_collector.alerts.detector import DropDetector
from ragtrace_collector.component import Supervisor
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.config import ConfigError
from ragtrace_collector.evaluation.case_builder import CaseRules
from ragtrace_collector.evaluation.evaluator import OnlineEvaluator
from ragtrace_collector.evaluation.pool import EvaluationPool
from ragtrace_collector.evaluation.sampling import Sampler
from ragtrace_collector.evaluation.segments import Segments
from ragtrace_collector.evaluation.stage import EvaluationStage, JudgeStatus
from ragtrace_collector.feedback.stage import FeedbackStage
from ragtrace_collector.judges.base import JudgeCallRecord
from ragtrace_collector.judges.factory import make_judge
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import Metric
from ragtrace_collector.results import MetricResult
from ragtrace_collector.service.preflight import (
    checked_metrics,
    load_reference_store,
    preflight_problems,
)
from ragtrace_collector.stores.session import SessionStore, create_session_store

if TYPE_CHECKING:
    from ragtrace_collector.component.telemetry import Telemetry
    from ragtrace_collector.config import CollectorConfig

__all__ = ["FeedbackAlerts", "build_feedback_stage", "build_stage"]

_ID_METRICS = frozenset({"id_context_recall", "id_context_precision"})


def _warn_about_alerts(config: CollectorConfig, log: Any) -> None:
    """Notifiers without rules send nothing (there are no default rules): a warning."""
    alerts = config.alerts
    notifies = (alerts.webhook is not None and alerts.webhook.enabled) or (
        alerts.alertmanager is not None and alerts.alertmanager.enabled
    )
    if alerts.enabled and notifies and not alerts.rules:
        log.warning(
            "alerts_without_rules",
            detail="a webhook or Alertmanager is configured but alerts.rules is empty;"
            " the drop detector has no default rules and will send nothing",
        )


class FeedbackAlerts:
    """The feedback stage's observer: hands each feedback to the drop detector (built
    after the feedback stage, by :func:`build_stage`), whose rules on
    ``feedback:<name>`` watch its mean."""

    def __init__(self) -> None:
        self.detector: DropDetector | None = None

    def __call__(
        self, service: str, name: str, value: float, trace_id: str, values: tuple[str, ...]
    ) -> None:
        if self.detector is not None:
            self.detector.observe_feedback(service, name, value, trace_id, segments=values)


def build_feedback_stage(
    config: CollectorConfig,
    telemetry: Telemetry,
    *,
    supervisor: Supervisor | None = None,
    alerts: FeedbackAlerts | None = None,
) -> FeedbackStage:
    """The feedback stage ``config`` describes: its join kept beside the write-ahead
    log (``storage.directory``) or in the session store's Redis, synced as the log is."""
    storage = config.storage
    return FeedbackStage(
        config.feedback,
        telemetry=telemetry,
        segments=config.segments,
        directory=storage.directory,
        synchronous="NORMAL" if storage.fsync == "never" else "FULL",
        session_store=config.session_store,
        supervisor=supervisor,
        observers=[alerts] if alerts is not None else [],
    )


def _pooled_metrics(metrics: list[Metric], offline: bool) -> list[Metric]:
    """The metrics whose work is CPU (no judge, or the offline judge): the pool's."""
    return [m for m in metrics if offline or not m.uses_judge]


def build_stage(
    config: CollectorConfig,
    telemetry: Telemetry,
    *,
    supervisor: Supervisor | None = None,
    feedback: FeedbackStage | None = None,
    feedback_alerts: FeedbackAlerts | None = None,
) -> EvaluationStage:
    """The evaluation stage ``config`` describes.  Raises :class:`ConfigError` with
    every problem of :func:`~ragtrace_collector.service.preflight.preflight_problems` (a
    missing API key variable, a broken reference file, an alert rule on a metric that
    is not evaluated...), the checks ``check-config`` runs too.  A reference file that
    does not exist yet is a ``reference_store`` status instead.  ``supervisor`` runs
    the stage's background loops.  ``feedback`` hears every result (for the join);
    ``feedback_alerts`` gets the drop detector."""
    log = get_logger("evaluation")
    listeners: list[Any] = []
    on_call_hooks: list[Any] = []

    def on_call(record: JudgeCallRecord) -> None:
        for hook in on_call_hooks:
            hook(record)

    # The checks check-config runs too (one function); the reference file is read once.
    problems = preflight_problems(config, reference_file=False)
    reference_store, reference_problems = load_reference_store(
        config, supervisor=supervisor, missing_ok=True
    )
    problems += reference_problems
    if problems:
        raise ConfigError(problems, "configuration")
    metrics, _problems = checked_metrics(config)
    try:
        judge = make_judge(config.judge, on_call=on_call)
    except ValueError as exc:
        raise ValueError(f"judge: {exc}") from exc
    window = max((m.options.window_size for m in metrics if m.kind == "conversation"), default=10)
    session_store: SessionStore = create_session_store(config.session_store, window_size=window)
    segments = Segments(config.segments, telemetry=telemetry)
    if segments:
        telemetry.results.set_segment_labels(segments.labels_names)
        segments.add_evict_listener(telemetry.results.forget)
    detector: DropDetector | None = None
    _warn_about_alerts(config, log)
    if config.alerts.enabled and config.alerts.rules:
        detector = DropDetector.from_config(
            config.alerts, telemetry=telemetry, segments=config.segments
        )
        active = detector

        def feed(
            service: str,
            metric: str,
            result: MetricResult,
            trace_id: str,
            values: tuple[str, ...],
        ) -> None:
            active.observe(service, metric, result.score, trace_id, segments=values)

        listeners.append(feed)
        if feedback_alerts is not None:
            feedback_alerts.detector = detector
    if feedback is not None:
        listeners.append(feedback.scored)
    pool: EvaluationPool | None = None
    pooled = _pooled_metrics(metrics, isinstance(judge, OfflineJudge))
    processes = config.evaluation.worker_processes
    if processes >= 1 and pooled:
        pool = EvaluationPool(
            pooled,
            processes=processes,
            metric_timeout=config.evaluation.metric_timeout,
            supervisor=supervisor,
            on_judge_call=on_call,
        )
    # The reference-id overlap watch only matters when ids are scored.
    case_rules = CaseRules(config.cases, watch_ids=any(m.name in _ID_METRICS for m in metrics))
    if case_rules.document_ids.watch is not None:
        case_rules.document_ids.watch.bind(telemetry.reference_id_overlap)
    evaluator = OnlineEvaluator(
        config.evaluation,
        metrics=metrics,
        judge=judge,
        sampler=Sampler(config.sampling, telemetry=telemetry),
        session_store=session_store,
        enrichment=config.enrichment,
        telemetry=telemetry,
        reference_lookup=reference_store.lookup if reference_store is not None else None,
        listeners=listeners,
        case_rules=case_rules,
        pool=pool,
        supervisor=supervisor,
        segments=segments,
    )
    on_call_hooks.append(evaluator.judge_listener())
    judge_status = JudgeStatus(judge.model)
    on_call_hooks.append(judge_status.on_call)
    log.info(
        "evaluation_configured",
        judge=judge.model,
        heuristic=judge.heuristic,
        metrics=[m.name for m in metrics],
        sample_rate=config.sampling.rate,
        segments=list(segments.keys),
        alert_rules=[r.name for r in config.alerts.rules] if detector else [],
        reference_store=str(config.reference_store.path) if config.reference_store else None,
        session_store=config.session_store.backend,
        processes=pool.processes if pool is not None else 0,
    )
    return EvaluationStage(
        evaluator,
        detector=detector,
        reference_store=reference_store,
        judge_status=judge_status,
        supervisor=supervisor,
    )
