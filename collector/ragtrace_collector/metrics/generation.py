"""Generation metrics (beyond the retrieval seeds): ``faithfulness`` and
``answer_relevancy`` (one judge call each).

* faithfulness: the share of the output's claims *not contradicted* by the context.
  Verdicts: yes (supported) and idk (neither) count as not contradicted, no counts
  as contradicted; other words are dropped.  No claims -> skipped.
* answer_relevancy: the share of the output's statements relevant to the input.
  yes counts as relevant, no as not; idk (an ambiguous but admissible statement)
  counts as relevant, as in DeepEval; other words are dropped.  No statements ->
  skipped.
"""

from __future__ import annotations

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.judges.base import AnswerRelevanceRequest, FaithfulnessRequest
from ragtrace_collector.metrics.base import (
    MetricBase,
    Outcome,
    Run,
    no_input,
    no_output,
    normalise_verdict,
    plural,
    share_outcome,
)

__all__ = ["AnswerRelevancy", "Faithfulness"]


def _tally(words: list[str]) -> tuple[int, int, int]:
    """(counted as good, counted as bad, dropped) for yes/idk vs no."""
    good = sum(1 for w in words if w in ("yes", "idk"))
    bad = words.count("no")
    return good, bad, len(words) - good - bad


class Faithfulness(MetricBase):
    name = "faithfulness"

    def missing_inputs(self, case: RAGCase) -> str | None:
        missing = no_output(case)
        if missing is not None:
            return missing
        if case.retrieval_context is None:
            return "no retrieval_context captured"
        if not case.retrieval_context:
            return "nothing was retrieved: no context to check the claims against"
        return None

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        assert case.actual_output is not None
        response = await run.ask(
            FaithfulnessRequest(
                output=case.actual_output,
                contexts=tuple(case.context_texts()),
                prompt_template=self.options.prompt_template,
            )
        )
        words = [normalise_verdict(c.verdict) for c in response.claims]
        good, bad, dropped = _tally(words)
        details = {
            "claims": [
                {"claim": c.claim, "verdict": w}
                for c, w in zip(response.claims, words, strict=True)
            ],
            "contradicted": bad,
        }
        return share_outcome(
            good,
            good + bad,
            details=details,
            dropped=dropped,
            skip_reason="the output yielded no claims to check",
            reason=f"{bad} of {plural(good + bad, 'claim')} contradicted by the retrieval context",
            judge_reason=response.reason,
        )


class AnswerRelevancy(MetricBase):
    name = "answer_relevancy"

    def missing_inputs(self, case: RAGCase) -> str | None:
        return no_input(case) or no_output(case)

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        assert case.input is not None
        assert case.actual_output is not None
        response = await run.ask(
            AnswerRelevanceRequest(
                input=case.input,
                output=case.actual_output,
                prompt_template=self.options.prompt_template,
            )
        )
        words = [normalise_verdict(s.verdict) for s in response.statements]
        good, bad, dropped = _tally(words)
        details = {
            "statements": [
                {"statement": s.statement, "verdict": w}
                for s, w in zip(response.statements, words, strict=True)
            ],
            "irrelevant": bad,
        }
        return share_outcome(
            good,
            good + bad,
            details=details,
            dropped=dropped,
            skip_reason="the output yielded no statements to judge",
            reason=(
                f"{good} of {plural(good + bad, 'statement')} of the output relevant to the input"
            ),
            judge_reason=response.reason,
        )
