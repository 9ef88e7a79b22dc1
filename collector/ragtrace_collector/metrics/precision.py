"""``contextual_precision``: are the useful nodes ranked first?  (one judge call)

For each node in rank order the judge answers yes or no: was it useful in arriving
at the reference answer?  ``score = AP`` over those verdicts (METRICS.md).  A verdict
other than yes counts as not useful (the node keeps its rank); it is listed in the
details.

The ``reference`` option chooses the reference: ``expected_output`` (default),
``actual_output`` (reference-free, like Ragas's WithoutReference) or ``auto``
(expected when present, else actual).  The one used is ``details["reference"]``,
written online as ``ragtrace.eval.contextual_precision.reference``.
"""

from __future__ import annotations

from typing import Any

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.judges.base import JudgeError, UsefulnessRequest, UsefulnessResponse
from ragtrace_collector.metrics.base import (
    MetricBase,
    Outcome,
    Run,
    average_precision,
    blank,
    no_input,
    normalise_verdict,
    order_by_node,
    with_judge_reason,
)

__all__ = ["ContextualPrecision", "usefulness_outcome"]


def usefulness_outcome(response: UsefulnessResponse, node_count: int) -> Outcome:
    """AP over one verdict per node.  Shared with ``turn_contextual_precision``."""
    if len(response.verdicts) != node_count:
        raise JudgeError(
            "invalid_response",
            f"expected exactly {node_count} verdicts, one per node, got {len(response.verdicts)}",
        )
    order = order_by_node([v.node for v in response.verdicts], node_count)
    ranked = [response.verdicts[i] for i in order]
    words = [normalise_verdict(v.verdict) for v in ranked]
    relevant = [1 if w == "yes" else 0 for w in words]
    details: dict[str, Any] = {
        "verdicts": [
            {"node": rank, "verdict": w, "reason": v.reason}
            for rank, (v, w) in enumerate(zip(ranked, words, strict=True), start=1)
        ],
        "relevant": relevant,
    }
    unclear = [rank for rank, w in enumerate(words, start=1) if w not in ("yes", "no")]
    if unclear:
        details["unclear_nodes"] = unclear
    ap = average_precision(relevant)
    reason = f"{sum(relevant)} of {node_count} nodes useful"
    if sum(relevant):
        first = relevant.index(1) + 1
        reason += f", first at rank {first}; average precision {ap:.3f}"
    return Outcome(ap, with_judge_reason(reason, response.reason), details)


class ContextualPrecision(MetricBase):
    name = "contextual_precision"

    def _reference(self, case: RAGCase) -> tuple[str, str] | None:
        choice = self.options.reference
        if choice in ("expected_output", "auto") and not blank(case.expected_output):
            assert case.expected_output is not None
            return "expected_output", case.expected_output
        if choice in ("actual_output", "auto") and not blank(case.actual_output):
            assert case.actual_output is not None
            return "actual_output", case.actual_output
        return None

    def missing_inputs(self, case: RAGCase) -> str | None:
        missing = no_input(case)
        if missing is not None:
            return missing
        if self._reference(case) is None:
            wanted = {
                "expected_output": "no expected_output",
                "actual_output": "no actual_output (reference=actual_output)",
                "auto": "neither expected_output nor actual_output",
            }
            reason = wanted[self.options.reference]
            if case.output_unreadable and self.options.reference != "expected_output":
                reason += f" (the answer: {case.output_unreadable})"
            return reason
        if case.retrieval_context is None:
            return "no retrieval_context captured"
        if not case.retrieval_context:
            return "nothing was retrieved: no ranking to score"
        return None

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        assert case.input is not None
        chosen = self._reference(case)
        assert chosen is not None
        used, reference = chosen
        contexts = tuple(case.context_texts())
        response = await run.ask(
            UsefulnessRequest(
                input=case.input,
                reference=reference,
                contexts=contexts,
                prompt_template=self.options.prompt_template,
            )
        )
        outcome = usefulness_outcome(response, len(contexts))
        outcome.details["reference"] = used
        return outcome
