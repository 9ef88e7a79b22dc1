"""The evaluation stage, assembled from config: judge, metrics, sampler, stores,
evaluator and drop detector, with one lifecycle.

``serve`` builds it from the configuration
(:func:`ragtrace_collector.service.stages.build_stage`), passes
:attr:`EvaluationStage.processor` to the pipeline as its trace processor, and calls
:meth:`EvaluationStage.start` / :meth:`EvaluationStage.aclose` around the service's own
lifecycle.

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

from ragtrace_collector.component import Component, Status, Supervisor
from ragtrace_collector.evaluation.evaluator import OnlineEvaluator
from ragtrace_collector.evaluation.pool import EvaluationPool
from ragtrace_collector.judges.base import JudgeCallRecord

if TYPE_CHECKING:
    from ragtrace_collector.alerts.detector import DropDetector
    from ragtrace_collector.stores.reference import ReferenceStore

__all__ = ["EvaluationStage", "JudgeStatus"]


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
        if self.detector is not None:
            if self.detector.config.rules:
                self._detector_task = self._supervisor.spawn(
                    self.detector.component, self.detector.run, name="alerts-detector"
                )
            # Started: readiness does not wait for a first evaluation.
            self.detector.component.report_ok()

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
