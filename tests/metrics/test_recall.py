"""contextual_recall: the verdict table of METRICS.md, strict mode, skips, errors."""

from __future__ import annotations

import pytest

from ragtrace_collector.judges.base import JudgeError
from ragtrace_collector.metrics import build_metric, normalise_verdict
from ragtrace_collector.results import Cost
from tests.fakes.judge import ScriptedJudge, case, verdicts

CASE = case(expected_output="Paris is the capital. It is in France.", contexts=["Paris ..."])


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["yes", "yes", "no", "no"], 0.5),
        (["yes", "yes", "yes"], 1.0),
        (["yes", "maybe", "no"], 0.5),
        # normalisation: lower-case, first word, punctuation dropped
        (["Yes.", "NO", "yes, node 1", "No - not there"], 0.5),
        (["Yes", "unsure", "idk"], 1.0),
        # the leading [a-z]+ run, as DeepEval reads it: "yes2" is yes ...
        (["yes2", "no"], 0.5),
        # ... and a verdict that does not start with a letter is dropped
        ([".no", "**yes**", "yes", " no!", "- no"], 0.5),
    ],
)
async def test_verdict_table(words: list[str], expected: float) -> None:
    judge = ScriptedJudge({"attribution": [verdicts(*words)]})
    result = await build_metric("contextual_recall").measure(CASE, judge)
    assert result.score == pytest.approx(expected, abs=1e-12)
    assert result.passed is (expected >= 0.5)
    assert not result.skipped
    assert result.error is None
    assert len(judge.calls) == 1  # one call, reason included


@pytest.mark.parametrize(
    ("raw", "word"),
    [
        (" Yes.", "yes"),
        ("yes2", "yes"),
        ("NO - not there", "no"),
        ("idk", "idk"),
        (".no", ""),
        ("**yes**", ""),
        ("2yes", ""),
        ("", ""),
        ("   ", ""),
    ],
)
def test_verdict_word_rule(raw: str, word: str) -> None:
    assert normalise_verdict(raw) == word


async def test_dropped_verdicts_are_reported() -> None:
    judge = ScriptedJudge({"attribution": [verdicts("yes", "maybe", "no")]})
    result = await build_metric("contextual_recall").measure(CASE, judge)
    assert result.details["dropped_verdicts"] == 1
    assert result.details["statements"] == 2
    assert [v["verdict"] for v in result.details["verdicts"]] == ["yes", "maybe", "no"]


async def test_no_verdicts_is_skipped() -> None:
    judge = ScriptedJudge({"attribution": [verdicts()]})
    result = await build_metric("contextual_recall").measure(CASE, judge)
    assert result.score is None
    assert result.skipped
    assert result.passed is None
    assert result.outcome == "skipped"
    assert "no statements" in result.reason
    assert result.cost.calls == 1


async def test_only_unusable_verdicts_is_skipped() -> None:
    judge = ScriptedJudge({"attribution": [verdicts("maybe", "unclear")]})
    result = await build_metric("contextual_recall").measure(CASE, judge)
    assert result.skipped
    assert result.score is None


async def test_strict_mode() -> None:
    judge = ScriptedJudge({"attribution": [verdicts("yes", "yes", "no", "no")]})
    result = await build_metric("contextual_recall", {"strict": True}).measure(CASE, judge)
    assert result.score == 0.0
    assert result.threshold == 1.0
    assert result.strict is True
    assert result.passed is False
    assert result.details["unstrict_score"] == 0.5

    judge = ScriptedJudge({"attribution": [verdicts("yes", "yes", "yes")]})
    result = await build_metric("contextual_recall", {"strict": True}).measure(CASE, judge)
    assert result.score == 1.0
    assert result.passed is True


async def test_threshold_decides_passed() -> None:
    judge = ScriptedJudge({"attribution": [verdicts("yes", "no", "no")]})
    result = await build_metric("contextual_recall", {"threshold": 0.3}).measure(CASE, judge)
    assert result.score == pytest.approx(1 / 3)
    assert result.passed is True
    assert result.threshold == 0.3


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"expected_output": None, "contexts": ["x"]}, "expected_output"),
        ({"expected_output": "   ", "contexts": ["x"]}, "expected_output"),
        ({"expected_output": "Paris.", "contexts": None}, "retrieval_context"),
    ],
)
async def test_missing_inputs_are_skipped_without_a_call(kwargs: dict, reason: str) -> None:
    judge = ScriptedJudge({})
    result = await build_metric("contextual_recall").measure(case(**kwargs), judge)
    assert result.skipped
    assert reason in result.reason
    assert judge.calls == []


async def test_empty_retrieval_is_a_real_zero_without_a_call() -> None:
    judge = ScriptedJudge({})
    result = await build_metric("contextual_recall").measure(
        case(expected_output="Paris is the capital.", contexts=[]), judge
    )
    assert result.score == 0.0
    assert result.passed is False
    assert judge.calls == []


async def test_judge_error_is_an_error_result_with_cost() -> None:
    spent = Cost(calls=2, prompt_tokens=300, completion_tokens=10, usd=0.002)
    judge = ScriptedJudge(
        {"attribution": [JudgeError("timeout", "judge did not answer in 5s", cost=spent)]}
    )
    result = await build_metric("contextual_recall").measure(CASE, judge)
    assert result.score is None
    assert result.passed is None
    assert result.error == "timeout: judge did not answer in 5s"
    assert result.outcome == "error"
    assert result.cost == spent
    assert result.judge == "scripted/model"


async def test_invalid_answer_is_an_error_not_a_guess() -> None:
    judge = ScriptedJudge({"attribution": ['{"verdicts": "yes"}']})
    result = await build_metric("contextual_recall").measure(CASE, judge)
    assert result.error is not None
    assert result.error.startswith("invalid_response:")
    assert result.score is None


async def test_no_judge_is_a_config_error() -> None:
    result = await build_metric("contextual_recall").measure(CASE, None)
    assert result.error is not None
    assert result.error.startswith("config:")


async def test_prompt_template_and_inputs_reach_the_task() -> None:
    judge = ScriptedJudge({"attribution": [verdicts("yes")]})
    metric = build_metric("contextual_recall", {"prompt_template": "Custom {reference}"})
    case_ = case(expected_output="Paris is the capital.", contexts=["a", "b"])
    result = await metric.measure(case_, judge)
    (task,) = judge.calls
    assert task.prompt_template == "Custom {reference}"
    assert task.reference == "Paris is the capital."
    assert task.contexts == ("a", "b")
    assert result.cost == judge.cost
    assert result.judge == "scripted/model"
    assert result.heuristic is False
    assert "scripted" in result.reason


async def test_heuristic_judge_labels_the_reason() -> None:
    judge = ScriptedJudge({"attribution": [verdicts("yes")]}, heuristic=True)
    result = await build_metric("contextual_recall").measure(CASE, judge)
    assert result.heuristic is True
    assert result.reason.startswith("[heuristic] ")
