"""contextual_relevancy, the rubric metrics (parsing rules) and the generation metrics."""

from __future__ import annotations

from typing import Any

import pytest

from ragtrace_collector.metrics import build_metric
from tests.fakes.judge import ScriptedJudge, case


def _relevance(*nodes: list[str]) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "node": i + 1,
                "statements": [{"statement": f"s{j}", "verdict": w} for j, w in enumerate(words)],
            }
            for i, words in enumerate(nodes)
        ],
        "reason": "scripted",
    }


# ------------------------------------------------------------- relevancy
async def test_contextual_relevancy_counts_statements_over_all_nodes() -> None:
    judge = ScriptedJudge({"relevance": [_relevance(["yes", "no"], ["yes", "yes", "no", "idk"])]})
    c = case(contexts=["n1", "n2"])
    result = await build_metric("contextual_relevancy").measure(c, judge)
    assert result.score == pytest.approx(3 / 5)
    assert result.details["dropped_verdicts"] == 1
    assert result.details["nodes"][0]["irrelevant_statements"] == ["s1"]
    assert len(judge.calls) == 1


async def test_contextual_relevancy_without_statements_is_skipped() -> None:
    judge = ScriptedJudge({"relevance": [_relevance([], [])]})
    result = await build_metric("contextual_relevancy").measure(case(contexts=["a", "b"]), judge)
    assert result.skipped


async def test_contextual_relevancy_needs_one_entry_per_node() -> None:
    judge = ScriptedJudge({"relevance": [_relevance(["yes"])]})
    result = await build_metric("contextual_relevancy").measure(case(contexts=["a", "b"]), judge)
    assert result.error is not None
    assert result.error.startswith("invalid_response")


async def test_contextual_relevancy_needs_input() -> None:
    result = await build_metric("contextual_relevancy").measure(
        case(input=None, contexts=["a"]), ScriptedJudge({})
    )
    assert result.skipped


# ---------------------------------------------------------------- rubric
RUBRIC_CASE = case(expected_output="Paris.", actual_output="Paris.", contexts=["Paris is..."])


@pytest.mark.parametrize("name", ["context_precision_rubric", "context_recall_rubric"])
@pytest.mark.parametrize(
    ("raw", "score"),
    [
        ('{"score": 0.6, "reason": "mostly"}', 0.6),
        ('{"score": "0.6", "reason": "string accepted"}', 0.6),
        ({"score": 1, "reason": "int"}, 1.0),
        ({"score": 0.0, "reason": "bounds are inclusive"}, 0.0),
    ],
)
async def test_rubric_parsing_accepts(name: str, raw: Any, score: float) -> None:
    judge = ScriptedJudge({"rubric": [raw]})
    result = await build_metric(name).measure(RUBRIC_CASE, judge)
    assert result.score == pytest.approx(score)
    assert result.error is None
    (task,) = judge.calls
    assert task.kind == ("precision" if "precision" in name else "recall")
    assert task.expected_output == "Paris."


@pytest.mark.parametrize("name", ["context_precision_rubric", "context_recall_rubric"])
@pytest.mark.parametrize(
    "raw",
    [
        '{"score": 1.2, "reason": "too high"}',
        '{"score": -0.1, "reason": "negative"}',
        '{"reason": "no score"}',
        '{"score": 0.5}',
        "not json at all",
        '{"score": "high", "reason": "words"}',
        '{"score": true, "reason": "bool"}',
    ],
)
async def test_rubric_parsing_errors_never_guess(name: str, raw: str) -> None:
    judge = ScriptedJudge({"rubric": [raw]})
    result = await build_metric(name).measure(RUBRIC_CASE, judge)
    assert result.score is None
    assert result.error is not None
    assert result.error.startswith("invalid_response")
    assert result.outcome == "error"


async def test_recall_rubric_needs_expected_output() -> None:
    c = case(expected_output=None, actual_output="Paris.", contexts=["x"])
    assert (await build_metric("context_recall_rubric").measure(c, ScriptedJudge({}))).skipped
    judge = ScriptedJudge({"rubric": [{"score": 0.4, "reason": "r"}]})
    result = await build_metric("context_precision_rubric").measure(c, judge)
    assert result.score == 0.4


# ------------------------------------------------------------ generation
async def test_faithfulness_counts_not_contradicted_claims() -> None:
    answer = {
        "claims": [
            {"claim": "a", "verdict": "yes"},
            {"claim": "b", "verdict": "idk"},
            {"claim": "c", "verdict": "no"},
            {"claim": "d", "verdict": "perhaps"},
        ]
    }
    judge = ScriptedJudge({"faithfulness": [answer]})
    c = case(actual_output="a. b. c. d.", contexts=["ctx"])
    result = await build_metric("faithfulness").measure(c, judge)
    assert result.score == pytest.approx(2 / 3)
    assert result.details["contradicted"] == 1


async def test_faithfulness_without_claims_is_skipped() -> None:
    judge = ScriptedJudge({"faithfulness": [{"claims": []}]})
    result = await build_metric("faithfulness").measure(
        case(actual_output="ok", contexts=["c"]), judge
    )
    assert result.skipped


async def test_answer_relevancy() -> None:
    answer = {
        "statements": [
            {"statement": "a", "verdict": "yes"},
            {"statement": "b", "verdict": "no"},
            {"statement": "c", "verdict": "no"},
            {"statement": "d", "verdict": "idk"},
        ]
    }
    judge = ScriptedJudge({"answer_relevance": [answer]})
    result = await build_metric("answer_relevancy").measure(case(actual_output="x"), judge)
    assert result.score == 0.5
    assert (await build_metric("answer_relevancy").measure(case(), judge)).skipped
