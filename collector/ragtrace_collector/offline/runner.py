"""Offline evaluation: the same metric code as the collector, run over a dataset.

>>> report = await evaluate(cases, ["contextual_recall", "id_context_recall"], judge)
>>> report = evaluate_file("cases.jsonl", metrics=["contextual_recall"])  # sync
>>> report = evaluate_rows(datasets.load_from_disk("eval"), metrics="id_context_recall")

Cases run concurrently (``concurrency`` items in flight; each item's metrics run
together).  Judge calls are further bounded by the judge itself.  Per-metric summary:
mean over *scored* results only (skipped and errored results do not pull it down),
pass rate over scored results, skipped and error counts, judge calls, tokens, cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ragtrace_collector.cases import ContextItem, Conversation, RAGCase
from ragtrace_collector.judges.base import Judge
from ragtrace_collector.metrics import (
    METRIC_NAMES,
    OFFLINE_METRICS,
    ConversationMetric,
    JudgeFreeMetric,
    Metric,
    MetricOptions,
    ScoreColumn,
    build_metrics,
    parse_metric_names,
)
from ragtrace_collector.offline.feedback import FeedbackReport, measure_feedback
from ragtrace_collector.offline.loaders import (
    DEFAULT_MAX_ROW_SIZE,
    LoadResult,
    RowError,
    load_dataset,
    load_rows,
)
from ragtrace_collector.results import Cost, MetricResult, trusted

__all__ = [
    "EvalReport",
    "FeedbackReport",
    "ItemResult",
    "MetricSummary",
    "applicable_metrics",
    "evaluate",
    "evaluate_file",
    "evaluate_rows",
    "missing_columns",
    "summarise",
]

Item = RAGCase | Conversation


class ItemResult(BaseModel):
    """The results of one case or conversation."""

    model_config = ConfigDict(extra="forbid")

    index: int
    case_id: str | None
    kind: Literal["case", "conversation"]
    line: int | None = None
    #: The case's input (a conversation's first user turn), to read results by.
    input: str | None = None
    results: list[MetricResult] = Field(default_factory=list)

    def result(self, metric: str) -> MetricResult | None:
        return next((r for r in self.results if r.metric == metric), None)

    def to_json_dict(self) -> dict[str, Any]:
        """One line of the ``--output`` JSONL."""
        out: dict[str, Any] = {"case_id": self.case_id, "kind": self.kind}
        if self.line is not None:
            out["line"] = self.line
        if self.input is not None:
            out["input"] = self.input
        out["results"] = {
            r.metric: r.model_dump(mode="json", exclude={"metric"}) for r in self.results
        }
        return out


class MetricSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str
    count: int = 0
    scored: int = 0
    mean: float | None = None
    passed: int = 0
    failed: int = 0
    pass_rate: float | None = None
    skipped: int = 0
    errors: int = 0
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    heuristic: bool = False


class EvalReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    judge: str
    metrics: list[str]
    items: list[ItemResult]
    summary: dict[str, MetricSummary]
    row_errors: list[RowError] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    elapsed_s: float = 0.0
    #: Each metric's agreement with a column of human labels (``feedback_column``).
    feedback: FeedbackReport | None = None
    #: The items of a judge-free batch, until someone reads ``items`` (see _Pending).
    _pending: _Pending | None = PrivateAttr(default=None)

    if not TYPE_CHECKING:

        def __getattribute__(self, name: str) -> Any:
            # ``items`` of a judge-free batch is built on first use.  Everything that
            # reads the fields (pydantic's dumps, ==, copies, pickling) goes through
            # ``__dict__`` or ``__pydantic_private__``, so these names build it first.
            if name in _BUILDS_ITEMS:
                _build_pending(self)
            return super().__getattribute__(name)

        def __setattr__(self, name: str, value: Any) -> None:
            # What pydantic does for a field, without reading __dict__ (and so building
            # the items) when the field is not ``items``.
            if (
                name != "items"
                and name in EvalReport.model_fields
                and _pending_of(self) is not None
            ):
                object.__getattribute__(self, "__dict__")[name] = value
                object.__getattribute__(self, "__pydantic_fields_set__").add(name)
                return
            super().__setattr__(name, value)

    def __repr__(self) -> str:
        # Short: asyncio.run() formats the main task (and so its result) when it
        # restores the SIGINT handler, and a full repr of 10k items costs seconds.
        return (
            f"EvalReport(judge={self.judge!r}, metrics={self.metrics!r}, "
            f"items={self.item_count}, row_errors={len(self.row_errors)})"
        )

    @property
    def item_count(self) -> int:
        """``len(items)``, without building the items of a judge-free batch."""
        pending = _pending_of(self)
        return len(pending) if pending is not None else len(self.items)

    def scores(self, metric: str) -> list[float | None]:
        """Each item's score for ``metric``, in item order (None: skipped, errored, or
        not measured on that item); read from the batch's score columns when the items
        of a judge-free batch have not been built."""
        pending = _pending_of(self)
        if pending is not None:
            return pending.scores(metric)
        out: list[float | None] = []
        for item in self.items:
            result = item.result(metric)
            out.append(None if result is None else result.score)
        return out

    @property
    def cost(self) -> Cost:
        if _pending_of(self) is not None:
            return Cost.none()  # a judge-free batch calls no judge
        total = Cost()
        for item in self.items:
            for r in item.results:
                total = total + r.cost
        return total

    @property
    def error_count(self) -> int:
        return sum(s.errors for s in self.summary.values())

    def summary_dict(self) -> dict[str, Any]:
        """The summary as plain JSON (``--json``)."""
        cost = self.cost
        return {
            "judge": self.judge,
            "items": self.item_count,
            "row_errors": [str(e) for e in self.row_errors],
            "warnings": list(self.warnings),
            "elapsed_s": round(self.elapsed_s, 3),
            "cost": cost.model_dump(mode="json"),
            "metrics": {k: v.model_dump(mode="json") for k, v in self.summary.items()},
            **({"feedback": self.feedback.model_dump(mode="json")} if self.feedback else {}),
        }


class _Tally:
    """A metric's running counts while :func:`summarise` reads the results."""

    __slots__ = ("counts", "heuristic", "scores", "usd")

    def __init__(self) -> None:
        # count, passed, failed, skipped, errors, calls, cached, prompt, completion
        self.counts = [0] * 9
        self.scores: list[float] = []
        self.usd: float | None = 0.0
        self.heuristic = False

    def add(self, r: MetricResult) -> None:
        counts = self.counts
        counts[0] += 1
        if r.heuristic:
            self.heuristic = True
        c = r.cost
        if c.calls or c.cached_calls or c.prompt_tokens or c.completion_tokens or c.usd != 0:
            counts[5] += c.calls
            counts[6] += c.cached_calls
            counts[7] += c.prompt_tokens
            counts[8] += c.completion_tokens
            spent = self.usd
            self.usd = None if spent is None or c.usd is None else spent + c.usd
        if r.error is not None:
            counts[4] += 1
        elif r.skipped or r.score is None:
            counts[3] += 1
        else:
            self.scores.append(r.score)
            counts[1 if r.passed else 2] += 1

    def add_column(self, column: ScoreColumn) -> None:
        """A judge-free metric's column: the built results one by one, the others
        (no judge, no cost, no error) from their scores."""
        built = column.built
        for r in built.values():
            self.add(r)
        scores = (
            column.scores
            if not built
            else [s for i, s in enumerate(column.scores) if i not in built]
        )
        scored = [s for s in scores if s is not None]
        threshold = column.metric.threshold
        passed = sum(1 for s in scored if s >= threshold)
        counts = self.counts
        counts[0] += len(scores)
        counts[1] += passed
        counts[2] += len(scored) - passed
        counts[3] += len(scores) - len(scored)
        self.scores.extend(scored)

    def summary(self, metric: str) -> MetricSummary:
        count, passed, failed, skipped, errors, calls, cached, prompt, completion = self.counts
        scored = len(self.scores)
        return MetricSummary(
            metric=metric,
            count=count,
            scored=scored,
            mean=math.fsum(self.scores) / scored if scored else None,
            passed=passed,
            failed=failed,
            pass_rate=passed / scored if scored else None,
            skipped=skipped,
            errors=errors,
            calls=calls,
            cached_calls=cached,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cost_usd=self.usd,
            heuristic=self.heuristic,
        )


