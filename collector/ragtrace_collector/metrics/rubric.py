"""``context_precision_rubric`` / ``context_recall_rubric``: Opik-style single-score
judges (one call, a 0.0-1.0 rubric with few-shot examples, answer ``{score, reason}``).

Parsing is strict and lives in the response model (``RubricResponse``): a score
outside [0, 1], a missing key or unparseable JSON is a judge error, never a silent
0.5; a numeric string such as ``"0.6"`` is accepted.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Literal

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.judges.base import RubricRequest
from ragtrace_collector.metrics.base import MetricBase, Outcome, Run, blank, no_input

__all__ = ["ContextPrecisionRubric", "ContextRecallRubric"]


class _Rubric(MetricBase):
    rubric: ClassVar[Literal["precision", "recall"]]

    def missing_inputs(self, case: RAGCase) -> str | None:
        missing = no_input(case)
        if missing is not None:
            return missing
        if case.retrieval_context is None:
            return "no retrieval_context captured"
        return self._missing_reference(case)

    @abc.abstractmethod
    def _missing_reference(self, case: RAGCase) -> str | None:
        """Why the case lacks the reference this rubric needs, or None."""

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        assert case.input is not None
        contexts = tuple(case.context_texts())
        if not contexts and self.rubric == "recall":
            return Outcome(0.0, "nothing was retrieved")
        response = await run.ask(
            RubricRequest(
                kind=self.rubric,
                input=case.input,
                contexts=contexts,
                expected_output=case.expected_output,
                actual_output=case.actual_output,
                prompt_template=self.options.prompt_template,
            )
        )
        reason = response.reason.strip() or f"rubric {self.rubric} score"
        return Outcome(response.score, reason, {"rubric": self.rubric})


class ContextPrecisionRubric(_Rubric):
    """How much of the retrieved context is relevant and useful for the answer."""

    name = "context_precision_rubric"
    rubric = "precision"

    def _missing_reference(self, case: RAGCase) -> str | None:
        if blank(case.expected_output) and blank(case.actual_output):
            return "neither expected_output nor actual_output"
        if not case.retrieval_context:
            return "nothing was retrieved: no precision to judge"
        return None


class ContextRecallRubric(_Rubric):
    """How much of the expected answer the retrieved context covers."""

    name = "context_recall_rubric"
    rubric = "recall"

    def _missing_reference(self, case: RAGCase) -> str | None:
        if blank(case.expected_output):
            return "no expected_output to recall"
        return None
