"""Online evaluation: the trace processor that scores sampled traces.

It plugs into the pipeline's one hook
(:class:`~ragtrace_collector.service.pipeline.TraceProcessor`).
For every ready trace:

1. build one case per case span (a ``@rag`` span, or the outermost chain/agent span
   with a retriever below it, whatever the convention:
   :mod:`ragtrace_collector.evaluation.case_builder`), filling ground truth from the reference
   store; a trace that cannot hold a case is forwarded at once;
2. sample (:mod:`ragtrace_collector.evaluation.sampling`): the decision and the rate go on every
   ``@rag`` span; a trace that is not sampled, or that has no ``@rag`` span, is
   forwarded at once and never waits on a judge;
3. queue it (bounded).  A full queue means the trace is forwarded unevaluated and
   counted (``ragtrace_eval_skipped{reason="overload"}``) — never dropped, never
   delayed;
4. a worker runs the metrics concurrently, each under ``metric_timeout`` and all under
   ``trace_timeout``; conversation metrics score the window that ends at this turn
   and keep the running conversation mean in the session store;
5. write the results onto the ``@rag`` span (:mod:`ragtrace_collector.evaluation.enrichment`),
   record telemetry and feed the drop detector, then forward.

With ``segments:`` configured (:mod:`ragtrace_collector.evaluation.segments`), each
sampled case's segment values are read when it is admitted (case span, resource,
retriever spans), those the case span lacks are written onto it, and its results are
recorded and fed to the detector with their bounded label values.

Where the work runs (the event loop does only I/O):

* every case is first held to the input bounds (:mod:`ragtrace_collector.evaluation.case_bounds`):
  over a bound, its metrics are skipped (or scored on truncated inputs) with the
  reason on the span;
* the CPU-bound metrics (no judge, or the offline judge) run in the worker processes
  of :class:`~ragtrace_collector.evaluation.pool.EvaluationPool`, all of a case's in one
  item, bounded by ``metric_timeout`` there; the worker also makes the per-document
  verdicts and encodes each result for the span, so that this process only appends
  bytes.  A small case whose metrics all need no judge is scored right here (cheaper
  than shipping it), as is everything when there is no pool
  (``evaluation.processes: 0``);
* LLM-judge metrics wait on litellm on the loop, one task per metric under
  ``metric_timeout``;
* a trace of more than ``_THREAD_BUILD_SPANS`` spans is turned into cases in a thread.

With ``enrichment.attach: carrier`` the trace is forwarded as soon as it is sampled
and the results follow on a carrier span.  With ``attach: span`` (the default), a
metric still running at ``trace_timeout`` is written as ``.error = "timeout"`` and the
trace goes on; ``late_results: carrier`` lets such a metric finish and sends its
result on a carrier span instead.  So it does in carrier mode: there the metrics done
by ``trace_timeout`` go on one carrier and the late ones follow on another.

With a write-ahead log (``storage.directory``) the pipeline hands the evaluator its
ledger of outputs (:meth:`OnlineEvaluator.use_ledger`): a trace whose results follow
it (carrier, late results) keeps its log entries until the carrier is logged; results
written on a span are logged before the trace is forwarded; and at a replay, a case
whose results the log held gets them back, only the metrics without a logged result
are computed, and those follow on a carrier (the trace may have reached an exporter
already).  So do the results of a replayed trace that a delivery mark says reached
some exporter before the restart (:meth:`OutputLedger.reached`), even when the log
held none of its results: with ``late_results: carrier``, a crash after the trace
went out and before its late results were computed still delivers them.

When the session store fails (Redis down, hung or refusing), the case metrics run and
are written as usual; each conversation metric gets ``.error = "session store
unavailable"`` with the store's error as its reason.  After the store recovers, a
window that lacks turns (evaluated during the outage, or never arrived) is still
scored, and its reason says which turns are missing ("turns 3–4 missing").  Only turns
the app indexed (``ragtrace.turn.index``) can be named missing: turns without an index
are numbered by the session store (1, 2, 3, ... by start), which knows no turn before
it arrives; each window result carries its turn's number in ``details["turn"]``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.cases import ContextItem, Conversation, Turn
from ragtrace_collector.component import Component, Status, Supervisor
from ragtrace_collector.component.logs import get_logger, redact
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.evaluation.case_bounds import case_chars, check_case
from ragtrace_collector.evaluation.case_builder import (
    BuiltCase,
    CaseRules,
    build_cases,
    may_hold_case,
)
from ragtrace_collector.evaluation.config import EvaluationConfig
from ragtrace_collector.evaluation.enrichment import (
    EnrichmentConfig,
    EvalSummary,
    case_extra,
    enrich_span,
    make_carrier_span,
)
from ragtrace_collector.evaluation.pool import Annex, CaseWork, EvaluationPool
from ragtrace_collector.evaluation.sampling import Sampler, SamplingDecision, trace_attribute_lookup
from ragtrace_collector.evaluation.segments import Segments, SegmentValues
from ragtrace_collector.judges.base import Judge, JudgeCallRecord
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import NOTHING_RETRIEVED_YET, ConversationMetric, Metric
from ragtrace_collector.otlp import protowire
from ragtrace_collector.otlp.codec import Span, SpanGroup
from ragtrace_collector.otlp.spanattrs import attributes_to_dict
from ragtrace_collector.results import MetricResult, trusted
from ragtrace_collector.storage.outputs import Hold, OutputLedger
from ragtrace_collector.stores.session import (
    SessionStore,
    SessionStoreError,
    SessionTurn,
    TurnContext,
)

__all__ = ["EvaluationConfig", "OnlineEvaluator", "ResultListener"]

Forward = Callable[[AssembledTrace], None]
#: Called for every metric result: (service, metric, result, trace id hex, segment
#: values in the order of the ``segments:`` keys).
ResultListener = Callable[[str, str, MetricResult, str, tuple[str, ...]], None]
#: Traces with more spans than this are turned into cases in a thread, off the loop.
_THREAD_BUILD_SPANS = 2000


@dataclass
class _Job:
    trace: AssembledTrace
    forward: Forward
    cases: list[BuiltCase]
    decision: SamplingDecision
    enqueued_at: float
    groups_of: dict[int, SpanGroup] = field(default_factory=dict)
    #: id(case span) -> its raw segment values (with ``segments:`` configured)
    segments: dict[int, SegmentValues] = field(default_factory=dict)
    #: Keeps the trace's log entries while outputs made after it may still come.
    hold: Hold | None = None
    #: Case (by id of its BuiltCase) -> metrics whose results the log already held.
    logged: dict[int, frozenset[str]] = field(default_factory=dict)
    #: Replayed, and some exporter had it before the restart (a delivery mark).
    reached: bool = False

    def release(self) -> None:
        if self.hold is not None:
            self.hold.release()

    def forward_output(self, trace: AssembledTrace) -> None:
        """Forward a carrier made from this job's trace (logged first, with a hold)."""
        if self.hold is not None:
            self.hold.forward(trace)
        else:
            self.forward(trace)