def summarise(metrics: Sequence[str], items: Iterable[ItemResult]) -> dict[str, MetricSummary]:
    """Per-metric summary: mean and pass rate over scored results only."""
    tallies = {m: _Tally() for m in metrics}
    for item in items:
        for r in item.results:
            tally = tallies.get(r.metric)
            if tally is None:
                tally = tallies[r.metric] = _Tally()
            tally.add(r)
    return {m: t.summary(m) for m, t in tallies.items()}


def _resolve_metrics(
    metrics: Sequence[Metric | str] | None,
    *,
    judge: Judge | None,
    options: Mapping[str, MetricOptions | Mapping[str, Any]] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> list[Metric]:
    names: list[str] = []
    built: list[Metric] = []
    if metrics is None:
        offline = judge is None or judge.model == "offline"
        names = list(OFFLINE_METRICS if offline else METRIC_NAMES)
    else:
        for m in metrics:
            if isinstance(m, str):
                names.append(m)
            else:
                built.append(m)
    return [*build_metrics(names, options, defaults=defaults), *built]


def applicable_metrics(metrics: Sequence[Metric], items: Sequence[Item]) -> list[Metric]:
    """The metrics whose inputs at least one item provides ("all that apply")."""
    keep: list[Metric] = []
    for metric in metrics:
        for item in items:
            if isinstance(item, Conversation):
                if isinstance(metric, ConversationMetric) and (
                    metric.missing_conversation_inputs(item) is None
                ):
                    keep.append(metric)
                    break
            elif metric.kind == "case" and metric.missing_inputs(item) is None:
                keep.append(metric)
                break
    return keep


#: A case with every field given: what each metric needs is what it misses once one
#: field is taken away (each metric's own ``missing_inputs``, not a second list).
_FULL_CASE = RAGCase(
    input="q",
    actual_output="a",
    expected_output="e",
    retrieval_context=[ContextItem(content="c", id="d")],
    reference_contexts=["c"],
    reference_context_ids=["d"],
)
#: The case fields a row may lack, each with what taking it away from the full case
#: means (the retrieved ids are the ids of ``retrieval_context`` when not given apart).
_PROBES: dict[str, dict[str, Any]] = {
    "input": {"input": None},
    "actual_output": {"actual_output": None},
    "expected_output": {"expected_output": None},
    "retrieval_context": {"retrieval_context": None},
    "reference_contexts": {"reference_contexts": None},
    "reference_context_ids": {"reference_context_ids": None},
    "retrieved_context_ids": {"retrieval_context": [ContextItem(content="c")]},
}


def _lacks(case: RAGCase, fld: str) -> bool:
    if fld == "retrieved_context_ids":
        return case.retrieved_ids() is None
    value = getattr(case, fld)
    return value is None or (isinstance(value, str) and not value.strip())


def missing_columns(metrics: Sequence[Metric], items: Sequence[Item]) -> dict[str, list[str]]:
    """``{field: [metric, ...]}``: each case field that *no* case of ``items`` gives,
    with the metrics of ``metrics`` that need it and so could score no case.

    What a metric needs is read from the metric itself (its ``missing_inputs`` on a case
    with every field, then without one).  Conversations are not looked at; a metric that
    scores some case is never listed."""
    cases = [i for i in items if isinstance(i, RAGCase)]
    if not cases:
        return {}
    absent = [f for f in _PROBES if all(_lacks(c, f) for c in cases)]
    found: dict[str, list[str]] = {}
    if not absent:
        return found
    for metric in metrics:
        if metric.kind != "case" or metric.missing_inputs(_FULL_CASE) is not None:
            continue
        if any(metric.missing_inputs(c) is None for c in cases):
            continue
        for fld in absent:
            if metric.missing_inputs(_FULL_CASE.model_copy(update=_PROBES[fld])) is not None:
                found.setdefault(fld, []).append(metric.name)
    return found


async def _measure(metric: Metric, item: Item, judge: Judge | None) -> MetricResult | None:
    try:
        if isinstance(item, Conversation):
            if not isinstance(metric, ConversationMetric):
                return None
            return await metric.measure_conversation(item, judge)
        if metric.kind != "case":
            return None
        return await metric.measure(item, judge)
    except Exception as exc:  # a third-party metric that raises: record, go on
        return MetricResult(
            metric=metric.name,
            score=None,
            error=f"internal: {type(exc).__name__}: {exc}",
            threshold=metric.options.threshold,
            judge=judge.model if judge is not None and metric.uses_judge else "none",
        )


#: How long ``evaluate()`` scores judge-free metrics before it lets the loop run, and
#: how many items it scores between two looks at the clock.
_SLICE_S = 0.02
_CHUNK = 64


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a judge-free batch (seconds for 10k cases).

    The batch allocates many small result objects that hold no reference cycles; with
    the collector on, the allocations make it traverse the live objects (the dataset
    included) again and again, which cost more than the scoring.  Reference counting
    still frees everything; the collector runs again after the batch.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _item_result(
    index: int, item: Item, line: int | None, results: list[MetricResult]
) -> ItemResult:
    # Every value is of its declared type, and the results are validated already.
    if isinstance(item, RAGCase):
        kind, text = "case", item.input
    else:
        kind = "conversation"
        text = next((t.content for t in item.turns if t.role == "user"), None)
    return trusted(
        ItemResult,
        {
            "index": index,
            "case_id": item.case_id,
            "kind": kind,
            "line": line,
            "input": text,
            "results": results,
        },
    )


def _line_of(lines: Sequence[int] | None, index: int) -> int | None:
    return lines[index] if lines is not None and index < len(lines) else None


class _Pending:
    """The items of a judge-free batch as score columns (one per metric, over the
    batch's cases in order): :class:`EvalReport` builds the :class:`ItemResult` objects
    from them on first use of ``items`` (a few µs per item that a caller reading only
    the summary or the scores never pays)."""

    __slots__ = ("columns", "lines", "todo")

    def __init__(
        self, todo: list[Item], lines: Sequence[int] | None, columns: list[ScoreColumn]
    ) -> None:
        self.todo = todo
        self.lines = lines
        self.columns = columns

    def __len__(self) -> int:
        return len(self.todo)

    def scores(self, metric: str) -> list[float | None]:
        column = next((c for c in self.columns if c.metric.name == metric), None)
        if column is None:
            return [None] * len(self.todo)
        if len(column.scores) == len(self.todo):  # only cases
            return list(column.scores)
        scores = iter(column.scores)
        return [next(scores) if isinstance(item, RAGCase) else None for item in self.todo]

    def build(self) -> list[ItemResult]:
        todo, lines = self.todo, self.lines
        cases = [item for item in todo if isinstance(item, RAGCase)]
        out: list[ItemResult] = []
        with _gc_paused():
            per_metric = [iter(column.results(cases)) for column in self.columns]
            for index, item in enumerate(todo):
                scored = [next(r) for r in per_metric] if isinstance(item, RAGCase) else []
                out.append(_item_result(index, item, _line_of(lines, index), scored))
        return out


#: The attributes of an EvalReport whose reading builds its pending items first.
_BUILDS_ITEMS = frozenset({"items", "__dict__", "__pydantic_private__"})


def _pending_of(report: EvalReport) -> _Pending | None:
    """The pending items of ``report``, read without building them."""
    try:
        private = object.__getattribute__(report, "__pydantic_private__")
    except AttributeError:  # still in __init__
        return None
    pending: _Pending | None = private.get("_pending") if private else None
    return pending


def _build_pending(report: EvalReport) -> None:
    """Build the pending items of ``report`` (a no-op when there are none)."""
    pending = _pending_of(report)
    if pending is not None:
        private = object.__getattribute__(report, "__pydantic_private__")
        fields = object.__getattribute__(report, "__dict__")
        built = {**fields, "items": pending.build()}
        # Back in field order: the JSON dumps follow the order of __dict__.
        fields.clear()
        fields.update({name: built.pop(name) for name in EvalReport.model_fields})
        fields.update(built)
        private["_pending"] = None


async def _score_columns(todo: list[Item], metrics: Sequence[JudgeFreeMetric]) -> list[ScoreColumn]:
    """Every metric's column over the cases of ``todo``, ``_CHUNK`` cases at a time,
    letting the loop run every ``_SLICE_S``."""
    cases = [item for item in todo if isinstance(item, RAGCase)]
    columns = [ScoreColumn(m, []) for m in metrics]
    deadline = time.perf_counter() + _SLICE_S
    for start in range(0, len(cases), _CHUNK):
        if time.perf_counter() > deadline:
            await asyncio.sleep(0)  # let the loop serve I/O between slices
            deadline = time.perf_counter() + _SLICE_S
        chunk = cases[start : start + _CHUNK]
        for column, metric in zip(columns, metrics, strict=True):
            column.extend(metric.score_column(chunk))
    return columns


async def evaluate(
    items: Iterable[Item],
    metrics: Sequence[Metric | str] | None,
    judge: Judge | None,
    concurrency: int = 8,
    *,
    lines: Sequence[int] | None = None,
    options: Mapping[str, MetricOptions | Mapping[str, Any]] | None = None,
    defaults: Mapping[str, Any] | None = None,
    on_item: Callable[[ItemResult], None] | None = None,
    feedback: Sequence[object] | None = None,
    feedback_column: str = "feedback",
) -> EvalReport:
    """Evaluate ``items`` with ``metrics`` (instances or names; None: the default
    set) using ``judge``.  Case metrics run on cases, conversation metrics on
    conversations.  ``on_item`` is called as each item finishes (progress bars).

    Judge-free metrics (:class:`JudgeFreeMetric`) are scored synchronously, with no
    task per case; when every metric is judge-free, the whole batch runs in one
    pass that yields to the event loop every few milliseconds.  Without ``on_item``,
    such a batch computes the scores and the summary only; ``report.items`` is built
    from them when first read (``report.scores(metric)`` reads the scores without).

    ``feedback``: one human label per item (a bool, a number in [0, 1], text such as
    ``"true"``; None where there is none); ``report.feedback`` then holds each
    metric's agreement with them (:mod:`ragtrace_collector.offline.feedback`).
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    started = time.perf_counter()
    todo = list(items)
    if feedback is not None and len(feedback) != len(todo):
        raise ValueError(f"{len(feedback)} feedback labels for {len(todo)} items")
    chosen = _resolve_metrics(metrics, judge=judge, options=options, defaults=defaults)
    report = await _evaluate_chosen(todo, chosen, judge, concurrency, lines, on_item, started)
    if feedback is not None:
        # Sorting every metric's scores: off the loop, which may serve a progress bar.
        report.feedback = await asyncio.to_thread(
            measure_feedback,
            feedback_column,
            feedback,
            report.metrics,
            report.scores,
            {m.name: m.threshold for m in chosen},
            lines,
        )
    return report


async def _evaluate_chosen(
    todo: list[Item],
    chosen: list[Metric],
    judge: Judge | None,
    concurrency: int,
    lines: Sequence[int] | None,
    on_item: Callable[[ItemResult], None] | None,
    started: float,
) -> EvalReport:
    now = [isinstance(m, JudgeFreeMetric) and m.kind == "case" for m in chosen]
    results: list[ItemResult | None] = [None] * len(todo)

    if all(now) and on_item is None:
        columns = await _score_columns(todo, cast("list[JudgeFreeMetric]", chosen))
        names = [m.name for m in chosen]
        tallies = {name: _Tally() for name in names}
        for column in columns:
            tallies[column.metric.name].add_column(column)
        report = EvalReport(
            judge=judge.model if judge is not None else "none",
            metrics=names,
            items=[],
            summary={name: tally.summary(name) for name, tally in tallies.items()},
            elapsed_s=time.perf_counter() - started,
        )
        del report.__dict__["items"]  # built from the columns when first read
        report._pending = _Pending(todo, lines, columns)
        return report
    if all(now):
        immediate = cast("list[JudgeFreeMetric]", chosen)

        def score_chunk(start: int) -> int:
            """Score ``_CHUNK`` items from ``start``, metric by metric; the next index."""
            chunk = todo[start : start + _CHUNK]
            cases = [item for item in chunk if isinstance(item, RAGCase)]
            per_metric = [iter(m.measure_many(cases)) for m in immediate]
            for index, item in enumerate(chunk, start):
                scored = [next(r) for r in per_metric] if isinstance(item, RAGCase) else []
                done = _item_result(index, item, _line_of(lines, index), scored)
                results[index] = done
                if on_item is not None:
                    on_item(done)
            return start + len(chunk)

        with _gc_paused():
            deadline = time.perf_counter() + _SLICE_S
            next_index = 0
            while next_index < len(todo):
                if time.perf_counter() > deadline:
                    await asyncio.sleep(0)  # let the loop serve I/O between slices
                    deadline = time.perf_counter() + _SLICE_S
                next_index = score_chunk(next_index)
    else:
        queue = iter(range(len(todo)))

        async def worker() -> None:
            for index in queue:
                item = todo[index]
                done = _item_result(
                    index,
                    item,
                    _line_of(lines, index),
                    await _measure_item(chosen, now, item, judge),
                )
                results[index] = done
                if on_item is not None:
                    on_item(done)

        workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(todo)))]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
    finished = [r for r in results if r is not None]
    names = [m.name for m in chosen]
    return EvalReport(
        judge=judge.model if judge is not None else "none",
        metrics=names,
        items=finished,
        summary=summarise(names, finished),
        elapsed_s=time.perf_counter() - started,
    )


async def _measure_item(
    chosen: Sequence[Metric], now: Sequence[bool], item: Item, judge: Judge | None
) -> list[MetricResult]:
    """One item's results, in metric order: judge-free ones synchronously, the others
    concurrently."""
    slots: list[MetricResult | None] = []
    pending: list[tuple[int, Coroutine[Any, Any, MetricResult | None]]] = []
    for metric, immediate in zip(chosen, now, strict=True):
        if immediate:
            if isinstance(item, RAGCase):
                slots.append(cast("JudgeFreeMetric", metric).measure_now(item))
            continue
        pending.append((len(slots), _measure(metric, item, judge)))
        slots.append(None)
    if len(pending) == 1:
        slots[pending[0][0]] = await pending[0][1]
    elif pending:
        measured = await asyncio.gather(*(c for _, c in pending))
        for (slot, _), result in zip(pending, measured, strict=True):
            slots[slot] = result
    return [r for r in slots if r is not None]


def _run_sync(coro_factory: Callable[[], Any]) -> Any:
    """``asyncio.run``, or in a helper thread when a loop already runs (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro_factory())
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="ragtrace-evaluate")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def evaluate_file(
    path: str | Path,
    metrics: Sequence[Metric | str] | str | None = None,
    model: str = "offline",
    *,
    concurrency: int = 8,
    threshold: float | None = None,
    options: Mapping[str, MetricOptions | Mapping[str, Any]] | None = None,
    judge: Judge | None = None,
    only_applicable: bool | None = None,
    format: str | None = None,
    max_row_size: int | None = DEFAULT_MAX_ROW_SIZE,
    feedback_column: str | None = None,
) -> EvalReport:
    """Load ``path`` (JSONL, JSON, CSV or Parquet) and evaluate it (synchronous; for
    notebooks and CI).

    ``metrics``: names (list or comma-separated) or instances; None means the
    default set restricted to the metrics the data can feed.  ``model`` is
    ``"offline"`` or a litellm model string (ignored when ``judge`` is given).
    Bad rows (and rows over ``max_row_size`` characters) do not stop the evaluation:
    they are in ``report.row_errors``.  ``feedback_column``: a column of human labels
    (bool or number per row); ``report.feedback`` then says how well each metric
    agrees with them.
    """
    loaded = load_dataset(
        path, format=format, max_row_size=max_row_size, feedback_column=feedback_column
    )
    return _evaluate_loaded(
        loaded, metrics, model, concurrency, threshold, options, judge, only_applicable
    )


