"""Offline evaluation: the same metric code as the collector, run over a dataset.

>>> report = await evaluate(cases, ["contextual_recall", "id_context_recall"], judge)
>>> report = evaluate_file("cases.jsonl", metrics=["contextual_recall"])  # sync

Cases run concurrently (``concurrency`` items in flight; each item's metrics run
together).  Judge calls are further bounded by the judge itself.  Per-metric summary:
mean over *scored* results only (skipped and errored results do not pull it down),
pass rate over scored results, skipped and error counts, judge calls, tokens, cost.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragtrace_collector.cases import Conversation, RAGCase
from ragtrace_collector.judges.base import Judge
from ragtrace_collector.loaders import RowError, load_dataset
from ragtrace_collector.metrics import (
    METRIC_NAMES,
    OFFLINE_METRICS,
    ConversationMetric,
    Metric,
    MetricOptions,
    build_metrics,
    parse_metric_names,
)
from ragtrace_collector.results import Cost, MetricResult

__all__ = [
    "EvalReport",
    "ItemResult",
    "MetricSummary",
    "applicable_metrics",
    "evaluate",
    "evaluate_file",
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
    results: list[MetricResult] = Field(default_factory=list)

    def result(self, metric: str) -> MetricResult | None:
        return next((r for r in self.results if r.metric == metric), None)

    def to_json_dict(self) -> dict[str, Any]:
        """One line of the ``--output`` JSONL."""
        out: dict[str, Any] = {"case_id": self.case_id, "kind": self.kind}
        if self.line is not None:
            out["line"] = self.line
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

    @property
    def cost(self) -> Cost:
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
            "items": len(self.items),
            "row_errors": [str(e) for e in self.row_errors],
            "elapsed_s": round(self.elapsed_s, 3),
            "cost": cost.model_dump(mode="json"),
            "metrics": {k: v.model_dump(mode="json") for k, v in self.summary.items()},
        }


def summarise(metrics: Sequence[str], items: Iterable[ItemResult]) -> dict[str, MetricSummary]:
    """Per-metric summary: mean and pass rate over scored results only."""
    out = {m: MetricSummary(metric=m) for m in metrics}
    sums: dict[str, list[float]] = {m: [] for m in metrics}
    costs: dict[str, Cost] = {m: Cost() for m in metrics}
    for item in items:
        for r in item.results:
            s = out.setdefault(r.metric, MetricSummary(metric=r.metric))
            sums.setdefault(r.metric, [])
            s.count += 1
            s.heuristic = s.heuristic or r.heuristic
            costs[r.metric] = costs.get(r.metric, Cost()) + r.cost
            outcome = r.outcome
            if outcome == "error":
                s.errors += 1
            elif outcome == "skipped":
                s.skipped += 1
            else:
                assert r.score is not None
                sums[r.metric].append(r.score)
                if outcome == "passed":
                    s.passed += 1
                else:
                    s.failed += 1
    for m, s in out.items():
        scores = sums.get(m, [])
        s.scored = len(scores)
        if scores:
            s.mean = math.fsum(scores) / len(scores)
            s.pass_rate = s.passed / len(scores)
        c = costs.get(m, Cost())
        s.calls, s.cached_calls = c.calls, c.cached_calls
        s.prompt_tokens, s.completion_tokens = c.prompt_tokens, c.completion_tokens
        s.cost_usd = c.usd
    return out


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
) -> EvalReport:
    """Evaluate ``items`` with ``metrics`` (instances or names; None: the default
    set) using ``judge``.  Case metrics run on cases, conversation metrics on
    conversations.  ``on_item`` is called as each item finishes (progress bars)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    started = time.perf_counter()
    todo = list(items)
    chosen = _resolve_metrics(metrics, judge=judge, options=options, defaults=defaults)
    results: list[ItemResult | None] = [None] * len(todo)
    queue = iter(range(len(todo)))

    async def worker() -> None:
        for index in queue:
            item = todo[index]
            measured = await asyncio.gather(*(_measure(m, item, judge) for m in chosen))
            done = ItemResult(
                index=index,
                case_id=item.case_id,
                kind="conversation" if isinstance(item, Conversation) else "case",
                line=lines[index] if lines is not None and index < len(lines) else None,
                results=[r for r in measured if r is not None],
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
) -> EvalReport:
    """Load ``path`` and evaluate it (synchronous; for notebooks and CI).

    ``metrics``: names (list or comma-separated) or instances; None means the
    default set restricted to the metrics the data can feed.  ``model`` is
    ``"offline"`` or a litellm model string (ignored when ``judge`` is given).
    Bad rows do not stop the evaluation: they are in ``report.row_errors``.
    """
    loaded = load_dataset(path)
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
        lambda: evaluate(loaded.items, chosen, judge, concurrency, lines=loaded.lines)
    )
    report.row_errors = list(loaded.errors)
    report.warnings = list(loaded.warnings)
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
