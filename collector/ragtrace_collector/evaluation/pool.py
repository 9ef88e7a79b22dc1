"""The evaluation worker pool (component ``evaluation:workers``).

The CPU part of evaluation runs here, in ``evaluation.processes`` worker processes,
so that it uses every core and never blocks the collector's event loop: the metrics
that need no judge, and those answered by the offline judge (sentence splitting,
content words, entity extraction).  LLM-judge metrics stay in the collector process:
they wait on the network, on the event loop, through litellm.

Design
======

* **Processes.** Workers come from a ``forkserver`` (a clean interpreter that has
  imported the metric code once), so a replacement starts in milliseconds and no
  worker inherits the collector's threads or sockets.  Each worker talks to the
  collector over its own socket pair: length-prefixed pickle frames, read and
  written with asyncio streams on the collector side.
* **Slots.** One supervised task per worker ("slot") takes a *batch* of queued
  items (up to ``batch_size``, whatever is waiting: one under light load), sends it
  in one frame and reads the results in one frame, so the round trip is paid once per
  batch.  An item is one case (plain tuples, not pydantic models) with the indices of
  its pooled metrics, or one conversation window with its metric's index.
* **Less work for the collector.** For a case, the worker also makes what the
  collector would otherwise make from each result (:class:`CaseWork`): the
  per-document verdicts, and the result encoded as span attribute and event entries
  (:func:`~ragtrace_collector.evaluation.enrichment.encode_result`), which the collector appends
  to the span as they are.  The collector's share of a pooled case is then building
  it, sampling, and appending bytes: what lets evaluation scale with processes.
* **Budgets.** A worker writes which item and metric it is running, and since when,
  into a small shared-memory array.  While a batch is out, its slot checks that array
  every ``tick``: a metric running for more than ``metric_timeout`` gets its worker
  killed (SIGKILL) and replaced; that metric's result is ``error = "timeout"``.  The
  other metrics of the batch are sent again (to the new worker); their results are
  lost with the killed process, and recomputing them is cheaper than streaming every
  result back.
* **Failures.** A worker that dies (killed, crashed) is replaced the same way: the
  metric it was running gets ``error = "worker_lost: ..."`` and is not retried (it may
  be what kills workers); the rest are retried once more, then errored.  A slot task
  that fails is restarted by the service's :class:`~ragtrace_collector.component.Supervisor`
  and its batch goes back to the queue first.  No trace waits forever: every item's
  future is resolved, and the evaluator bounds the wait by ``trace_timeout`` anyway.

Status: ``ok`` once the slots run (:meth:`EvaluationPool.start`: a worker process
starts with its slot's first batch, so a pool with nothing to do yet is ready, not
``starting``); ``recoverable_error`` (with the reason) from a worker loss or kill
until the replacement answers.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import multiprocessing
import pickle
import signal
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ragtrace_collector.cases import ContextItem, Conversation, RAGCase
from ragtrace_collector.component import Component, Status, Supervisor
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.evaluation.case_builder import DocumentSource
from ragtrace_collector.judges.base import JudgeCallRecord
from ragtrace_collector.metrics import ConversationMetric, Metric
from ragtrace_collector.results import Cost, MetricResult, trusted

__all__ = ["Annex", "CaseWork", "EvaluationPool", "PoolStats"]

if TYPE_CHECKING:
    from ragtrace_collector.evaluation.enrichment import EnrichmentConfig

_HEADER = struct.Struct("!Q")
ItemKind = Literal["case", "window"]
_CASE: ItemKind = "case"
_WINDOW: ItemKind = "window"
#: How many times an item's metrics are sent again after their worker was lost.
_MAX_ATTEMPTS = 2
#: Index of the progress array: item position, metric index, start (monotonic; 0 idle).
_POS, _METRIC, _SINCE = 0, 1, 2


@dataclass
class PoolStats:
    """Counters for tests and the benchmark."""

    batches: int = 0
    items: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    replaced: int = 0
    timeouts: int = 0
    lost: int = 0
    #: Results that came back encoded for the span (see :class:`CaseWork`).
    encoded: int = 0


#: What a worker adds to a case metric's result: (extra flat keys, the result encoded
#: for the span by :func:`~ragtrace_collector.evaluation.enrichment.encode_result`, or None).
Annex = tuple[dict[str, Any], bytes | None]


@dataclass(frozen=True)
class CaseWork:
    """What a worker does for a case besides scoring it, so that the collector process
    does not: the extra flat keys (per-document verdicts) from the case's document
    sources, and (with ``enrichment``) each result encoded for the span as
    OpenInference evaluation number ``indices[metric]``."""

    sources: Sequence[DocumentSource] | None
    enrichment: EnrichmentConfig | None = None
    indices: Mapping[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class _Item:
    kind: ItemKind
    payload: Any
    #: Metric indices still to compute.
    indices: list[int]
    future: asyncio.Future[list[MetricResult]]
    results: dict[int, MetricResult] = field(default_factory=dict)
    attempts: int = 0
    #: Filled with each result's :data:`Annex` (by metric name) when the worker made one.
    annex: dict[str, Annex] | None = None


class _Worker:
    """One worker process and the collector's end of its socket."""

    def __init__(
        self,
        process: Any,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        progress: Any,
    ) -> None:
        self.process = process
        self.reader = reader
        self.writer = writer
        self.progress = progress

    @property
    def pid(self) -> int | None:
        pid: int | None = self.process.pid
        return pid

    def running(self) -> tuple[int, int, float] | None:
        """(item position, metric index, seconds running) of the metric in progress."""
        since = float(self.progress[_SINCE])
        if since <= 0.0:
            return None
        pos, metric = int(self.progress[_POS]), int(self.progress[_METRIC])
        if float(self.progress[_SINCE]) != since:  # moved on while we read
            return None
        return pos, metric, time.monotonic() - since

    async def read_frame(self) -> bytes:
        header = await self.reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        return await self.reader.readexactly(size)

    async def kill(self) -> None:
        self.writer.close()
        if self.process.is_alive():
            self.process.kill()
        await asyncio.to_thread(self.process.join, 5.0)

    def exit_text(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "the worker stopped answering"
        if code < 0:
            try:
                return f"the worker was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"the worker was killed by signal {-code}"
        return f"the worker exited with code {code}"


class EvaluationPool(Component):
    """``evaluation.processes`` worker processes scoring the CPU-bound metrics.

    ``metrics`` are the metrics the pool may run (each worker builds its own copies
    from their names and options); callers pass the subset they want per item.
    """

    component_name = "evaluation:workers"

    def __init__(
        self,
        metrics: Sequence[Metric],
        *,
        processes: int,
        metric_timeout: float,
        batch_size: int = 16,
        supervisor: Supervisor | None = None,
        on_judge_call: Callable[[JudgeCallRecord], None] | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("an evaluation pool needs at least one process")
        self.processes = processes
        self.metric_timeout = metric_timeout
        self.batch_size = batch_size
        self._metrics = list(metrics)
        self._index = {id(m): i for i, m in enumerate(self._metrics)}
        self._spec = tuple((m.name, m.options.model_dump()) for m in self._metrics)
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._on_judge_call = on_judge_call
        self._queue: collections.deque[_Item] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._workers: list[_Worker | None] = [None] * processes
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._tick = min(0.1, max(0.005, metric_timeout / 10.0))
        self._log = get_logger("evaluation.workers")
        self.stats = PoolStats()

    # ------------------------------------------------------------ lifecycle
    def covers(self, metric: Metric) -> bool:
        return id(metric) in self._index

    def start(self) -> None:
        """Start the slots (needs a running event loop); each starts its worker
        process when the first item comes.  The pool is ``ok`` from here on: it takes
        work now, and waiting for the first item is not starting."""
        if self._tasks:
            return
        self._wakeup = asyncio.Event()
        for slot in range(self.processes):
            self._tasks.append(
                self._supervisor.spawn(
                    self,
                    functools.partial(self._run_slot, slot),
                    name=f"ragtrace-eval-worker-{slot}",
                )
            )
        self.report_ok()

    async def aclose(self) -> None:
        """Stop the slots and the worker processes; queued items fail with an error."""
        self._closed = True
        self.report(Status.STOPPING)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        while self._queue:
            item = self._queue.popleft()
            self._fail(item, "shutdown", "the evaluation workers were stopped")
        for slot, worker in enumerate(self._workers):
            if worker is not None:
                await worker.kill()
                self._workers[slot] = None
        self.report(Status.STOPPED)

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [w.pid for w in self._workers if w is not None and w.pid is not None]

    def running(self) -> list[tuple[int, str, float]]:
        """(worker pid, metric, seconds so far) of every metric being computed now."""
        out: list[tuple[int, str, float]] = []
        for worker in self._workers:
            now = worker.running() if worker is not None else None
            if worker is not None and worker.pid is not None and now is not None:
                out.append((worker.pid, self._metrics[now[1]].name, now[2]))
        return out

    # ------------------------------------------------------------------ API
    def run_case(
        self,
        case: RAGCase,
        metrics: Sequence[Metric],
        work: CaseWork | None = None,
        annex: dict[str, Annex] | None = None,
    ) -> asyncio.Future[list[MetricResult]]:
        """Score ``case`` with ``metrics`` (all covered by the pool), in their order.
        With ``work``, ``annex`` is filled (by metric name) before the future is done."""
        payload = (_pack_payload(_CASE, case), _pack_work(work))
        return self._submit(_CASE, payload, metrics, annex if work is not None else None)

    def run_window(
        self, conversation: Conversation, metric: ConversationMetric
    ) -> asyncio.Future[list[MetricResult]]:
        """The window result of ``metric`` for the last turn of ``conversation``."""
        return self._submit(_WINDOW, conversation, [metric])

    def _submit(
        self,
        kind: ItemKind,
        payload: Any,
        metrics: Sequence[Metric],
        annex: dict[str, Annex] | None = None,
    ) -> asyncio.Future[list[MetricResult]]:
        future: asyncio.Future[list[MetricResult]] = asyncio.get_running_loop().create_future()
        item = _Item(kind, payload, [self._index[id(m)] for m in metrics], future, annex=annex)
        if self._closed:
            self._fail(item, "shutdown", "the evaluation workers were stopped")
            return future
        self._queue.append(item)
        if self._wakeup is not None:
            self._wakeup.set()
        return future

    # ---------------------------------------------------------------- slots
    async def _take(self) -> list[_Item]:
        assert self._wakeup is not None
        while True:
            while self._queue and self._queue[0].future.done():
                self._queue.popleft()  # its trace gave up waiting (trace_timeout)
            if self._queue:
                break
            self._wakeup.clear()
            await self._wakeup.wait()
        batch: list[_Item] = []
        while self._queue and len(batch) < self.batch_size:
            item = self._queue.popleft()
            if not item.future.done():
                batch.append(item)
        if self._queue:
            self._wakeup.set()  # more for the other slots
        return batch

    async def _run_slot(self, slot: int) -> None:
        while True:
            # Workers start with the first item (a collector whose cases all run
            # inline never starts one), and a replacement with the next batch.
            batch = await self._take()
            if self._workers[slot] is None:
                try:
                    self._workers[slot] = await self._spawn(slot)
                except BaseException:
                    for item in reversed(batch):
                        self._queue.appendleft(item)
                    raise
            try:
                await self._serve(slot, batch)
            except BaseException:
                # Cancelled (shutdown) or a bug: nothing in hand is lost.
                for item in reversed(batch):
                    if not item.future.done():
                        self._queue.appendleft(item)
                raise

    async def _spawn(self, slot: int) -> _Worker:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["ragtrace_collector.evaluation.pool"])
        ours, theirs = socket.socketpair()
        progress = ctx.RawArray("d", 3)
        process = ctx.Process(
            target=_worker_main,
            args=(theirs, self._spec, progress),
            name=f"ragtrace-eval-worker-{slot}",
            daemon=True,
        )
        try:
            await asyncio.to_thread(process.start)
        finally:
            theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours, limit=1 << 20)
        self._log.debug("worker_started", slot=slot, pid=process.pid)
        return _Worker(process, reader, writer, progress)

    async def _serve(self, slot: int, batch: list[_Item]) -> None:
        worker = self._workers[slot]
        assert worker is not None
        frame = pickle.dumps(
            [(item.kind, item.payload, item.indices) for item in batch],
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        self.stats.batches += 1
        self.stats.items += len(batch)
        self.stats.bytes_out += len(frame)
        read = asyncio.ensure_future(worker.read_frame())
        try:
            worker.writer.write(_HEADER.pack(len(frame)))
            worker.writer.write(frame)
            await worker.writer.drain()
            idle_since = time.monotonic()
            while True:
                done, _ = await asyncio.wait({read}, timeout=self._tick)
                if done:
                    break
                running = worker.running()
                if running is None:
                    # Between metrics only for an instant: idle this long is a hang
                    # (a stopped process, a worker stuck outside any metric).
                    if time.monotonic() - idle_since > self.metric_timeout:
                        await self._replace(slot, worker, batch, None, timed_out=True)
                        return
                    continue
                idle_since = time.monotonic()
                if running[2] > self.metric_timeout:
                    await self._replace(slot, worker, batch, running, timed_out=True)
                    return
            answer = read.result()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            await self._replace(slot, worker, batch, worker.running(), timed_out=False)
            return
        finally:
            if not read.done():
                read.cancel()
            elif not read.cancelled():
                # A worker that died before the batch was written fails the write and
                # the read alike; the write's error was handled above, so this one is
                # only marked as seen (never "Task exception was never retrieved").
                read.exception()
        self.stats.bytes_in += len(answer)
        self.report_ok()
        for item, (results, calls, annexes) in zip(batch, pickle.loads(answer), strict=True):
            for packed in results:
                item.results[packed[0]] = _unpack_result(packed)
            if item.annex is not None:
                for name, extra, blob in annexes:
                    item.annex[name] = (extra, blob)
                    self.stats.encoded += blob is not None
            self._judge_calls(calls)
            self._finish(item)

    async def _replace(
        self,
        slot: int,
        worker: _Worker,
        batch: list[_Item],
        running: tuple[int, int, float] | None,
        *,
        timed_out: bool,
    ) -> None:
        await worker.kill()
        self._workers[slot] = None
        self.stats.replaced += 1
        if timed_out:
            self.stats.timeouts += 1
            error, reason = (
                "timeout",
                (
                    f"the metric did not finish within {self.metric_timeout:g}s; "
                    "its worker process was killed and replaced"
                ),
            )
        else:
            self.stats.lost += 1
            error = f"worker_lost: {worker.exit_text()}"
            reason = "the evaluation worker process running this metric died; it was replaced"
        self.report(Status.RECOVERABLE_ERROR, f"worker {worker.pid}: {error}")
        self._log.warning(
            "evaluation_worker_replaced",
            slot=slot,
            pid=worker.pid,
            error=error,
            timed_out=timed_out,
        )
        culprit: tuple[int, int] | None = (running[0], running[1]) if running else None
        for pos, item in enumerate(reversed(batch)):
            position = len(batch) - 1 - pos
            if culprit is not None and culprit[0] == position and culprit[1] in item.indices:
                index = culprit[1]
                item.indices.remove(index)
                item.results[index] = _error_result(self._metrics[index], error, reason)
            else:
                item.attempts += 1
            if not item.indices:
                self._finish(item)
            elif item.attempts > _MAX_ATTEMPTS:
                self._fail(item, error, reason)
            elif not item.future.done():
                self._queue.appendleft(item)
        if self._wakeup is not None:
            self._wakeup.set()

    # -------------------------------------------------------------- results
    def _finish(self, item: _Item) -> None:
        if item.future.done():
            return
        wanted = sorted(item.results)
        item.future.set_result([item.results[i] for i in wanted])

    def _fail(self, item: _Item, error: str, reason: str) -> None:
        for index in item.indices:
            item.results[index] = _error_result(self._metrics[index], error, reason)
        item.indices = []
        self._finish(item)

    def _judge_calls(self, calls: list[tuple[str, float]]) -> None:
        hook = self._on_judge_call
        if hook is None:
            return
        for task, latency in calls:
            hook(
                JudgeCallRecord.model_construct(
                    model="offline", task=task, outcome="ok", latency_s=latency, cost_usd=0.0
                )
            )


# ============================================================ transfer format
# Cases and results cross the socket as plain tuples, rebuilt without validation on
# the other side (they were valid when packed): pickling pydantic models costs ten
# times more, and this is the collector's share of every pooled case.
_Packed = tuple[Any, ...]


def _pack_payload(kind: ItemKind, payload: RAGCase | Conversation) -> Any:
    if kind != _CASE or not isinstance(payload, RAGCase):
        return payload  # conversation windows: rarer, pickled as they are
    contexts = payload.retrieval_context
    return (
        payload.input,
        payload.actual_output,
        payload.expected_output,
        None if contexts is None else [(c.content, c.id, c.score, c.metadata) for c in contexts],
        payload.reference_contexts,
        payload.reference_context_ids,
        payload.retrieved_context_ids,
        payload.case_id,
        payload.retrieved_ids_mismatch,
        payload.input_unreadable,
        payload.output_unreadable,
    )


def _pack_work(work: CaseWork | None) -> _Packed | None:
    if work is None:
        return None
    # The config and the positions are the same objects for every case of an
    # evaluator: the pickler's memo sends them once per batch, not once per case.
    sources = None if work.sources is None else [tuple(s) for s in work.sources]
    return (sources, work.enrichment, work.indices)


def _unpack_case(packed: _Packed) -> RAGCase:
    contexts = packed[3]
    return RAGCase.model_construct(
        input=packed[0],
        actual_output=packed[1],
        expected_output=packed[2],
        retrieval_context=None
        if contexts is None
        else [
            ContextItem.model_construct(content=c, id=i, score=sc, metadata=md)
            for c, i, sc, md in contexts
        ],
        reference_contexts=packed[4],
        reference_context_ids=packed[5],
        retrieved_context_ids=packed[6],
        case_id=packed[7],
        retrieved_ids_mismatch=packed[8],
        input_unreadable=packed[9],
        output_unreadable=packed[10],
    )


_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether a details value is plain data (scalars, and lists or string-keyed dicts of
    them, a few levels deep): what crosses back to the collector.  The per-node verdict
    lists are plain dicts, and the document annotations are made from them."""
    if isinstance(value, _SCALARS):
        return True
    if depth >= 3:
        return False
    if isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _pack_result(index: int, r: MetricResult, *, details: bool = True) -> _Packed:
    """A result as a tuple; of its details only plain data travels (see :func:`_plain`),
    and none without ``details``."""
    c = r.cost
    return (
        index,
        r.metric,
        r.score,
        r.reason,
        r.threshold,
        r.strict,
        r.passed,
        r.skipped,
        r.error,
        {k: v for k, v in r.details.items() if _plain(v)} if details else {},
        (c.calls, c.cached_calls, c.prompt_tokens, c.completion_tokens, c.usd),
        r.judge,
        r.heuristic,
    )


def _unpack_result(p: _Packed) -> MetricResult:
    calls, cached, prompt, completion, usd = p[10]
    cost = _COSTS.get(p[10])
    if cost is None:
        if len(_COSTS) > 1024:
            _COSTS.clear()
        cost = _COSTS[p[10]] = trusted(
            Cost,
            {
                "calls": calls,
                "cached_calls": cached,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "usd": usd,
            },
        )
    return trusted(
        MetricResult,
        {
            "metric": p[1],
            "score": p[2],
            "reason": p[3],
            "threshold": p[4],
            "strict": p[5],
            "passed": p[6],
            "skipped": p[7],
            "error": p[8],
            "details": p[9],
            "cost": cost,
            "judge": p[11],
            "heuristic": p[12],
        },
    )


#: Costs are immutable and repeat (offline: zero calls, zero dollars): shared.
_COSTS: dict[tuple[Any, ...], Cost] = {}


def _error_result(metric: Metric, error: str, reason: str) -> MetricResult:
    return MetricResult(
        metric=metric.name,
        score=None,
        error=error,
        reason=reason,
        threshold=metric.options.threshold,
    )


# ================================================================ worker side
def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return bytes(buf)


def _worker_main(
    sock: socket.socket, spec: tuple[tuple[str, dict[str, Any]], ...], progress: Any
) -> None:
    """A worker process: read a batch, score it, answer; exit when the socket closes."""
    from ragtrace_collector.evaluation.enrichment import case_extra, encode_result
    from ragtrace_collector.judges.offline import OfflineJudge
    from ragtrace_collector.metrics import build_metric

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the collector decides when we stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    metrics = [build_metric(name, options) for name, options in spec]
    calls: list[tuple[str, float]] = []
    judge = OfflineJudge(on_call=lambda record: calls.append((record.task, record.latency_s)))
    loop = asyncio.new_event_loop()

    def annex(case: RAGCase, result: MetricResult, work: _Packed) -> _Packed | None:
        """(metric, extra keys, encoded result or None): see :class:`CaseWork`.  None
        when that fails (spans are untrusted): the collector then makes them itself,
        and reports the failure, as it does without a pool."""
        try:
            return _annex(case, result, work)
        except Exception:
            return None

    def _annex(case: RAGCase, result: MetricResult, work: _Packed) -> _Packed:
        sources, config, positions = work
        extra = case_extra(
            result, case, None if sources is None else [DocumentSource(*s) for s in sources]
        )
        position = positions.get(result.metric)
        if config is None or position is None:
            return (result.metric, extra, None)
        blob = encode_result(result, position, extra, config, time.time_ns())
        return (result.metric, extra, blob)

    async def score(
        kind: ItemKind, payload: Any, pos: int, indices: list[int]
    ) -> tuple[list[_Packed], list[_Packed]]:
        out: list[_Packed] = []
        annexes: list[_Packed] = []
        work: _Packed | None = None
        if kind == _CASE:
            case: Any = _unpack_case(payload[0])
            work = payload[1]
        else:
            case = payload
        for index in indices:
            progress[_SINCE] = 0.0
            progress[_POS] = pos
            progress[_METRIC] = index
            progress[_SINCE] = time.monotonic()
            metric = metrics[index]
            if kind == _WINDOW:
                assert isinstance(metric, ConversationMetric)
                result = await metric.measure_window(case, -1, judge)
            else:
                result = await metric.measure(case, judge)
            made = annex(case, result, work) if work is not None else None
            if made is not None:
                annexes.append(made)
            # With its annex made here, the collector needs none of the details (what
            # the verdicts are made from): they stay here.
            out.append(_pack_result(index, result, details=made is None))
        return out, annexes

    while True:
        header = _recv_exactly(sock, _HEADER.size)
        if header is None:
            return
        body = _recv_exactly(sock, _HEADER.unpack(header)[0])
        if body is None:
            return
        answers = []
        for pos, (kind, payload, indices) in enumerate(pickle.loads(body)):
            results, annexes = loop.run_until_complete(score(kind, payload, pos, indices))
            answers.append((results, list(calls), annexes))
            calls.clear()
        progress[_SINCE] = 0.0
        frame = pickle.dumps(answers, protocol=pickle.HIGHEST_PROTOCOL)
        sock.sendall(_HEADER.pack(len(frame)) + frame)
