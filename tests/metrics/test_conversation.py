"""Conversation units, windows, the worked example of METRICS.md, and the online form."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragtrace_collector.cases import ContextItem, Conversation, Turn
from ragtrace_collector.judges.base import JudgeError, JudgeTask, UsefulnessRequest
from ragtrace_collector.metrics import (
    NOTHING_RETRIEVED_YET,
    ConversationMetric,
    build_metric,
    conversation_windows,
    split_units,
    unit_index_of_turn,
)
from tests.fakes.judge import ScriptedJudge


def U(text: str) -> Turn:
    return Turn(role="user", content=text)


def A(text: str, *nodes: str) -> Turn:
    ctx = [ContextItem(content=n) for n in nodes] if nodes else None
    return Turn(role="assistant", content=text, retrieval_context=ctx)


def roles(units: list[list[Turn]]) -> list[str]:
    return ["".join(t.role[0].upper() for t in u) for u in units]


# ----------------------------------------------------------------- units
@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        ([U("1"), A("1"), U("2"), A("2")], ["UA", "UA"]),
        ([U("1"), A("1"), U("2")], ["UA"]),  # trailing unanswered user dropped
        ([U("1"), U("1b"), A("1"), A("1b"), U("2"), A("2")], ["UUAA", "UA"]),
        ([A("greeting"), U("1"), A("1"), U("2"), A("2")], ["AUA", "UA"]),
        ([A("greeting")], []),  # no user turn
        ([U("1")], []),  # one turn
        ([U("1"), A("1"), A("1b")], ["UAA"]),
        ([], []),
    ],
)
def test_units(turns: list[Turn], expected: list[str]) -> None:
    assert roles(split_units(turns)) == expected


def test_unit_index_of_turn() -> None:
    turns = [U("1"), A("1"), U("2"), A("2"), U("3")]
    assert [unit_index_of_turn(turns, i) for i in range(5)] == [0, 0, 1, 1, None]


def test_windows_flatten_user_text_and_assistant_contexts() -> None:
    turns = [U("q1"), A("a1", "n1", "n2"), U("q2"), A("a2"), U("q3"), A("a3", "n3")]
    windows = conversation_windows(turns, 2)
    assert [(w.first_unit, w.unit_index) for w in windows] == [(0, 0), (0, 1), (1, 2)]
    assert windows[0].contexts == ("n1", "n2")
    assert windows[1].user_text == "q1\nq2"
    assert windows[1].contexts == ("n1", "n2")
    assert windows[2].user_text == "q2\nq3"
    assert windows[2].contexts == ("n3",)
    assert all("a1" not in w.user_text for w in windows)  # assistant content unused


# ---------------------------------------------------------- worked example
RELEVANT = {"n1": "yes", "n2": "no", "n3": "no", "n4": "yes"}


def node_verdicts(task: JudgeTask[Any]) -> dict[str, Any]:
    assert isinstance(task, UsefulnessRequest)
    return {
        "verdicts": [{"node": i + 1, "verdict": RELEVANT[c]} for i, c in enumerate(task.contexts)],
        "reason": "scripted",
    }


EXAMPLE = Conversation(
    turns=[
        U("U1"),
        A("A1", "n1", "n2"),
        U("U2"),
        A("A2"),
        U("U3"),
        A("A3", "n3", "n4"),
        U("U4 unanswered"),
    ],
    expected_outcome="The user learns the answer.",
)


@pytest.mark.parametrize(
    ("window_size", "windows", "score"),
    [(10, [1.0, 1.0, 0.75], 0.91667), (1, [1.0, 1.0, 0.5], 0.83333)],
)
async def test_worked_example(window_size: int, windows: list[float], score: float) -> None:
    judge = ScriptedJudge({"usefulness": node_verdicts})
    metric = build_metric("turn_contextual_precision", {"window_size": window_size})
    assert isinstance(metric, ConversationMetric)
    result = await metric.measure_conversation(EXAMPLE, judge)
    assert result.score == pytest.approx(score, abs=1e-5)
    assert result.details["window_scores"] == pytest.approx(windows)
    # The window without retrieval context costs no judge call.
    assert len(judge.calls) == (2 if window_size == 1 else 3)
    assert result.cost.calls == len(judge.calls)


@pytest.mark.parametrize("window_size", [1, 2, 10])
async def test_online_windows_average_to_the_offline_score(window_size: int) -> None:
    judge = ScriptedJudge({"usefulness": node_verdicts})
    metric = build_metric("turn_contextual_precision", {"window_size": window_size})
    assert isinstance(metric, ConversationMetric)
    offline = await metric.measure_conversation(EXAMPLE, judge)

    online_scores: list[float | None] = []
    turns = EXAMPLE.turns
    for k in range(len(turns)):
        so_far = Conversation(turns=turns[: k + 1], expected_outcome=EXAMPLE.expected_outcome)
        unit = unit_index_of_turn(so_far.turns, k)
        if unit is None or turns[k].role != "assistant":
            continue  # the collector scores when a turn (user + answer) completes
        window = await metric.measure_window(so_far, -1, judge)
        assert window.details["unit_index"] == unit
        online_scores.append(window.details["window_score"])
        running = metric.conversation_result(online_scores)
        assert running.score is not None
    assert running.score == pytest.approx(offline.score, abs=1e-12)


async def test_measure_window_by_index_and_out_of_range() -> None:
    judge = ScriptedJudge({"usefulness": node_verdicts})
    metric = build_metric("turn_contextual_precision", {"window_size": 1})
    assert isinstance(metric, ConversationMetric)
    last = await metric.measure_window(EXAMPLE, 2, judge)
    assert last.score == 0.5
    assert last.details["window"] == [2, 2]
    no_ctx = await metric.measure_window(EXAMPLE, 1, judge)
    assert no_ctx.score == 1.0
    assert len(judge.calls) == 1
    missing = await metric.measure_window(EXAMPLE, 3, judge)
    assert missing.skipped
    assert "unit 3" in missing.reason


async def test_no_windows_and_missing_outcome_are_skipped() -> None:
    metric = build_metric("turn_contextual_precision")
    assert isinstance(metric, ConversationMetric)
    empty = Conversation(turns=[U("hello?")], expected_outcome="x")
    result = await metric.measure_conversation(empty, ScriptedJudge({}))
    assert result.skipped
    assert result.score is None
    assert "no complete units" in result.reason
    assert metric.conversation_result([]).skipped
    skipped = await metric.measure_conversation(
        Conversation(turns=EXAMPLE.turns), ScriptedJudge({})
    )
    assert skipped.skipped
    assert "expected_outcome" in skipped.reason


async def test_turn_metric_on_a_single_case_is_skipped() -> None:
    from tests.fakes.judge import case

    result = await build_metric("turn_contextual_recall").measure(case(), ScriptedJudge({}))
    assert result.skipped


async def test_turn_recall_and_relevancy() -> None:
    conv = Conversation(
        turns=[U("q1"), A("a1", "n1"), U("q2"), A("a2", "n2")], expected_outcome="o1. o2."
    )

    def attribution(task: JudgeTask[Any]) -> dict[str, Any]:
        yes = "n2" in task.contexts  # type: ignore[attr-defined]
        return {
            "verdicts": [
                {"statement": "o1", "verdict": "yes"},
                {"statement": "o2", "verdict": "yes" if yes else "no"},
            ]
        }

    recall = build_metric("turn_contextual_recall")
    assert isinstance(recall, ConversationMetric)
    r = await recall.measure_conversation(conv, ScriptedJudge({"attribution": attribution}))
    assert r.details["window_scores"] == [0.5, 1.0]
    assert r.score == 0.75

    def relevance(task: JudgeTask[Any]) -> dict[str, Any]:
        contexts = task.contexts  # type: ignore[attr-defined]
        return {
            "nodes": [
                {
                    "node": i + 1,
                    "statements": [{"statement": "s", "verdict": "yes" if c == "n1" else "no"}],
                }
                for i, c in enumerate(contexts)
            ]
        }

    relevancy = build_metric("turn_contextual_relevancy", {"window_size": 1})
    assert isinstance(relevancy, ConversationMetric)
    judge = ScriptedJudge({"relevance": relevance})
    r = await relevancy.measure_conversation(Conversation(turns=conv.turns), judge)
    assert r.details["window_scores"] == [1.0, 0.0]
    assert r.score == 0.5
    assert judge.calls[1].input == "q2"  # type: ignore[attr-defined]


async def test_a_failing_window_errors_the_conversation_and_keeps_cost() -> None:
    calls = {"n": 0}

    def flaky(task: JudgeTask[Any]) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            return JudgeError("api_error", "500 from provider")
        return node_verdicts(task)

    metric = build_metric("turn_contextual_precision")
    assert isinstance(metric, ConversationMetric)
    result = await metric.measure_conversation(EXAMPLE, ScriptedJudge({"usefulness": flaky}))
    assert result.error == "api_error: 500 from provider"
    assert result.score is None
    assert result.cost.calls == 2  # the successful call's cost is kept


async def test_strict_applies_to_the_conversation_mean() -> None:
    judge = ScriptedJudge({"usefulness": node_verdicts})
    metric = build_metric("turn_contextual_precision", {"strict": True})
    assert isinstance(metric, ConversationMetric)
    result = await metric.measure_conversation(EXAMPLE, judge)
    assert result.score == 0.0
    assert result.details["unstrict_score"] == pytest.approx(0.91667, abs=1e-5)


# --------------------------------------------- property: online == offline
_turn = st.one_of(
    st.builds(lambda: U("q")),
    st.builds(
        lambda nodes: A("a", *nodes),
        st.lists(st.sampled_from(["n1", "n2", "n3", "n4"]), max_size=3),
    ),
)


@settings(max_examples=60, deadline=None)
@given(turns=st.lists(_turn, max_size=12), window_size=st.integers(1, 4))
def test_property_online_equals_offline(turns: list[Turn], window_size: int) -> None:
    import asyncio

    conv = Conversation(turns=turns, expected_outcome="outcome")
    metric = build_metric("turn_contextual_precision", {"window_size": window_size})
    assert isinstance(metric, ConversationMetric)

    async def run() -> tuple[float | None, float | None]:
        judge = ScriptedJudge({"usefulness": node_verdicts})
        offline = await metric.measure_conversation(conv, judge)
        scores: list[float | None] = []
        skipped: list[bool] = []
        n_units = len(split_units(turns))
        # Each unit completes at its last turn; score it with the turns up to there.
        from ragtrace_collector.metrics import split_unit_ranges

        for u, r in enumerate(split_unit_ranges(turns)):
            so_far = Conversation(turns=turns[: r.stop], expected_outcome="outcome")
            w = await metric.measure_window(so_far, u, judge)
            scores.append(w.details["window_score"])
            skipped.append(w.skipped)
        assert len(scores) == n_units
        if offline.skipped:  # no units, or nothing retrieved: every online window skipped
            assert all(skipped)
            return None, None
        return offline.score, metric.conversation_result(scores).score

    offline, online = asyncio.run(run())
    assert offline == pytest.approx(online, abs=1e-12)


@pytest.mark.parametrize(
    "name", ["turn_contextual_precision", "turn_contextual_recall", "turn_contextual_relevancy"]
)
async def test_a_conversation_without_retrieval_is_skipped(name: str) -> None:
    # Every Ragas multi-turn sample looks like this: no window has any context.
    conv = Conversation(
        turns=[U("q1"), A("a1"), U("q2"), A("a2"), U("q3"), A("a3")], expected_outcome="o."
    )
    metric = build_metric(name, {"window_size": 1})
    assert isinstance(metric, ConversationMetric)
    judge = ScriptedJudge({})
    result = await metric.measure_conversation(conv, judge)
    assert result.skipped
    assert result.score is None
    assert result.passed is None
    assert "no retrieval context" in result.reason
    assert judge.calls == []
    # Online, turn by turn: every window is skipped and flagged for the evaluator.
    for unit in range(3):
        window = await metric.measure_window(conv, unit, judge)
        assert window.skipped
        assert window.details[NOTHING_RETRIEVED_YET] is True


async def test_contextless_window_still_scores_one_when_others_retrieved() -> None:
    conv = Conversation(turns=[U("q1"), A("a1", "n1"), U("q2"), A("a2")], expected_outcome="o.")
    metric = build_metric("turn_contextual_recall", {"window_size": 1})
    assert isinstance(metric, ConversationMetric)
    judge = ScriptedJudge({"attribution": [{"verdicts": [{"statement": "o", "verdict": "no"}]}]})
    result = await metric.measure_conversation(conv, judge)
    assert result.details["window_scores"] == [0.0, 1.0]
    assert result.score == 0.5
    online = await metric.measure_window(conv, 1, judge)
    assert online.score == 1.0
