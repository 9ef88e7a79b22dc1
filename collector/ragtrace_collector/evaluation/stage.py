"""The evaluation stage, assembled from config: judge, metrics, sampler, stores,
evaluator and drop detector, with one lifecycle.

``serve`` builds it with :func:`build_stage`, passes :attr:`EvaluationStage.processor`
to the pipeline as its trace processor, and calls :meth:`EvaluationStage.start` /
:meth:`EvaluationStage.aclose` around the service's own lifecycle.

Its components (:attr:`EvaluationStage.components`, registered by the service):
``judge`` (``recoverable_error`` while judge calls fail or time out, ``ok`` on the
next answer), ``session_store``, ``reference_store``, the drop detector
(``alerts:detector``) and one ``notifier:<name>`` per alert notifier.  The drop
detector's loop and the reference store's polling run under the service's supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from ragtrace_collector.alerts.detector import DropDetector
from ragtrace_collector.config import ConfigError
from ragtrace_collector.evaluation.case_builder import CaseRules
from ragtrace_collector.evaluation.evaluator import OnlineEvaluator
from ragtrace_collector.evaluation.pool import EvaluationPool
from ragtrace_collector.evaluation.sampling import Sampler
from ragtrace_collector.evaluation.segments import Segments
from ragtrace_collector.judges.base import JudgeCallRecord
from ragtrace_collector.judges.factory import make_judge
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import Metric
from ragtrace_collector.results import MetricResult
from ragtrace_collector.service.component import Component, Status, Supervisor
from ragtrace_collector.service.logs import get_logger
from ragtrace_collector.service.preflight import (
    checked_metrics,
    load_reference_store,
    preflight_problems,
)
from ragtrace_collector.stores.reference import ReferenceStore
from ragtrace_collector.stores.session import SessionStore, create_session_store

if TYPE_CHECKING:
    from ragtrace_collector.config import CollectorConfig
    from ragtrace_collector.service.telemetry import Telemetry

__all__ = ["EvaluationStage", "build_stage"]

_ID_METRICS = frozenset({"id_context_recall", "id_context_precision"})


class JudgeStatus(Component):
    """The ``judge`` component, fed by the judge's ``on_call`` hook: an answered call
    reports ``ok``, a failed or timed-out one ``recoverable_error``."""

    component_name = "judge"

    def __init__(self, model: str) -> None:
        self._model = model
        self.report(Status.OK)

    def on_call(self, record: JudgeCallRecord) -> None:
        if record.outcome in ("ok", "cached"):
            self.report_ok()
        elif record.outcome in ("error", "timeout"):
            self.report(
                Status.RECOVERABLE_ERROR, f"{self._model}: {record.task} call {record.outcome}"
            )


class EvaluationStage:
    """Everything evaluation needs at run time, started and stopped together."""

    def __init__(
        self,
        evaluator: OnlineEvaluator,
        *,
        detector: DropDetector | None,
        reference_store: ReferenceStore | None,
        judge_status: JudgeStatus | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.evaluator = evaluator
        self.detector = detector
        self.reference_store = reference_store
        self.judge_status = judge_status
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._detector_task: asyncio.Task[None] | None = None

    @property
    def components(self) -> list[Component]:
        """Every component of the stage, for the service's host."""
        parts: list[Any] = [self.judge_status, self.evaluator.sessions, self.reference_store]
        if self.detector is not None:
            parts += [self.detector.component, *self.detector.notifiers]
        return [p for p in parts if isinstance(p, Component)]

    @property
    def processor(self) -> OnlineEvaluator:
        return self.evaluator

    @property
    def pool(self) -> EvaluationPool | None:
        """The worker processes (component ``evaluation:workers``), if any."""
        return self.evaluator.pool

    def start(self) -> None:
        """Start workers and background loops (needs a running event loop)."""
        self.evaluator.start()
        if self.reference_store is not None:
            self.reference_store.start()
        if self.detector is not None and self.detector.config.rules:
            self._detector_task = self._supervisor.spawn(
                self.detector.component, self.detector.run, name="alerts-detector"
            )

    async def aclose(self) -> None:
        """After the pipeline drained: stop the loops and close the notifiers.

        Alert state is not persisted: an alert still firing in Alertmanager resolves
        there by itself once its ``endsAt`` passes (see
        :mod:`ragtrace_collector.alerts.detector`, "Restarts")."""
        if self._detector_task is not None:
            self._detector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._detector_task
        if self.detector is not None:
            await self.detector.aclose()
        if self.reference_store is not None:
            await self.reference_store.aclose()
        if self.pool is not None:
            await self.pool.aclose()  # if the drain was cut short: no worker outlives us


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


def _pooled_metrics(metrics: list[Metric], offline: bool) -> list[Metric]:
    """The metrics whose work is CPU (no judge, or the offline judge): the pool's."""
    return [m for m in metrics if offline or not m.uses_judge]


def build_stage(
    config: CollectorConfig, telemetry: Telemetry, *, supervisor: Supervisor | None = None
) -> EvaluationStage:
    """The evaluation stage ``config`` describes.  Raises :class:`ConfigError` with
    every problem of :func:`~ragtrace_collector.service.preflight.preflight_problems` (a
    missing API key variable, a broken reference file, an alert rule on a metric that
    is not evaluated...), the checks ``check-config`` runs too.  A reference file that
    does not exist yet is a ``reference_store`` status instead.  ``supervisor`` runs
    the stage's background loops."""
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
    segments = Segments(config.segments)
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
