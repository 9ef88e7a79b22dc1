"""Score columns: the fast scorers of the judge-free metrics give the scores of their
full results, and a judge-free ``evaluate()`` batch, whose items are built from the
columns only when read, gives the same report as the item-by-item path."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragtrace_collector.cases import ContextItem, Conversation, RAGCase, Turn
from ragtrace_collector.metrics import JudgeFreeMetric, build_metric
from ragtrace_collector.metrics.base import Outcome
from ragtrace_collector.metrics.ids import IDContextRecall
from ragtrace_collector.metrics.nonllm import SIMILARITIES, best_similarities
from ragtrace_collector.offline.runner import (
    EvalReport,
    ItemResult,
    _pending_of,
    evaluate,
    evaluate_rows,
    summarise,
)
from tests.fakes.judge import case

FAST = ["id_context_recall", "id_context_precision", "non_llm_context_recall",
        "non_llm_context_precision"]  # fmt: skip
DISTANCES = ["levenshtein", "jaro", "jaro_winkler", "hamming", "indel"]


def _corpus() -> list[RAGCase]:
    """Cases that score, and every way of being skipped, for all four metrics."""
    return [
        case(contexts=["zzzz", "ab"], reference_contexts=["ac"]),  # sim exactly 0.5
        case(contexts=["ab"], reference_contexts=["ac", "ab"], retrieved_ids=["a", "b"],
             reference_ids=["b", "c", "c"]),
        case(contexts=[], reference_contexts=["x"], retrieved_ids=[], reference_ids=["x"]),
        case(contexts=["text"], reference_ids=["a"]),  # contexts without ids
        case(reference_contexts=["x"], reference_ids=["a"]),  # nothing captured
        case(contexts=["x"], reference_contexts=[], retrieved_ids=["a"], reference_ids=[]),
        case(retrieved_ids=[3.0, 4.0, "5.0"], reference_ids=["3", 4, 5]),
        case(retrieved_ids=["a", "a", "b"], reference_ids=["a"]),
        RAGCase(
            retrieval_context=[ContextItem(content="x", id=7), ContextItem(content="y", id="d2")],
            reference_context_ids=["7", "d9"],
            reference_contexts=["y"],
        ),
        case(contexts=["the capital of France is Paris", "cooking"],
             reference_contexts=["Paris is the capital of France"],
             retrieved_ids=["d1", "d2"], reference_ids=["d1"]),
    ]  # fmt: skip


def _slow_scores(metric: JudgeFreeMetric, cases: Sequence[RAGCase]) -> list[float | None]:
    return [r.score for r in metric.measure_many(cases)]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("name", FAST)
def test_fast_scores_equal_the_full_results(name: str, strict: bool) -> None:
    cases = _corpus()
    for extra in [{}, {"threshold": 0.5}, {"similarity_threshold": 0.0}, {"threshold": 1.0}]:
        metric = build_metric(name, {"strict": strict, **extra})
        assert isinstance(metric, JudgeFreeMetric)
        column = metric.score_column(cases)
        assert column.built == {}  # the fast path: no result built
        assert column.scores == _slow_scores(metric, cases)
        assert column.results(cases) == metric.measure_many(cases)


@pytest.mark.parametrize("name", ["non_llm_context_recall", "non_llm_context_precision"])
@pytest.mark.parametrize("distance", DISTANCES)
@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(
        st.tuples(
            st.lists(st.text("abc", max_size=5), max_size=4),
            st.lists(st.text("abc", max_size=5), min_size=1, max_size=3),
        ),
        min_size=1,
        max_size=6,
    ),
    cut=st.sampled_from([0.0, 0.25, 1 / 3, 0.5, 0.6, 2 / 3, 0.75, 0.8, 1.0]),
)
def test_fast_non_llm_scores_at_the_cut(
    name: str, distance: str, data: list[tuple[list[str], list[str]]], cut: float
) -> None:
    # Short texts over three letters: similarities land exactly on the cut often.
    cases = [case(contexts=ret, reference_contexts=ref) for ret, ref in data]
    metric = build_metric(name, {"distance": distance, "similarity_threshold": cut})
    assert isinstance(metric, JudgeFreeMetric)
    assert metric.score_column(cases).scores == _slow_scores(metric, cases)


class _Broken(IDContextRecall):
    """A fast scorer that raises: the batch falls back to the full path."""

    def _fast_scores(self, cases: Sequence[RAGCase]) -> list[float | None]:
        raise RuntimeError("bug")

    def _score_now(self, case: RAGCase) -> Outcome:
        if case.reference_context_ids == ["boom"]:
            raise RuntimeError("bug")
        return super()._score_now(case)


class _NoFastPath(JudgeFreeMetric):
    """A third-party judge-free metric: no fast scorer."""

    name = "length_ratio"

    def missing_inputs(self, case: RAGCase) -> str | None:
        return None if case.retrieval_context else "nothing retrieved"

    def _score_now(self, case: RAGCase) -> Outcome:
        return Outcome(len(case.retrieval_context or ()) / 4, "n/4", {"n": 1})


def _items() -> list[RAGCase | Conversation]:
    conversation = Conversation(
        turns=[Turn(role="user", content="hi"), Turn(role="assistant", content="hello")]
    )
    broken = case(retrieved_ids=["a"], reference_ids=["boom"])
    return [*_corpus(), conversation, broken, *_corpus()[:3]]


async def _both(metrics: list[Any]) -> tuple[EvalReport, EvalReport]:
    items = _items()
    lines = list(range(10, 10 + len(items)))
    seen: list[ItemResult] = []
    eager = await evaluate(items, metrics, None, lines=lines, on_item=seen.append)
    assert _pending_of(eager) is None
    assert len(seen) == len(items)
    lazy = await evaluate(items, metrics, None, lines=lines)
    assert _pending_of(lazy) is not None
    eager.elapsed_s = lazy.elapsed_s  # reading a field builds nothing
    assert _pending_of(lazy) is not None
    return eager, lazy


@pytest.mark.parametrize(
    "metrics",
    [FAST, ["id_context_precision"], [_Broken(), _NoFastPath(), "non_llm_context_recall"],
     [build_metric("id_context_recall", {"strict": True}), "id_context_recall"]],
)  # fmt: skip
async def test_lazy_report_equals_the_item_by_item_report(metrics: list[Any]) -> None:
    eager, lazy = await _both(metrics)
    names = eager.metrics
    # Read without building the items: the summary, the scores, the count, the repr.
    assert lazy.summary == eager.summary
    for name in names:
        assert lazy.scores(name) == eager.scores(name)
    assert lazy.scores("no_such_metric") == [None] * len(eager.items)
    assert lazy.item_count == len(eager.items)
    assert "items=" in repr(lazy)
    assert lazy.summary_dict()["metrics"] == {
        k: v.model_dump(mode="json") for k, v in eager.summary.items()
    }
    assert lazy.cost == eager.cost
    assert _pending_of(lazy) is not None
    # The items, built on first read, are those of the item-by-item path.
    assert lazy.model_dump() == eager.model_dump()
    assert _pending_of(lazy) is None
    assert lazy.model_dump_json() == eager.model_dump_json()
    assert lazy == eager
    assert lazy.items == eager.items
    assert summarise(names, lazy.items) == lazy.summary
    for item in lazy.items:
        assert item == ItemResult.model_validate(item.model_dump())


async def test_every_way_to_read_a_lazy_report_builds_its_items() -> None:
    readers = [
        lambda r: r.model_dump(),
        lambda r: r.model_dump_json(),
        lambda r: pickle.loads(pickle.dumps(r)),
        lambda r: copy.deepcopy(r),
        lambda r: r.model_copy(),
        lambda r: dict(r),
        lambda r: EvalReport.model_validate(r.model_dump()),
    ]
    for read in readers:
        eager, lazy = await _both(FAST)
        assert read(lazy) == read(eager)
        assert lazy == eager
    eager, lazy = await _both(FAST)
    lazy.warnings = ["set before the items were read"]
    assert _pending_of(lazy) is not None
    assert lazy.model_fields_set == eager.model_fields_set | {"warnings"}
    assert lazy.items == eager.items
    assert lazy.warnings == ["set before the items were read"]


async def test_fallback_records_the_error_of_the_case_that_raised() -> None:
    _, lazy = await _both([_Broken()])
    errors = [r for item in lazy.items for r in item.results if r.error is not None]
    assert [e.error for e in errors] == ["internal: RuntimeError: bug"]
    assert lazy.summary["id_context_recall"].errors == 1


def test_evaluate_rows_leaves_the_items_of_a_judge_free_batch_unbuilt() -> None:
    rows = [
        {"retrieved_context_ids": ["a", "b"], "reference_context_ids": ["a"]},
        {"retrieved_context_ids": "not a list"},
    ]
    report = evaluate_rows(rows, "id_context_recall,id_context_precision")
    assert _pending_of(report) is not None
    assert len(report.row_errors) == 1
    assert report.scores("id_context_precision") == [0.5]
    assert [item.results[0].score for item in report.items] == [1.0]


@pytest.mark.parametrize("distance", DISTANCES)
@settings(max_examples=150, deadline=None)
@given(
    queries=st.lists(st.text("abcd", max_size=8), max_size=4),
    choices=st.lists(st.text("abcd", max_size=8), max_size=4),
)
def test_best_similarities_is_the_maximum_of_the_similarity(
    distance: str, queries: list[str], choices: list[str]
) -> None:
    sim = SIMILARITIES[distance]
    expected = [max([sim(q, c) for c in choices], default=0.0) for q in queries]
    assert best_similarities(queries, choices, sim) == expected
