"""Average precision (METRICS.md table) and contextual_precision."""

from __future__ import annotations

import pytest

from ragtrace_collector.metrics import average_precision, build_metric
from tests.fakes.judge import ScriptedJudge, case, usefulness


@pytest.mark.parametrize(
    ("relevant", "ap"),
    [
        ([1, 0, 1], 0.8333),
        ([0, 1], 0.5),
        ([1, 0, 0, 1], 0.75),
        ([0, 1, 1], 0.58333),
        ([1, 0], 1.0),
        ([0, 0], 0.0),
        ([], 0.0),
    ],
)
def test_ap_table(relevant: list[int], ap: float) -> None:
    assert average_precision(relevant) == pytest.approx(ap, abs=1e-4)


def test_ap_has_no_epsilon() -> None:
    assert average_precision([1, 0]) == 1.0
    assert average_precision([1, 1, 1]) == 1.0


CASE = case(
    expected_output="Paris is the capital of France.",
    actual_output="It is Paris.",
    contexts=["n1", "n2", "n3"],
)


@pytest.mark.parametrize(
    ("words", "score"),
    [(["yes", "no", "yes"], 0.8333), (["no", "yes", "yes"], 0.58333), (["no", "no", "no"], 0.0)],
)
async def test_contextual_precision_is_ap(words: list[str], score: float) -> None:
    judge = ScriptedJudge({"usefulness": [usefulness(*words)]})
    result = await build_metric("contextual_precision").measure(CASE, judge)
    assert result.score == pytest.approx(score, abs=1e-4)
    assert result.details["reference"] == "expected_output"
    assert len(judge.calls) == 1
    (task,) = judge.calls
    assert task.reference == "Paris is the capital of France."
    assert task.input == "What is the capital of France?"
    assert task.contexts == ("n1", "n2", "n3")


async def test_unclear_verdict_keeps_its_rank_as_not_useful() -> None:
    judge = ScriptedJudge({"usefulness": [usefulness("maybe", "Yes.", "no")]})
    result = await build_metric("contextual_precision").measure(CASE, judge)
    assert result.score == 0.5
    assert result.details["unclear_nodes"] == [1]


async def test_verdicts_are_put_in_rank_order_by_node_number() -> None:
    answer = {
        "verdicts": [
            {"node": 3, "verdict": "yes"},
            {"node": 1, "verdict": "yes"},
            {"node": 2, "verdict": "no"},
        ]
    }
    judge = ScriptedJudge({"usefulness": [answer]})
    result = await build_metric("contextual_precision").measure(CASE, judge)
    assert result.details["relevant"] == [1, 0, 1]


@pytest.mark.parametrize(
    ("option", "expected_output", "used", "reference"),
    [
        ("expected_output", "Paris is the capital of France.", "expected_output", "Paris is"),
        ("actual_output", "Paris is the capital of France.", "actual_output", "It is Paris."),
        ("auto", "Paris is the capital of France.", "expected_output", "Paris is"),
        ("auto", None, "actual_output", "It is Paris."),
    ],
)
async def test_reference_option(
    option: str, expected_output: str | None, used: str, reference: str
) -> None:
    judge = ScriptedJudge({"usefulness": [usefulness("yes", "no")]})
    c = case(expected_output=expected_output, actual_output="It is Paris.", contexts=["a", "b"])
    result = await build_metric("contextual_precision", {"reference": option}).measure(c, judge)
    assert result.details["reference"] == used
    assert judge.calls[0].reference.startswith(reference)


async def test_reference_missing_is_skipped() -> None:
    judge = ScriptedJudge({})
    c = case(expected_output=None, actual_output="It is Paris.", contexts=["a"])
    result = await build_metric("contextual_precision").measure(c, judge)
    assert result.skipped
    assert "expected_output" in result.reason
    c = case(expected_output="x", actual_output=None, contexts=["a"])
    result = await build_metric("contextual_precision", {"reference": "actual_output"}).measure(
        c, judge
    )
    assert result.skipped
    assert judge.calls == []


async def test_wrong_verdict_count_is_an_error() -> None:
    judge = ScriptedJudge({"usefulness": [usefulness("yes", "no")]})
    result = await build_metric("contextual_precision").measure(CASE, judge)
    assert result.error is not None
    assert result.error.startswith("invalid_response:")
    assert "3" in result.error


async def test_empty_retrieval_is_skipped() -> None:
    judge = ScriptedJudge({})
    c = case(expected_output="Paris.", contexts=[])
    result = await build_metric("contextual_precision").measure(c, judge)
    assert result.skipped
