"""non_llm_context_recall / non_llm_context_precision: METRICS.md examples with rapidfuzz."""

from __future__ import annotations

import pytest
from rapidfuzz.distance import Levenshtein

from ragtrace_collector.metrics import build_metric
from tests.fakes.judge import case

PARIS = "Paris is the capital of France."
EIFFEL = "The Eiffel Tower is one of the most famous landmarks in Paris."
LOCATED = "The Eiffel Tower is located in Paris."


async def test_recall_paris_example() -> None:
    result = await build_metric("non_llm_context_recall").measure(
        case(contexts=[PARIS], reference_contexts=[PARIS, EIFFEL]), None
    )
    assert result.score == 0.5
    assert result.details["similarities"] == pytest.approx([1.0, 0.2258], abs=1e-4)
    assert result.judge == "none"
    assert result.cost.calls == 0


@pytest.mark.parametrize(
    ("retrieved", "reference", "sim", "score"),
    [("ab", "ac", 0.5, 0.0), ("kitten", "sitting", 0.5714, 1.0)],
)
async def test_recall_threshold_is_strictly_greater(
    retrieved: str, reference: str, sim: float, score: float
) -> None:
    result = await build_metric("non_llm_context_recall").measure(
        case(contexts=[retrieved], reference_contexts=[reference]), None
    )
    assert result.details["similarities"][0] == pytest.approx(sim, abs=1e-4)
    assert result.score == score


async def test_precision_example_is_inclusive() -> None:
    result = await build_metric("non_llm_context_precision").measure(
        case(contexts=[LOCATED], reference_contexts=[PARIS, EIFFEL]), None
    )
    assert result.details["similarities"] == pytest.approx([0.5484], abs=1e-4)
    assert result.score == 1.0


async def test_precision_at_exactly_the_threshold_counts() -> None:
    # "ab" vs "ac" is exactly 0.5: not recalled (>), but relevant for precision (>=).
    result = await build_metric("non_llm_context_precision").measure(
        case(contexts=["zzzz", "ab"], reference_contexts=["ac"]), None
    )
    assert result.details["relevant"] == [0, 1]
    assert result.score == 0.5


async def test_precision_is_ap_over_ranked_matches() -> None:
    result = await build_metric("non_llm_context_precision").measure(
        case(
            contexts=[PARIS, "unrelated text about cooking", EIFFEL],
            reference_contexts=[PARIS, EIFFEL],
        ),
        None,
    )
    assert result.details["relevant"] == [1, 0, 1]
    assert result.score == pytest.approx(0.8333, abs=1e-4)


async def test_recall_is_case_sensitive() -> None:
    result = await build_metric("non_llm_context_recall").measure(
        case(contexts=["PARIS"], reference_contexts=["paris"]), None
    )
    assert result.score == 0.0


@pytest.mark.parametrize("distance", ["levenshtein", "jaro", "jaro_winkler", "hamming", "indel"])
async def test_distances(distance: str) -> None:
    result = await build_metric("non_llm_context_recall", {"distance": distance}).measure(
        case(contexts=["kitten", PARIS], reference_contexts=["sitting", PARIS]), None
    )
    assert result.details["distance"] == distance
    assert result.details["similarities"][1] == 1.0
    assert 0.0 <= result.details["similarities"][0] < 1.0


async def test_jaro_winkler_scores_differ_from_levenshtein() -> None:
    lev = await build_metric("non_llm_context_recall").measure(
        case(contexts=["kitten"], reference_contexts=["sitting"]), None
    )
    jw = await build_metric("non_llm_context_recall", {"distance": "jaro_winkler"}).measure(
        case(contexts=["kitten"], reference_contexts=["sitting"]), None
    )
    assert lev.details["similarities"][0] == pytest.approx(
        Levenshtein.normalized_similarity("sitting", "kitten")
    )
    assert jw.details["similarities"][0] != lev.details["similarities"][0]


def test_unknown_distance_is_rejected() -> None:
    with pytest.raises(ValueError, match="distance"):
        build_metric("non_llm_context_recall", {"distance": "cosine"})


async def test_similarity_threshold_separate_from_pass_threshold() -> None:
    metric = build_metric("non_llm_context_recall", {"similarity_threshold": 0.2, "threshold": 0.9})
    result = await metric.measure(case(contexts=[PARIS], reference_contexts=[PARIS, EIFFEL]), None)
    assert result.score == 1.0  # 0.2258 > 0.2
    assert result.threshold == 0.9
    assert result.details["similarity_threshold"] == 0.2


async def test_threshold_option_is_the_similarity_cut_by_default() -> None:
    result = await build_metric("non_llm_context_recall", {"threshold": 0.2}).measure(
        case(contexts=[PARIS], reference_contexts=[PARIS, EIFFEL]), None
    )
    assert result.score == 1.0


@pytest.mark.parametrize("name", ["non_llm_context_recall", "non_llm_context_precision"])
async def test_empty_reference_is_skipped(name: str) -> None:
    result = await build_metric(name).measure(case(contexts=[PARIS], reference_contexts=[]), None)
    assert result.skipped
    assert result.score is None
    missing = await build_metric(name).measure(case(contexts=[PARIS]), None)
    assert missing.skipped


async def test_empty_retrieval() -> None:
    recall = await build_metric("non_llm_context_recall").measure(
        case(contexts=[], reference_contexts=[PARIS]), None
    )
    assert recall.score == 0.0
    precision = await build_metric("non_llm_context_precision").measure(
        case(contexts=[], reference_contexts=[PARIS]), None
    )
    assert precision.skipped


async def test_strict() -> None:
    result = await build_metric("non_llm_context_recall", {"strict": True}).measure(
        case(contexts=[PARIS], reference_contexts=[PARIS, EIFFEL]), None
    )
    assert result.score == 0.0
    assert result.passed is False
    assert result.details["unstrict_score"] == 0.5
