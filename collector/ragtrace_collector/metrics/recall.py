"""``contextual_recall``: the share of the reference's statements that can be
attributed to the retrieval context (one judge call).

Same quantity as DeepEval ``ContextualRecallMetric`` and Ragas ``LLMContextRecall``.
"""

from __future__ import annotations

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.judges.base import AttributionRequest, AttributionResponse
from ragtrace_collector.metrics.base import (
    MetricBase,
    Outcome,
    Run,
    blank,
    normalise_verdict,
    plural,
    share_outcome,
)

__all__ = ["ContextualRecall", "attribution_outcome"]


def attribution_outcome(response: AttributionResponse, what: str = "expected output") -> Outcome:
    """``yes / (yes + no)`` over the judge's verdicts; other words are dropped.

    No usable verdict -> skipped.  Shared with ``turn_contextual_recall``.
    """
    verdicts = [
        {"statement": v.statement, "verdict": normalise_verdict(v.verdict), "node": v.node}
        for v in response.verdicts
    ]
    yes = sum(1 for v in verdicts if v["verdict"] == "yes")
    no = sum(1 for v in verdicts if v["verdict"] == "no")
    return share_outcome(
        yes,
        yes + no,
        details={"verdicts": verdicts, "attributed": yes, "statements": yes + no},
        dropped=len(verdicts) - yes - no,
        skip_reason=f"the {what} yielded no statements with a yes/no verdict",
        reason=(
            f"{yes} of {plural(yes + no, 'statement')} of the {what} "
            "attributable to the retrieval context"
        ),
        judge_reason=response.reason,
    )


class ContextualRecall(MetricBase):
    name = "contextual_recall"

    def missing_inputs(self, case: RAGCase) -> str | None:
        if blank(case.expected_output):
            return "no expected_output to recall"
        if case.retrieval_context is None:
            return "no retrieval_context captured"
        return None

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        assert case.expected_output is not None
        contexts = tuple(case.context_texts())
        if not contexts:
            # A real zero, and no judge call needed: nothing was retrieved.
            return Outcome(0.0, "nothing was retrieved", {"attributed": 0})
        response = await run.ask(
            AttributionRequest(
                reference=case.expected_output,
                contexts=contexts,
                prompt_template=self.options.prompt_template,
            )
        )
        return attribution_outcome(response)
