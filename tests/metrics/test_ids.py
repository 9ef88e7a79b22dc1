"""id_context_recall / id_context_precision: the ID table of METRICS.md."""

from __future__ import annotations

from typing import Any

import pytest

from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.metrics import build_metric
from tests.fakes.judge import case


@pytest.mark.parametrize(
    ("retrieved", "reference", "recall", "precision"),
    [
        (["doc_1", "doc_2", "doc_3"], ["doc_1", "doc_4", "doc_5", "doc_6"], 0.25, 0.3333),
        (["doc_1", "doc_2", "doc_3", "doc_4"], ["doc_1", "doc_4", "doc_5", "doc_6"], 0.5, 0.5),
        ([1, 2, 3], ["1", "2"], 1.0, 0.6667),
        ([1, 1, 2], ["1"], 1.0, 0.5),
        ([], ["a"], 0.0, None),
    ],
)
async def test_id_table(
    retrieved: list[Any], reference: list[Any], recall: float, precision: float | None
) -> None:
    c = case(retrieved_ids=retrieved, reference_ids=reference)
    r = await build_metric("id_context_recall").measure(c, None)
    p = await build_metric("id_context_precision").measure(c, None)
    assert r.score == pytest.approx(recall, abs=1e-4)
    if precision is None:
        assert p.skipped  # empty denominator
        assert p.score is None
    else:
        assert p.score == pytest.approx(precision, abs=1e-4)
    assert r.judge == "none"


@pytest.mark.parametrize("name", ["id_context_recall", "id_context_precision"])
async def test_empty_reference_is_skipped(name: str) -> None:
    result = await build_metric(name).measure(case(retrieved_ids=["a"], reference_ids=[]), None)
    assert result.skipped
    assert "empty" in result.reason


@pytest.mark.parametrize("name", ["id_context_recall", "id_context_precision"])
async def test_missing_ids_are_skipped(name: str) -> None:
    assert (await build_metric(name).measure(case(retrieved_ids=["a"]), None)).skipped
    # contexts without ids: nothing to compare
    no_ids = case(contexts=["text"], reference_ids=["a"])
    assert (await build_metric(name).measure(no_ids, None)).skipped


async def test_ids_come_from_the_retrieval_context() -> None:
    c = RAGCase(
        retrieval_context=[ContextItem(content="x", id=7), ContextItem(content="y", id="d2")],
        reference_context_ids=["7", "d9"],
    )
    r = await build_metric("id_context_recall").measure(c, None)
    assert r.score == 0.5
    assert r.details["missing"] == ["d9"]


async def test_integral_float_ids_equal_integers() -> None:
    # Decision (docs/metrics.md): 3.0 is the id 3, as Ragas coerces it; "3.0" is not.
    c = case(retrieved_ids=[3.0, 4.0, "5.0"], reference_ids=["3", 4, 5])
    assert c.retrieved_ids() == ["3", "4", "5.0"]
    r = await build_metric("id_context_recall").measure(c, None)
    assert r.score == pytest.approx(2 / 3)
    assert ContextItem(content="x", id=2.0).id == "2"
    assert ContextItem(content="x", id=2.5).id == "2.5"
    assert RAGCase(reference_context_ids=[1.0, "1.0"]).reference_context_ids == ["1", "1.0"]