@dataclass(eq=False)
class _Pending:
    """Metrics of one case still running: one pool item, or one task (LLM judge,
    conversation window); the future gives their results."""

    future: asyncio.Future[list[MetricResult]]
    names: tuple[str, ...]
    #: From the pool: a "timeout" result there is counted here.
    pooled: bool = False
    #: From the pool: what its worker computed besides the results (by metric).
    annex: dict[str, Annex] | None = None


@dataclass
class _CaseOutcome:
    built: BuiltCase
    results: list[MetricResult]
    extra: dict[str, dict[str, Any]]
    pending: list[_Pending]
    #: What the input bounds truncated, prefixed to every reason ("" if nothing).
    note: str = ""
    #: Results already encoded for the span (by the workers), for ``enrich_span``.
    encoded: dict[tuple[str, int], bytes] = field(default_factory=dict)


class OnlineEvaluator(Component):
    """The evaluation stage (component ``evaluation``): a
    :class:`~ragtrace_collector.service.pipeline.TraceProcessor`.

    ``pool`` runs the CPU-bound metrics in worker processes; None scores them in
    this process (``evaluation.processes: 0``, and tests).
    """

    component_name = "evaluation"

    def __init__(
        self,
        config: EvaluationConfig,
        *,
        metrics: Sequence[Metric],
        judge: Judge,
        sampler: Sampler,
        session_store: SessionStore,
        enrichment: EnrichmentConfig,
        telemetry: Telemetry,
        reference_lookup: Callable[[str], Any] | None = None,
        listeners: Sequence[ResultListener] = (),
        case_rules: CaseRules | None = None,
        pool: EvaluationPool | None = None,
        supervisor: Supervisor | None = None,
        segments: Segments | None = None,
    ) -> None:
        self.config = config
        self._segments = segments if segments else None
        self.pool = pool
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self.judge = judge
        self.sampler = sampler
        self.sessions = session_store
        self.enrichment = enrichment
        self._telemetry = telemetry
        self._reference_lookup = reference_lookup
        self._listeners = list(listeners)
        self._case_rules = case_rules or CaseRules()
        self._log = get_logger("evaluator")
        self.case_metrics: list[Metric] = [m for m in metrics if m.kind == "case"]
        self.conversation_metrics: list[ConversationMetric] = [
            m for m in metrics if isinstance(m, ConversationMetric) and m.kind == "conversation"
        ]
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(config.queue_size)
        self._workers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._session_locks: dict[str, asyncio.Lock] = {}
        # (session, metric) -> done when the latest turn's window step has finished:
        # each turn adds its window score after the turns that arrived before it.
        self._window_steps: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._draining = False
        self._depth = telemetry.queue_depth.labels("evaluation")
        #: The write-ahead log's ledger of outputs (set by the pipeline when there is
        #: a log): results and carriers are logged, and a replayed trace whose results
        #: the log held is not evaluated again.
        self.ledger: OutputLedger | None = None
        #: Cases whose results (some or all) came from the log at a replay.
        self.restored_cases = 0
        # Where each case metric runs: CPU-bound ones (no judge, or the offline judge)
        # inline or in the pool, the others (LLM judge) as tasks on the loop.
        offline = isinstance(judge, OfflineJudge)
        self._cpu_metrics = [m for m in self.case_metrics if offline or not m.uses_judge]
        self._task_metrics = [m for m in self.case_metrics if m not in self._cpu_metrics]
        self._skipped_cache: dict[tuple[str, str], MetricResult] = {}
        # A case with any metric for the pool sends all its CPU metrics there: the
        # collector process then only builds, samples and writes results.
        self._cpu_needs_pool = any(m.uses_judge for m in self._cpu_metrics)
        # Results are written sorted by metric: each one's OpenInference evaluation
        # number on a span that has none yet, so that the workers encode them.
        order = sorted(m.name for m in (*self.case_metrics, *self.conversation_metrics))
        self._positions = {name: i for i, name in enumerate(order)}

    @property
    def status_detail(self) -> str | None:
        """The reference-id overlap warning (cases.id_overlap_window), if any."""
        return self._case_rules.document_ids.warning()

    # ------------------------------------------------------------ lifecycle
    def use_ledger(self, ledger: OutputLedger) -> None:
        """Called by the pipeline when a write-ahead log keeps what it accepts."""
        self.ledger = ledger

    def start(self) -> None:
        """Start the workers (needs a running event loop)."""
        if self._workers:
            return
        if self.pool is not None:
            self.pool.start()
        for i in range(self.config.workers):
            self._workers.append(
                self._supervisor.spawn(self, self._work, name=f"ragtrace-eval-{i}")
            )
        self.report_ok()

    async def drain(self) -> None:
        """Shutdown: traces still queued are forwarded unevaluated (counted as
        ``shutdown``); evaluations in flight finish or time out as usual."""
        self._draining = True
        self.report(Status.STOPPING)
        while True:
            try:
                job = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            self._queue.task_done()
            self._skip(job, "shutdown")
        self._depth.set(0)
        await self._queue.join()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        if self.pool is not None:
            await self.pool.aclose()
        await self.sessions.aclose()
        self.report(Status.STOPPED)

    # ----------------------------------------------------------- telemetry
    def judge_listener(self) -> Callable[[JudgeCallRecord], None]:
        """An ``on_call`` hook for the judge: judge calls, tokens, cost, latency."""
        t = self._telemetry

        def on_call(rec: JudgeCallRecord) -> None:
            t.judge_calls.labels(rec.model, rec.outcome).inc()
            if rec.outcome != "cached":
                t.judge_latency.labels(rec.model).observe(rec.latency_s)
            if rec.prompt_tokens:
                t.judge_tokens.labels(rec.model, "prompt").inc(rec.prompt_tokens)
            if rec.completion_tokens:
                t.judge_tokens.labels(rec.model, "completion").inc(rec.completion_tokens)
            if rec.cost_usd:
                t.judge_cost.labels(rec.model).inc(rec.cost_usd)

        return on_call

    # --------------------------------------------------------------- submit
    def submit(self, trace: AssembledTrace, forward: Forward) -> None:
        if not self.config.enabled or trace.late or self._draining:
            forward(trace)
            return
        if trace.span_count > _THREAD_BUILD_SPANS:
            # Even the prefilter over a huge trace would hold the loop, and decoding
            # its attributes more so: both run in a thread.
            task = self._supervisor.run_once(
                self, self._submit_large(trace, forward), name="ragtrace-eval-large-trace"
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return
        if not may_hold_case((s for g in trace.groups for s in g.spans), self._case_rules):
            forward(trace)  # not RAG (no retriever, no case span): unscored, at once
            return
        cases, groups_of = self._build(trace)
        self._admit(trace, forward, cases, groups_of)

    async def _submit_large(self, trace: AssembledTrace, forward: Forward) -> None:
        try:
            spans = [s for g in trace.groups for s in g.spans]
            if await asyncio.to_thread(may_hold_case, spans, self._case_rules):
                cases, groups_of = await asyncio.to_thread(self._build, trace)
                self._admit(trace, forward, cases, groups_of)
                return
        except Exception as exc:  # never lose the trace over a bad span
            self._log.error("case_building_failed", trace_id=trace.trace_id_hex, error=repr(exc))
        if not trace.forwarded:
            forward(trace)

    def _build(self, trace: AssembledTrace) -> tuple[list[BuiltCase], dict[int, SpanGroup]]:
        """The cases of ``trace``, and each span's group (pure; may run in a thread)."""
        groups_of: dict[int, SpanGroup] = {}
        spans: list[Span] = []
        for span, group in trace.spans():
            spans.append(span)
            groups_of[id(span)] = group
        service_cache: dict[int, str] = {}

        def service_of(span: Span) -> str:
            group = groups_of[id(span)]
            key = id(group.resource)
            name = service_cache.get(key)
            if name is None:
                name = "unknown"
                if group.resource is not None:
                    for kv in group.resource.attributes:
                        if kv.key == "service.name":
                            name = kv.value.string_value or "unknown"
                service_cache[key] = name
            return name

        cases = build_cases(
            spans,
            service_of=service_of,
            reference_lookup=self._reference_lookup,
            rules=self._case_rules,
            prefiltered=True,  # by submit
        )
        return cases, groups_of

    def _admit(
        self,
        trace: AssembledTrace,
        forward: Forward,
        cases: list[BuiltCase],
        groups_of: dict[int, SpanGroup],
    ) -> None:
        """Sample a trace that has cases, and queue it for evaluation or forward it."""
        if not cases or self._draining:
            forward(trace)
            return
        logged: dict[int, frozenset[str]] = {}
        reached = self.ledger is not None and self.ledger.reached(trace)
        if self.ledger is not None and self.ledger.replayed_results:
            cases, logged = self._logged_results(trace, cases)
            if not cases:
                forward(trace)  # every result came from the log: none computed again
                return
        decision = self._sample(trace, cases, groups_of)
        decided = decision.attributes().items()
        for built in cases:
            span = built.span
            entries = protowire.span_attribute_entries(span.attributes, decided, built.attributes)
            if entries:
                span.MergeFromString(b"".join(entries))
        if not decision.sampled:
            if decision.outcome == "budget":
                self._telemetry.eval_skipped.labels("budget").inc()
            forward(trace)
            return
        job = _Job(
            trace,
            forward,
            cases,
            decision,
            time.monotonic(),
            groups_of,
            logged=logged,
            reached=reached,
        )
        if self._segments is not None:
            self._read_segments(job)
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            # Sampled (already counted by the sampler), then shed: counted once more,
            # under ragtrace_eval_skipped{reason="overload"}.
            self._skip(job, "overload")
            return
        self._depth.set(self._queue.qsize())

    def _sample(
        self, trace: AssembledTrace, cases: list[BuiltCase], groups_of: Mapping[int, SpanGroup]
    ) -> SamplingDecision:
        maps: list[Mapping[str, object]] = []
        resources: set[int] = set()
        for built in cases:
            maps.append(built.attributes)
            group = groups_of[id(built.span)]
            if group.resource is not None and id(group.resource) not in resources:
                resources.add(id(group.resource))
                maps.append(attributes_to_dict(group.resource.attributes))
            if built.ground_truth_source == "reference_store":
                # Ground truth that only the reference store has still counts for
                # the "always evaluate traces with ground truth" rule.
                maps.append({semconv.EXPECTED_OUTPUT: True})
        session_id = next((c.session_id for c in cases if c.session_id), None)
        return self.sampler.decide(trace.trace_id, session_id, trace_attribute_lookup(maps))

    def _read_segments(self, job: _Job) -> None:
        """Each case's segment values; those the case span lacks are written onto it."""
        segments = self._segments
        assert segments is not None
        spans: dict[str, Span] | None = None
        for built in job.cases:
            retrievers: list[Span] = []
            if built.document_sources:
                if spans is None:
                    spans = {s.span_id.hex(): s for s, _ in job.trace.spans()}
                for source in built.document_sources:
                    found = spans.get(source.span_id)
                    if found is not None and (not retrievers or retrievers[-1] is not found):
                        retrievers.append(found)
            resource = job.groups_of[id(built.span)].resource
            values = segments.read(
                built.attributes, resource.attributes if resource is not None else None, retrievers
            )
            job.segments[id(built.span)] = values
            missing = segments.missing_on_span(values, built.attributes)
            if missing:
                entries = protowire.span_attribute_entries(built.span.attributes, missing, ())
                built.span.MergeFromString(b"".join(entries))

    def _skip(self, job: _Job, reason: str) -> None:
        self._telemetry.eval_skipped.labels(reason).inc()
        job.forward(job.trace)

    def _logged_results(
        self, trace: AssembledTrace, cases: list[BuiltCase]
    ) -> tuple[list[BuiltCase], dict[int, frozenset[str]]]:
        """Replay: the results the log held for these cases are used, not computed
        again.  A span logged with its results is restored as it was forwarded; a
        carrier in the log is delivered from there.  Returns the cases with metrics
        still to compute, and for each the metrics already done."""
        assert self.ledger is not None
        wanted = {m.name for m in (*self.case_metrics, *self.conversation_metrics)}
        todo: list[BuiltCase] = []
        done_of: dict[int, frozenset[str]] = {}
        for built in cases:
            found = self.ledger.logged(trace.trace_id, built.span.span_id)
            if found is None:
                todo.append(built)
                continue
            if found.span is not None:
                built.span.CopyFrom(found.span)
            done = frozenset(found.metrics() & wanted)
            self.restored_cases += 1
            if done >= wanted:
                continue
            todo.append(built)
            done_of[id(built)] = done
        return todo, done_of

    # -------------------------------------------------------------- workers
    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            self._depth.set(self._queue.qsize())
            try:
                await self._evaluate(job)
            except asyncio.CancelledError:
                if not job.trace.forwarded:
                    job.forward(job.trace)
                raise
            except Exception as exc:  # never lose the trace over an evaluator bug
                self._log.error(
                    "evaluation_failed", trace_id=job.trace.trace_id_hex, error=repr(exc)
                )
                if not job.trace.forwarded:
                    job.forward(job.trace)
                job.release()
            finally:
                self._queue.task_done()

    async def _evaluate(self, job: _Job) -> None:
        started = time.monotonic()
        # A replayed trace that reached some exporter before the restart (a delivery
        # mark), or whose results were restored from the log, may be there already:
        # what is computed now follows on a carrier span.
        carrier_mode = self.enrichment.attach == "carrier" or bool(job.logged) or job.reached
        if self.ledger is not None and (carrier_mode or self.config.late_results == "carrier"):
            # Results may follow the trace: its log entries stay until they are logged.
            job.hold = self.ledger.hold(job.trace)
        if carrier_mode:
            job.forward(job.trace)  # results follow on a carrier span
        outcomes = [
            await self._start_case(built, job.logged.get(id(built), frozenset()))
            for built in job.cases
        ]
        pending = [p.future for o in outcomes for p in o.pending]
        done: set[asyncio.Future[list[MetricResult]]] = {f for f in pending if f.done()}
        if len(done) < len(pending):  # only inline results: nothing to wait for
            done, _ = await asyncio.wait(pending, timeout=self.config.trace_timeout)
        late: list[tuple[_CaseOutcome, _Pending]] = []
        for outcome in outcomes:
            for item in outcome.pending:
                if item.future in done:
                    self._collect(outcome, item)
                    continue
                for name in item.names:
                    self._telemetry.eval_timeouts.labels(name).inc()
                # Let it finish, in carrier mode too (a replayed trace runs in it).
                if self.config.late_results == "carrier":
                    late.append((outcome, item))
                else:
                    item.future.cancel()
                    outcome.results.extend(
                        _timeout_result(name, self.config.trace_timeout) for name in item.names
                    )
        latency_ms = (time.monotonic() - started) * 1000.0
        total_usd = 0.0
        for outcome in outcomes:
            outcome.results.sort(key=lambda r: r.metric)
            summary = self._summary(job, outcome, latency_ms)
            total_usd += summary.cost_usd or 0.0
            self._record(outcome, job)
            if carrier_mode:
                if outcome.results or not any(o is outcome for o, _ in late):
                    # (a case whose every metric is late has no carrier yet)
                    self._forward_carrier(job, outcome.built, outcome.results, summary)
            else:
                enrich_span(
                    outcome.built.span,
                    outcome.results,
                    summary,
                    self.enrichment,
                    encoded=outcome.encoded,
                )
        if total_usd:
            self.sampler.record_cost(total_usd)
        self._telemetry.eval_latency.observe(latency_ms / 1000.0)
        if not carrier_mode:
            if self.ledger is not None:
                self.ledger.results(job.trace, [o.built.span for o in outcomes if o.results])
            job.forward(job.trace)
        if late:
            finisher = self._supervisor.run_once(
                self, self._finish_late(job, late, started), name="ragtrace-eval-late-results"
            )
            self._background.add(finisher)
            finisher.add_done_callback(self._background.discard)
        else:
            job.release()

    def _collect(self, outcome: _CaseOutcome, item: _Pending) -> None:
        """Move a finished item's results into its case's outcome."""
        annexes = item.annex
        for result in item.future.result():
            if outcome.note:
                result.reason = outcome.note + result.reason
            if item.pooled and result.error == "timeout":
                self._telemetry.eval_timeouts.labels(result.metric).inc()
            annex = annexes.get(result.metric) if annexes else None
            if annex is not None:
                extra, blob = annex
                if blob is not None:
                    outcome.encoded[(result.metric, self._positions[result.metric])] = blob
            else:
                extra = case_extra(result, outcome.built.case, outcome.built.document_sources)
            if extra:
                outcome.extra.setdefault(result.metric, {}).update(extra)
            outcome.results.append(result)

    async def _finish_late(
        self, job: _Job, late: list[tuple[_CaseOutcome, _Pending]], started: float
    ) -> None:
        try:
            # Each late item is still bounded by its own metric_timeout.
            await asyncio.wait([item.future for _, item in late])
            by_case: dict[int, _CaseOutcome] = {}
            for outcome, item in late:
                partial = by_case.setdefault(
                    id(outcome), _CaseOutcome(outcome.built, [], outcome.extra, [], outcome.note)
                )
                self._collect(partial, item)
            latency_ms = (time.monotonic() - started) * 1000.0
            for partial in by_case.values():
                self._record(partial, job)
                self._forward_carrier(
                    job, partial.built, partial.results, self._summary(job, partial, latency_ms)
                )
        except asyncio.CancelledError:
            # Cut short (shutdown): the hold stays, so the trace's entries stay in the
            # log and the next start computes these results.
            raise
        except Exception:
            job.release()
            raise
        job.release()

    def _forward_carrier(
        self, job: _Job, built: BuiltCase, results: list[MetricResult], summary: EvalSummary
    ) -> None:
        carrier = make_carrier_span(built.span, results, summary, self.enrichment)
        group = job.groups_of[id(built.span)]
        now = time.monotonic()
        trace = AssembledTrace(
            trace_id=job.trace.trace_id,
            groups=[
                SpanGroup(
                    group.resource,
                    group.resource_schema_url,
                    group.scope,
                    group.scope_schema_url,
                    [carrier],
                )
            ],
            reason=ReleaseReason.LATE,
            first_seen=now,
            released_at=now,
            has_root=False,
        )
        job.forward_output(trace)

    def _summary(self, job: _Job, outcome: _CaseOutcome, latency_ms: float) -> EvalSummary:
        # Summed by hand: Cost.__add__ validates a new model per addition.
        calls = 0
        usd: float | None = 0.0
        for r in outcome.results:
            calls += r.cost.calls
            usd = None if usd is None or r.cost.usd is None else usd + r.cost.usd
        return EvalSummary(
            model=self.judge.model,
            sample_rate=job.decision.rate,
            latency_ms=latency_ms,
            cost_usd=usd if calls else (0.0 if usd is not None else None),
            extra=outcome.extra,
            input=outcome.built.case.input,
            output=outcome.built.case.actual_output,
        )

    def _record(self, outcome: _CaseOutcome, job: _Job) -> None:
        record = self._telemetry.results.record
        service = outcome.built.service
        segments = self._segments
        labels: tuple[str, ...] = ()
        if segments is not None:
            raw = job.segments.get(id(outcome.built.span))
            labels = segments.labels(raw if raw is not None else segments.read({}, None))
        for r in outcome.results:
            record(service, r.metric, r.outcome, r.score, labels)
            for listener in self._listeners:
                try:
                    listener(service, r.metric, r, job.trace.trace_id_hex, labels)
                except Exception as exc:
                    self._log.error("result_listener_failed", error=repr(exc))

    # -------------------------------------------------------------- metrics
    async def _start_case(self, built: BuiltCase, done: frozenset[str]) -> _CaseOutcome:
        """Start the metrics of one case, except ``done`` (results the log held)."""
        outcome = _CaseOutcome(built, [], {}, [])
        case_metrics = _without(self.case_metrics, done)
        conversation_metrics = _without(self.conversation_metrics, done)
        bounded = check_case(built.case, self.config)
        if bounded.case is None:
            outcome.results.extend(self._skipped(m, bounded.note) for m in case_metrics)
            outcome.results.extend(self._skipped(m, bounded.note) for m in conversation_metrics)
            return outcome
        if bounded.note:
            built.case, outcome.note = bounded.case, bounded.note
        await self._start_case_metrics(built, outcome, done)
        if conversation_metrics:
            try:
                view = await self._conversation_for(built)
            except SessionStoreError as exc:
                for cmetric in conversation_metrics:
                    outcome.results.append(_store_unavailable(cmetric.name, exc))
                return outcome
            except Exception as exc:  # a bug: the case metrics above still finish
                self._log.exception("conversation_failed", trace_id=built.trace_id)
                for cmetric in conversation_metrics:
                    outcome.results.append(
                        MetricResult(
                            metric=cmetric.name,
                            score=None,
                            error="conversation unavailable",
                            reason=str(redact(f"{type(exc).__name__}: {exc}")),
                        )
                    )
                return outcome
            loop = asyncio.get_running_loop()
            for cmetric in conversation_metrics:
                if view is None:
                    outcome.results.append(
                        self._skipped(cmetric, "not part of a session (no session id)")
                    )
                    continue
                # Chained now, in arrival order (no await since the turn was stored).
                key = (built.session_id or "", cmetric.name)
                previous = self._window_steps.get(key)
                step: asyncio.Future[None] = loop.create_future()
                self._window_steps[key] = step
                task = asyncio.create_task(
                    self._window_task(cmetric, built, view, previous, outcome),
                    name=cmetric.name,
                )
                # Released however the task ends (even cancelled before it started).
                task.add_done_callback(functools.partial(self._release_step, key, step))
                outcome.pending.append(_Pending(task, (cmetric.name,)))
        return outcome

    async def _start_case_metrics(
        self, built: BuiltCase, outcome: _CaseOutcome, done: frozenset[str]
    ) -> None:
        """Start (or, when cheap, run) the case metrics: small CPU work inline, the
        rest of the CPU work as one pool item, LLM-judge metrics as tasks."""
        case = built.case
        pooled: list[Metric] = []
        cpu_metrics = _without(self._cpu_metrics, done)
        task_metrics = _without(self._task_metrics, done)
        if cpu_metrics:
            pool = self.pool
            if pool is None or (
                not self._cpu_needs_pool and case_chars(case) <= self.config.inline_max_chars
            ):
                inline = cpu_metrics
            else:
                inline, pooled = [], cpu_metrics
            if inline:
                future: asyncio.Future[list[MetricResult]] = (
                    asyncio.get_running_loop().create_future()
                )
                # Awaited directly: no task, and no loop round unless a metric suspends.
                future.set_result([await m.measure(case, self.judge) for m in inline])
                outcome.pending.append(_Pending(future, tuple(m.name for m in inline)))
            if pooled and pool is not None:
                work = CaseWork(
                    built.document_sources,
                    # Encoded there for the evaluated span; not with a bounds note to
                    # prefix to every reason here, nor for carrier spans.
                    None if outcome.note or self.enrichment.attach != "span" else self.enrichment,
                    self._positions,
                )
                annex: dict[str, Annex] = {}
                future = pool.run_case(case, pooled, work, annex)
                outcome.pending.append(_Pending(future, tuple(m.name for m in pooled), True, annex))
        for metric in task_metrics:
            task = asyncio.create_task(self._run_case_metric(metric, built), name=metric.name)
            outcome.pending.append(_Pending(task, (metric.name,)))

    def _skipped(self, metric: Metric, reason: str) -> MetricResult:
        key = (metric.name, reason)
        made = self._skipped_cache.get(key)
        if made is None:
            if len(self._skipped_cache) > 1024:
                self._skipped_cache.clear()
            made = self._skipped_cache[key] = MetricResult(
                metric=metric.name,
                score=None,
                skipped=True,
                reason=reason,
                threshold=metric.options.threshold,
                judge=self.judge.model,
                heuristic=self.judge.heuristic,
            )
        # Validated once per (metric, reason); each case gets its own copy.
        return trusted(MetricResult, dict(made.__dict__))

    async def _run_case_metric(self, metric: Metric, built: BuiltCase) -> list[MetricResult]:
        try:
            result = await asyncio.wait_for(
                metric.measure(built.case, self.judge), self.config.metric_timeout
            )
        except TimeoutError:
            self._telemetry.eval_timeouts.labels(metric.name).inc()
            return [_timeout_result(metric.name, self.config.metric_timeout)]
        return [result]

    async def _window_task(
        self,
        metric: ConversationMetric,
        built: BuiltCase,
        view: _TurnView,
        previous: asyncio.Future[None] | None,
        outcome: _CaseOutcome,
    ) -> list[MetricResult]:
        result, extra = await self._run_window_metric(metric, built, view, previous)
        if extra:
            outcome.extra.setdefault(result.metric, {}).update(extra)
        return [result]

    async def _measure_window(self, metric: ConversationMetric, conv: Conversation) -> MetricResult:
        """The window result of ``metric`` for this turn: in the pool when it is CPU
        work (the pool enforces ``metric_timeout``), else on the loop under it."""
        if self.pool is not None and self.pool.covers(metric):
            (result,) = await self.pool.run_window(conv, metric)
            if result.error == "timeout":
                self._telemetry.eval_timeouts.labels(metric.name).inc()
            return result
        return await asyncio.wait_for(
            metric.measure_window(conv, -1, self.judge), self.config.metric_timeout
        )

    async def _conversation_for(self, built: BuiltCase) -> _TurnView | None:
        """Append this turn to its session and return the conversation up to it, with
        the turn numbers it holds.  A turn without ``ragtrace.turn.index`` is numbered by
        the session store (1, 2, 3, ... by start).  Raises :class:`SessionStoreError`."""
        if built.session_id is None:
            return None
        case = built.case
        turn = SessionTurn(
            turn_index=built.turn_index,
            trace_id=built.trace_id,
            span_id=built.span_id,
            user_content=case.input,
            assistant_content=case.actual_output,
            retrieval_context=tuple(
                TurnContext(id=c.id, content=c.content, score=c.score)
                for c in case.retrieval_context or ()
            ),
            timestamp=built.span.start_time_unix_nano / 1e9,
            expected_outcome=built.expected_outcome,
        )
        async with self._session_lock(built.session_id):
            kept = await self.sessions.append_turn(built.session_id, turn)
        number = built.turn_index
        if number is None:  # numbered by the store; absent: older than every kept turn
            number = next((t.turn_index for t in kept if t.span_id == built.span_id), None)
        turns: list[Turn] = []
        outcome = built.expected_outcome
        present: set[int] = set()
        for stored in kept:
            if stored.turn_index is None or number is None or stored.turn_index > number:
                continue  # a later turn arrived first: this turn's window ends here
            present.add(stored.turn_index)
            turns.append(Turn(role="user", content=stored.user_content or ""))
            turns.append(
                Turn(
                    role="assistant",
                    content=stored.assistant_content or "",
                    retrieval_context=[
                        ContextItem(content=c.content, id=c.id, score=c.score)
                        for c in stored.retrieval_context
                    ],
                )
            )
            outcome = outcome or stored.expected_outcome
        conversation = Conversation(turns=turns, expected_outcome=outcome, case_id=built.session_id)
        return _TurnView(conversation, frozenset(present), number)

    def _session_lock(self, session_id: str) -> asyncio.Lock:
        lock = self._session_locks.get(session_id)
        if lock is None:
            if len(self._session_locks) > 10_000:
                for key, old in list(self._session_locks.items()):
                    if not old.locked():
                        del self._session_locks[key]
            lock = self._session_locks[session_id] = asyncio.Lock()
        return lock

    def _release_step(
        self, key: tuple[str, str], step: asyncio.Future[None], _task: asyncio.Task[Any]
    ) -> None:
        if not step.done():
            step.set_result(None)
        if self._window_steps.get(key) is step:
            del self._window_steps[key]

    async def _run_window_metric(
        self,
        metric: ConversationMetric,
        built: BuiltCase,
        view: _TurnView,
        previous: asyncio.Future[None] | None,
    ) -> tuple[MetricResult, dict[str, Any]]:
        """Score this turn's window, then (after the session's previous turn did the
        same) add it to the running sums: the conversation score written on turn k is
        the mean over the windows up to k, whatever order the windows finish in."""
        assert built.session_id is not None
        conv, present, number = view
        try:
            result = await self._measure_window(metric, conv)
        except TimeoutError:
            self._telemetry.eval_timeouts.labels(metric.name).inc()
            return _timeout_result(metric.name, self.config.metric_timeout), {}
        if previous is not None and not previous.done():
            # Bounded: the previous turn's task is itself bounded by the timeouts, and
            # its step is released however it ends.
            await asyncio.wait([previous])
        missing: list[int] = []
        if built.turn_index is not None:  # the app's indices: a gap is a turn not seen yet
            first = max(0, built.turn_index - metric.options.window_size + 1)
            missing = [i for i in range(first, built.turn_index) if i not in present]
        # (numbered by the store, the turns so far have no gaps: nothing to name)
        if number is not None and result.error is None:
            result = result.model_copy(update={"details": {**result.details, "turn": number}})
        if missing and result.error is None:
            note = f"{_describe_turns(missing)} missing from the window"
            result = result.model_copy(
                update={
                    "reason": f"{result.reason} ({note})" if result.reason else note,
                    "details": {**result.details, "missing_turns": missing},
                }
            )
        window_score = result.details.get("window_score", result.score)
        try:
            if result.error is not None or window_score is None:
                sums = await self.sessions.get_window_scores(built.session_id, metric.name)
            else:
                # The store's numbers move when a late turn arrives: key by span then.
                key = built.turn_index if built.turn_index is not None else built.span_id
                sums = await self.sessions.add_window_score(
                    built.session_id, metric.name, float(window_score), turn_index=key
                )
        except SessionStoreError as exc:
            return _store_unavailable(metric.name, exc), {}
        total, count = sums
        if not count or result.details.get(NOTHING_RETRIEVED_YET):
            return result, {}  # nothing retrieved so far: no conversation score yet
        running = total / count
        if metric.options.strict and running < 1.0:
            running = 0.0  # as the offline conversation result: strict applies to the mean
        return result, {semconv.EVAL_FIELD_CONVERSATION_SCORE: running}


_M = TypeVar("_M", bound=Metric)


class _TurnView(NamedTuple):
    """A turn's conversation so far: its turns up to this one, their numbers, and this
    turn's number (None: the store dropped it, older than every kept turn)."""

    conversation: Conversation
    present: frozenset[int]
    number: int | None


def _without(metrics: list[_M], done: frozenset[str]) -> list[_M]:
    """``metrics`` less those in ``done`` (results the log held); as is when none."""
    return [m for m in metrics if m.name not in done] if done else metrics


def _store_unavailable(metric: str, exc: SessionStoreError) -> MetricResult:
    """A conversation metric that could not run: the session store failed."""
    return MetricResult(
        metric=metric,
        score=None,
        error="session store unavailable",
        reason=str(redact(str(exc))),
    )


def _describe_turns(indices: Sequence[int]) -> str:
    """``[3, 4, 7]`` -> ``"turns 3–4, 7"``; ``[2]`` -> ``"turn 2"``."""
    runs: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        runs.append(str(start) if start == prev else f"{start}\u2013{prev}")
        if i is not None:
            start = prev = i
    return f"{'turn' if len(indices) == 1 else 'turns'} {', '.join(runs)}"


def _timeout_result(metric: str, seconds: float) -> MetricResult:
    return MetricResult(
        metric=metric,
        score=None,
        error="timeout",
        reason=f"the metric did not finish within {seconds:g}s",
    )
