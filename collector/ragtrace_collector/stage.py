"""The evaluation stage, assembled from config: judge, metrics, sampler, stores,
evaluator and drop detector, with one lifecycle.

``serve`` builds it with :func:`build_stage`, passes :attr:`EvaluationStage.processor`
to the pipeline as its trace processor, and calls :meth:`EvaluationStage.start` /
:meth:`EvaluationStage.aclose` around the service's own lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ragtrace_collector.alerts.detector import DropDetector
from ragtrace_collector.component import Supervisor
from ragtrace_collector.evalpool import EvaluationPool
from ragtrace_collector.evaluator import OnlineEvaluator
from ragtrace_collector.judges.base import JudgeCallRecord
from ragtrace_collector.judges.factory import make_judge
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.logs import get_logger
from ragtrace_collector.metrics import OFFLINE_METRICS, Metric, MetricOptions, build_metrics
from ragtrace_collector.reference_store import ReferenceStore, ReferenceStoreError
from ragtrace_collector.results import MetricResult
from ragtrace_collector.sampling import Sampler
from ragtrace_collector.session_store import create_session_store

if TYPE_CHECKING:
    from ragtrace_collector.config import CollectorConfig
    from ragtrace_collector.telemetry import Telemetry

__all__ = ["EvaluationStage", "build_stage"]


class EvaluationStage:
    """Everything evaluation needs at run time, started and stopped together."""

    def __init__(
        self,
        evaluator: OnlineEvaluator,
        *,
        detector: DropDetector | None,
        reference_store: ReferenceStore | None,
    ) -> None:
        self.evaluator = evaluator
        self.detector = detector
        self.reference_store = reference_store
        self._detector_task: asyncio.Task[None] | None = None

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
            self._detector_task = asyncio.create_task(self.detector.run(), name="ragtrace-alerts")

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


def _check_metric_defaults(defaults: Mapping[str, Any]) -> None:
    """``evaluation.metric_defaults`` holds metric options: check them on their own, so
    that a typo names its key rather than the first metric it is applied to."""
    try:
        MetricOptions.model_validate(dict(defaults))
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            key = ".".join(str(p) for p in error["loc"])
            if error["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, list(MetricOptions.model_fields), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(f"evaluation.metric_defaults.{key}: unknown key{hint}")
            else:
                problems.append(f"evaluation.metric_defaults.{key}: {error['msg']}")
        raise ValueError("; ".join(problems)) from None


def _check_alert_rules(config: CollectorConfig, evaluated: list[str], log: Any) -> None:
    """A rule on a metric this collector does not compute could never fire: that is a
    configuration error, not a silent no-op.  Notifiers without rules get a warning
    (there are no default rules)."""
    for index, rule in enumerate(config.alerts.rules):
        if rule.metric not in evaluated:
            close = difflib.get_close_matches(rule.metric, evaluated, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"alerts.rules.{index}.metric: rule {rule.name!r} watches {rule.metric!r},"
                f" which this collector does not evaluate, so it could never fire ({hint}"
                f"evaluated metrics: {', '.join(evaluated)})"
            )
    alerts = config.alerts
    notifies = (alerts.webhook is not None and alerts.webhook.enabled) or (
        alerts.alertmanager is not None and alerts.alertmanager.enabled
    )
    if notifies and not alerts.rules:
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
    """The evaluation stage ``config`` describes.  Raises ``ValueError`` with a clear
    message for settings that only fail when built (e.g. a missing API key variable,
    a broken reference file).  ``supervisor`` runs its background tasks."""
    log = get_logger("evaluation")
    listeners: list[Any] = []
    on_call_hooks: list[Any] = []

    def on_call(record: JudgeCallRecord) -> None:
        for hook in on_call_hooks:
            hook(record)

    try:
        judge = make_judge(config.judge, on_call=on_call)
    except ValueError as exc:
        raise ValueError(f"judge: {exc}") from exc
    _check_metric_defaults(config.evaluation.metric_defaults)
    names = list(config.metrics) if config.metrics is not None else list(OFFLINE_METRICS)
    try:
        metrics = build_metrics(
            names, config.metrics or {}, defaults=config.evaluation.metric_defaults
        )
    except ValueError as exc:
        raise ValueError(f"metrics: {exc}") from exc
    reference_store: ReferenceStore | None = None
    if config.reference_store is not None:
        try:
            reference_store = ReferenceStore(config.reference_store)
        except (ReferenceStoreError, OSError, ValueError) as exc:
            raise ValueError(f"reference_store.path: {exc}") from exc
    window = max((m.options.window_size for m in metrics if m.kind == "conversation"), default=10)
    session_store = create_session_store(config.session_store, window_size=window)
    detector: DropDetector | None = None
    if config.alerts.enabled:
        _check_alert_rules(config, [m.name for m in metrics], log)
    if config.alerts.enabled and config.alerts.rules:
        detector = DropDetector.from_config(config.alerts, telemetry=telemetry)
        active = detector

        def feed(service: str, metric: str, result: MetricResult, trace_id: str) -> None:
            active.observe(service, metric, result.score, trace_id)

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
        pool=pool,
        supervisor=supervisor,
    )
    on_call_hooks.append(evaluator.judge_listener())
    log.info(
        "evaluation_configured",
        judge=judge.model,
        heuristic=judge.heuristic,
        metrics=[m.name for m in metrics],
        sample_rate=config.sampling.rate,
        alert_rules=[r.name for r in config.alerts.rules] if detector else [],
        reference_store=str(config.reference_store.path) if config.reference_store else None,
        session_store=config.session_store.backend,
        processes=pool.processes if pool is not None else 0,
    )
    return EvaluationStage(evaluator, detector=detector, reference_store=reference_store)
