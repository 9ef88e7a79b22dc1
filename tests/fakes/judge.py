"""A scripted judge and case builders for the metric and offline-evaluation tests.

:class:`ScriptedJudge` is a real :class:`~ragtrace_collector.judges.base.Judge`
whose answers are scripted per task: raw JSON text or dicts (validated through the
task's response model exactly like a model's answer would be, so the parsing rules
are exercised), callables computing the answer from the task, or a
:class:`JudgeError` to raise.  It records every task it was asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.judges.base import JudgeAnswer, JudgeError, JudgeTask
from ragtrace_collector.results import Cost

Script = list[Any] | Callable[[JudgeTask[Any]], Any]


class ScriptedJudge:
    def __init__(
        self,
        answers: Mapping[str, Script] | None = None,
        *,
        model: str = "scripted/model",
        heuristic: bool = False,
        cost: Cost | None = None,
    ) -> None:
        self._answers = dict(answers or {})
        self._model = model
        self._heuristic = heuristic
        self.cost = (
            cost
            if cost is not None
            else Cost(calls=1, prompt_tokens=100, completion_tokens=20, usd=0.001)
        )
        self.calls: list[JudgeTask[Any]] = []

    @property
    def model(self) -> str:
        return self._model

    @property
    def heuristic(self) -> bool:
        return self._heuristic

    def asked(self, task_name: str) -> list[JudgeTask[Any]]:
        return [t for t in self.calls if t.task_name == task_name]

    async def ask(self, task: JudgeTask[Any]) -> JudgeAnswer[Any]:
        self.calls.append(task)
        script = self._answers.get(task.task_name)
        if script is None:
            raise AssertionError(f"unexpected judge task {task.task_name}")
        if callable(script):
            raw = script(task)
        else:
            if not script:
                raise AssertionError(f"no scripted answer left for {task.task_name}")
            raw = script.pop(0)
        if isinstance(raw, JudgeError):
            raise raw
        try:
            if isinstance(raw, str):
                value = task.response_model.model_validate_json(raw)
            else:
                value = task.response_model.model_validate(raw)
        except ValidationError as exc:
            raise JudgeError(
                "invalid_response", f"answer does not match the schema: {exc}", cost=self.cost
            ) from None
        problem = task.check(value)
        if problem is not None:
            raise JudgeError("invalid_response", problem, cost=self.cost)
        return JudgeAnswer(value=value, cost=self.cost)


def verdicts(*words: str) -> dict[str, Any]:
    """An attribution answer with these verdict words."""
    return {
        "verdicts": [{"statement": f"s{i}", "verdict": w} for i, w in enumerate(words)],
        "reason": "scripted",
    }


def usefulness(*words: str) -> dict[str, Any]:
    return {
        "verdicts": [{"node": i + 1, "verdict": w} for i, w in enumerate(words)],
        "reason": "scripted",
    }


def case(
    *,
    input: str | None = "What is the capital of France?",
    actual_output: str | None = None,
    expected_output: str | None = None,
    contexts: list[str] | None = None,
    reference_contexts: list[str] | None = None,
    retrieved_ids: list[Any] | None = None,
    reference_ids: list[Any] | None = None,
) -> RAGCase:
    return RAGCase(
        input=input,
        actual_output=actual_output,
        expected_output=expected_output,
        retrieval_context=None if contexts is None else [ContextItem(content=c) for c in contexts],
        reference_contexts=reference_contexts,
        retrieved_context_ids=retrieved_ids,
        reference_context_ids=reference_ids,
    )


__all__ = ["ScriptedJudge", "case", "usefulness", "verdicts"]
