"""context_entity_recall: METRICS.md examples, normalisation, batching and caching."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ragtrace_collector.judges.base import EntityExtractionRequest, JudgeError, JudgeTask
from ragtrace_collector.metrics import EntityCache, build_metric, normalise_entity
from ragtrace_collector.metrics.entities import ContextEntityRecall
from tests.fakes.judge import ScriptedJudge, case

REFERENCE = "The Taj Mahal ..."  # the scripted judge decides the entities


def _by_text(table: dict[str, list[str]]) -> Any:
    def answer(task: JudgeTask[Any]) -> dict[str, Any]:
        assert isinstance(task, EntityExtractionRequest)
        return {"entities": [table[t] for t in task.texts]}

    return answer


def _metric(**options: Any) -> ContextEntityRecall:
    return ContextEntityRecall(
        build_metric("context_entity_recall", options).options, cache=EntityCache(64)
    )


GE = ["Taj Mahal", "Yamuna", "Agra", "1631", "Shah Jahan", "Mumtaz Mahal"]


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ({"c1": ["Taj Mahal", "Agra"], "c2": ["Shah Jahan", "Mumtaz Mahal", "India"]}, 4 / 6),
        ({"c1": ["Taj Mahal", "UNESCO", "India"]}, 1 / 6),
    ],
)
async def test_taj_mahal_examples(chunks: dict[str, list[str]], expected: float) -> None:
    table = {REFERENCE: GE, **chunks}
    judge = ScriptedJudge({"entities": _by_text(table)})
    result = await _metric().measure(case(expected_output=REFERENCE, contexts=list(chunks)), judge)
    assert result.score == pytest.approx(expected, abs=1e-6)
    assert len(judge.calls) == 1  # reference and every chunk in one batched call
    assert set(judge.calls[0].texts) == {REFERENCE, *chunks}


async def test_paris_set_semantics_and_case_folding() -> None:
    table = {REFERENCE: ["Paris", "Paris", "France"], "ctx": ["paris"]}
    judge = ScriptedJudge({"entities": _by_text(table)})
    result = await _metric().measure(case(expected_output=REFERENCE, contexts=["ctx"]), judge)
    assert result.score == 0.5
    assert result.details["reference_entities"] == ["france", "paris"]
    assert result.details["missing"] == ["france"]


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("Paris", "paris"),
        ("  Taj   Mahal, ", "taj mahal"),
        ("(Agra)", "agra"),
        ("“Shah Jahan”.", "shah jahan"),
        ("STRASSE", "strasse"),
        ("Straße", "strasse"),
        ("U.S.", "u.s"),
        ("...", ""),
    ],
)
def test_normalisation(raw: str, normal: str) -> None:
    assert normalise_entity(raw) == normal


async def test_empty_reference_entities_is_skipped() -> None:
    table = {REFERENCE: ["  ", "!"], "ctx": ["Paris"]}
    judge = ScriptedJudge({"entities": _by_text(table)})
    result = await _metric().measure(case(expected_output=REFERENCE, contexts=["ctx"]), judge)
    assert result.skipped
    assert result.score is None


async def test_empty_retrieval_scores_zero() -> None:
    judge = ScriptedJudge({"entities": _by_text({REFERENCE: ["Paris"]})})
    result = await _metric().measure(case(expected_output=REFERENCE, contexts=[]), judge)
    assert result.score == 0.0


async def test_chunks_already_seen_cost_no_call() -> None:
    cache = EntityCache(64)
    table = {"ref A": ["Paris"], "ref B": ["France"], "doc 1": ["Paris"], "doc 2": ["France"]}
    judge = ScriptedJudge({"entities": _by_text(table)})
    metric = ContextEntityRecall(cache=cache)

    first = await metric.measure(case(expected_output="ref A", contexts=["doc 1", "doc 2"]), judge)
    assert first.score == 1.0
    assert first.cost.calls == 1

    # Same documents, another question: only the new reference is extracted.
    second = await metric.measure(case(expected_output="ref B", contexts=["doc 2", "doc 1"]), judge)
    assert second.score == 1.0
    assert judge.calls[-1].texts == ("ref B",)
    assert second.details["texts_from_cache"] == 2

    # Everything seen: zero calls.
    third = await metric.measure(case(expected_output="ref A", contexts=["doc 1"]), judge)
    assert third.cost.calls == 0
    assert len(judge.calls) == 2


async def test_cache_key_includes_the_judge_model() -> None:
    cache = EntityCache(64)
    table = {"ref": ["Paris"], "doc": ["Paris"]}
    one = ScriptedJudge({"entities": _by_text(table)}, model="m1")
    two = ScriptedJudge({"entities": _by_text(table)}, model="m2")
    metric = ContextEntityRecall(cache=cache)
    await metric.measure(case(expected_output="ref", contexts=["doc"]), one)
    await metric.measure(case(expected_output="ref", contexts=["doc"]), two)
    assert len(one.calls) == 1
    assert len(two.calls) == 1


def test_lru_is_bounded() -> None:
    cache = EntityCache(3)
    for i in range(10):
        cache._remember(f"k{i}", (str(i),))
    assert len(cache) == 3
    assert list(cache._done) == ["k7", "k8", "k9"]


async def test_concurrent_cases_share_one_extraction_per_chunk() -> None:
    gate = asyncio.Event()
    table = {f"ref {i}": ["Paris"] for i in range(5)} | {"shared doc": ["Paris"]}
    asked: list[tuple[str, ...]] = []
    all_asked = asyncio.Event()

    class SlowJudge(ScriptedJudge):
        async def ask(self, task: JudgeTask[Any]) -> Any:
            asked.append(task.texts)  # type: ignore[attr-defined]
            if len(asked) == 5:
                all_asked.set()
            await gate.wait()
            return await super().ask(task)

    judge = SlowJudge({"entities": _by_text(table)})
    metric = ContextEntityRecall(cache=EntityCache(64))
    tasks = [
        asyncio.create_task(
            metric.measure(case(expected_output=f"ref {i}", contexts=["shared doc"]), judge)
        )
        for i in range(5)
    ]
    await asyncio.wait_for(all_asked.wait(), timeout=10)
    gate.set()
    results = await asyncio.gather(*tasks)
    assert all(r.score == 1.0 for r in results)
    assert sum(t.count("shared doc") for t in asked) == 1


async def test_a_failed_shared_extraction_errors_the_waiters_too() -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    class FailingJudge(ScriptedJudge):
        async def ask(self, task: JudgeTask[Any]) -> Any:
            started.set()
            await gate.wait()
            return await super().ask(task)

    judge = FailingJudge(
        {
            "entities": [JudgeError("rate_limited", "429 from provider")] * 2
            + [{"entities": [["Paris"]]}]
        }
    )
    cache = EntityCache(64)
    metric = ContextEntityRecall(cache=cache)
    first = asyncio.create_task(
        metric.measure(case(expected_output="ref", contexts=["doc"]), judge)
    )
    await started.wait()
    second = asyncio.create_task(
        metric.measure(case(expected_output="ref", contexts=["doc"]), judge)
    )
    await asyncio.sleep(0)
    gate.set()
    r1, r2 = await asyncio.gather(first, second)
    assert r1.error == "rate_limited: 429 from provider"
    assert r2.error == "rate_limited: 429 from provider"
    assert len(judge.calls) == 1
    assert cache._inflight == {}


async def test_cancellation_releases_waiters() -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    class HangingJudge(ScriptedJudge):
        async def ask(self, task: JudgeTask[Any]) -> Any:
            started.set()
            await gate.wait()
            return await super().ask(task)

    judge = HangingJudge({"entities": _by_text({"ref": ["Paris"], "doc": ["Paris"]})})
    cache = EntityCache(64)
    metric = ContextEntityRecall(cache=cache)
    first = asyncio.create_task(
        metric.measure(case(expected_output="ref", contexts=["doc"]), judge)
    )
    await started.wait()
    second = asyncio.create_task(
        metric.measure(case(expected_output="ref", contexts=["doc"]), judge)
    )
    await asyncio.sleep(0)
    first.cancel()
    result = await asyncio.wait_for(second, timeout=10)
    assert result.error is not None
    assert "abandoned" in result.error
    assert cache._inflight == {}
    with pytest.raises(asyncio.CancelledError):
        await first