def evaluate_rows(
    rows: Iterable[Mapping[str, Any]],
    metrics: Sequence[Metric | str] | str | None = None,
    model: str = "offline",
    *,
    concurrency: int = 8,
    threshold: float | None = None,
    options: Mapping[str, MetricOptions | Mapping[str, Any]] | None = None,
    judge: Judge | None = None,
    only_applicable: bool | None = None,
    max_row_size: int | None = DEFAULT_MAX_ROW_SIZE,
    feedback_column: str | None = None,
) -> EvalReport:
    """:func:`evaluate_file` for rows already in memory: a Hugging Face
    ``datasets.Dataset`` (its rows are mappings), ``DataFrame.to_dict("records")`` or a
    list of dicts, with the field names of the files.  Rows are numbered from 1."""
    loaded = load_rows(rows, max_row_size=max_row_size, feedback_column=feedback_column)
    return _evaluate_loaded(
        loaded, metrics, model, concurrency, threshold, options, judge, only_applicable
    )


def _evaluate_loaded(
    loaded: LoadResult,
    metrics: Sequence[Metric | str] | str | None,
    model: str,
    concurrency: int,
    threshold: float | None,
    options: Mapping[str, MetricOptions | Mapping[str, Any]] | None,
    judge: Judge | None,
    only_applicable: bool | None,
) -> EvalReport:
    if isinstance(metrics, str):
        metrics = parse_metric_names(metrics)
    if judge is None:
        judge = make_judge_for(model, concurrency=concurrency)
    defaults = {"threshold": threshold} if threshold is not None else None
    chosen = _resolve_metrics(metrics, judge=judge, options=options, defaults=defaults)
    if only_applicable is None:
        only_applicable = metrics is None
    if only_applicable:
        chosen = applicable_metrics(chosen, loaded.items)

    report: EvalReport = _run_sync(
        lambda: evaluate(
            loaded.items,
            chosen,
            judge,
            concurrency,
            lines=loaded.lines,
            feedback=loaded.feedback if loaded.feedback_column is not None else None,
            feedback_column=loaded.feedback_column or "feedback",
        )
    )
    report.row_errors = list(loaded.errors)
    report.warnings = loaded.grouped_warnings()
    return report


def make_judge_for(model: str | None, *, concurrency: int | None = None, **config: Any) -> Judge:
    """A judge for ``model`` through the judge factory (``"offline"`` by default).

    Raises ``ValueError`` for an invalid judge configuration.
    """
    from pydantic import ValidationError

    from ragtrace_collector.judges.config import JudgeConfig
    from ragtrace_collector.judges.factory import make_judge

    fields = dict(config)
    if model is not None:
        fields["model"] = model
    if concurrency is not None:
        fields["concurrency"] = concurrency
    try:
        judge_config = JudgeConfig(**fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'judge'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"invalid judge configuration: {problems}") from None
    return make_judge(judge_config)
