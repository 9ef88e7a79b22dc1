"""The batch path of evaluate(): judge-free metrics scored synchronously, without a task
per case, with the collector paused per slice; results built without revalidation but
equal to validated ones."""

from __future__ import annotations

import asyncio
import gc

import pytest

from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import JudgeFreeMetric, build_metric
from ragtrace_collector.offline import runner as evaluate_module
from ragtrace_collector.offline.runner import ItemResult, evaluate
from ragtrace_collector.results import Cost, MetricResult
from tests.fakes.judge import case


def _cases(n: int) -> list:  # type: ignore[type-arg]
    return [
        case(
            contexts=[f"text {i} about paris", "unrelated"],
            reference_contexts=[f"text {i} about paris"],
            retrieved_ids=[f"d{i}", "x"],
            reference_ids=[f"d{i}", "y"],
            expected_output=f"answer {i}",
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "name",
    ["id_context_recall", "id_context_precision", "non_llm_context_recall",
     "non_llm_context_precision"],
)  # fmt: skip
async def test_measure_now_equals_measure_and_a_validated_result(name: str) -> None:
    metric = build_metric(name, {"strict": name.endswith("recall")})
    assert isinstance(metric, JudgeFreeMetric)
    for item in [*_cases(2), case(retrieved_ids=["a"], reference_ids=[])]:
        now = metric.measure_now(item)
        assert now == await metric.measure(item, None)
        # The unvalidated result is exactly what validation of its values gives.
        assert now == MetricResult.model_validate(now.model_dump())
        assert now.model_fields_set == set(MetricResult.model_fields)


async def test_judge_free_batch_creates_no_task_per_case_and_pauses_gc() -> None:
    tasks_seen: set[int] = set()
    gc_states: set[bool] = set()

    def on_item(done: ItemResult) -> None:
        tasks_seen.add(len(asyncio.all_tasks()))
        gc_states.add(gc.isenabled())

    assert gc.isenabled()
    report = await evaluate(
        _cases(300), ["id_context_recall", "non_llm_context_recall"], None, on_item=on_item
    )
    assert tasks_seen == {1}  # only the test's own task: no worker, no per-metric task
    assert gc_states == {False}
    assert gc.isenabled()  # back on afterwards
    assert report.summary["id_context_recall"].mean == 0.5
    assert report.summary["non_llm_context_recall"].mean == 1.0


async def test_judge_free_batch_yields_to_the_loop_between_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(evaluate_module, "_SLICE_S", 0.0)
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    await evaluate(_cases(640), ["id_context_recall"], None)
    stop.set()
    await task
    assert ticks - before >= 9  # one turn per slice of 64 cases at least


async def test_mixed_metrics_keep_metric_order_and_item_inputs() -> None:
    names = ["id_context_recall", "contextual_recall", "non_llm_context_precision"]
    report = await evaluate(_cases(5), names, OfflineJudge(), concurrency=2)
    for index, item in enumerate(report.items):
        assert [r.metric for r in item.results] == names
        assert item.index == index
        assert item.input == "What is the capital of France?"
        assert item == ItemResult.model_validate(item.model_dump())


def test_summary_keeps_an_unknown_price_and_counts_calls() -> None:
    priced = Cost(calls=1, prompt_tokens=10, completion_tokens=2, usd=0.5)
    unknown = Cost(calls=1, prompt_tokens=10, completion_tokens=2, usd=None)
    items = [
        ItemResult(index=i, case_id=None, kind="case",
                   results=[MetricResult(metric="m", score=1.0, passed=True, cost=c)])
        for i, c in enumerate([priced, unknown, Cost()])
    ]  # fmt: skip
    s = evaluate_module.summarise(["m"], items)["m"]
    assert (s.calls, s.prompt_tokens, s.completion_tokens, s.cost_usd) == (2, 20, 4, None)
    s = evaluate_module.summarise(["m"], items[:1] + items[2:])["m"]
    assert (s.calls, s.cost_usd, s.mean, s.pass_rate) == (1, 0.5, 1.0, 1.0)


async def test_report_repr_is_short() -> None:
    # asyncio.run() formats the main task's result when it restores SIGINT handling.
    report = await evaluate(_cases(1000), ["id_context_recall"], None)
    assert len(repr(report)) < 200
    assert "items=1000" in repr(report)
