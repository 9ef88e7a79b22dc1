"""evaluate() and evaluate_file(): per-item results and per-metric summaries."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.cases import ContextItem, Conversation, Turn
from ragtrace_collector.judges.base import JudgeError, JudgeTask
from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.offline.runner import evaluate, evaluate_file
from tests.fakes.judge import ScriptedJudge, case, verdicts


async def test_summary_means_only_scored_results() -> None:
    answers = [verdicts("yes", "no"), verdicts(), JudgeError("timeout", "slow"),
               verdicts("yes")]  # fmt: skip
    judge = ScriptedJudge({"attribution": answers})
    cases = [case(expected_output=f"e{i}", contexts=["c"]) for i in range(4)]
    report = await evaluate(cases, ["contextual_recall"], judge, concurrency=1)
    s = report.summary["contextual_recall"]
    assert (s.count, s.scored, s.skipped, s.errors) == (4, 2, 1, 1)
    assert s.mean == pytest.approx(0.75)
    assert (s.passed, s.failed) == (2, 0)
    assert s.pass_rate == 1.0
    assert s.calls == 3  # the error's call had no cost attached; skipped one did
    assert report.error_count == 1
    assert [i.index for i in report.items] == [0, 1, 2, 3]


async def test_case_and_conversation_metrics_apply_to_their_items() -> None:
    conv = Conversation(
        turns=[Turn(role="user", content="Who designed the Eiffel Tower?"),
               Turn(role="assistant", content="Gustave Eiffel.",
                    retrieval_context=[ContextItem(content="Gustave Eiffel designed it.")])],
        expected_outcome="Gustave Eiffel designed the Eiffel Tower.",
    )  # fmt: skip
    items = [case(retrieved_ids=["a"], reference_ids=["a", "b"]), conv]
    report = await evaluate(items, ["id_context_recall", "turn_contextual_recall"], OfflineJudge())
    first, second = report.items
    assert [r.metric for r in first.results] == ["id_context_recall"]
    assert first.kind == "case"
    assert [r.metric for r in second.results] == ["turn_contextual_recall"]
    assert second.kind == "conversation"
    assert second.results[0].score == 1.0
    assert report.summary["id_context_recall"].mean == 0.5


async def test_items_run_concurrently_within_the_bound() -> None:
    in_flight = 0
    peak = 0
    release = asyncio.Event()

    class Gate(ScriptedJudge):
        async def ask(self, task: JudgeTask[Any]) -> Any:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            if peak >= 3:
                release.set()
            await release.wait()
            in_flight -= 1
            return await super().ask(task)

    judge = Gate({"attribution": lambda task: verdicts("yes")})
    cases = [case(expected_output=f"e{i}", contexts=["c"]) for i in range(10)]
    seen: list[int] = []
    report = await asyncio.wait_for(
        evaluate(cases, ["contextual_recall"], judge, concurrency=3,
                 on_item=lambda r: seen.append(r.index)),
        timeout=30,
    )  # fmt: skip
    assert peak == 3
    assert sorted(seen) == list(range(10))
    assert report.summary["contextual_recall"].mean == 1.0


def test_evaluate_file_sync_with_offline_judge(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    rows = [
        {"input": "Who designed the Eiffel Tower?",
         "expected_output": "Gustave Eiffel designed the Eiffel Tower.",
         "retrieval_context": ["The Eiffel Tower was designed by Gustave Eiffel."],
         "reference_context_ids": ["d1"], "retrieved_context_ids": ["d1"]},
        {"input": 42},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows))
    report = evaluate_file(path)  # default: the offline metrics that apply
    assert report.judge == "offline"
    assert "non_llm_context_recall" not in report.metrics  # no reference contexts
    assert "contextual_recall" in report.metrics
    assert report.summary["contextual_recall"].mean == 1.0
    assert report.summary["id_context_recall"].mean == 1.0
    assert [str(e) for e in report.row_errors] == [
        "line 2, field 'input': expected a string, got a number"
    ]
    assert report.items[0].line == 1
    assert report.summary["contextual_recall"].heuristic


async def test_evaluate_file_works_inside_a_running_loop(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps({"retrieved_context_ids": [1], "reference_context_ids": [1]}))
    report = evaluate_file(path, metrics="id_context_recall,id_context_precision")
    assert report.summary["id_context_precision"].mean == 1.0
